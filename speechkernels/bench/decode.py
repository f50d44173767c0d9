"""Greedy decoding: ``TransducerDecoder.greedy`` (one kernel launch per batch; float32 LSTM networks from
``GREEDY_STEP_ROWS`` utterances up: the beam search's steps at one hypothesis, the row's "path") and
``ctc_greedy_decode`` against the plain PyTorch loop and, given --peers, other decoders in the same run.

Transducer rows MODEL-NxSECONDS: "tdt" (a Parakeet-TDT-0.6B-sized model: encoder 1024, LSTM 640 x 2, joint 640,
relu, V = 1024 + blank, durations 0..4, 80 ms frames), "rnnt" (its RNN-T twin) and "zipformer" (encoder 512,
stateless decoder 512 with context 2, joiner 512, tanh, V = 500, 40 ms frames, one symbol per frame). Random
weights (seed 0), encoder outputs N(0, 1), the blank's output bias raised until about one frame in three emits a
token (set once per model on a calibration batch). CTC rows ctc-NxTxC: log-probabilities of N(0, 3) logits.

Times: the median of CUDA-event-timed calls after warm-up, taking turns between the decoders. "torch loop": this
library's PyTorch path on the same device (a batched label-looping loop, a host synchronisation per step: it
cannot be captured in a CUDA graph). Exactness: every utterance's tokens, frames and durations against the float64
PyTorch path (weights in float64); where they differ, ours is replayed in float64 and the first decision that is
not float64's argmax is reported with its margin (the float64 gap between the two choices, relative to the largest
logit's magnitude; TDT blanks' durations are not in a hypothesis, so where ours parts from float64 inside a run of
blanks, the least margin over the decisions where it may have parted): a near-tie when below 2^-7 (bfloat16) or
2^-18 (float32); and against the PyTorch path in the networks' own dtype (in bfloat16 the rounding of the
activations changes some decisions by more than a near-tie: the PyTorch path in bfloat16 makes the same ones).

--peers FILE: a Python file defining ``transducer_peers(decoder, dtype) -> {name: (run, lists)}``: ``run(x,
lengths)`` decodes (timed), ``lists(result)`` gives [(tokens, frames, durations or None)] per utterance (compared
with ours); absent or failing peers are reported and skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import os
import statistics
import traceback

import torch

import speechkernels as sk
from speechkernels._transducer.activations import activation_fn
from speechkernels.decode import api as decode_api
from speechkernels.decode.networks import predict, start_state

from .common import (
    add_common_arguments,
    comma_choices,
    emit,
    environment,
    interleaved_times_ms,
    plot_series,
    plot_title,
    positive_int,
    print_legend,
    print_title,
    progress,
    resolve_device,
    split_rows,
    time_graphed_call,
    write_json,
)

MODELS = ("tdt", "rnnt", "zipformer")
FRAME_MS = {"tdt": 80, "rnnt": 80, "zipformer": 40}
ROWS = [
    "tdt-1x8",
    "tdt-8x8",
    "tdt-128x15",
    "rnnt-1x8",
    "rnnt-8x8",
    "rnnt-128x15",
    "zipformer-128x15",
    "ctc-128x188x1025",
    "ctc-64x1500x5000",
]
CPU_DEMO = ["tdt-2x2", "zipformer-2x2", "ctc-4x100x129"]
CPU_SECONDS = 10  # the CPU demo with the default options, start-up not included
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
NEAR_TIE = {torch.float32: 2.0**-18, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
LEGEND = [
    ("row", "model-NxSECONDS (transducers) or ctc-NxTxC"),
    ("ours ms", "median ms of one decode of the batch (validate=False; CTC: the whole ctc_greedy_decode call)"),
    ("loop ms", "the same, the PyTorch path (transducers) or argmax + unique_consecutive per utterance (CTC)"),
    (
        "graph ms",
        "ours captured in a CUDA graph and replayed (GPU): the device's time, no host part (a capture takes the "
        "one-launch kernel also where the eager call takes the steps)",
    ),
    ("peers", "the fastest --peers decoder's ms and name"),
    ("x", "the fastest other decoder's ms / ours"),
    ("RTFx", "seconds of audio decoded per second (transducers; decoder only)"),
    ("TB/s", "CTC: the scores' bytes / ours ms, and / graph ms"),
    (
        "exact",
        "utterances equal to the float64 PyTorch path / all (differences explained by a near-tie); = the "
        "PyTorch path in the same dtype",
    ),
]
CELLS = "-: not run (no peer given, or not defined for the row)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(
        p,
        parse_rows,
        "model-NxSECONDS with model one of tdt, rnnt, zipformer (e.g. tdt-8x8), or ctc-NxTxC (e.g. ctc-128x188x1025)",
        "our speed-up over the fastest other decoder per row",
    )
    p.add_argument(
        "--dtypes",
        type=comma_choices(tuple(DTYPES)),
        default=None,
        help="the networks' dtypes for the transducer rows (default: float32,bfloat16 on the GPU, float32 on the CPU)",
    )
    p.add_argument("--reps", type=positive_int, default=20, help="timed calls of each decoder (default 20)")
    p.add_argument(
        "--beam",
        action="store_true",
        help="beam search instead of greedy decoding (rows of the same forms; see speechkernels.bench.decode_beam)",
    )
    p.add_argument(
        "--beams",
        type=positive_int_list,
        default=None,
        help="with --beam: the beam sizes of every row (default: 1,4,8 for transducers and 10,32 for CTC on the GPU)",
    )
    p.add_argument(
        "--peers",
        metavar="FILE",
        type=peers_file,
        default=None,
        help="a Python file defining transducer_peers(decoder, dtype) (see above)",
    )


def positive_int_list(text: str) -> list[int]:
    """--beams: comma-separated positive integers."""
    return [positive_int(v) for v in split_rows(text)]


def peers_file(text: str) -> str:
    """--peers: an existing file."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a file")
    return text


def parse_rows(text: str) -> list[str]:
    """--rows: comma-separated MODEL-NxSECONDS or ctc-NxTxC, or argparse's ArgumentTypeError naming the form."""
    rows = []
    for item in split_rows(text):
        model, _, shape = item.partition("-")
        want = 3 if model == "ctc" else 2
        try:
            dims = [int(v) for v in shape.split("x")]
        except ValueError:
            dims = []
        if (model not in MODELS and model != "ctc") or len(dims) != want or min(dims, default=0) < 1:
            raise argparse.ArgumentTypeError(
                f"{item!r} is not MODEL-NxSECONDS (MODEL one of {', '.join(MODELS)}, "
                "e.g. tdt-8x8) or ctc-NxTxC (e.g. ctc-128x188x1025)"
            )
        rows.append(item)
    return list(dict.fromkeys(rows))


def build_model(name: str, device, dtype) -> tuple[sk.TransducerDecoder, int]:
    """(decoder, encoder width) of a random model of the given kind."""
    torch.manual_seed(0)
    if name == "zipformer":
        V, E, P = 500, 512, 512
        dec = sk.TransducerDecoder(
            torch.nn.Embedding(V, P),
            torch.nn.Linear(E, P),
            torch.nn.Linear(P, P),
            torch.nn.Linear(P, V),
            conv=torch.nn.Conv1d(P, P, 2, groups=P // 4, bias=False),
            context_size=2,
            activation="tanh",
            blank=0,
            max_symbols_per_frame=1,
        )
    else:
        V, E, H = 1025, 1024, 640
        durations = [0, 1, 2, 3, 4] if name == "tdt" else None
        out = torch.nn.Linear(H, V + (5 if durations else 0))
        dec = sk.TransducerDecoder(
            torch.nn.Embedding(V, H),
            torch.nn.Linear(E, H),
            torch.nn.Linear(H, H),
            out,
            lstm=torch.nn.LSTM(H, H, 2),
            blank=V - 1,
            durations=durations,
        )
    return dec.to(device=device, dtype=dtype).eval(), E


def calibrate(dec: sk.TransducerDecoder, x: torch.Tensor, rate: float = 1 / 3, iters: int = 12) -> float:
    """Raises the blank's output bias (bisection) until about ``rate`` tokens per frame are emitted; the rate."""
    bias = dec.out.bias
    base = bias[dec.blank].item()

    def emitted(shift: float) -> float:
        with torch.no_grad():
            bias[dec.blank] = base + shift
        hyp, _ = dec.greedy(x)
        return hyp.lengths.sum().item() / x.shape[0] / x.shape[1]

    lo, hi = -16.0, 16.0
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if emitted(mid) > rate else (lo, mid)
    return emitted((lo + hi) / 2)


def utterances(hyp) -> list[tuple[list[int], list[int], list[int] | None]]:
    out = []
    for n in range(hyp.tokens.shape[0]):
        k = int(hyp.lengths[n])
        durs = None if hyp.durations is None else hyp.durations[n, :k].tolist()
        out.append((hyp.tokens[n, :k].tolist(), hyp.frames[n, :k].tolist(), durs))
    return out


@torch.no_grad()
def first_divergence(dec: sk.TransducerDecoder, x: torch.Tensor, length: int, ours) -> dict | None:
    """Replays our hypothesis of one utterance (x [T, E]) in float64: the first decision that is not float64's
    argmax, with its relative margin, or None if every decision is (then ours is the float64 path itself)."""
    w = dec.weights().to(torch.float64)
    act = activation_fn(w.activation)
    V, blank = dec.vocab_size, dec.blank
    tokens, frames, durs = ours
    st = start_state(w, 1, blank, x.device)
    pred_state, out = st.predictor, st.output
    enc = torch.nn.functional.linear(x.double(), w.enc_w, w.enc_b)
    t, j, at_frame = 0, 0, 0
    run = []  # float64's blank decisions since the last label (frame, duration logits, scale): ours's unrecorded
    while t < length:
        logits = torch.nn.functional.linear(
            act(enc[t] + torch.nn.functional.linear(out[0], w.pred_w, w.pred_b)), w.out_w, w.out_b
        )
        ours_emits = j < len(tokens) and frames[j] == t
        choice = tokens[j] if ours_emits else blank
        scale = logits[:V].abs().max().item() or 1.0
        best = int(logits[:V].argmax())
        if best != choice:
            margin = (logits[best] - logits[choice]).item() / scale
            limit = frames[j] if j < len(tokens) else length  # where ours's run of blanks ends
            skips = [] if ours_emits else skip_margins(run, dec.durations, t + 1, limit)
            what = "label" if not skips else "label, or an earlier blank's duration"
            return dict(token_index=j, frame=t, what=what, margin=min([margin, *skips]))
        if dec.durations:
            D = logits[V:]
            d_best = int(D.argmax())
            if ours_emits and dec.durations[d_best] != durs[j]:
                d_ours = dec.durations.index(durs[j])
                return dict(token_index=j, frame=t, what="duration", margin=(D[d_best] - D[d_ours]).item() / scale)
            step = dec.durations[d_best]
        else:
            step = 0 if ours_emits else 1
        if not ours_emits:
            if dec.durations:
                run.append((t, D, scale))
            t, at_frame = t + max(step, 1), 0
            if j < len(tokens) and frames[j] < t:
                # float64's blank jumped past our label: ours took another duration here or at an earlier blank
                alternatives = skip_margins(run, dec.durations, 0, frames[j])
                margin = min(alternatives) if alternatives else None
                return dict(token_index=j, frame=t, what="blank duration", margin=margin)
            continue
        run = []
        out, pred_state = predict(w, torch.tensor([choice], device=x.device), pred_state)
        j += 1
        at_frame = at_frame + 1 if step == 0 else 0
        if at_frame >= dec.max_symbols_per_frame:
            step, at_frame = 1, 0
        t += step
    return None if j == len(tokens) else dict(token_index=j, frame=t, what="length", margin=None)


def skip_margins(run: list, durations, lo: int, hi: int) -> list[float]:
    """Blanks' durations are not in a hypothesis: where ours and float64 part within a run of blanks, ours took
    another duration at one of float64's blank frames (ours visited them all up to the one where it parted). For
    each frame of ``run`` ((frame, duration logits, scale) of float64's decisions), the relative margin of
    float64's duration over the best one landing elsewhere in [lo, hi]; the least of them bounds the
    margin of the decision where ours parted from below."""
    out = []
    for t, D, scale in run:
        land = t + max(durations[int(D.argmax())], 1)
        alt = [q for q, d in enumerate(durations) if t + max(d, 1) != land and lo <= t + max(d, 1) <= hi]
        if alt:
            out.append((D.max() - D[alt].max()).item() / scale)
    return out


@contextlib.contextmanager
def pytorch_path():
    """TransducerDecoder.greedy on its PyTorch path inside (both kernel routes switched off)."""
    saved = decode_api.transducer_kernels, decode_api.transducer_beam_kernels
    decode_api.transducer_kernels = decode_api.transducer_beam_kernels = None
    try:
        yield
    finally:
        decode_api.transducer_kernels, decode_api.transducer_beam_kernels = saved


def exactness(dec, x, lengths, hyp, dtype) -> dict:
    """Ours against the float64 PyTorch path (the same weights in float64) and against the PyTorch path in the
    networks' own dtype, utterance by utterance; differences from float64 replayed (first_divergence), each marked
    with whether the PyTorch path in the networks' dtype decodes the utterance as ours does (then the difference
    comes from that dtype's arithmetic, not from the kernel)."""
    with pytorch_path():
        ref, _ = _double(dec).greedy(x.double(), lengths)
        same_dtype, _ = dec.greedy(x, lengths)
    ours, want, torch_path = utterances(hyp), utterances(ref), utterances(same_dtype)
    differing = []
    for n, (a, b) in enumerate(zip(ours, want, strict=True)):
        if a != b:
            d = first_divergence(dec, x[n], int(lengths[n]), a) or {"margin": None, "what": "none found"}
            d["utterance"] = n
            d["torch_path_decodes_as_ours"] = torch_path[n] == a
            differing.append(d)
    tol = NEAR_TIE[dtype]
    ties = sum(1 for d in differing if d["margin"] is not None and 0 <= d["margin"] <= tol)
    return {
        "utterances": len(ours),
        "equal": len(ours) - len(differing),
        "near_ties": ties,
        "tie_tolerance": tol,
        "equal_torch_path_same_dtype": sum(a == b for a, b in zip(ours, torch_path, strict=True)),
        "differing": differing,
    }


def _double(dec: sk.TransducerDecoder) -> sk.TransducerDecoder:
    return copy.deepcopy(dec).double()


def load_peers(path: str | None, module: bool = False):
    """The --peers file's transducer_peers (or, with ``module``, the file's module), or None without one."""
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location("decode_peers", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod if module else mod.transducer_peers


def transducer_row(row: str, device, dtype):
    """(model, N, T, seconds, decoder, encoder outputs [N, T, E], a calibration batch) of a transducer row."""
    model, _, shape = row.partition("-")
    N, seconds = (int(v) for v in shape.split("x"))
    T = round(seconds * 1000 / FRAME_MS[model])
    dec, E = build_model(model, device, dtype)
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(N, T, E, generator=g, device=device).to(dtype)
    cal = torch.randn(max(N, 8), T, E, generator=g, device=device).to(dtype)
    return model, N, T, seconds, dec, x, cal


def measure_transducer(row: str, dtype, device, args, peers_fn) -> dict:
    model, N, T, seconds, dec, x, cal = transducer_row(row, device, dtype)
    out = dict(row=row, model=model, N=N, T=T, seconds=seconds, dtype=str(dtype).removeprefix("torch."))
    out["emit_rate"] = calibrate(dec, cal)
    lengths = torch.full((N,), T, device=device)
    hyp, _ = dec.greedy(x, lengths, validate=False)
    out["tokens"] = int(hyp.lengths.sum())
    fns = {"ours": lambda: dec.greedy(x, lengths, validate=False)}

    def loop():
        with pytorch_path():
            return dec.greedy(x, lengths)

    fns["torch loop"] = loop
    peer_lists = {}
    if peers_fn is not None:
        errors = {}
        try:
            peers = peers_fn(dec, dtype)
        except Exception:  # noqa: BLE001 - a failing peer is reported, not fatal
            peers, errors["peers"] = {}, traceback.format_exc(limit=3)
        for name, (run, lists) in peers.items():
            try:
                peer_lists[name] = lists(run(x, lengths))
                fns[name] = lambda run=run: run(x, lengths)
            except Exception:  # noqa: BLE001
                errors[name] = traceback.format_exc(limit=3)
        if errors:
            out["peer_errors"] = errors
    reps = args.reps if device.type == "cuda" else 2
    times = interleaved_times_ms(fns, device, warmup=2, reps=reps)
    out["ms"] = {k: statistics.median(v) for k, v in times.items()}
    if device.type == "cuda":
        out["graph_ms"] = time_graphed_call(fns["ours"], device, reps)["ms"]
    out["rtfx"] = N * seconds / (out["ms"]["ours"] / 1000)
    # the eager call's route (a capture always takes the one-launch kernel: the graph column times that)
    out["path"] = "steps" if decode_api._greedy_takes_steps(dec.weights(), N) else "one launch"
    out["exact"] = exactness(dec, x, lengths, hyp, dtype)
    ours = utterances(hyp)
    out["peers_equal"] = {
        name: {
            "tokens_frames_durations": sum(a == b for a, b in zip(ours, theirs, strict=True)),
            "tokens_frames": sum(a[:2] == b[:2] for a, b in zip(ours, theirs, strict=True)),
        }
        for name, theirs in peer_lists.items()
    }
    return out


def measure_ctc(row: str, device, args) -> dict:
    N, T, C = (int(v) for v in row.partition("-")[2].split("x"))
    g = torch.Generator(device=device).manual_seed(2)
    x = (3 * torch.randn(N, T, C, generator=g, device=device)).log_softmax(-1)
    lengths = torch.full((N,), T, device=device)

    def peer():
        best = x.argmax(-1)
        return [torch.unique_consecutive(best[n]) for n in range(N)]

    fns = {"ours": lambda: sk.ctc_greedy_decode(x, lengths, validate=False), "torch loop": peer}
    times = interleaved_times_ms(fns, device, warmup=3, reps=args.reps if device.type == "cuda" else 2)
    ms = {k: statistics.median(v) for k, v in times.items()}
    nbytes = x.numel() * x.element_size()
    out = dict(row=row, model="ctc", N=N, T=T, C=C, dtype="float32", ms=ms, tbps=nbytes / (ms["ours"] / 1000) / 1e12)
    if device.type == "cuda":
        out["graph_ms"] = time_graphed_call(fns["ours"], device, args.reps)["ms"]
        out["tbps_graph"] = nbytes / (out["graph_ms"] / 1000) / 1e12
    return out


def plan(args, title: str, rows: list[str], cpu_rows: list[str], gpu_dtypes: list[str]):
    """(device, environment, [(row, dtype or None for CTC)]) of a run, its title printed."""
    device = resolve_device(args)
    env = environment(device)
    gpu = device.type == "cuda"
    dtypes = [DTYPES[d] for d in (args.dtypes or (gpu_dtypes if gpu else ["float32"]))]
    print_title(title, env, args.reps)
    rows = args.rows or (rows if gpu else cpu_rows)
    return device, env, [(r, d) for r in rows for d in (dtypes if not r.startswith("ctc") else [None])]


def run(args) -> int:
    if args.beam:
        from . import decode_beam

        return decode_beam.run(args)
    device, env, work = plan(
        args, "Greedy decoding (TransducerDecoder.greedy, ctc_greedy_decode)", ROWS, CPU_DEMO, ["float32", "bfloat16"]
    )
    print_legend(LEGEND, CELLS)
    peers_fn = load_peers(args.peers)
    print(
        f"{'row':>18} {'dtype':>8} | {'ours ms':>8} {'graph ms':>8} {'loop ms':>8} {'peers':>18} {'x':>6} | "
        f"{'RTFx':>8} {'TB/s':>11} | exact (ties); same dtype",
        flush=True,
    )
    out = []
    for r, d in progress(work, "decode", lambda w: f"{w[0]} {w[1] or ''}"):
        out.append(measure_ctc(r, device, args) if d is None else measure_transducer(r, d, device, args, peers_fn))
        _print_row(out[-1])
    if args.json:
        write_json(args.json, {"benchmark": "decode", "environment": env, "rows": out})
    if args.plot:
        labels = [f"{r['row']}\n{r['dtype']}" for r in out]
        series = {"fastest other decoder ms / ours": [_speedup(r) for r in out]}
        plot_series(
            args.plot,
            labels,
            series,
            plot_title("Greedy decoding against the PyTorch loop and peers", env, device),
            "speed-up",
            "row, dtype",
        )
    return 0


def _speedup(row: dict) -> float | None:
    others = [v for k, v in row["ms"].items() if k != "ours"]
    return min(others) / row["ms"]["ours"] if others else None


def _print_row(row: dict) -> None:
    ms = row["ms"]
    peers = {k: v for k, v in ms.items() if k not in ("ours", "torch loop")}
    best = min(peers, key=peers.get) if peers else None
    peer = f"{peers[best]:7.2f} {best[:10]:>10}" if best else f"{'-':>18}"
    x = _speedup(row)
    rtfx = f"{row['rtfx']:8.0f}" if "rtfx" in row else f"{'-':>8}"
    tbps = f"{row['tbps']:5.2f}" if "tbps" in row else "-"
    tbps = f"{tbps} / {row['tbps_graph']:4.2f}" if "tbps_graph" in row else tbps
    graph = f"{row['graph_ms']:8.3f}" if "graph_ms" in row else f"{'-':>8}"
    e = row.get("exact")
    exact = f"{e['equal']}/{e['utterances']} ({e['near_ties']}); {e['equal_torch_path_same_dtype']}" if e else "-"
    emit(
        f"{row['row']:>18} {row['dtype']:>8} | {ms['ours']:8.3f} {graph} {ms['torch loop']:8.2f} {peer} "
        f"{x if x is None else format(x, '6.1f')} | {rtfx} {tbps:>11} | {exact}"
    )
