"""WaveNet's serial-chain proxy (speechkernels.wavenet.proxy): its designs against the float64 loop, the
automatic design choice, its argument checks."""

from __future__ import annotations

import itertools
import math
import wave

import numpy as np
import pytest
import torch

from speechkernels.wavenet import (
    cuda_runtime,
    mu_law_decode,
    mu_law_encode,
    save_wav,
    serial_chain,
    serial_chain_reference,
)


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


@pytest.mark.parametrize("design", ["auto", "torch"])
def test_serial_chain_auto_design(path, design):
    """design="auto" (the default) runs the fastest design here: the PyTorch loop on the CPU (also under the
    interpreter), on a GPU the cluster design up to 16 streams where cuda-core and the GPU allow it, else the
    stream design; the same bits as that design named."""
    from speechkernels.wavenet.cuda_runtime import clusters_available
    from speechkernels.wavenet.proxy import auto_design

    device = path.device
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
