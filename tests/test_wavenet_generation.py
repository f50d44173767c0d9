"""WaveNet generation (speechkernels.wavenet.generation): the paths' choice and argument checks, the Triton and
cluster kernels against the incremental path, the packed weights."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from wavenet_helpers import incremental_path, small_model

from speechkernels.wavenet.weights import VocoderInputs, vocoder_weights

GENERATE_CASES = [
    # (model keywords, generate keywords beyond cond / speaker of batch 2 where the model has them, match)
    ({}, dict(speaker=1.5), "speaker must be"),
    ({}, dict(speaker=[0.0, 1.0]), "speaker must hold integers"),
    ({}, dict(speaker=torch.tensor([0.0, 1.0])), "speaker must hold integers"),
    ({}, dict(speaker=torch.tensor([[0, 1]])), "speaker must be 1-D"),
    ({}, dict(generator=5), "generator"),
    ({}, dict(cond=torch.randn(2, 5, 10).long()), "cond must be float"),
    ({}, dict(cond=np.zeros((2, 5, 10), np.float32)), "cond must be a torch.Tensor"),
    ({}, dict(batch=2.5), "batch must be an integer"),
    ({}, dict(batch=3), "batch=3 but cond has 2 streams"),
    ({}, dict(speaker=torch.tensor([0, 1, 2])), "cond has 2 streams but speaker has 3"),
    ({}, dict(temperature="1"), "temperature must be a real number"),
    ({}, dict(temperature=math.inf), "temperature must be a finite number"),
    ({}, dict(kernel=None), "kernel must be one of"),
    (dict(cond_channels=0), dict(cond=torch.randn(2, 5, 10)), "cond must be None"),
    (dict(speakers=0), dict(speaker=torch.tensor([0, 1])), "speaker must be None"),
    (dict(cond_channels=0, speakers=0), dict(batch=2.5), "batch must be an integer"),
    (dict(cond_channels=0, speakers=0), dict(batch=0), "batch must be >= 1"),
    (dict(cond_channels=0), dict(speaker=torch.tensor([0, 1]), batch=3), "batch=3 but speaker has 2 streams"),
]


@pytest.mark.parametrize(
    "entry, model_kw, kw, match",
    [
        (entry, *case)
        for entry in ("generate", "incremental_state", "generate_cuda_graph", "generate_kernel")
        for case in GENERATE_CASES
        if "kernel" not in case[1] or entry in ("generate", "generate_kernel")
    ],
)
def test_generate_bad_arguments(entry, model_kw, kw, match):
    """Every generation entry point refuses the same mistakes, before any work, with a ValueError naming the
    argument (the CUDA-only entry points check their arguments before their device)."""
    from speechkernels.bench import wavenet_baselines
    from speechkernels.wavenet import generation

    net = small_model(**model_kw)
    args = dict(
        cond=torch.randn(2, 5, 10) if net.cond_channels else None,
        n_samples=8,
        temperature=1.0,
        generator=None,
        speaker=torch.tensor([0, 1]) if net.speakers else None,
        batch=None,
    )
    args.update(kw)
    if entry == "generate":
        call = lambda: net.generate(**args)
    elif entry == "generate_kernel":
        args.setdefault("kernel", "triton")
        call = lambda: generation.generate_kernel(net, **args, weights_dtype=torch.float32)
    elif entry == "incremental_state":
        call = lambda: generation.incremental_state(net, **args, uniforms=None)
    else:
        module = wavenet_baselines if entry == "generate_cuda_graph" else generation
        call = lambda: getattr(module, entry)(net, **args)
    with pytest.raises(ValueError, match=match):
        call()


def test_generate_takes_normalised_arguments():
    """Integer-like sizes, a list of speaker ids, float64 conditioning and a numpy temperature give what the plain
    arguments give; a CUDA-only entry point refuses a CPU model with a ValueError."""
    from speechkernels.bench.wavenet_baselines import generate_cuda_graph

    net = small_model()
    cond = torch.randn(2, 5, 10).half().float()
    ref = net.generate(cond, 9, 0.7, torch.Generator().manual_seed(2), torch.tensor([2, 0]), batch=2)
    out = net.generate(
        cond.double(), np.int64(9), np.float32(0.7), torch.Generator().manual_seed(2), [2, 0], batch=torch.tensor(2)
    )
    assert torch.equal(out, ref)
    with pytest.raises(ValueError, match="generate_cuda_graph needs the model on a CUDA device"):
        generate_cuda_graph(net, cond, 9, speaker=[2, 0])


def test_generate_progress(capsys):
    """progress=True reports on stderr (a last line at 100 %) and changes nothing else; anything but a bool is
    refused."""
    net = small_model()
    cond = torch.randn(2, 5, 10)
    ref = net.generate(cond, 9, 0.7, torch.Generator().manual_seed(2), torch.tensor([2, 0]))
    capsys.readouterr()
    out = net.generate(cond, 9, 0.7, torch.Generator().manual_seed(2), torch.tensor([2, 0]), progress=True)
    assert torch.equal(out, ref)
    err = capsys.readouterr().err
    assert "generated 9/9 samples per stream (100 %, 2 streams" in err
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="progress must be True or False"):
            net.generate(cond, 9, speaker=torch.tensor([2, 0]), progress=bad)


def test_inverse_temperature_is_a_finite_float32():
    """The generation kernels' 1 / temperature (shared by the Triton and the cluster launcher) stays a finite
    float32 however small the temperature (the smallest subnormal float64 included)."""
    from speechkernels.wavenet.weights import FLOAT32_MAX, inverse_temperature

    assert FLOAT32_MAX == float(torch.finfo(torch.float32).max)
    assert inverse_temperature(0.0) == 0.0 and inverse_temperature(0.5) == 2.0
    for t in (1e-38, 3e-39, 1e-40, 1e-300, 5e-324):
        inv = np.float32(inverse_temperature(t))
        assert np.isfinite(inv) and inv >= 1e38, (t, inv)


@pytest.mark.filterwarnings("ignore:overflow encountered in multiply")  # (logits - max) * 3.4e38 -> -inf: exp 0
def test_generate_kernel_tiny_temperature_matches_torch(interpreter):
    """A temperature too small for its reciprocal in float32 (< ~3e-39): the Triton kernel samples the most likely
    class, as the PyTorch path's float64 softmax, rather than NaN probabilities (every sample class 0)."""
    net = small_model()
    g = torch.Generator().manual_seed(9)
    cond, spk = torch.randn(3, 5, 8, generator=g), torch.tensor([1, 0, 2])
    runs = {
        k: net.generate(cond, 21, 1e-40, torch.Generator().manual_seed(1), spk, kernel=k) for k in ("torch", "triton")
    }
    greedy = net.generate(cond, 21, 0.0, None, spk, kernel="torch")
    assert torch.equal(runs["torch"], greedy)  # the model's argmax at this temperature...
    # ...also where 1 / temperature overflows float64 (the PyTorch path divides logits shifted by their maximum)
    assert torch.equal(net.generate(cond, 21, 5e-324, torch.Generator().manual_seed(1), spk, kernel="torch"), greedy)
    assert (greedy != 0).any() and greedy.unique().numel() > 2  # ...which is not always class 0
    assert torch.equal(runs["triton"], runs["torch"])


def test_generate_kernel_choice_and_bad_arguments(interpreter):
    net = small_model()
    cond, spk = torch.randn(2, 5, 10), torch.tensor([2, 0])
    a = net.generate(cond, 9, generator=torch.Generator().manual_seed(5), speaker=spk)  # CPU: the PyTorch path
    b = net.generate(cond, 9, generator=torch.Generator().manual_seed(5), speaker=spk, kernel="triton")
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="kernel must be"):
        net.generate(cond, 9, speaker=spk, kernel="cuda")
    with pytest.raises(ValueError, match="weights_dtype"):
        net.generate(cond, 9, speaker=spk, weights_dtype=torch.float16)
    with pytest.raises(ValueError, match="needs kernel='cluster'"):
        net.generate(cond, 9, speaker=spk, kernel="torch", weights_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA device"):
        net.generate(cond, 9, speaker=spk, kernel="cluster")


@pytest.mark.gpu
def test_gpu_generate_auto_kernel_matches_explicit(gpu):
    net = small_model(residual_channels=64, gate_channels=128, skip_channels=256, classes=256).to(gpu)
    cond, spk = torch.randn(3, 5, 20, device=gpu), torch.tensor([2, 0, 1], device=gpu)
    runs = {
        k: net.generate(cond, 50, generator=torch.Generator(gpu).manual_seed(1), speaker=spk, kernel=k)
        for k in ("auto", "triton", "cluster", "torch")
    }
    assert torch.equal(runs["auto"], runs["cluster"])
    for k in ("triton", "torch"):  # same uniforms: the same classes but for a rare float32 boundary case
        assert (runs[k] == runs["cluster"]).float().mean() > 0.95


GENERATION_KERNELS = ["triton", "cluster", "cluster bf16", "cluster C=4"]


@pytest.mark.kernels
@pytest.mark.parametrize("temperature", [0.0, 0.9, 1e-40])  # 1e-40: 1 / temperature is no float32
@pytest.mark.parametrize("kernel", GENERATION_KERNELS)
@pytest.mark.parametrize("kw", [{}, dict(speakers=0), dict(cond_channels=0, speakers=0)], ids=str)
def test_generation_kernels_match_incremental_path(path, kernel, kw, temperature):
    """Each generation kernel on the same uniforms as the PyTorch path. Under the interpreter the
    one-program-per-stream Triton kernel draws exactly its samples (the same sums in the same order); on the GPU
    the Triton kernel and the cluster kernel (float32 and bfloat16 weights, clusters of 8 and 4 CTAs), each step
    against the PyTorch logits on the kernel's own samples and the same uniform (a sum in another order moves a
    sample across a boundary of the CDF only when the uniform lies within ~1e-6 of it; a wrong step would not
    feed back here); bfloat16 against the model with its matrices rounded as the kernel reads them."""
    from speechkernels.wavenet.cluster_vocoder import wavenet_generate_cluster
    from speechkernels.wavenet.generation import cluster_kernel_available
    from speechkernels.wavenet.triton_vocoder import wavenet_generate

    gpu = path.device.type == "cuda"
    if kernel != "triton" and not gpu:
        pytest.skip("the cluster kernels run on a GPU")
    wide = dict(residual_channels=64, gate_channels=128, skip_channels=256, classes=256) if gpu else {}
    net = small_model(**wide, **kw).to(path.device)
    if kernel.startswith("cluster") and not cluster_kernel_available(net):
        pytest.skip("cuda-core or a GPU of compute capability 9.0 missing")
    B, n = (4, 200) if gpu else (3, 21)
    g = torch.Generator().manual_seed(9)
    cond = torch.randn(B, 5, n // 4 + 2, generator=g).to(path.device) if net.cond_channels else None
    speaker = torch.tensor([1, 0, 2, 1][:B], device=path.device) if net.speakers else None
    u = torch.rand(n, B, generator=g, dtype=torch.float64).float().to(path.device)
    with torch.no_grad():
        spk = net.speaker_embed(speaker) if net.speakers else None
        inputs = VocoderInputs(cond, spk, u, temperature)
        if kernel == "triton":
            out = wavenet_generate(vocoder_weights(net), inputs)
        else:
            wd = torch.bfloat16 if "bf16" in kernel else torch.float32
            out = wavenet_generate_cluster(vocoder_weights(net), inputs, wd, 4 if "C=4" in kernel else 8)
            if wd == torch.bfloat16:  # the same model with its matrices rounded as the kernel reads them
                for name, prm in net.named_parameters():
                    if prm.dim() == 2 and not name.startswith(("embed", "speaker", "w_cond", "w_speaker")):
                        prm.copy_(prm.to(torch.bfloat16).float())
    path.check_ran()
    if not gpu:
        ref, _ = incremental_path(net, cond, n, temperature, None, speaker, batch=B, uniforms=u)
        assert torch.equal(out, ref)
        return
    with torch.no_grad():
        logits = net(out, cond, speaker)  # teacher-forced on the kernel's own samples
    if temperature == 0:
        expected = logits.argmax(dim=1)
    else:
        cdf = torch.softmax(logits.double() / temperature, dim=1).cumsum(dim=1)  # [B, C, n]
        ut = (u.T.double() * cdf[:, -1])[:, None, :]
        expected = (cdf < ut).sum(dim=1).clamp(max=net.classes - 1)
    assert (out == expected).float().mean() > 0.99


def test_vocoder_weights_packed_once_per_parameter_version():
    """The kernels' weights are packed once and reused while the parameters are unchanged; an in-place update
    (an optimizer step, load_state_dict, a copy under no_grad) or a new parameter packs them again."""
    net = small_model()
    w = vocoder_weights(net)
    assert vocoder_weights(net) is w
    for p in (w.w_past, w.w_cur, w.b_cur, w.w_res, w.b_skip, w.w_head2, w.dilations):
        assert type(p) is torch.Tensor and not p.requires_grad  # plain tensors, no parameters
    assert w.w_past.shape == (6, 12, 8) and w.queue_slots == sum(net.dilations) and w.start_class == 16
    torch.testing.assert_close(w.w_res[2], net.w_res[2].weight, rtol=0, atol=0)

    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net(torch.zeros(1, 4, dtype=torch.long), torch.randn(1, 5, 1), torch.tensor([1])).sum().backward()
    opt.step()
    w2 = vocoder_weights(net)
    assert w2 is not w and vocoder_weights(net) is w2
    torch.testing.assert_close(w2.w_res[2], net.w_res[2].weight, rtol=0, atol=0)
    assert not torch.equal(w2.w_res, w.w_res)

    net.load_state_dict(small_model(seed=1).state_dict())
    w3 = vocoder_weights(net)
    assert w3 is not w2
    torch.testing.assert_close(w3.w_head2, small_model(seed=1).head2.weight, rtol=0, atol=0)
    net.head2.bias = torch.nn.Parameter(net.head2.bias.detach() + 1)  # a new tensor, same version count
    assert vocoder_weights(net) is not w3


@pytest.mark.kernels
def test_generate_reuses_packed_weights(path, monkeypatch):
    """Repeated generate() calls pack the weights once; after an in-place update the kernel packs them again and
    draws what the PyTorch path draws from the updated model."""
    from speechkernels.wavenet import weights as weights_module

    device, kernel = path.device, path.wavenet_kernel
    packs = []
    pack = weights_module.pack_vocoder_weights
    monkeypatch.setattr(weights_module, "pack_vocoder_weights", lambda model: packs.append(1) or pack(model))
    wide = dict(residual_channels=64, gate_channels=128, skip_channels=256, classes=256)
    net = small_model(**(wide if device.type == "cuda" else {})).to(device)
    cond, spk = torch.randn(2, 5, 6, device=device), torch.tensor([2, 0], device=device)

    def run(k):
        return net.generate(cond, 12, 0.9, torch.Generator(device).manual_seed(4), spk, kernel=k)

    a = run(kernel)
    path.check_ran()
    w = vocoder_weights(net)
    assert torch.equal(run(kernel), a) and len(packs) == 1 and vocoder_weights(net) is w
    with torch.no_grad():  # favour the high classes
        net.head2.bias.add_(torch.linspace(0, 4, net.classes, device=device))
    b = run(kernel)
    assert len(packs) == 2 and vocoder_weights(net) is not w
    assert not torch.equal(a, b)
    ref = run("torch")
    if device.type == "cpu":
        assert torch.equal(b, ref)
    else:  # the same classes but for a rare float32 boundary case
        assert (b == ref).float().mean() > 0.95
