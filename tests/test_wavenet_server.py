"""Many WaveNet streams at once: the batched cluster kernel and the serving loop (WaveNetServer, generate_stream)."""

from __future__ import annotations

import math

import pytest
import torch
from wavenet_helpers import incremental_path, small_model

from speechkernels.wavenet import (
    WaveNetServer,
    cuda_runtime,
)
from speechkernels.wavenet.weights import Continuation, VocoderInputs, vocoder_weights


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


# the serving loop's kernels on each path: the PyTorch path, the Triton kernel under the interpreter; on the GPU
# "auto" (the batched cluster kernel where it runs) and the Triton kernel
SERVER_KERNELS = {"torch": ("torch",), "triton": ("triton",), "cuda": ("auto", "triton")}


@pytest.mark.parametrize("max_streams", [None, 2])
def test_server_matches_incremental_path(path, max_streams):
    """Requests joining at different chunks, of different lengths, each with its own generator, served by each of
    the path's kernels. On the CPU each gets exactly the samples of the PyTorch path run alone on its uniforms; on
    the GPU each step of each request is checked against the PyTorch logits on its own samples and the same
    uniform (a sum in another order moves a sample across a boundary of the CDF only when the uniform lies within
    ~1e-6 of it). With max_streams=2 requests wait for room."""
    cpu = path.device.type == "cpu"
    dev = path.device
    if cpu:
        net, lens, chunk = small_model(), [37, 21, 45], 7
    else:
        net = small_model(residual_channels=64, gate_channels=128, skip_channels=256, classes=256).to(dev)
        lens, chunk = [130, 64, 200, 97, 150, 33, 120, 80, 110, 60, 90, 70], 32
    conds = [torch.randn(5, math.ceil(n / 4) + k, device=dev) for k, n in enumerate(lens)]
    spk = [k % 3 for k in range(len(lens))]
    third = len(lens) // 3
    for kernel in SERVER_KERNELS[path.name]:
        path.reset()
        server = WaveNetServer(net, chunk=chunk, max_streams=max_streams, kernel=kernel)
        server.warmup()
        reqs = [
            (n, conds[k], spk[k] if k != 2 else torch.tensor(spk[k]), torch.Generator().manual_seed(10 + k))
            for k, n in enumerate(lens)
        ]
        out = served(server, {0: reqs[:third], 1: reqs[third : 2 * third], 3: reqs[2 * third :]})
        assert list(out) == list(range(len(lens)))
        path.check_ran(kernel != "torch")
        for k, rid in enumerate(out):
            u = chunked_uniforms(10 + k, lens[k], chunk)[:, None]
            if cpu:  # the same sums in the same order
                ref, _ = incremental_path(net, conds[k][None], lens[k], 1.0, None, torch.tensor([spk[k]]), uniforms=u)
                assert torch.equal(out[rid], ref[0]), (kernel, k)
            else:
                assert out[rid].shape == (lens[k],)
                with torch.no_grad():
                    logits = net(out[rid][None], conds[k][None], torch.tensor([spk[k]], device=dev))
                assert (out[rid][None] == expected_classes(logits, u, 1.0)).float().mean() > 0.99, (kernel, k)
        assert server.active == [] and server.pending == [] and server.step() == {}


def test_server_warmup_leaves_the_server_as_it_was(path):
    """warmup() runs a scratch chunk through a scratch server: the server's requests, ids, samples and the global
    generator's state are those of a server that was never warmed up."""
    net = small_model().to(path.device)
    outs = []
    for warm in (False, True):
        torch.manual_seed(5)
        server = WaveNetServer(net, chunk=6, kernel=path.wavenet_kernel)
        if warm:
            server.warmup(3)
            assert server.active == [] and server.pending == []
        rid = server.submit(14, torch.randn(5, 4, device=path.device), 1)  # no generator: the global one's numbers
        outs.append((rid, torch.cat([chunks[rid] for chunks in server]), torch.rand(3, device=path.device)))
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
    u = torch.cat(
        [torch.stack([torch.rand(min(chunk, n - k), generator=g) for _ in range(B)], 1) for k in range(0, n, chunk)]
    )
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
@pytest.mark.parametrize(
    "per_cluster, weights_dtype", [(1, "float32"), (3, "float32"), (8, "float32"), (9, "float32"), (5, "bfloat16")]
)
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
        out = wavenet_generate_cluster_batch(
            vocoder_weights(net), VocoderInputs(cond, g, u, temperature), wd, streams_per_cluster=per_cluster
        )
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
        a = wavenet_generate_cluster_batch(
            w, VocoderInputs(cond, g, u[:cut], 1.0), streams_per_cluster=4, cont=Continuation(queue=q, rows=rows)
        )
        phase = torch.full((B,), cut % 4, dtype=torch.int32, device=gpu)
        b = wavenet_generate_cluster_batch(
            w,
            VocoderInputs(cond[:, :, cut // 4 :], g, u[cut:], 1.0),
            streams_per_cluster=4,
            cont=Continuation(a[:, -1].contiguous(), phase, q, rows, cut),
        )
    assert torch.equal(torch.cat([a, b], 1), whole)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["cluster", "triton"])
def test_gpu_server_first_chunk_after_warmup_compiles_nothing(gpu, kernel, monkeypatch):
    """After warmup(), the first chunk of 20 requests compiles no kernel: neither a cluster kernel variant (NVRTC)
    nor a Triton specialisation (the chunk's continuation of the queues included)."""
    from triton import knobs

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
    runs = {
        k: net.generate(cond, n, generator=torch.Generator(gpu).manual_seed(1), speaker=spk, kernel=k)
        for k in ("auto", "cluster")
    }
    assert torch.equal(runs["auto"], runs["cluster"])
    u = torch.rand(n, B, generator=torch.Generator(gpu).manual_seed(1), device=gpu)
    with torch.no_grad():
        logits = net(runs["auto"], cond, spk)
    assert (runs["auto"] == expected_classes(logits, u, 1.0)).float().mean() > 0.99
