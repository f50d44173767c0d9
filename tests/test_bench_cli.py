"""The benchmark command line (python -m speechkernels.bench) on the CPU, at the smallest rows: argument errors
end in a usage line and status 2 before anything runs, the tables carry a legend and no NaN, and --json / --plot
write their files and say so."""

from __future__ import annotations

import argparse
import json
import re

import pytest
import torch

from speechkernels.bench import align, common, ctc, decode, joint, rnnt, tdt, wavenet
from speechkernels.bench.__main__ import CAPABILITIES, all_output, main

# one tiny row per benchmark, in each one's --rows form
TINY = {
    "ctc": "20x2x5x6",
    "rnnt": "10x3x5x2",
    "joint": "1x4x2x5",
    "tdt": "tdt:1x5x2x5",
    "align": "1x12x5x3",
    "decode": "tdt-1x1,ctc-2x20x9",
    "wavenet": "proxy:float32:1",
}


@pytest.fixture(autouse=True)
def _as_a_user_runs_it(monkeypatch):
    # the PyTorch paths, as on a CPU without the interpreter (which would run the kernels, far slower)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.fixture
def nothing_runs(monkeypatch):
    """Every benchmark's run() fails the test if called: the errors must come before anything runs."""

    def refuse(args):
        raise AssertionError("a benchmark ran despite an argument error")

    for module, _ in CAPABILITIES.values():
        monkeypatch.setattr(module, "run", refuse)


def exits_with_usage(argv: list[str], capsys) -> str:
    """Runs the CLI, expects argparse's exit (status 2, a usage line) and returns its stderr."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m speechkernels.bench"), err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["ctc", "--rows", "150x1"], "TxNxC or TxNxCxS"),
        (["ctc", "--rows", "150xax28"], "TxNxC or TxNxCxS"),
        (["ctc", "--rows", "150x1x28,"], "empty row"),
        (["ctc", "--rows", "150x1x1"], "C=1"),
        (["ctc", "--reps", "0"], "not a positive integer"),
        (["ctc", "--device", "gpu"], "invalid choice"),
        (["rnnt", "--rows", "150x40x28"], "TxUxVxN"),
        (["joint", "--dtypes", "float64"], "float32, bfloat16"),
        (["joint", "--impls", "fused,warp"], "fused, sk, torchaudio"),
        (["tdt", "--rows", "ctc:1x5x2x5"], "tdt, multiblank"),
        (["tdt", "--rows", "1x9-5x2x5"], "lo <= hi"),
        (["tdt", "--joint", "--rows", "multiblank:1x5x2x5"], "NxTxUxV rows only"),
        (["tdt", "--joint", "--rows", "1x5x2x5+9"], "no +D"),
        (["tdt", "--rows", "multiblank:1x5x2x5+9"], "a TDT row's"),
        (["tdt", "--rows", "1x5x2x5+0"], "[KIND:]NxTxUxV[+D]"),
        (["align", "--rows", "1:12:5"], "NxTxCxS"),
        (["align", "--rows", "1x4x5x3"], "T >= 2S - 1"),
        (["decode", "--rows", "lstm-1x8"], "MODEL-NxSECONDS"),
        (["decode", "--rows", "ctc-1x8"], "ctc-NxTxC"),
        (["decode", "--dtypes", "float64"], "float32, bfloat16, float16"),
        (["decode", "--peers", "/nonexistent/peers.py"], "is not a file"),
        (["decode", "--beam", "--beams", "4,0"], "--beams"),
        (["wavenet", "--only", "foo"], "proxy, vocoder"),
        (["wavenet", "--designs", "stream,foo"], "stream, barrier, cluster, partials, pipeline"),
        (["wavenet", "--rows", "proxy:float64:1"], "proxy:WEIGHTS:B"),
        (["wavenet", "--only", "vocoder", "--rows", "proxy:float32:1"], "leave no row to run"),
        (["wavenet", "--capacity", "1,0"], "positive integers"),
        (["wavenet", "--capacity", "1", "--rows", "vocoder:20:1"], "do not go together"),
        (["wavenet", "--capacity", "1", "--kernel", "cuda"], "invalid choice"),
        (["wavenet", "--capacity", "1", "--chunk", "0"], "positive"),
        (["all", "--rows", "ctc=150x1"], "ctc: '150x1' is not TxNxC"),
        (["all", "--rows", "nope=1x2"], "BENCHMARK=ROWS"),
        (["all", "--json", "/nonexistent-folder/run"], "does not exist"),
        (["ctc", "--json", "/nonexistent-folder/ctc.json"], "does not exist"),
        ([], "required: BENCHMARK"),
    ],
)
def test_bad_arguments_exit_with_usage(argv, message, capsys, nothing_runs):
    err = exits_with_usage(argv, capsys)
    assert message in err.splitlines()[-1], err


@pytest.mark.parametrize("what", [*CAPABILITIES, "all"])
def test_device_cuda_without_cuda(what, capsys, monkeypatch, nothing_runs):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = exits_with_usage([what, "--device", "cuda"], capsys)
    assert "CUDA is not available" in err


@pytest.mark.parametrize("what", [*CAPABILITIES, "all"])
def test_plot_without_matplotlib(what, capsys, monkeypatch, nothing_runs):
    monkeypatch.setattr(common, "matplotlib_available", lambda: False)
    err = exits_with_usage([what, "--plot", "out.png"], capsys)
    assert "--plot needs matplotlib: pip install matplotlib (or pip install -e '.[bench]')" in err


def test_rows_parsers():
    """Each benchmark's --rows form, and the error argparse reports for a malformed row."""
    assert ctc.parse_rows("150x1x28, 1200x16x32x600") == [(150, 1, 28, 150), (1200, 16, 32, 600)]
    assert ctc.parse_row("150x1x28") == (150, 1, 28, 150)  # the one-row helper, kept for scripts
    assert rnnt.parse_rows("150x40x28x16") == [(150, 40, 28, 16)]
    assert joint.parse_rows("32x400x128x1025") == [(32, 400, 128, 1025)]
    assert tdt.parse_rows("2x20x5x28,multiblank:16x250-400x40-100x8193") == [
        ("tdt", 2, (20, 20), (5, 5), 28, len(tdt.DURATIONS)),
        ("multiblank", 16, (250, 400), (40, 100), 8193, len(tdt.BIG_BLANKS)),
    ]
    assert tdt.parse_rows("tdt:4x1200x200x513+9") == [("tdt", 4, (1200, 1200), (200, 200), 513, 9)]
    assert align.parse_rows("8x300x32x40,2:2000:32:300") == [(8, 300, 32, 40), (2, 2000, 32, 300)]
    assert decode.parse_rows("tdt-8x8, ctc-64x1500x5000") == ["tdt-8x8", "ctc-64x1500x5000"]
    assert wavenet.parse_rows("proxy:bfloat16:8,vocoder:20:1") == [("proxy", "bfloat16", 8), ("vocoder", 20, 1)]
    for parse, text in [(ctc.parse_rows, "150x0x28"), (rnnt.parse_rows, ""), (wavenet.parse_rows, "vocoder:x:1")]:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def test_all_output_names(tmp_path):
    assert all_output(str(tmp_path), "ctc", ".json") == str(tmp_path / "ctc.json")
    assert all_output("out/", "rnnt", ".png") == "out/rnnt.png"
    assert all_output("runs/h100", "ctc", ".json") == "runs/h100_ctc.json"
    assert all_output("runs/h100.json", "ctc", ".json") == "runs/h100_ctc.json"


def test_ctc_json_and_plot(tmp_path, capsys, monkeypatch):
    """One small row: the table with its legend, a progress line on stderr, both files written and announced."""
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out_json, out_png = tmp_path / "ctc.json", tmp_path / "ctc.png"
    argv = ["ctc", "--rows", TINY["ctc"], "--reps", "1", "--json", str(out_json), "--plot", str(out_png)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "running on the CPU" in out.splitlines()[0]
    assert "x best" in out and "cells: -: no value" in out
    assert f"wrote {out_json}" in out and f"wrote {out_png}" in out
    assert "[1/1] ctc 20x2x5x6" in err
    payload = json.loads(out_json.read_text())
    assert payload["benchmark"] == "ctc" and payload["environment"]["device"]
    row = payload["rows"][0]
    assert (row["T"], row["N"], row["C"], row["S"]) == (20, 2, 5, 6)
    assert row["sk_logits"]["ms"] > 0 and row["speedup_logits"] > 0 and "speedup_logprobs" in row
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_wavenet_capacity(tmp_path, capsys, monkeypatch):
    """--capacity: the default path's rate for each stream count, the serving loop's latency to the first chunk,
    the largest counts above 16 and 24 kHz, the rows in the JSON (kind "capacity", the path taken) and a PNG."""
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out_json, out_png = tmp_path / "cap.json", tmp_path / "cap.png"
    argv = [
        "wavenet",
        "--capacity",
        "1,2",
        "--layers",
        "2",
        "--samples",
        "16",
        "--reps",
        "1",
        "--chunk",
        "8",
        "--json",
        str(out_json),
        "--plot",
        str(out_png),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "most streams all above 16 kHz:" in out and "most streams all above 24 kHz:" in out
    assert "1st chunk ms" in out
    result = json.loads(out_json.read_text())
    rows = result["rows"]
    assert set(result["summary"]) == {"most_streams_above_16khz", "most_streams_above_24khz"}
    assert all(r["first_chunk_s"] > 0 and r["chunk"] == 8 for r in rows)
    assert [(r["kind"], r["B"], r["path"], r["layers"]) for r in rows] == [
        ("capacity", 1, "torch", 2),
        ("capacity", 2, "torch", 2),
    ]
    assert all(r["samples_per_s_per_stream"] > 0 for r in rows)
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tables_print_no_nan(capsys):
    """Cells without a value print "-": errors skipped (--no-error) or undefined (no sample can be aligned: labels
    up to 20 in 20 frames of 5 classes), no peer."""
    for argv in (
        ["ctc", "--device", "cpu", "--rows", TINY["ctc"], "--reps", "1", "--no-error"],
        ["ctc", "--device", "cpu", "--rows", "20x2x5x20", "--reps", "1"],
        ["rnnt", "--device", "cpu", "--rows", TINY["rnnt"], "--reps", "1", "--no-error"],
        ["joint", "--device", "cpu", "--rows", TINY["joint"], "--reps", "1", "--no-error", "--dtypes", "float32"],
        ["tdt", "--device", "cpu", "--rows", TINY["tdt"], "--reps", "1"],
        ["decode", "--device", "cpu", "--rows", TINY["decode"], "--reps", "1"],
    ):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert not re.search(r"nan", out, flags=re.I), out
        assert " - " in out or "      -" in out


def test_all_writes_one_file_per_benchmark(tmp_path, capsys):
    """all --json DIR (and --plot DIR where matplotlib is there): one file per benchmark, each announced."""
    argv = ["all", "--device", "cpu", "--reps", "1", "--json", str(tmp_path)]
    argv += [a for what, rows in TINY.items() for a in ("--rows", f"{what}={rows}")]
    plots = common.matplotlib_available()
    if plots:
        argv += ["--plot", f"{tmp_path}/"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("# note: running on the CPU") == 1
    assert not re.search(r"nan", out, flags=re.I), out
    for what in CAPABILITIES:
        path = tmp_path / f"{what}.json"
        payload = json.loads(path.read_text())
        assert payload["benchmark"] == what and payload["rows"], what
        assert f"wrote {path}" in out
        if plots:
            assert (tmp_path / f"{what}.png").stat().st_size > 1000
            assert f"wrote {tmp_path / what}.png" in out


def test_decode_peers_file(tmp_path, capsys):
    """--peers: a file's decoders are timed in the same run and compared with ours utterance by utterance (here
    the PyTorch path itself, which must agree on every utterance); a peer that fails is reported, not fatal."""
    peers = tmp_path / "peers.py"
    peers.write_text(
        "from speechkernels.bench.decode import utterances\n"
        "def transducer_peers(decoder, dtype):\n"
        "    def broken(x, lengths):\n"
        "        raise RuntimeError('no such decoder')\n"
        "    return {'same': (lambda x, lengths: decoder.greedy(x, lengths)[0], utterances),\n"
        "            'broken': (broken, utterances)}\n"
    )
    out_json = tmp_path / "d.json"
    argv = [
        "decode",
        "--device",
        "cpu",
        "--rows",
        "rnnt-2x1",
        "--reps",
        "1",
        "--peers",
        str(peers),
        "--json",
        str(out_json),
    ]
    assert main(argv) == 0
    row = json.loads(out_json.read_text())["rows"][0]
    assert row["peers_equal"]["same"] == {"tokens_frames_durations": 2, "tokens_frames": 2}
    assert set(row["ms"]) == {"ours", "torch loop", "same"}
    assert "no such decoder" in row["peer_errors"]["broken"]
    assert row["exact"]["equal"] == 2 and row["emit_rate"] > 0


def test_decode_beam_with_peers(tmp_path):
    """decode --beam: every row at each beam without fusion, with the LM and with the LM and phrases; the peers of
    a --peers file timed and compared (here our own searches, which must agree on every utterance, and one with an
    utterance changed: reported with float64's search on our side); a failing peer reported, not fatal."""
    peers = tmp_path / "peers.py"
    peers.write_text(
        "import speechkernels as sk\n"
        "def ctc_beam_peers(beam_size, lm_path, lm_weight):\n"
        "    if lm_path is not None:\n"
        "        return {}\n"
        "    def best(hyp):\n"
        "        return [hyp.tokens[n, 0, : hyp.lengths[n, 0]].tolist() for n in range(hyp.tokens.shape[0])]\n"
        "    return {'same': (lambda x, lengths: sk.ctc_beam_search(x, lengths, beam_size), best)}\n"
        "def transducer_beam_peers(decoder, dtype, beam_size, lm_path, lm_weight, phrases, boosting_weight):\n"
        "    def broken(x, lengths):\n"
        "        raise RuntimeError('no such decoder')\n"
        "    def lists(hyp):\n"
        "        L = hyp.lengths[:, 0].tolist()\n"
        "        t, f = hyp.tokens[:, 0].tolist(), hyp.frames[:, 0].tolist()\n"
        "        return [(t[n][: L[n]], f[n][: L[n]]) for n in range(len(L))]\n"
        "    def off(hyp):\n"
        "        got = lists(hyp)\n"
        "        got[1] = (got[1][0] + [1], got[1][1] + [0])\n"
        "        return got\n"
        "    if lm_path is not None:\n"
        "        return {}\n"
        "    run = lambda x, lengths: decoder.beam_search(x, lengths, beam_size)\n"
        "    return {'same': (run, lists), 'broken': (broken, lists), 'off': (run, off)}\n"
    )
    out_json = tmp_path / "b.json"
    argv = ["decode", "--beam", "--device", "cpu", "--rows", "rnnt-2x1,ctc-2x12x9", "--beams", "2", "--reps", "1"]
    assert main([*argv, "--peers", str(peers), "--json", str(out_json)]) == 0
    rows = json.loads(out_json.read_text())["rows"]
    assert [(r["row"], r["beam"], r["fusion"]) for r in rows] == [
        (row, 2, fusion) for row in ("rnnt-2x1", "ctc-2x12x9") for fusion in ("none", "lm", "lm+boost")
    ]
    rnnt, ctc = rows[0], rows[3]
    assert rnnt["peers_same_best"]["same"] == {"tokens": 2, "tokens_frames": 2}
    assert rnnt["peers_same_best"]["off"] == {"tokens": 1, "tokens_frames": 1}
    (off,) = rnnt["peers_differing"]["off"]
    assert (off["utterance"], off["ours_is_float64s"], off["peer_is_float64s"]) == (1, True, False)
    assert off["float64_gap_ours"] == 0 and off["float64_gap_peer"] is None  # (a hypothesis the search never made)
    assert off["flip_to_ours"] is None and off["flip_to_peer"] is None  # (ours is float64's; the peer's never made)
    assert "no such decoder" in rnnt["peer_errors"]["broken"]
    assert ctc["peers_same_best"] == {"same": 2} and set(ctc["ms"]) == {"ours", "same", "greedy"}
    assert all(r["ms"]["ours"] > 0 for r in rows)


def test_decode_beam_flips():
    """decode --beam's _flips: float64's malsd search with single decisions taken the other way, the closest
    first: the first reversal that changes the best hypothesis is reported for that hypothesis, with its margin;
    a hypothesis no single reversal makes gets None; the search with every decision kept is the PyTorch path's."""
    from speechkernels.bench import decode_beam
    from speechkernels.decode.transducer_beam import transducer_beam_search_reference

    _, N, T, _, dec, x, cal = decode.transducer_row("tdt-1x2", torch.device("cpu"), torch.float32)
    decode.calibrate(dec, cal)
    d64, x64, lengths = decode._double(dec), x.double(), torch.full((1,), T)
    kw = dict(beam_size=3, validate=False)
    w, K = d64._current_weights(), 3
    margins = []

    def search(decide):
        hyp = transducer_beam_search_reference(
            w, x64, lengths, K, d64.blank, d64.durations, d64.max_symbols_per_frame, decide=decide
        )
        return decode_beam._nbest_lists(hyp)[0][0]

    def record(step, flat, pick):
        v = flat[0].sort(descending=True).values
        if v[K] > float("-inf"):
            margins.append(((v[K - 1] - v[K]).item() / -v[K - 1].item(), step))
        return pick

    def flip_at(at):
        def decide(step, flat, pick):
            if step == at:
                pick = pick.clone()
                pick[0, K - 1] = flat[0].sort(descending=True, stable=True).indices[K]
            return pick

        return decide

    best = search(record)
    assert best == decode_beam._float64_lists(dec, x, lengths, kw)[0][0]
    tried = [(m, s, search(flip_at(s))) for m, s in sorted(margins)]
    changed = next(t for t in tried if t[2] != best)
    assert changed is not tried[0]  # (here the closest call's reversal changes nothing: the search goes on)
    never = ([1, 2, 3], [0, 0, 0])
    got = decode_beam._flips(d64, x64, lengths, kw, {"flipped": changed[2], "never": never}, len(margins))
    assert got["flipped"]["step"] == changed[1] and got["flipped"]["relative_margin"] == pytest.approx(changed[0])
    assert got["never"] is None


def test_decode_beam_differences_of_another_algorithm():
    """decode --beam's _peer_differences: a peer differing on more than ``most`` utterances (another algorithm) is
    counted, not searched in float64, and keeps the others' analysis."""
    from speechkernels.bench import decode_beam

    _, N, T, _, dec, x, cal = decode.transducer_row("rnnt-2x1", torch.device("cpu"), torch.float32)
    decode.calibrate(dec, cal)
    lengths, kw = torch.full((N,), T), dict(beam_size=2, validate=False)
    ours = [tuple(b[0]) for b in decode_beam._nbest_lists(dec.beam_search(x, lengths, **kw))]
    other = [(t + [1], f + [0]) for t, f in ours]
    got = decode_beam._peer_differences(dec, x, lengths, kw, ours, {"one": [ours[0], other[1]], "all": other}, 1)
    (one,) = got["peers_differing"]["one"]
    assert one["utterance"] == 1 and one["ours_is_float64s"] and not one["peer_is_float64s"]
    assert one["flip_to_peer"] is None
    assert got["peers_differing"]["all"] == [{"utterance": 0}, {"utterance": 1}]
    assert decode_beam._peer_differences(dec, x, lengths, kw, ours, {"same": ours}) == {}


def test_decode_beam_phrases():
    """decode --beam's phrases: as many as asked, 2 to 5 tokens of the classes, distinct, none inside another but
    as its prefix (a prefix may be a phrase); fewer where the classes cannot give so many."""
    from speechkernels.bench.decode_beam import draw_phrases

    got = draw_phrases(list(range(1, 30)), 300, torch.Generator().manual_seed(0))
    assert len(got) == 300 and len({tuple(p) for p in got}) == 300
    assert all(2 <= len(p) <= 5 and all(1 <= t < 30 for t in p) for p in got)
    inner = {tuple(q[i:j]) for q in got for i in range(1, len(q)) for j in range(i + 1, len(q) + 1)}
    assert not inner & {tuple(p) for p in got}
    assert any(tuple(q[: len(p)]) == tuple(p) for p in got for q in got if len(q) > len(p))
    assert len(draw_phrases([4], 10, torch.Generator().manual_seed(0))) == 1  # (one class: one inside the other)
