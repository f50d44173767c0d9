"""Beam search (``python -m speechkernels.bench decode --beam``): ``ctc_beam_search`` and
``TransducerDecoder.beam_search`` on the greedy benchmark's rows, without fusion, with a 4-gram token LM and with
the LM and 1,000 boosted phrases, against greedy decoding, the PyTorch path and, given --peers, other decoders.
The zipformer row (icefall's model) searches with icefall's algorithm (``algorithm="modified"``), the others with
NeMo's ``malsd_batch`` semantics.

The LM: ``write_arpa`` (order 4, discount 0.5) of 3,000 random sentences of 30 tokens drawn from a Zipf
distribution over the row's tokens (the blank left out; 300 sentences in the CPU demo), weight 0.5. The phrases:
1,000 of 2 to 5 tokens drawn from the same distribution, none inside another but as its prefix (``draw_phrases``),
a bonus of 1.0 per token. Beams: 1, 4 and 8 for
transducers, 10 and 32 for CTC (the CPU demo: 4 and 4). Times: the median of CUDA-event-timed calls after warm-up,
taking turns between the decoders (fewer calls for decoders slower than 0.1 s).

--peers FILE may define ``ctc_beam_peers(beam_size, lm_path, lm_weight) -> {name: (run, lists)}`` (CTC without
fusion, ``lm_path`` None, and with the LM: ``run(x, lengths)`` decodes [N, T, C] log-probabilities,
``lists(result)`` gives each utterance's best tokens) and
``transducer_beam_peers(decoder, dtype, beam_size, lm_path, lm_weight, phrases, boosting_weight) -> {name: (run,
lists)}`` (``lm_path`` and ``phrases`` None without fusion; ``lists`` gives (tokens, frames) per utterance), and
``transducer_greedy_peers(decoder, dtype, lm_path, lm_weight, phrases, boosting_weight)`` likewise for greedy
decoding with the same fusion, which the transducer rows with fusion also time (``greedy(lm=..., boosting=...)``).

The JSON rows also hold, for transducers, the utterances that differ from the PyTorch path (and whether float64's
search is ours or that path's) and from each peer (``peers_differing``: float64's search of the same weights, its
best and how far below it ours and the peer's rank, and which single decision of float64's search, taken the other
way, gives ours or the peer's: the decisions tried are the closest calls between the beam's last survivor and the
best of the rest, and a difference whose decision's margin is at float32's rounding of the scores is a near-tie).
"""

from __future__ import annotations

import statistics
import tempfile
import traceback
from types import SimpleNamespace

import torch

import speechkernels as sk
from speechkernels.decode import api as decode_api
from speechkernels.decode.ngram import write_arpa
from speechkernels.decode.transducer_beam import transducer_beam_search_reference

from .common import (
    emit,
    interleaved_times_ms,
    print_legend,
    progress,
    times_ms,
    write_json,
)
from .decode import _double, calibrate, first_divergence, load_peers, plan, transducer_row, utterances

ROWS = ["tdt-128x15", "rnnt-128x15", "zipformer-128x15", "tdt-8x8", "ctc-128x188x1025"]
CPU_DEMO = ["tdt-2x2", "ctc-2x50x65"]
BEAMS = {"transducer": (1, 4, 8), "ctc": (10, 32)}
CPU_BEAMS = {"transducer": (4,), "ctc": (4,)}
FUSIONS = ("none", "lm", "lm+boost")
LM_WEIGHT, BOOST_WEIGHT, PHRASES = 0.5, 1.0, 1000
LEGEND = [
    ("row", "model-NxSECONDS (transducers) or ctc-NxTxC, as the greedy benchmark's"),
    ("beam, fusion", "beam size; none, a 4-gram LM (lm) or the LM and 1,000 boosted phrases (lm+boost)"),
    ("ours ms", "median ms of one beam search of the batch (validate=False)"),
    ("x greedy", "ours / greedy decoding of the same batch (with fusion, also / greedy decoding fused alike)"),
    ("torch ms", "the PyTorch path of the same search on the same device (its kernels off)"),
    ("peers", "the fastest --peers decoder's ms and name, and its ms / ours"),
    (
        "same",
        "utterances whose N-best (tokens, frames, order) equal the PyTorch path's; transducers at beam 1: "
        "utterances equal to greedy decoding (tokens, frames, durations); and per peer, best hypotheses equal",
    ),  # fmt: skip
]
CELLS = "-: not run (no peer given, not defined for the row, or the row's path is the PyTorch path itself)"


def zipf_tokens(classes: list[int], count: int, generator: torch.Generator) -> list[int]:
    """``count`` tokens of ``classes`` drawn with probability proportional to 1 / rank."""
    w = 1.0 / torch.arange(1, len(classes) + 1, dtype=torch.float64)
    idx = torch.multinomial(w, count, replacement=True, generator=generator)
    return [classes[i] for i in idx.tolist()]


def draw_phrases(classes: list[int], count: int, generator: torch.Generator) -> list[list[int]]:
    """``count`` phrases (fewer if so many cannot be drawn) of 2 to 5 tokens (``zipf_tokens``), none occurring
    inside another but as its prefix: a token then completes at most the phrase whose prefix it extends, so NeMo's
    boosting tree (which pays only that phrase) and ``PhraseBooster`` (every phrase ending there) give the same
    bonuses."""
    phrases, seen, inner = [], set(), set()  # inner: the phrases' substrings that start after their first token
    for _ in range(100 * count):  # (fewer phrases where the classes run out)
        if len(phrases) == count:
            break
        k = int(torch.randint(2, 6, (1,), generator=generator))
        p = tuple(zipf_tokens(classes, k, generator))
        subs = {p[i:j] for i in range(1, k) for j in range(i + 1, k + 1)}
        if p in seen or p in inner or subs & seen:
            continue
        phrases.append(list(p))
        seen.add(p)
        inner |= subs
    return phrases


def fusion_models(V: int, blank: int, device, workdir: str) -> dict:
    """The benchmark's LM (its ARPA path and the NGramLM on ``device``) and phrases (and the PhraseBooster) over V
    classes, the blank left out."""
    g = torch.Generator().manual_seed(3)
    classes = [c for c in range(V) if c != blank]
    text = zipf_tokens(classes, (3000 if device.type == "cuda" else 300) * 30, g)
    path = f"{workdir}/lm4_{V}_{blank}.arpa"
    # over the tokens only where the blank is the last class (as NeMo's LMs are: the blank reads as <unk>)
    write_arpa([text[i : i + 30] for i in range(0, len(text), 30)], V - (blank == V - 1), path, order=4)
    return dict(
        lm_path=path,
        lm=sk.NGramLM.from_arpa(path, V).to(device),
        phrases=(phrases := draw_phrases(classes, PHRASES, g)),
        boosting=sk.PhraseBooster(phrases, V, BOOST_WEIGHT).to(device),
    )


def _times(fns: dict, device, reps: int, peers: dict | None = None, errors: dict | None = None) -> dict[str, float]:
    """Median ms per decoder, fewer calls for the slow ones (one untimed call first estimates each); a decoder
    named in ``peers`` that fails in its timed calls is left out, its error in ``errors``."""
    out = {}
    for name, fn in fns.items():
        try:
            est = times_ms(fn, device, warmup=0, reps=1)[0]
            n = max(2, min(reps, int(2000 / max(est, 1e-3)))) if device.type == "cuda" else 1
            out[name] = statistics.median(interleaved_times_ms({name: fn}, device, warmup=1, reps=n)[name])
        except Exception:
            if peers is None or name not in peers or errors is None:
                raise
            errors[name] = traceback.format_exc(limit=3)
    return out


def _without_kernels(module: str, fn):
    """fn's result with one kernel module of the decode API switched off (the PyTorch path)."""
    saved = getattr(decode_api, module)
    setattr(decode_api, module, None)
    try:
        return fn()
    finally:
        setattr(decode_api, module, saved)


def _nbest_lists(hyp) -> list[list[tuple]]:
    N, B = hyp.lengths.shape
    return [
        [(hyp.tokens[n, b, : hyp.lengths[n, b]].tolist(), hyp.frames[n, b, : hyp.lengths[n, b]].tolist())
         for b in range(B)]
        for n in range(N)
    ]  # fmt: skip


def _peers(r: dict, make, *args) -> dict:
    """The --peers file's decoders for a row (``make(*args)``), or none (the error recorded in the row)."""
    try:
        return make(*args)
    except Exception:  # noqa: BLE001 - a failing peer is reported, not fatal
        r.setdefault("peer_errors", {})["peers"] = traceback.format_exc(limit=3)
        return {}


def _run_peers(r: dict, peers: dict, x, lengths, fns: dict, best: dict) -> None:
    """Each peer's first result (its lists) into ``best`` and its call into ``fns``; a failing one recorded."""
    for name, (run, lists) in peers.items():
        try:
            best[name] = lists(run(x, lengths))
            fns[name] = lambda run=run: run(x, lengths)
        except Exception:  # noqa: BLE001
            r.setdefault("peer_errors", {})[name] = traceback.format_exc(limit=3)


def measure_ctc(row: str, device, args, peers_mod, workdir: str) -> list[dict]:
    N, T, C = (int(v) for v in row.partition("-")[2].split("x"))
    g = torch.Generator(device=device).manual_seed(2)
    x = (3 * torch.randn(N, T, C, generator=g, device=device)).log_softmax(-1)
    lengths = torch.full((N,), T, device=device)
    fusion = fusion_models(C, 0, device, workdir)
    greedy_ms = _times({"greedy": lambda: sk.ctc_greedy_decode(x, lengths, validate=False)}, device, args.reps)
    out = []
    for K in args.beams or (BEAMS if device.type == "cuda" else CPU_BEAMS)["ctc"]:
        for fu in FUSIONS:
            kw = dict(beam_size=K, nbest=min(K, 10), validate=False)
            if fu != "none":
                kw.update(lm=fusion["lm"], lm_weight=LM_WEIGHT)
            if fu == "lm+boost":
                kw["boosting"] = fusion["boosting"]
            fns = {"ours": lambda kw=kw: sk.ctc_beam_search(x, lengths, **kw)}
            r = dict(row=row, model="ctc", N=N, T=T, C=C, beam=K, fusion=fu, dtype="float32")
            ours = _nbest_lists(fns["ours"]())
            if device.type == "cuda" and decode_api.beam_kernels is not None:
                fns["torch path"] = lambda kw=kw: _without_kernels(
                    "beam_kernels", lambda: sk.ctc_beam_search(x, lengths, **kw)
                )
                ref = _nbest_lists(fns["torch path"]())
                r["same_as_torch_path"] = sum(a == b for a, b in zip(ours, ref, strict=True))
            peer_best = {}
            if fu != "lm+boost" and peers_mod is not None and hasattr(peers_mod, "ctc_beam_peers"):
                lm_path = fusion["lm_path"] if fu == "lm" else None
                peers = _peers(r, peers_mod.ctc_beam_peers, K, lm_path, LM_WEIGHT)
                _run_peers(r, peers, x, lengths, fns, peer_best)
            r["ms"] = {**_times(fns, device, args.reps), **greedy_ms}
            r["peers_same_best"] = {
                n: sum(a[0][0] == b for a, b in zip(ours, v, strict=True)) for n, v in peer_best.items()
            }
            out.append(r)
            _print(r)
    return out


def measure_transducer(row: str, dtype, device, args, peers_mod, workdir: str) -> list[dict]:
    model, N, T, seconds, dec, x, cal = transducer_row(row, device, dtype)
    calibrate(dec, cal)
    lengths = torch.full((N,), T, device=device)
    V = dec.out.out_features - (len(dec.durations) if dec.durations is not None else 0)
    fusion = fusion_models(V, dec.blank, device, workdir)
    greedy, _ = dec.greedy(x, lengths, validate=False)
    greedy_ms = _times({"greedy": lambda: dec.greedy(x, lengths, validate=False)}, device, args.reps)
    fused_greedy: dict[str, dict] = {}  # fusion -> greedy decoding with it: its ms, its agreement
    out = []
    for K in args.beams or (BEAMS if device.type == "cuda" else CPU_BEAMS)["transducer"]:
        for fu in FUSIONS:
            kw = dict(beam_size=K, validate=False, algorithm="modified" if model == "zipformer" else "malsd")
            if fu != "none":
                kw.update(lm=fusion["lm"], lm_weight=LM_WEIGHT)
            if fu == "lm+boost":
                kw.update(boosting=fusion["boosting"], boosting_weight=BOOST_WEIGHT)
            fns = {"ours": lambda kw=kw: dec.beam_search(x, lengths, **kw)}
            r = dict(row=row, model=model, N=N, T=T, seconds=seconds, beam=K, fusion=fu, dtype=str(dtype)[6:])
            hyp = fns["ours"]()
            ours = [(hyp.tokens[n, 0, : hyp.lengths[n, 0]].tolist(), hyp.frames[n, 0, : hyp.lengths[n, 0]].tolist())
                    for n in range(N)]  # fmt: skip
            if K == 1 and fu == "none":
                r.update(_against_greedy(dec, x, lengths, hyp, greedy))
            if device.type == "cuda" and decode_api.transducer_beam_kernels is not None:
                fns["torch path"] = lambda kw=kw: _without_kernels(
                    "transducer_beam_kernels", lambda: dec.beam_search(x, lengths, **kw)
                )
                ref = _nbest_lists(fns["torch path"]())
                mine = _nbest_lists(hyp)
                r["same_as_torch_path"] = sum(a == b for a, b in zip(mine, ref, strict=True))
                differ = [n for n in range(N) if mine[n] != ref[n]]
                if differ:  # which of the two is float64's search (the same weights in float64)?
                    f64 = _float64_lists(dec, x[differ], lengths[differ], kw)
                    r["differing_from_torch_path"] = [
                        dict(utterance=n, ours_is_float64s=mine[n] == f64[i], torch_path_is_float64s=ref[n] == f64[i])
                        for i, n in enumerate(differ)
                    ]  # fmt: skip
            peer_best = {}
            if peers_mod is not None and hasattr(peers_mod, "transducer_beam_peers"):
                lm_path = fusion["lm_path"] if fu != "none" else None
                phrases = fusion["phrases"] if fu == "lm+boost" else None
                args_ = (dec, dtype, K, lm_path, LM_WEIGHT, phrases, BOOST_WEIGHT)
                peers = _peers(r, peers_mod.transducer_beam_peers, *args_)
                _run_peers(r, peers, x, lengths, fns, peer_best)
            if fu != "none" and fu not in fused_greedy:
                greedy_peers = {}
                if peers_mod is not None and hasattr(peers_mod, "transducer_greedy_peers"):
                    phrases = fusion["phrases"] if fu == "lm+boost" else None
                    args_ = (dec, dtype, fusion["lm_path"], LM_WEIGHT, phrases, BOOST_WEIGHT)
                    greedy_peers = _peers(r, peers_mod.transducer_greedy_peers, *args_)
                fused_greedy[fu] = _fused_greedy(dec, x, lengths, kw, device, args.reps, greedy_peers)
            r.update(fused_greedy.get(fu, {}).get("same", {}))
            timed = _times(fns, device, args.reps, peer_best, r.setdefault("peer_errors", {}))
            r["ms"] = {**timed, **greedy_ms, **fused_greedy.get(fu, {}).get("ms", {})}
            if not r["peer_errors"]:
                del r["peer_errors"]
            r["peers_same_best"] = {
                n: {"tokens": sum(a[0] == b[0] for a, b in zip(ours, v, strict=True)),
                    "tokens_frames": sum(a == tuple(b) for a, b in zip(ours, v, strict=True))}
                for n, v in peer_best.items()
            }  # fmt: skip
            r.update(_peer_differences(dec, x, lengths, kw, ours, peer_best))
            out.append(r)
            _print(r)
    return out


def _fused_greedy(dec, x, lengths, kw: dict, device, reps: int, peers: dict) -> dict:
    """Greedy decoding with the row's fusion (``greedy(lm=..., boosting=...)``): its ms ("greedy fused") and each
    greedy peer's (``peers``: {name: (run, lists)}; "NAME (greedy)"), and the utterances whose tokens and frames
    equal ours: on the GPU its PyTorch path's (``fused_greedy_same_as_torch_path``), each peer's
    (``fused_greedy_peers_same``)."""
    gkw = {k: v for k, v in kw.items() if k in ("lm", "lm_weight", "boosting", "boosting_weight")}

    def run():
        return dec.greedy(x, lengths, validate=False, **gkw)[0]

    def lists(h):
        return [(h.tokens[n, : h.lengths[n]].tolist(), h.frames[n, : h.lengths[n]].tolist()) for n in range(len(h[0]))]

    ours = lists(run())
    same, fns, best = {}, {"greedy fused": run}, {}
    if device.type == "cuda" and decode_api.transducer_beam_kernels is not None:
        ref = lists(_without_kernels("transducer_beam_kernels", run))
        same["fused_greedy_same_as_torch_path"] = sum(a == b for a, b in zip(ours, ref, strict=True))
    _run_peers(same, {f"{k} (greedy)": v for k, v in peers.items()}, x, lengths, fns, best)
    if "peer_errors" in same:
        same["greedy_peer_errors"] = same.pop("peer_errors")
    if best:
        same["fused_greedy_peers_same"] = {
            k: sum(a == (list(b[0]), list(b[1])) for a, b in zip(ours, v, strict=True)) for k, v in best.items()
        }
    errors = {}
    ms = _times(fns, device, reps, best, errors)
    if errors:
        same.setdefault("greedy_peer_errors", {}).update(errors)
    return {"ms": ms, "same": same}


def _peer_differences(dec, x, lengths, kw: dict, ours: list, peer_best: dict, most: int = 16,
                      flips: int = 16) -> dict:  # fmt: skip
    """Each peer's utterances whose best (tokens, frames) differ from ours and, over the peers with at most
    ``most`` differences (a peer of another algorithm differs on most) where at most ``most`` differ in all,
    float64's search (the PyTorch path, the same weights in float64, its K best): whether its best is ours or the
    peer's, how far below its best each of the two ranks there (its ranking score, per token where the search
    normalises; None: not among its K best), and, for malsd, the decision of float64's search that taken the other
    way gives ours or the peer's (``_flips``)."""
    differ = {name: [n for n, (a, b) in enumerate(zip(ours, v, strict=True)) if a != tuple(b)] for name, v in
              peer_best.items()}  # fmt: skip
    if not any(differ.values()):
        return {}
    analysed = {name for name, d in differ.items() if len(d) <= most}
    union = sorted({n for name in analysed for n in differ[name]})
    f64, flipped = {}, {}
    if union and len(union) <= most:
        d64 = _double(dec)
        x64 = x[union].double()
        hyp = _search64(d64, x64, lengths[union], {**kw, "nbest": kw["beam_size"]})
        rank = hyp.scores / (hyp.lengths + 1) if kw.get("score_norm", True) else hyp.scores
        lists = _nbest_lists(hyp)
        f64 = {n: (lists[i], rank[i].tolist()) for i, n in enumerate(union)}
        if kw.get("algorithm", "malsd") == "malsd":
            for i, n in enumerate(union):
                targets = {"ours": ours[n], **{m: tuple(peer_best[m][n]) for m in analysed if n in differ[m]}}
                targets = {k: v for k, v in targets.items() if v != f64[n][0][0]}
                flipped[n] = _flips(d64, x64[i : i + 1], lengths[union][i : i + 1], kw, targets, flips)

    def gap(n: int, best: tuple):
        found, ranks = f64[n]
        return ranks[0] - ranks[found.index(best)] if best in found else None

    def detail(name: str, n: int) -> dict:
        peer = tuple(peer_best[name][n])
        if not f64 or name not in analysed:
            return {}
        out = {"ours_is_float64s": ours[n] == f64[n][0][0], "peer_is_float64s": peer == f64[n][0][0],
               "float64_gap_ours": gap(n, ours[n]), "float64_gap_peer": gap(n, peer)}  # fmt: skip
        if n in flipped:
            out["flip_to_ours"] = flipped[n].get("ours")
            out["flip_to_peer"] = flipped[n].get(name)
        return out

    return {
        "peers_differing": {name: [dict(utterance=n, **detail(name, n)) for n in d] for name, d in differ.items() if d}
    }


def _flips(d64, x64, length, kw: dict, targets: dict, most: int) -> dict:
    """float64's malsd search of one utterance (x64 [1, T, E]) with one decision taken the other way: at each of
    the ``most`` steps whose margin between the K-th pick and the best candidate left out is smallest relative to
    the K-th's score, that candidate picked instead (the reversals searched together, one a row). For each target
    (name -> best (tokens, frames)): the first such reversal (smallest margin first) that gives it, {step,
    relative_margin, margin}, or None."""
    w = d64._current_weights()
    K = kw["beam_size"]
    margins, rows_at = [], {}

    @torch.no_grad()
    def search(x, decide):
        hyp = transducer_beam_search_reference(
            w, x, length.clamp(0, x.shape[1]).expand(x.shape[0]), K, d64.blank, d64.durations,
            d64.max_symbols_per_frame, 1, kw.get("lm"), kw.get("lm_weight", 0.0), kw.get("score_norm", True),
            kw.get("boosting"), kw.get("boosting_weight", 1.0), decide=decide,
        )  # fmt: skip
        return [b[0] for b in _nbest_lists(hyp)]

    def record(step, flat, pick):
        v = flat[0].sort(descending=True).values
        if flat.shape[1] > K and v[K] > float("-inf"):
            margins.append((float((v[K - 1] - v[K]) / v[K - 1].abs()), float(v[K - 1] - v[K]), step))
        return pick

    def flip(step, flat, pick):
        rows = rows_at.get(step)
        if rows is None:
            return pick
        pick = pick.clone()
        pick[rows, K - 1] = flat[rows].sort(dim=1, descending=True, stable=True).indices[:, K]
        return pick

    search(x64, record)
    tries = sorted(margins)[:most]
    for row, (_, _, step) in enumerate(tries):
        rows_at.setdefault(step, []).append(row)
    got = search(x64.expand(len(tries), -1, -1), flip) if tries else []
    out = dict.fromkeys(targets)
    for (rel, margin, step), best in zip(tries, got, strict=True):
        for name, want in targets.items():
            if out[name] is None and best == want:
                out[name] = {"step": step, "relative_margin": rel, "margin": margin}
    return out


def _float64_lists(dec, x, lengths, kw: dict) -> list[list[tuple]]:
    """The PyTorch path's N-best with the decoder's weights and x in float64."""
    return _nbest_lists(_search64(_double(dec), x.double(), lengths, kw))


def _search64(d64, x64, lengths, kw: dict):
    """The PyTorch path's search of a float64 decoder (``_double``) over float64 x."""
    return _without_kernels("transducer_beam_kernels", lambda: d64.beam_search(x64, lengths, **kw))


def _against_greedy(dec, x, lengths, hyp, greedy) -> dict:
    """Beam 1 against greedy decoding: utterances with the same tokens, frames and durations; each other one
    replayed in float64 (``decode.first_divergence``: the first decision that is not float64's greedy argmax and
    its relative margin) for both, and searched at beam 1 in float64 (TDT: a slot at max_symbols moves by its best
    pair's duration, NeMo's malsd rule, where greedy moves by one frame)."""
    first = SimpleNamespace(tokens=hyp.tokens[:, 0], lengths=hyp.lengths[:, 0], frames=hyp.frames[:, 0],
                            durations=None if hyp.durations is None else hyp.durations[:, 0])  # fmt: skip
    beam, greedy_u = utterances(first), utterances(greedy)
    out = {"same_as_greedy": sum(a == b for a, b in zip(beam, greedy_u, strict=True))}
    differ = [n for n in range(len(beam)) if beam[n] != greedy_u[n]]
    if differ:  # (and whether float64's beam 1 is ours: then the search's rules part from greedy's, not rounding)
        f64 = _float64_lists(dec, x[differ], lengths[differ], dict(beam_size=1, validate=False))
        out["differing_from_greedy"] = [
            dict(utterance=n, beam=first_divergence(dec, x[n], int(lengths[n]), beam[n]),
                 greedy=first_divergence(dec, x[n], int(lengths[n]), greedy_u[n]),
                 float64_beam_is_ours=f64[i][0] == (beam[n][0], beam[n][1]))
            for i, n in enumerate(differ)
        ]  # fmt: skip
    return out


def run(args) -> int:
    title = "Beam search (ctc_beam_search, TransducerDecoder.beam_search)"
    device, env, work = plan(args, title, ROWS, CPU_DEMO, ["float32"])
    print_legend(LEGEND, CELLS)
    peers_mod = load_peers(args.peers, module=True)
    print(
        f"{'row':>18} {'beam':>4} {'fusion':>8} | {'ours ms':>8} {'x greedy':>8} {'torch ms':>8} {'peers':>18} "
        f"{'x':>6} | same",
        flush=True,
    )
    out = []
    with tempfile.TemporaryDirectory() as workdir:
        for r, d in progress(work, "decode --beam", lambda w: f"{w[0]} {w[1] or ''}"):
            if d is None:
                out += measure_ctc(r, device, args, peers_mod, workdir)
            else:
                out += measure_transducer(r, d, device, args, peers_mod, workdir)
    if args.json:
        write_json(args.json, {"benchmark": "decode --beam", "environment": env, "rows": out})
    return 0


def _print(r: dict) -> None:
    ms = r["ms"]
    peers = {k: v for k, v in ms.items() if k not in ("ours", "torch path", "greedy") and "greedy" not in k}
    best = min(peers, key=peers.get) if peers else None
    peer = f"{peers[best]:7.2f} {best[:10]:>10} {peers[best] / ms['ours']:6.1f}" if best else f"{'-':>18} {'-':>6}"
    torch_ms = f"{ms['torch path']:8.1f}" if "torch path" in ms else f"{'-':>8}"
    same = []
    if "same_as_torch_path" in r:
        same.append(f"torch path {r['same_as_torch_path']}/{r['N']}")
    if "same_as_greedy" in r:
        same.append(f"greedy {r['same_as_greedy']}/{r['N']}")
    if "greedy fused" in ms:
        same.append(f"fused greedy {ms['greedy fused']:.1f} ms: x {ms['ours'] / ms['greedy fused']:.2f}")
    if "fused_greedy_same_as_torch_path" in r:
        same.append(f"its torch path {r['fused_greedy_same_as_torch_path']}/{r['N']}")
    for name, v in r.get("fused_greedy_peers_same", {}).items():
        same.append(f"{name} {ms[name]:.1f} ms, {v}/{r['N']}")
    for name, v in r.get("peers_same_best", {}).items():
        same.append(f"{name} {v if isinstance(v, int) else v['tokens']}/{r['N']}")
    if "peer_errors" in r:
        same.append("peer failed")
    emit(
        f"{r['row']:>18} {r['beam']:>4} {r['fusion']:>8} | {ms['ours']:8.2f} {ms['ours'] / ms['greedy']:8.2f} "
        f"{torch_ms} {peer} | {'; '.join(same) or '-'}"
    )
