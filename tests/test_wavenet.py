"""WaveNet: mu-law helpers, the serial-chain proxy against its float64 loop, incremental generation against the
teacher-forced forward pass, argument checks, WAV output, and a tiny model that learns a tone."""

from __future__ import annotations

import itertools
import math
import wave

import numpy as np
import pytest
import torch

from speechkernels.wavenet import (
    WaveNet,
    WaveNetServer,
    cuda_runtime,
    mu_law_decode,
    mu_law_encode,
    save_wav,
    serial_chain,
    serial_chain_reference,
)
from speechkernels.wavenet.generation import incremental_state
from speechkernels.wavenet.incremental import sample_incremental
from speechkernels.wavenet.weights import Continuation, VocoderInputs, vocoder_weights


def chain_case(L, H, B, activation, dtype=torch.float32, seed=0):
    """Weights at a gain (1.2 for tanh, 1.4 for relu) where the vector neither dies out nor blows up over a few
    samples of the chain, so that the comparisons below are of outputs of order one, not of zeros."""
    g = torch.Generator().manual_seed(seed)
    gain = 1.2 if activation == "tanh" else 1.4
    w = (torch.randn(L, H, H, generator=g) * gain / math.sqrt(H)).to(dtype)
    return w, torch.randn(B, H, generator=g)


def assert_chain_close(out, ref, rtol=1e-4):
    scale = ref.abs().max().item()
    assert 1e-2 < scale < 1e3, f"the chain's output is of size {scale:.1e}: a comparison would test little"
    torch.testing.assert_close(out.cpu().double(), ref, rtol=rtol, atol=rtol * scale)


def test_mu_law_round_trip():
    x = torch.linspace(-1, 1, 1001)
    q = mu_law_encode(x)
    assert q.dtype == torch.int64 and q.min() == 0 and q.max() == 255
    assert mu_law_encode(torch.tensor([0.0])).item() == 128
    # the quantisation step of mu-law near x is about ln(256) (1/256 + |x|) / 128 * ... : bounded by 0.03
    err = (mu_law_decode(q) - x).abs()
    assert err.max() < 0.03 and err[490:511].max() < 1e-3
    assert torch.equal(mu_law_encode(mu_law_decode(torch.arange(256))), torch.arange(256))


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_serial_chain_matches_float64_loop(activation, dtype):
    L, H, B = 5, 16, 3
    w, x0 = chain_case(L, H, B, activation, dtype, seed=1)
    out = serial_chain(w, x0, n_samples=7, activation=activation)
    ref = serial_chain_reference(w.float(), x0, n_samples=7, activation=activation)
    assert out.dtype == torch.float32 and out.shape == (B, H)
    assert_chain_close(out, ref, rtol=1e-5)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("H", [16, 13])
def test_serial_chain_stream_kernel_matches_float64_loop(interpreter, activation, dtype, H):
    """The one-program-per-stream Triton kernel under the interpreter (no bfloat16 there: float16 stands in for a
    16-bit weight format, the GPU test covers bfloat16)."""
    L, B = 4, 3
    w, x0 = chain_case(L, H, B, activation, seed=2)
    from speechkernels.wavenet.proxy.triton_designs import serial_chain_stream

    out = serial_chain_stream(w.to(dtype), x0, 5, relu=activation == "relu")
    ref = serial_chain_reference(w.to(dtype).float(), x0, n_samples=5, activation=activation)
    assert_chain_close(out, ref, rtol=1e-5)
    if dtype == torch.float32:  # the public function (float32 or bfloat16 weights) runs the same kernel
        torch.testing.assert_close(serial_chain(w, x0, 5, activation, design="stream"), out)
        x0_t = x0.T.contiguous().T  # same values, not contiguous
        torch.testing.assert_close(serial_chain(w, x0_t, 5, activation, design="stream"), out)


def test_serial_chain_barrier_kernel_matches_float64_loop(interpreter):
    """The post's design under the interpreter: one program (programs run one after another there, so the grid
    barrier can only be passed alone); the GPU test runs it with H / 16 programs."""
    L, H, B = 3, 24, 19  # B over one 16-stream block
    w, x0 = chain_case(L, H, B, "tanh", seed=4)
    out = serial_chain(w, x0, 4, "tanh", design="barrier")
    assert_chain_close(out, serial_chain_reference(w, x0, n_samples=4), rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("design", ["stream", "barrier", "cluster", "partials", "pipeline"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_gpu_serial_chain_designs(gpu, design, dtype, activation):
    """The benchmark's shape (80 layers of 128): 160 matrices in a row with tanh, 80 with relu (whose chain
    fades), where float32 rounding stays well inside the tolerance (PyTorch's own float32 loop is 3e-5 off at
    160 matrices, 2e-4 at 240)."""
    if design in ("cluster", "partials", "pipeline"):
        if not cuda_runtime.clusters_available():
            pytest.skip("cuda-core or a GPU of compute capability 9.0 missing")
    if design == "pipeline" and dtype != torch.bfloat16:
        pytest.skip("the pipeline design takes bfloat16 weights")
    L, H, B = 80, 128, 5
    w, x0 = chain_case(L, H, B, activation, dtype, seed=3)
    n = 2 if activation == "tanh" else 1
    out = serial_chain(w.to(gpu), x0.to(gpu), n, activation, design=design)
    assert_chain_close(out, serial_chain_reference(w.float(), x0, n_samples=n, activation=activation))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "H, C, S",
    [
        (128, 1, 1),
        (128, 2, 3),
        (128, 4, 2),
        (128, 8, 1),
        (128, 8, 4),
        (128, 16, 1),
        (128, 16, 2),
        (64, 2, 1),
        (64, 8, 2),
        (256, 4, 1),
    ],
)
def test_gpu_serial_chain_cluster_configs(gpu, H, C, S):
    """Cluster sizes, streams per cluster (B not a multiple of S), widths, a sample count that is not a multiple
    of the prefetch depth."""
    from speechkernels.wavenet.proxy import cluster

    if not cuda_runtime.clusters_available():
        pytest.skip("cuda-core or a GPU of compute capability 9.0 missing")
    L, B, n = 7, 5, 3
    w, x0 = chain_case(L, H, B, "tanh", seed=5)
    out = cluster.serial_chain_cluster(w.to(gpu), x0.to(gpu), n, relu=False, C=C, S=S)
    assert_chain_close(out, serial_chain_reference(w, x0, n_samples=n))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("S", [1, 2])
def test_gpu_serial_chain_cluster_variants(gpu, dtype, S):
    """The row-split kernel's critical-path options (wait semantics, reduction, FMA chains, loads in the polling
    loop, interleaved columns) against float64, and bitwise: the indexed reduction adds in the butterfly's order,
    the wait and load placement change no arithmetic."""
    from speechkernels.wavenet.proxy import cluster

    if not cuda_runtime.clusters_available():
        pytest.skip("cuda-core or a GPU of compute capability 9.0 missing")
    L, H, B, n = 80, 128, 3, 2
    w, x0 = chain_case(L, H, B, "tanh", dtype=dtype, seed=11)
    ref = serial_chain_reference(w, x0, n_samples=n)
    runs = {}
    for acq, red, fch, liw, wil, cil in itertools.product((0, 1), (0, 1), (2, 4), (0, 1), (0, 1), (0, 1)):
        if wil and not (liw and dtype == torch.bfloat16):
            continue
        o = dict(ACQ=acq, RED=red, FCH=fch, LIW=liw, WIL=wil, CIL=cil)
        out = cluster.serial_chain_cluster(w.to(gpu), x0.to(gpu), n, relu=False, C=16, S=S, **o)
        assert_chain_close(out, ref)
        runs[(acq, red, fch, liw, wil, cil)] = out
    for key, out in runs.items():  # the same bits as the plain kernel with the same FMA chains and columns
        assert torch.equal(out, runs[(0, 0, key[2], 0, 0, key[5])]), key


@pytest.mark.gpu
@pytest.mark.parametrize(
    "H, C, dtype, activation",
    [
        (128, 16, torch.float32, "tanh"),
        (128, 16, torch.bfloat16, "relu"),
        (128, 8, torch.bfloat16, "tanh"),
        (128, 4, torch.float32, "tanh"),
        (64, 8, torch.float32, "relu"),
        (256, 16, torch.bfloat16, "tanh"),
        (32, 4, torch.float32, "tanh"),
    ],
)
def test_gpu_serial_chain_partials_configs(gpu, H, C, dtype, activation):
    """The column-split cluster design: cluster sizes, widths, both weight types, a layer count that is not a
    multiple of the prefetch depth, several streams."""
    from speechkernels.wavenet.proxy.partials import serial_chain_partials

    if not cuda_runtime.clusters_available():
        pytest.skip("cuda-core or a GPU of compute capability 9.0 missing")
    L, B, n = 7, 3, 3
    w, x0 = chain_case(L, H, B, activation, dtype, seed=7)
    out = serial_chain_partials(w.to(gpu), x0.to(gpu), n, relu=activation == "relu", C=C)
    assert_chain_close(out, serial_chain_reference(w.float(), x0, n_samples=n, activation=activation))
    assert torch.equal(out, serial_chain_partials(w.to(gpu), x0.to(gpu), n, relu=activation == "relu", C=C))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "L, H, B, n, activation",
    [
        (80, 128, 3, 2, "tanh"),  # 16 CTAs of 5 layers
        (80, 128, 2, 1, "relu"),
        (7, 128, 2, 3, "tanh"),  # 2 CTAs of 3 and 4 layers
        (5, 128, 1, 4, "tanh"),  # one CTA
        (8, 128, 3, 4, "relu"),
        (13, 64, 5, 4, "tanh"),
        (3, 32, 1, 5, "relu"),  # one CTA of two warps
        (50, 32, 2, 6, "tanh"),
    ],
)
def test_gpu_serial_chain_pipeline(gpu, L, H, B, n, activation):
    """The layer-split cluster design against float64 (bfloat16 weights; the vector split in three bfloat16
    pieces must keep float32 accuracy)."""

    if not cuda_runtime.clusters_available():
        pytest.skip("cuda-core or a GPU of compute capability 9.0 missing")
    w, x0 = chain_case(L, H, B, activation, torch.bfloat16, seed=6)
    out = serial_chain(w.to(gpu), x0.to(gpu), n, activation, design="pipeline")
    assert_chain_close(out, serial_chain_reference(w.float(), x0, n_samples=n, activation=activation))
    again = serial_chain(w.to(gpu), x0.to(gpu), n, activation, design="pipeline")
    assert torch.equal(out, again)  # no race: the same bits every run


@pytest.mark.gpu
def test_gpu_serial_chain_pipeline_rejects(gpu):
    if not cuda_runtime.clusters_available():
        pytest.skip("cuda-core or a GPU of compute capability 9.0 missing")
    x0 = torch.zeros(1, 128, device=gpu)
    with pytest.raises(ValueError, match="bfloat16"):
        serial_chain(torch.zeros(4, 128, 128, device=gpu), x0, 1, design="pipeline")
    with pytest.raises(ValueError, match="cannot hold L=81"):
        serial_chain(torch.zeros(81, 128, 128, device=gpu, dtype=torch.bfloat16), x0, 1, design="pipeline")
    with pytest.raises(ValueError, match="cannot hold"):
        serial_chain(torch.zeros(2, 48, 48, device=gpu, dtype=torch.bfloat16), x0[:, :48], 1, design="pipeline")


@pytest.mark.parametrize(
    "args, match",
    [
        ((torch.zeros(2, 3, 4), torch.zeros(1, 3), 1), "weights must be"),
        ((torch.zeros(2, 3, 3, dtype=torch.float64), torch.zeros(1, 3), 1), "float32 or bfloat16"),
        ((torch.zeros(2, 3, 3), torch.zeros(1, 4), 1), "x0 must be"),
        ((torch.zeros(2, 3, 3), torch.zeros(0, 3), 1), "B = 0"),
        ((torch.zeros(2, 3, 3), torch.zeros(1, 3), 0), "n_samples"),
    ],
)
def test_serial_chain_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        serial_chain(*args)
    with pytest.raises(ValueError, match="activation"):
        serial_chain(torch.zeros(2, 3, 3), torch.zeros(1, 3), 1, activation="gelu")
    with pytest.raises(ValueError, match="design"):
        serial_chain(torch.zeros(2, 3, 3), torch.zeros(1, 3), 1, design="uber")
    with pytest.raises(ValueError, match="activation"):
        serial_chain(torch.zeros(2, 3, 3), torch.zeros(1, 3), 1, activation=None)
    with pytest.raises(ValueError, match="design"):
        serial_chain(torch.zeros(2, 3, 3), torch.zeros(1, 3), 1, design=["torch"])
    for design in ("cluster", "partials", "pipeline"):
        with pytest.raises(ValueError, match="needs CUDA"):
            serial_chain(torch.zeros(2, 3, 3), torch.zeros(1, 3), 1, design=design)


def incremental_path(net, cond, n, temperature, generator, speaker, batch=None, uniforms=None, return_logits=False):
    """The PyTorch path (the reference): (classes [B, n], logits [B, classes, n] or None)."""
    with torch.no_grad():
        state = incremental_state(net, cond, n, temperature, generator, speaker, batch, uniforms)
        return sample_incremental(state, return_logits)


def small_model(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(layers=6, cycle=3, residual_channels=8, gate_channels=12, skip_channels=10, classes=32,
               cond_channels=5, hop_length=4, speakers=3, speaker_channels=4)  # fmt: skip
    cfg.update(kw)
    return WaveNet(**cfg).eval()


@pytest.mark.parametrize("kw", [{}, dict(speakers=0), dict(cond_channels=0), dict(cond_channels=0, speakers=0)])
def test_incremental_generation_matches_teacher_forced_forward(kw):
    net = small_model(**kw)
    B, n = 3, 37
    g = torch.Generator().manual_seed(5)
    cond = torch.randn(B, 5, 10, generator=g) if net.cond_channels else None
    speaker = torch.tensor([0, 2, 1]) if net.speakers else None
    samples, logits = incremental_path(net, cond, n, 1.0, g, speaker, batch=B, return_logits=True)
    assert samples.shape == (B, n) and samples.min() >= 0 and samples.max() < net.classes
    with torch.no_grad():
        ref = net(samples, cond, speaker)
    torch.testing.assert_close(logits, ref, rtol=0, atol=1e-4)
    # the samples follow the logits: greedy decoding picks each step's most likely class
    greedy, glogits = incremental_path(net, cond, n, 0.0, None, speaker, batch=B, return_logits=True)
    assert torch.equal(greedy, glogits.argmax(dim=1))


@pytest.mark.gpu
def test_gpu_cuda_graph_generation_matches_eager(gpu):
    from speechkernels.bench.wavenet_baselines import generate_cuda_graph

    net = small_model().to(gpu)
    cond, spk = torch.randn(2, 5, 10, device=gpu), torch.tensor([2, 0], device=gpu)
    u = torch.rand(33, 2, generator=torch.Generator().manual_seed(7)).to(gpu)
    eager, _ = incremental_path(net, cond, 33, 0.8, None, spk, uniforms=u)
    torch.testing.assert_close(generate_cuda_graph(net, cond, 33, 0.8, None, spk, uniforms=u), eager, rtol=0, atol=0)


def test_generation_is_seeded():
    net = small_model()
    cond = torch.randn(2, 5, 10)
    a = net.generate(cond, 30, generator=torch.Generator().manual_seed(3), speaker=torch.tensor([1, 1]))
    b = net.generate(cond, 30, generator=torch.Generator().manual_seed(3), speaker=torch.tensor([1, 1]))
    c = net.generate(cond, 30, generator=torch.Generator().manual_seed(4), speaker=torch.tensor([1, 1]))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_wavenet_bad_arguments():
    net = small_model()
    cond, spk = torch.randn(2, 5, 10), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="n_samples"):
        net.generate(cond, 0, speaker=spk)
    with pytest.raises(ValueError, match="do not cover"):
        net.generate(cond, 41, speaker=spk)
    with pytest.raises(ValueError, match="do not cover"):
        net(torch.zeros(2, 41, dtype=torch.long), cond, spk)
    with pytest.raises(ValueError, match="cond must be"):
        net.generate(torch.randn(2, 4, 10), 8, speaker=spk)
    with pytest.raises(ValueError, match="streams must be >= 1"):
        net.generate(torch.randn(0, 5, 10), 8, speaker=torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="B = 0"):
        net(torch.zeros(0, 8, dtype=torch.long), torch.randn(0, 5, 10), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="speaker is required"):
        net.generate(cond, 8)
    with pytest.raises(ValueError, match="speaker ids"):
        net.generate(cond, 8, speaker=torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="temperature"):
        net.generate(cond, 8, temperature=-1.0, speaker=spk)
    with pytest.raises(ValueError, match="temperature"):
        net.generate(cond, 8, temperature=math.nan, speaker=spk)
    with pytest.raises(ValueError, match="n_samples"):
        net.generate(cond, 8.0, speaker=spk)


@pytest.mark.parametrize(
    "kw, name",
    [
        (dict(classes=0), "classes"),
        (dict(hop_length=0), "hop_length"),
        (dict(residual_channels=-1), "residual_channels"),
        (dict(gate_channels=0), "gate_channels"),
        (dict(skip_channels=0), "skip_channels"),
        (dict(cond_channels=-1), "cond_channels"),
        (dict(speakers=-1), "speakers"),
        (dict(speaker_channels=0), "speaker_channels"),
        (dict(layers=2.0), "layers"),
        (dict(cycle=True), "cycle"),
        (dict(classes="32"), "classes"),
    ],
)
def test_wavenet_constructor_bad_arguments(kw, name):
    with pytest.raises(ValueError, match=name):
        small_model(**kw)


def test_wavenet_constructor_takes_integer_like_sizes():
    net = small_model(layers=np.int64(4), classes=torch.tensor(16), hop_length=np.int32(4))
    assert (net.layers, net.classes, net.hop_length) == (4, 16, 4) and type(net.layers) is int
    assert net(torch.zeros(1, 6, dtype=torch.long), torch.randn(1, 5, 2), torch.tensor([0])).shape == (1, 16, 6)


@pytest.mark.parametrize(
    "case, match",
    [
        ("class too high", r"audio classes must be in \[0, classes=32\), got audio\[1, 3\]=32"),
        ("negative class", r"audio classes .* got audio\[0, 5\]=-1"),
        ("audio a list", "audio must be"),
        ("integer cond", "cond must be float"),
        ("cond without local conditioning", "cond must be None"),
        ("speaker without speakers", "speaker must be None"),
        ("float speaker", "speaker must hold integers"),
        ("speaker of another batch", "audio has 2 streams but speaker has 3"),
        ("cond of another batch", "audio has 2 streams but cond has 3"),
    ],
)
def test_forward_bad_arguments(case, match):
    kw = dict(cond_channels=0) if case == "cond without local conditioning" else {}
    kw = dict(speakers=0) if case == "speaker without speakers" else kw
    net = small_model(**kw)
    audio = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0))
    cond = torch.randn(2, 5, 2) if net.cond_channels else None
    spk = torch.tensor([0, 2]) if net.speakers else None
    if case == "class too high":
        audio[1, 3] = 32
    elif case == "negative class":
        audio[0, 5] = -1
    elif case == "audio a list":
        audio = audio.tolist()
    elif case == "integer cond":
        cond = cond.long()
    elif case == "cond without local conditioning":
        cond = torch.randn(2, 5, 2)
    elif case == "speaker without speakers":
        spk = torch.tensor([0, 1])
    elif case == "float speaker":
        spk = spk.float()
    elif case == "speaker of another batch":
        spk = torch.tensor([0, 1, 2])
    elif case == "cond of another batch":
        cond = torch.randn(3, 5, 2)
    with pytest.raises(ValueError, match=match), torch.no_grad():
        net(audio, cond, spk)


def test_forward_converts_cond_dtype():
    """float64 (or float16) conditioning runs in the parameters' dtype, as float32 conditioning of the same values;
    speaker ids may be int32 or a list."""
    net = small_model()
    audio = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    cond = torch.randn(2, 5, 2).half().float()
    with torch.no_grad():
        ref = net(audio, cond, torch.tensor([0, 2]))
        assert ref.dtype == torch.float32
        torch.testing.assert_close(net(audio, cond.double(), torch.tensor([0, 2], dtype=torch.int32)), ref)
        torch.testing.assert_close(net(audio, cond.half(), [0, 2]), ref)
        out = incremental_path(net, cond.double(), 8, 0.0, None, np.array([0, 2]), return_logits=True)[1]
    torch.testing.assert_close(out, net(out.argmax(dim=1), cond, torch.tensor([0, 2])), rtol=0, atol=1e-4)


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
    args = dict(cond=torch.randn(2, 5, 10) if net.cond_channels else None, n_samples=8, temperature=1.0,
                generator=None, speaker=torch.tensor([0, 1]) if net.speakers else None, batch=None)  # fmt: skip
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
    out = net.generate(cond.double(), np.int64(9), np.float32(0.7), torch.Generator().manual_seed(2), [2, 0],
                       batch=torch.tensor(2))  # fmt: skip
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
    runs = {k: net.generate(cond, 21, 1e-40, torch.Generator().manual_seed(1), spk, kernel=k)
            for k in ("torch", "triton")}  # fmt: skip
    greedy = net.generate(cond, 21, 0.0, None, spk, kernel="torch")
    assert torch.equal(runs["torch"], greedy)  # the model's argmax at this temperature...
    # ...also where 1 / temperature overflows float64 (the PyTorch path divides logits shifted by their maximum)
    assert torch.equal(net.generate(cond, 21, 5e-324, torch.Generator().manual_seed(1), spk, kernel="torch"), greedy)
    assert (greedy != 0).any() and greedy.unique().numel() > 2  # ...which is not always class 0
    assert torch.equal(runs["triton"], runs["torch"])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda w, x: serial_chain(w, x, np.int64(0)), "n_samples must be >= 1"),
        (lambda w, x: serial_chain(w, x.long(), 2), "x0 must be float"),
        (lambda w, x: serial_chain_reference(w, x, 2.5), "n_samples must be an integer"),
        (lambda w, x: serial_chain_reference(w, x, 2, activation="gelu"), "activation"),
        (lambda w, x: serial_chain_reference(w, x[:, :2], 2), "x0 must be"),
        (lambda w, x: mu_law_encode(torch.zeros(4), classes=1), "classes must be >= 2"),
        (lambda w, x: mu_law_encode(torch.zeros(4), classes=256.0), "classes must be an integer"),
        (lambda w, x: mu_law_encode(torch.zeros(4, dtype=torch.int16)), "audio must be float"),
        (
            lambda w, x: mu_law_decode(torch.tensor([0, 300, 2])),
            r"classes_ must be in \[0, classes=256\), got classes_\[1\]=300",
        ),
        (lambda w, x: mu_law_decode(torch.tensor([-1, 3]), classes=16), r"classes_\[0\]=-1"),
        (lambda w, x: mu_law_decode(torch.arange(4), classes=0), "classes must be >= 2"),
        (lambda w, x: mu_law_decode(torch.zeros(3)), "classes_ must hold integer classes"),
        (lambda w, x: mu_law_decode([0, 1]), "classes_ must be a torch.Tensor"),
    ],
)
def test_proxy_and_reference_bad_arguments(call, match):
    w, x0 = chain_case(2, 3, 1, "tanh")
    with pytest.raises(ValueError, match=match):
        call(w, x0)


def test_proxy_and_reference_take_integer_like_scalars(tmp_path):
    w, x0 = chain_case(2, 3, 1, "tanh")
    torch.testing.assert_close(serial_chain(w, x0, np.int64(3)), serial_chain(w, x0, 3))
    torch.testing.assert_close(serial_chain_reference(w, x0, torch.tensor(3)), serial_chain_reference(w, x0, 3))
    q = mu_law_encode(torch.linspace(-1, 1, 9), classes=np.int32(16))
    assert q.min() == 0 and q.max() == 15
    assert torch.equal(mu_law_decode(q.to(torch.uint8), classes=16), mu_law_decode(q, 16))
    with pytest.raises(ValueError, match="sample_rate must be an integer"):
        save_wav(str(tmp_path / "a.wav"), torch.zeros(8), 16000.5)
    with pytest.raises(ValueError, match="sample_rate must be >= 1"):
        save_wav(str(tmp_path / "a.wav"), torch.zeros(8), 0)
    with pytest.raises(ValueError, match="audio must be a torch.Tensor"):
        save_wav(str(tmp_path / "a.wav"), [0.0, 0.5], 16000)
    save_wav(str(tmp_path / "a.wav"), torch.zeros(8), np.int64(8000))
    with wave.open(str(tmp_path / "a.wav"), "rb") as f:
        assert f.getframerate() == 8000


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
    runs = {k: net.generate(cond, 50, generator=torch.Generator(gpu).manual_seed(1), speaker=spk, kernel=k)
            for k in ("auto", "triton", "cluster", "torch")}  # fmt: skip
    assert torch.equal(runs["auto"], runs["cluster"])
    for k in ("triton", "torch"):  # same uniforms: the same classes but for a rare float32 boundary case
        assert (runs[k] == runs["cluster"]).float().mean() > 0.95


def test_save_wav(tmp_path):
    audio = torch.sin(torch.arange(800) * 0.1) * 0.5
    path = str(tmp_path / "tone.wav")
    save_wav(path, audio, 16000)
    with wave.open(path, "rb") as f:
        assert (f.getnchannels(), f.getsampwidth(), f.getframerate(), f.getnframes()) == (1, 2, 16000, 800)
        pcm = torch.frombuffer(bytearray(f.readframes(800)), dtype=torch.int16).float() / 32767
    torch.testing.assert_close(pcm, audio, rtol=0, atol=1e-4)


def test_tiny_model_learns_a_tone():
    """Trained for a few hundred steps on a 500 Hz tone (8 kHz), the model generates that tone."""
    torch.manual_seed(0)
    sr, freq, classes = 8000, 500.0, 64
    net = WaveNet(layers=6, cycle=6, residual_channels=16, gate_channels=32, skip_channels=32, classes=classes,
                  cond_channels=0, speakers=0)  # fmt: skip
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    t = torch.arange(256)
    for _ in range(300):
        phase = torch.rand(8, 1) * 2 * math.pi
        audio = mu_law_encode(0.5 * torch.sin(2 * math.pi * freq * t / sr + phase), classes)
        loss = torch.nn.functional.cross_entropy(net(audio), audio)
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    out = mu_law_decode(net.generate(None, 1088, temperature=0.0, batch=1)[0], classes)[64:]
    spectrum = torch.fft.rfft(out - out.mean()).abs()
    peak = spectrum.argmax().item() * sr / len(out)
    assert abs(peak - freq) <= 0.05 * freq, (peak, loss.item())
    assert out.abs().max() > 0.25  # a tone, not silence


@pytest.mark.parametrize(
    "kw, temperature", [({}, 0.9), (dict(speakers=0), 0.0), (dict(cond_channels=0, speakers=0), 0.9)]
)
def test_generate_kernel_matches_incremental_path(interpreter, kw, temperature):
    """The one-program-per-stream Triton kernel (interpreter) draws the PyTorch path's samples from the same
    uniforms."""
    from speechkernels.wavenet.triton_vocoder import wavenet_generate

    net = small_model(**kw)
    B, n = 3, 21
    g = torch.Generator().manual_seed(9)
    cond = torch.randn(B, 5, 8, generator=g) if net.cond_channels else None
    speaker = torch.tensor([1, 0, 2]) if net.speakers else None
    u = torch.rand(n, B, generator=g, dtype=torch.float64).float()
    ref, _ = incremental_path(net, cond, n, temperature, None, speaker, batch=B, uniforms=u)
    with torch.no_grad():
        spk = net.speaker_embed(speaker) if net.speakers else None
        out = wavenet_generate(vocoder_weights(net), VocoderInputs(cond, spk, u, temperature))
    assert torch.equal(out, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [0.0, 1.0, 1e-40])  # 1e-40: 1 / temperature is no float32
@pytest.mark.parametrize("kernel", ["triton", "cluster", "cluster bf16", "cluster C=4"])
def test_gpu_generate_kernel_matches_incremental_path(gpu, temperature, kernel):
    from speechkernels.wavenet.cluster_vocoder import wavenet_generate_cluster
    from speechkernels.wavenet.generation import cluster_kernel_available
    from speechkernels.wavenet.triton_vocoder import wavenet_generate

    net = small_model(residual_channels=64, gate_channels=128, skip_channels=256, classes=256).to(gpu)
    B, n = 4, 200
    cond = torch.randn(B, 5, 50, device=gpu)
    speaker = torch.tensor([0, 1, 2, 1], device=gpu)
    u = torch.rand(n, B, device=gpu)
    if kernel.startswith("cluster") and not cluster_kernel_available(net):
        pytest.skip("cuda-core or a GPU of compute capability 9.0 missing")
    with torch.no_grad():
        g = net.speaker_embed(speaker)
        if kernel == "triton":
            out = wavenet_generate(vocoder_weights(net), VocoderInputs(cond, g, u, temperature))
        else:
            wd = torch.bfloat16 if "bf16" in kernel else torch.float32
            C = 4 if "C=4" in kernel else 8
            out = wavenet_generate_cluster(vocoder_weights(net), VocoderInputs(cond, g, u, temperature), wd, C)
            if wd == torch.bfloat16:  # the same model with its matrices rounded as the kernel reads them
                for name, prm in net.named_parameters():
                    if prm.dim() == 2 and not name.startswith(("embed", "speaker", "w_cond", "w_speaker")):
                        prm.copy_(prm.to(torch.bfloat16).float())
        logits = net(out, cond, speaker)  # teacher-forced on the kernel's own samples
    # each step against the PyTorch logits and the same uniform (a different sum order may move a sample across
    # a CDF boundary only when u lies within ~1e-6 of it; a wrong step would not feed back here)
    if temperature == 0:
        expected = logits.argmax(dim=1)
    else:
        cdf = torch.softmax(logits.double() / temperature, dim=1).cumsum(dim=1)  # [B, C, n]
        ut = (u.T.double() * cdf[:, -1])[:, None, :]
        expected = (cdf < ut).sum(dim=1).clamp(max=net.classes - 1)
    assert (out == expected).float().mean() > 0.99


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> torch.device:
    """Each test once on the CPU and once on the GPU (tests marked gpu)."""
    return torch.device(request.param)


@pytest.fixture(params=["interpreter", pytest.param("cuda", marks=pytest.mark.gpu)])
def kernel_path(request) -> tuple[torch.device, str]:
    """(device, generate()'s kernel) of the generation kernels: the Triton kernel on the CPU under
    TRITON_INTERPRET=1 (skipped otherwise), and "auto" on the GPU (the cluster kernel where it runs)."""
    if request.param == "interpreter":
        return request.getfixturevalue("interpreter"), "triton"
    return torch.device("cuda"), "auto"


@pytest.mark.parametrize("design", ["auto", "torch"])
def test_serial_chain_auto_design(device, design):
    """design="auto" (the default) runs the fastest design here: the PyTorch loop on the CPU (also under the
    interpreter), on a GPU the cluster design up to 16 streams where cuda-core and the GPU allow it, else the
    stream design; the same bits as that design named."""
    from speechkernels.wavenet.cuda_runtime import clusters_available
    from speechkernels.wavenet.proxy import auto_design

    w, x0 = chain_case(6, 32, 3, "tanh", seed=12)
    w, x0 = w.to(device), x0.to(device)
    if device.type == "cpu":
        expected = "torch"
    else:
        expected = "cluster" if clusters_available() else "stream"
    assert auto_design(w, x0) == expected
    if device.type == "cuda":  # beyond 16 streams the stream design
        assert auto_design(w, torch.zeros(17, 32, device=device)) == "stream"
    out = serial_chain(w, x0, 3) if design == "auto" else serial_chain(w, x0, 3, design="auto")
    assert torch.equal(out, serial_chain(w, x0, 3, design=expected))
    assert_chain_close(out, serial_chain_reference(w.cpu(), x0.cpu(), n_samples=3))
    for bad in ("fastest", "Auto", None, 3):
        with pytest.raises(ValueError, match=r"design must be one of 'auto', 'torch', 'stream'"):
            serial_chain(w, x0, 3, design=bad)


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


def test_generate_reuses_packed_weights(kernel_path, monkeypatch):
    """Repeated generate() calls pack the weights once; after an in-place update the kernel packs them again and
    draws what the PyTorch path draws from the updated model."""
    from speechkernels.wavenet import weights as weights_module

    device, kernel = kernel_path
    packs = []
    pack = weights_module.pack_vocoder_weights
    monkeypatch.setattr(weights_module, "pack_vocoder_weights", lambda model: packs.append(1) or pack(model))
    wide = dict(residual_channels=64, gate_channels=128, skip_channels=256, classes=256)
    net = small_model(**(wide if device.type == "cuda" else {})).to(device)
    cond, spk = torch.randn(2, 5, 6, device=device), torch.tensor([2, 0], device=device)

    def run(k):
        return net.generate(cond, 12, 0.9, torch.Generator(device).manual_seed(4), spk, kernel=k)

    a = run(kernel)
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


# ---- many streams: the batched cluster kernel and the serving loop


def expected_classes(logits: torch.Tensor, u: torch.Tensor, temperature: float) -> torch.Tensor:
    """The class the PyTorch path draws at each step from teacher-forced logits [B, classes, n] and the uniforms
    u [n, B] (inverse CDF of the float64 softmax; the first maximum at temperature 0)."""
    if temperature == 0:
        return logits.argmax(dim=1)
    cdf = torch.softmax(logits.double() / temperature, dim=1).cumsum(dim=1)
    ut = (u.T.double().to(logits.device) * cdf[:, -1])[:, None, :]
    return (cdf < ut).sum(dim=1).clamp(max=logits.shape[1] - 1)


def served(server: WaveNetServer, joins: dict[int, list[tuple]]) -> dict[int, torch.Tensor]:
    """Runs ``server`` to the end, submitting joins[k] (lists of submit arguments) before step k; each request's
    samples, by id."""
    out: dict[int, list[torch.Tensor]] = {}
    step = 0
    while True:
        for args in joins.get(step, []):
            out[server.submit(*args)] = []
        if not server.active and not server.pending:
            break
        for rid, chunk in server.step().items():
            out[rid].append(chunk)
        step += 1
    return {rid: torch.cat(c) for rid, c in out.items()}


def chunked_uniforms(seed: int, n: int, chunk: int) -> torch.Tensor:
    """A request's uniforms as the server draws them: chunk by chunk from its own generator."""
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.rand(min(chunk, n - k), generator=g) for k in range(0, n, chunk)])


@pytest.mark.parametrize("max_streams", [None, 2])
@pytest.mark.parametrize("kernel", ["torch", "triton"])
def test_server_matches_incremental_path(max_streams, kernel, request):
    """Requests joining at different chunks, of different lengths, each with its own generator: each gets exactly
    the samples of the PyTorch path run alone on its uniforms (the PyTorch path, and the Triton kernel under the
    interpreter); with max_streams=2 the third request waits."""
    if kernel == "triton":
        request.getfixturevalue("interpreter")
    net = small_model()
    lens, spk, seeds, chunk = [37, 21, 45], [2, 0, 1], [10, 11, 12], 7
    conds = [torch.randn(5, math.ceil(n / 4) + k) for k, n in enumerate(lens)]
    server = WaveNetServer(net, chunk=chunk, max_streams=max_streams, kernel=kernel)
    server.warmup()
    reqs = [(lens[k], conds[k], spk[k] if k != 2 else torch.tensor(spk[k]), torch.Generator().manual_seed(seeds[k]))
            for k in range(3)]  # fmt: skip
    joins = {0: [reqs[0]], 1: [reqs[1]], 2: [reqs[2]]}
    if max_streams == 2:
        joins = {0: reqs}
    out = served(server, joins)
    assert list(out) == [0, 1, 2]
    for k, rid in enumerate(out):
        u = chunked_uniforms(seeds[k], lens[k], chunk)
        ref, _ = incremental_path(net, conds[k][None], lens[k], 1.0, None, torch.tensor([spk[k]]), uniforms=u[:, None])
        assert torch.equal(out[rid], ref[0]), k
    assert server.active == [] and server.pending == [] and server.step() == {}


@pytest.mark.parametrize("kernel", ["torch", "triton"])
def test_server_warmup_leaves_the_server_as_it_was(kernel, request):
    """warmup() runs a scratch chunk through a scratch server: the server's requests, ids, samples and the global
    generator's state are those of a server that was never warmed up."""
    if kernel == "triton":
        request.getfixturevalue("interpreter")
    net = small_model()
    outs = []
    for warm in (False, True):
        torch.manual_seed(5)
        server = WaveNetServer(net, chunk=6, kernel=kernel)
        if warm:
            server.warmup(3)
            assert server.active == [] and server.pending == []
        rid = server.submit(14, torch.randn(5, 4), 1)  # no generator of its own: the global one's numbers
        outs.append((rid, torch.cat([chunks[rid] for chunks in server]), torch.rand(3)))
    assert outs[1][0] == outs[0][0] == 0
    assert torch.equal(outs[1][1], outs[0][1]) and torch.equal(outs[1][2], outs[0][2])


def test_server_waits_for_room():
    net = small_model(cond_channels=0, speakers=0)
    server = WaveNetServer(net, chunk=4, max_streams=2)
    ids = [server.submit(n) for n in (8, 4, 4)]
    assert server.pending == ids
    first = server.step()
    assert sorted(first) == ids[:2] and server.pending == [ids[2]]
    second = server.step()  # request 1 left after its one chunk: request 2 joined
    assert sorted(second) == [ids[0], ids[2]] and server.pending == []
    assert [c.shape[0] for c in first.values()] == [4, 4]


def test_generate_stream_chunks():
    """generate_stream: [B, chunk] pieces whose concatenation is the PyTorch path's run on the uniforms the server
    drew (chunk by chunk, request after request, from the one generator)."""
    net = small_model(speakers=0)
    B, n, chunk = 3, 26, 8
    cond = torch.randn(B, 5, 7)
    parts = list(net.generate_stream(cond, n, chunk=chunk, generator=torch.Generator().manual_seed(3)))
    assert [p.shape for p in parts] == [(B, 8), (B, 8), (B, 8), (B, 2)]
    g = torch.Generator().manual_seed(3)
    u = torch.cat([torch.stack([torch.rand(min(chunk, n - k), generator=g) for _ in range(B)], 1)
                   for k in range(0, n, chunk)])  # fmt: skip
    ref, _ = incremental_path(net, cond, n, 1.0, None, None, uniforms=u)
    assert torch.equal(torch.cat(parts, 1), ref)
    for kw, match in [(dict(chunk=0), "chunk"), (dict(kernel="cuda"), "kernel must be"), (dict(batch=2), "batch")]:
        with pytest.raises(ValueError, match=match):  # when called, before any chunk is asked for
            net.generate_stream(cond, n, **kw)


def test_server_bad_arguments():
    net = small_model()
    for kw, match in [
        (dict(chunk=0), "chunk"),
        (dict(kernel="cuda"), "kernel must be"),
        (dict(max_streams=0), "max_streams"),
        (dict(temperature=-1.0), "temperature"),
        (dict(weights_dtype=torch.bfloat16), "needs kernel='cluster'"),
        (dict(kernel="triton", weights_dtype=torch.bfloat16), "needs kernel='cluster'"),
        (dict(weights_dtype=torch.float16), "weights_dtype"),
        (dict(kernel="cluster"), "kernel='cluster' needs"),  # a CPU model
    ]:
        with pytest.raises(ValueError, match=match):
            WaveNetServer(net, **kw)
    server = WaveNetServer(net)
    with pytest.raises(ValueError, match="max_streams"):
        server.warmup(0)
    cond = torch.randn(5, 10)
    for args, err, match in [
        ((0, cond, 1), ValueError, "n_samples"),
        ((41, cond, 1), ValueError, "do not cover n_samples=41"),
        ((8, torch.randn(1, 5, 10), 1), ValueError, r"cond must be \[cond_channels, frames\]"),
        ((8, torch.randn(4, 10), 1), ValueError, "cond must be"),
        ((8, None, 1), ValueError, "cond must be"),
        ((8, cond, None), ValueError, "speaker is required"),
        ((8, cond, 3), ValueError, "speaker"),
        ((8, cond, torch.tensor([0, 1])), ValueError, "one id"),
        ((8, cond, 1.0), TypeError, "speaker must be an int"),
        ((8, cond, 1, "seed"), ValueError, "generator"),
    ]:
        with pytest.raises(err, match=match):
            server.submit(*args)
    assert server.pending == []


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [0.0, 1.0, 1e-40])
@pytest.mark.parametrize("per_cluster, weights_dtype", [(1, "float32"), (3, "float32"), (8, "float32"),
                                                        (9, "float32"), (5, "bfloat16")])  # fmt: skip
def test_gpu_batched_cluster_kernel_matches_incremental_path(gpu, temperature, per_cluster, weights_dtype):
    """The batched cluster kernel (streams per cluster not dividing B, blocks of 8 and a remainder), each step
    against the PyTorch logits on the kernel's own samples and the same uniform; bfloat16 against the model with
    its matrices rounded as the kernel reads them."""
    from speechkernels.wavenet.cluster_vocoder import wavenet_generate_cluster_batch
    from speechkernels.wavenet.generation import cluster_kernel_available

    net = small_model(residual_channels=64, gate_channels=128, skip_channels=256, classes=256).to(gpu)
    if not cluster_kernel_available(net):
        pytest.skip("cuda-core or a GPU of compute capability 9.0 missing")
    B, n = 11, 150
    cond = torch.randn(B, 5, 40, device=gpu)
    speaker = torch.randint(0, 3, (B,), device=gpu)
    u = torch.rand(n, B, device=gpu)
    wd = getattr(torch, weights_dtype)
    with torch.no_grad():
        g = net.speaker_embed(speaker)
        out = wavenet_generate_cluster_batch(vocoder_weights(net), VocoderInputs(cond, g, u, temperature), wd,
                                             streams_per_cluster=per_cluster)  # fmt: skip
        if wd == torch.bfloat16:
            for name, prm in net.named_parameters():
                if prm.dim() == 2 and not name.startswith(("embed", "speaker", "w_cond", "w_speaker")):
                    prm.copy_(prm.to(torch.bfloat16).float())
        logits = net(out, cond, speaker)
    assert (out == expected_classes(logits, u, temperature)).float().mean() > 0.99


@pytest.mark.gpu
def test_gpu_batched_cluster_kernel_in_chunks(gpu):
    """Two launches that carry the last classes, the queues (rows in another order) and the conditioning's phase
    make exactly the samples of one launch."""
    from speechkernels.wavenet.cluster_vocoder import batch_queue, wavenet_generate_cluster_batch
    from speechkernels.wavenet.generation import cluster_kernel_available

    net = small_model(residual_channels=64, gate_channels=128, skip_channels=256, classes=256).to(gpu)
    if not cluster_kernel_available(net):
        pytest.skip("cuda-core or a GPU of compute capability 9.0 missing")
    w = vocoder_weights(net)
    B, n, cut = 6, 90, 50  # the cut inside a frame (hop 4): phase 2
    cond = torch.randn(B, 5, 30, device=gpu)
    u = torch.rand(n, B, device=gpu)
    with torch.no_grad():
        g = net.speaker_embed(torch.randint(0, 3, (B,), device=gpu))
        whole = wavenet_generate_cluster_batch(w, VocoderInputs(cond, g, u, 1.0), streams_per_cluster=4)
        rows = torch.tensor([5, 0, 7, 2, 3, 6], dtype=torch.int32, device=gpu)
        q = batch_queue(w, 8, 8, gpu)
        a = wavenet_generate_cluster_batch(w, VocoderInputs(cond, g, u[:cut], 1.0), streams_per_cluster=4,
                                           cont=Continuation(queue=q, rows=rows))  # fmt: skip
        phase = torch.full((B,), cut % 4, dtype=torch.int32, device=gpu)
        b = wavenet_generate_cluster_batch(
            w, VocoderInputs(cond[:, :, cut // 4 :], g, u[cut:], 1.0), streams_per_cluster=4,
            cont=Continuation(a[:, -1].contiguous(), phase, q, rows, cut),
        )  # fmt: skip
    assert torch.equal(torch.cat([a, b], 1), whole)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["cluster", "triton"])
def test_gpu_server_matches_incremental_path(gpu, kernel):
    """The serving loop on the batched cluster kernel and on the Triton kernel: requests joining at different
    chunks, each step of each request against the PyTorch logits on its own samples and its own uniforms."""
    from speechkernels.wavenet.generation import cluster_kernel_available

    net = small_model(residual_channels=64, gate_channels=128, skip_channels=256, classes=256).to(gpu)
    if kernel == "cluster" and not cluster_kernel_available(net):
        pytest.skip("cuda-core or a GPU of compute capability 9.0 missing")
    lens, chunk = [130, 64, 200, 97, 150, 33, 120, 80, 110, 60, 90, 70], 32
    conds = [torch.randn(5, 60, device=gpu) for _ in lens]
    reqs = [(n, conds[k], k % 3, torch.Generator().manual_seed(k)) for k, n in enumerate(lens)]
    server = WaveNetServer(net, chunk=chunk, kernel=kernel)
    server.warmup(12)
    out = served(server, {0: reqs[:5], 1: reqs[5:9], 3: reqs[9:]})
    for k, rid in enumerate(out):
        assert out[rid].shape == (lens[k],)
        with torch.no_grad():
            logits = net(out[rid][None], conds[k][None], torch.tensor([k % 3], device=gpu))
        u = chunked_uniforms(k, lens[k], chunk)[:, None]
        assert (out[rid][None] == expected_classes(logits, u, 1.0)).float().mean() > 0.99, k


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["cluster", "triton"])
def test_gpu_server_first_chunk_after_warmup_compiles_nothing(gpu, kernel, monkeypatch):
    """After warmup(), the first chunk of 20 requests compiles no kernel: neither a cluster kernel variant (NVRTC)
    nor a Triton specialisation (the chunk's continuation of the queues included)."""
    from triton import knobs

    from speechkernels.wavenet import cuda_runtime
    from speechkernels.wavenet.generation import cluster_kernel_available

    net = small_model(residual_channels=64, gate_channels=128, skip_channels=256, classes=256).to(gpu)
    if kernel == "cluster" and not cluster_kernel_available(net):
        pytest.skip("cuda-core or a GPU of compute capability 9.0 missing")
    server = WaveNetServer(net, chunk=32, kernel=kernel)
    server.warmup(20)
    nvrtc, triton_compiles = [], []
    real = cuda_runtime.compile_kernel
    monkeypatch.setattr(cuda_runtime, "compile_kernel", lambda *a, **k: nvrtc.append(a[0]) or real(*a, **k))
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **k: triton_compiles.append(k.get("repr")))
    for k in range(20):
        server.submit(50, torch.randn(5, 20, device=gpu), k % 3)
    chunks = server.step()
    torch.cuda.synchronize()
    assert len(chunks) == 20 and nvrtc == [] and triton_compiles == []


@pytest.mark.gpu
def test_gpu_generate_many_streams_auto_is_cluster(gpu):
    """Past the streams the GPU holds one cluster each, "auto" takes the batched cluster kernel: the same samples
    as kernel="cluster", and the PyTorch path's classes on the kernel's own samples."""
    from speechkernels.wavenet.generation import cluster_kernel_available

    net = small_model(residual_channels=64, gate_channels=128, skip_channels=256, classes=256).to(gpu)
    if not cluster_kernel_available(net):
        pytest.skip("cuda-core or a GPU of compute capability 9.0 missing")
    B, n = 40, 60
    cond, spk = torch.randn(B, 5, 20, device=gpu), torch.randint(0, 3, (B,), device=gpu)
    runs = {k: net.generate(cond, n, generator=torch.Generator(gpu).manual_seed(1), speaker=spk, kernel=k)
            for k in ("auto", "cluster")}  # fmt: skip
    assert torch.equal(runs["auto"], runs["cluster"])
    u = torch.rand(n, B, generator=torch.Generator(gpu).manual_seed(1), device=gpu)
    with torch.no_grad():
        logits = net(runs["auto"], cond, spk)
    assert (runs["auto"] == expected_classes(logits, u, 1.0)).float().mean() > 0.99
