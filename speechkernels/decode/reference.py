"""Greedy decoding in PyTorch, readable and float64-capable: the CPU path and the oracle of the kernels."""

from __future__ import annotations

import torch

from .._transducer.activations import activation_fn
from .hypotheses import Hypotheses, TransducerState, compact, fusion_start
from .networks import TransducerWeights, predict


def ctc_greedy_decode_reference(x: torch.Tensor, lengths: torch.Tensor, blank: int, logits: bool) -> Hypotheses:
    """Greedy (best-path) CTC decoding of x [N, T, C]: each frame's most likely class (the first one of equal
    scores, as ``torch.argmax``; a NaN counts as the largest), runs of one class merged, blanks dropped. A token
    is reported at the first frame of its run with its log-probability there (``logits``: x's log_softmax, taken
    in float32, float64 for float64 x). Frames at and past ``lengths`` [N] (clamped to [0, T]) are not read."""
    wd = torch.float64 if x.dtype == torch.float64 else torch.float32
    best = x.argmax(2)
    score = x.gather(2, best[..., None])[..., 0].to(wd)
    if logits:
        score = score - torch.logsumexp(x.to(wd), 2)
    return ctc_hypotheses(best, score, lengths, blank)


def ctc_hypotheses(best: torch.Tensor, score: torch.Tensor, lengths: torch.Tensor, blank: int) -> Hypotheses:
    """Hypotheses from each frame's most likely class ``best`` [N, T] and its ``score``: runs merged, blanks and
    the frames at and past ``lengths`` (clamped to [0, T]) dropped, each token at the first frame of its run."""
    N, T = best.shape
    dev = best.device
    t = torch.arange(T, device=dev)
    live = t[None, :] < lengths.to(dev).clamp(0, T)[:, None]
    prev = torch.cat((torch.full((N, 1), -1, dtype=best.dtype, device=dev), best[:, :-1]), 1)
    emit = live & (best != blank) & (best != prev)
    lengths_out, tokens, frames, scores = compact(emit, (best, -1), (t.expand(N, T), -1), (score, 0.0))
    return Hypotheses(tokens, lengths_out, frames, scores)


def transducer_greedy_reference(
    w: TransducerWeights,
    x: torch.Tensor,
    lengths: torch.Tensor,
    state: TransducerState,
    blank: int,
    durations: tuple[int, ...] | None,
    max_symbols: int,
    lm=None,
    lm_weight: float = 0.0,
    boosting=None,
    boosting_weight: float = 1.0,
) -> tuple[Hypotheses, TransducerState]:
    """Greedy transducer decoding of encoder outputs x [N, T, E] (frames past ``lengths`` [N] unread), batched in
    PyTorch with the semantics of NeMo's label-looping decoders: at frame t the joint's argmax over the V token
    classes (ties to the lowest index) and, for TDT, its argmax duration; a blank advances t by its duration (RNN-T:
    1; a TDT blank of duration 0 by 1); a label is emitted at t, advances the prediction network and t by its
    duration (RNN-T: 0); after ``max_symbols`` labels at one frame, t advances by 1. Everything is computed in the
    weights' dtype (x is cast to it); scores are the labels' log_softmax over the V token logits (float32, float64
    for float64 weights). S = T * max_symbols (a bound, no host synchronisation needed to size the outputs).

    Shallow fusion (``lm``: an ``NGramLM``, ``boosting``: a ``PhraseBooster``, over the V token classes), as NeMo's
    label-looping decoders fuse their models: whether a frame emits is the joint's own argmax (blank or not); an
    emitted label is the argmax over the non-blank classes of logit + ``lm_weight`` log p_LM + ``boosting_weight``
    bonus (the joint's raw outputs: the same argmax as its log-softmax), and the LM's and the booster's states
    follow the labels (``state.lm_states`` / ``boosting_states``, None: the start states). Scores stay the labels'
    log-softmax."""
    N, T, _ = x.shape
    dev = x.device
    V = w.out_w.shape[0] - (len(durations) if durations else 0)
    S = T * max_symbols
    wd = torch.float64 if w.enc_w.dtype == torch.float64 else torch.float32
    enc = torch.nn.functional.linear(x.to(w.enc_w.dtype), w.enc_w, w.enc_b)  # [N, T, J], once for all frames
    act = activation_fn(w.activation)
    dur = None if durations is None else torch.tensor(durations, dtype=torch.int64, device=dev)
    rows = torch.arange(N, device=dev)
    lengths = lengths.to(dev).clamp(0, T)
    pred_state, out = state.predictor, state.output
    g = torch.nn.functional.linear(out, w.pred_w, w.pred_b)
    t = state.time_jumps.clone()
    tokens = torch.full((N, S + 1), -1, dtype=torch.int64, device=dev)  # column S: a sink for rows not emitting
    frames, durs = tokens.clone(), tokens.clone()
    scores = torch.zeros(N, S + 1, dtype=wd, device=dev)
    k = torch.zeros(N, dtype=torch.int64, device=dev)
    at_frame = torch.zeros(N, dtype=torch.int64, device=dev)  # labels emitted at frame t so far
    active = t < lengths
    lm_state = fusion_start(lm, state.lm_states, N, dev)
    b_state = fusion_start(boosting, state.boosting_states, N, dev)
    while bool(active.any()):
        logits = torch.nn.functional.linear(act(enc[rows, t.clamp(max=T - 1)] + g), w.out_w, w.out_b)
        label = logits[:, :V].argmax(1)
        emit = active & (label != blank)
        if lm is not None or boosting is not None:  # the label among the non-blank classes, fused
            fused = logits[:, :V].to(wd)
            if lm is not None:
                lm_lp, lm_next = lm.score(lm_state)
                fused = fused + lm_weight * lm_lp.to(wd)
            if boosting is not None:
                bonus, b_next = boosting.step(b_state)
                fused = fused + boosting_weight * bonus.to(wd)
            fused[:, blank] = float("-inf")
            label = torch.where(emit, fused.argmax(1), label)
            if lm is not None:
                lm_state = torch.where(emit, lm_next[rows, label], lm_state)
            if boosting is not None:
                b_state = torch.where(emit, b_next[rows, label], b_state)
        score = logits[:, :V].to(wd).log_softmax(1).gather(1, label[:, None])[:, 0]
        if dur is None:
            step = (~emit).long()
        else:
            step = dur[logits[:, V:].argmax(1)]
        slot = torch.where(emit, k, S)
        tokens[rows, slot] = label
        frames[rows, slot] = t
        durs[rows, slot] = step
        scores[rows, slot] = score
        tokens[:, S], frames[:, S], durs[:, S], scores[:, S] = -1, -1, -1, 0
        k += emit
        if bool(emit.any()):
            new_out, new_state = predict(w, label, pred_state)
            m = emit[:, None]
            out = torch.where(m, new_out, out)
            g = torch.where(m, torch.nn.functional.linear(new_out, w.pred_w, w.pred_b), g)
            pairs = zip(new_state, pred_state, strict=True)
            pred_state = tuple(torch.where(m if s.dim() == 2 else m[None], n, s) for n, s in pairs)
        step = torch.where(emit, step, step.clamp(min=1))
        at_frame = torch.where(emit & (step == 0), at_frame + 1, 0)
        step = torch.where(at_frame >= max_symbols, 1, step)
        at_frame = torch.where(at_frame >= max_symbols, 0, at_frame)
        t = torch.where(active, t + step, t)
        active = t < lengths
    frames = torch.where(frames >= 0, frames + state.frames[:, None], -1)
    hyp = Hypotheses(tokens[:, :S], k, frames[:, :S], scores[:, :S], None if dur is None else durs[:, :S])
    return hyp, TransducerState(
        pred_state,
        out,
        t - lengths,
        state.frames + lengths,
        lm_state if lm is not None else state.lm_states,
        b_state if boosting is not None else state.boosting_states,
    )
