"""The WaveNet model: mu-law helpers, incremental generation against the teacher-forced forward pass, the
constructor's and forward's argument checks, WAV output, and a tiny model that learns a tone."""

from __future__ import annotations

import math
import wave

import numpy as np
import pytest
import torch
from wavenet_helpers import incremental_path, small_model

from speechkernels.wavenet import (
    WaveNet,
    mu_law_decode,
    mu_law_encode,
    save_wav,
)


def test_mu_law_round_trip():
    x = torch.linspace(-1, 1, 1001)
    q = mu_law_encode(x)
    assert q.dtype == torch.int64 and q.min() == 0 and q.max() == 255
    assert mu_law_encode(torch.tensor([0.0])).item() == 128
    # the quantisation step of mu-law near x is about ln(256) (1/256 + |x|) / 128 * ... : bounded by 0.03
    err = (mu_law_decode(q) - x).abs()
    assert err.max() < 0.03 and err[490:511].max() < 1e-3
    assert torch.equal(mu_law_encode(mu_law_decode(torch.arange(256))), torch.arange(256))


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
    net = WaveNet(
        layers=6,
        cycle=6,
        residual_channels=16,
        gate_channels=32,
        skip_channels=32,
        classes=classes,
        cond_channels=0,
        speakers=0,
    )
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
