"""The scripts in examples/ run and do what they say: the training steps lower the loss on their fixed batch, the
generation writes a WAV file of the samples asked for. On the CPU as a user runs them (the PyTorch path: Triton's
interpreter is switched off) and on the GPU."""

from __future__ import annotations

import importlib.util
import pathlib
import wave

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(autouse=True)
def as_a_user_runs_them(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["ctc_training_step", "rnnt_training_step"])
def test_training_examples_lower_the_loss(name, device, capsys):
    first, last = load(name).main(["--steps", "8", "--device", device])
    assert last < 0.8 * first
    assert f"{device}: loss" in capsys.readouterr().out


@pytest.mark.parametrize("device", DEVICES)
def test_tdt_example_transcribes(device, capsys):
    """A TDT model trained with TDTJointLoss and decoded by TransducerDecoder transcribes held-out utterances."""
    ter = load("tdt_transcribe").main(["--device", device])
    assert ter < 0.05
    assert f"{device}: token error rate" in capsys.readouterr().out


@pytest.mark.parametrize("device", DEVICES)
def test_beam_search_example_quality(device, capsys):
    """Beam search with a 3-gram LM of the training transcripts transcribes better than greedy decoding, and
    boosting a rare phrase raises its recall, the other utterances' error rate moving by at most half a point
    (about a dozen of their 2,700 tokens: the noise of 256 utterances)."""
    report = load("beam_lm_transcribe").main(["--device", device])
    assert report[(0.0, "beam 4 + LM")]["ter"] < report[(0.0, "greedy")]["ter"] - 0.005
    plain, boosted = report[(0.3, "beam 4 + LM")], report[(0.3, "beam 4 + LM + boosting")]
    assert boosted["recall"] > plain["recall"] + 0.05
    assert boosted["ter_rest"] <= plain["ter_rest"] + 0.005
    assert f"{device}: in distribution" in capsys.readouterr().out


@pytest.mark.parametrize("device", DEVICES)
def test_wavenet_example_writes_the_samples(device, tmp_path):
    out = tmp_path / "out.wav"
    load("wavenet_generate").main(["--samples", "300", "--layers", "2", "--out", str(out), "--device", device])
    with wave.open(str(out)) as f:
        assert (f.getnframes(), f.getframerate(), f.getsampwidth(), f.getnchannels()) == (300, 16000, 2, 1)
        pcm = f.readframes(300)
    assert len(set(pcm[::2])) > 10  # sampled audio, not silence or one value


@pytest.mark.parametrize("device", DEVICES)
def test_wavenet_serving_example(device, capsys):
    """Requests arriving while others generate: each gets all its samples, the report names the rates."""
    out = load("wavenet_serve").main(
        ["--requests", "5", "--samples", "64", "--chunk", "24", "--layers", "2", "--device", device]
    )
    assert sorted(out) == list(range(5))
    assert [c.shape[0] for c in out.values()] == [16, 32, 48, 64, 16]
    assert all(c.min() >= 0 and c.max() < 256 for c in out.values())
    assert f"{device}: 5 requests, 176 samples" in capsys.readouterr().out


@pytest.mark.parametrize(
    "name",
    [
        "ctc_training_step",
        "rnnt_training_step",
        "tdt_transcribe",
        "beam_lm_transcribe",
        "wavenet_generate",
        "wavenet_serve",
    ],
)
def test_examples_refuse_bad_arguments_with_usage(name, capsys, monkeypatch):
    """A size of 0 and an unknown device end in argparse's usage error (status 2), as does --device cuda on a
    machine without CUDA: no traceback."""
    size = "--samples" if "wavenet" in name else "--steps"
    bad = [[size, "0"], ["--device", "tpu"]]
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    bad.append(["--device", "cuda"])
    for argv in bad:
        with pytest.raises(SystemExit) as e:
            load(name).main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "usage:" in err and "error: argument" in err or "CUDA is not available" in err, err
