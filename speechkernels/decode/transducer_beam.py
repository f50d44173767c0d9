"""Transducer beam search in PyTorch (RNN-T and TDT): modified alignment-length synchronous decoding, batched, with
the semantics of NeMo's ``malsd_batch`` (the CPU path, and in float64 the oracle of a kernel to come).

K slots per utterance advance together, one symbol per step (a label, a blank, or nothing once finished). A step
evaluates the joint of every slot at its own frame; each live slot proposes its K best outputs (TDT: its K best
(output, duration) pairs, the two log-softmaxes added), scored by the slot's score plus the log-probabilities; a
finished slot (its frame past the utterance's end) proposes itself unchanged; a slot that has emitted
``max_symbols`` labels at its frame proposes only the blank (TDT: with its best duration's log-probability, moving
by its best candidate's duration, at least 1). The K best of the K x K proposals survive (ties: the earlier slot,
then the earlier proposal). Then slots that hold the same token sequence (TDT: at the same frame) are merged into
the most likely one (the first of equal scores) with the log-sum of their scores. A blank moves its slot to the
next frame (TDT: by its duration; a blank of duration 0 by 1); a label keeps the frame (TDT: moves by its duration)
and advances the slot's prediction network. The search ends when every slot is past its utterance's end; the
hypotheses are ranked by score / (tokens + 1) (``score_norm``, NeMo's default) or by score.

An n-gram LM and phrase boosting fuse as NeMo's fusion models do by default (``lm_weighted_full``, late pruning):
with weights a (the LM) and b (the booster), A = a + b, a label v scores log p(v) + A log(1 - p(blank)) +
a log p_LM(v) + b bonus(v), the blank (1 + A) log p(blank) (p(blank) clamped to 0.99 in the label's term); the
LM's and the booster's states follow the labels; no end-of-sentence term.
"""

from __future__ import annotations

import torch

from .hypotheses import BeamHypotheses
from .networks import TransducerWeights, predict, search_start


def _mix(h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The hash of a token sequence extended by token c (int64, wrapping)."""
    return h * 6364136223846793005 + 1 + c


def transducer_beam_search_reference(
    w: TransducerWeights,
    x: torch.Tensor,
    lengths: torch.Tensor,
    beam_size: int,
    blank: int,
    durations: tuple[int, ...] | None,
    max_symbols: int,
    nbest: int = 1,
    lm=None,
    lm_weight: float = 0.0,
    score_norm: bool = True,
    boosting=None,
    boosting_weight: float = 1.0,
    decide=None,
) -> BeamHypotheses:
    """The beam search of encoder outputs x [N, T, E] (frames past ``lengths`` [N], clamped to [0, T], unread)
    with the networks ``w`` (computed in their dtype; scores in float32, float64 for float64 networks): the
    ``nbest`` best of the K = ``beam_size`` slots, best first. ``frames``: each label's frame (where it was found);
    ``scores``: the searched score; ``acoustic``: the same without the LM's terms; ``lm_scores``: the difference.
    ``lm``: an ``NGramLM`` over the V token classes (the blank's column unused) or None; ``boosting``: a
    ``PhraseBooster`` over them or None. ``decide``: None, or a function (step, the candidates' scores [N, K * K],
    the K picks [N, K]) -> the picks (the benchmark takes single decisions the other way)."""
    N, T, _ = x.shape
    dev = x.device
    K, i64 = beam_size, torch.int64
    D = len(durations) if durations else 0
    V = w.out_w.shape[0] - D
    S = T * max_symbols  # labels at most
    dur = None if durations is None else torch.tensor(durations, dtype=i64, device=dev)
    enc, act, lengths, wd, ninf, pred_state, out, g, score = search_start(w, x, lengths, K, blank)
    acoustic = score.clone()
    t = torch.zeros(N, K, dtype=i64, device=dev)
    at_frame = torch.zeros(N, K, dtype=i64, device=dev)  # labels found at the slot's frame (TDT: of duration 0)
    n_lab = torch.zeros(N, K, dtype=i64, device=dev)
    last = torch.full((N, K), -1, dtype=i64, device=dev)
    hsh = torch.zeros(N, K, dtype=i64, device=dev)
    tokens = torch.full((N, K, S + 1), -1, dtype=i64, device=dev)  # column S: a sink
    frames, durs = tokens.clone(), tokens.clone()
    lm_state = torch.full((N, K), lm.start if lm is not None else 0, dtype=i64, device=dev)
    b_state = torch.full((N, K), boosting.start if boosting is not None else 0, dtype=i64, device=dev)
    fusion = (lm_weight if lm is not None else 0.0) + (boosting_weight if boosting is not None else 0.0)
    rows = torch.arange(N, device=dev)[:, None]
    o_k = torch.arange(K, device=dev)
    steps = 0
    while True:
        active = t < lengths[:, None]
        if not bool(active.any()):
            break
        frame = torch.minimum(t, (lengths[:, None] - 1).clamp(min=0))
        joint = act(enc[rows, frame] + g.view(N, K, -1))
        logits = torch.nn.functional.linear(joint, w.out_w, w.out_b).to(wd)
        lp = logits[..., :V].log_softmax(-1)  # [N, K, V]
        fused = lp
        if lm is not None or boosting is not None:
            p_blank = lp[..., blank].exp().clamp(max=1 - 1e-2)
            fused = lp + fusion * torch.log1p(-p_blank)[..., None]
            if lm is not None:
                lm_lp, lm_next = lm.score(lm_state.reshape(-1))
                lm_lp, lm_next = lm_lp.to(wd).view(N, K, V), lm_next.view(N, K, V)
                fused = fused + lm_weight * lm_lp
            if boosting is not None:
                bonus, b_next = boosting.step(b_state.reshape(-1))
                bonus, b_next = bonus.to(wd).view(N, K, V), b_next.view(N, K, V)
                fused = fused + boosting_weight * bonus
            fused[..., blank] = (1 + fusion) * lp[..., blank]
        if dur is None:
            top, lab = fused.topk(min(K, V), dim=-1)  # [N, K, K] (fewer outputs than K: padded below)
            top_ac = lp.gather(-1, lab)
            d_idx = torch.zeros_like(lab)
            forced = score + fused[..., blank]
            forced_ac = acoustic + lp[..., blank]
        else:
            dlp = logits[..., V:].log_softmax(-1)  # [N, K, D]
            pair = (fused[..., :, None] + dlp[..., None, :]).reshape(N, K, V * D)
            top, idx = pair.topk(min(K, V * D), dim=-1)
            lab, d_idx = idx // D, idx % D
            top_ac = lp.gather(-1, lab) + dlp.gather(-1, d_idx)
            forced = score + fused[..., blank] + dlp.max(-1).values
            forced_ac = acoustic + lp[..., blank] + dlp.max(-1).values
        if top.shape[-1] < K:  # impossible proposals
            pad = K - top.shape[-1]
            top, top_ac = (torch.nn.functional.pad(v, (0, pad), value=float("-inf")) for v in (top, top_ac))
            lab, d_idx = (torch.nn.functional.pad(v, (0, pad), value=-1 if v is lab else 0) for v in (lab, d_idx))
        cand = score[..., None] + top
        cand_ac = acoustic[..., None] + top_ac
        # finished slots propose themselves (label -1); slots at max_symbols only the blank
        first = o_k == 0
        done = ~active
        cand = torch.where(done[..., None], torch.where(first, score[..., None], ninf), cand)
        cand_ac = torch.where(done[..., None], torch.where(first, acoustic[..., None], ninf), cand_ac)
        lab = torch.where(done[..., None], -1, lab)
        full = active & (at_frame >= max_symbols)
        cand = torch.where(full[..., None], torch.where(first, forced[..., None], ninf), cand)
        cand_ac = torch.where(full[..., None], torch.where(first, forced_ac[..., None], ninf), cand_ac)
        lab = torch.where(full[..., None], blank, lab)
        d_idx = torch.where(full[..., None], d_idx[..., :1], d_idx)  # the best candidate's duration
        # the K best of the K x K (ties: the earlier slot, then the earlier proposal)
        flat = cand.reshape(N, K * K)
        pick = torch.sort(flat, dim=1, descending=True, stable=True).indices[:, :K]
        if decide is not None:
            pick = decide(steps, flat, pick)
        steps += 1
        parent = pick // K
        label = lab.reshape(N, K * K).gather(1, pick)
        new_score = flat.gather(1, pick)
        new_ac = cand_ac.reshape(N, K * K).gather(1, pick)
        is_ext = label >= 0
        is_blank = label == blank
        is_lab = is_ext & ~is_blank
        t_par = t.gather(1, parent)
        if dur is None:  # a blank moves one frame, a label none
            step = is_blank.to(i64)
        else:  # by the duration; a blank by at least 1
            step = dur[d_idx.reshape(N, K * K).gather(1, pick)]
            step = torch.where(is_blank, step.clamp(min=1), step)
        step = torch.where(is_ext, step, 0)
        k_par = n_lab.gather(1, parent)
        slot = torch.where(is_lab, k_par, S)
        g3 = parent[..., None].expand(N, K, S + 1)
        tokens, frames, durs = tokens.gather(1, g3), frames.gather(1, g3), durs.gather(1, g3)
        tokens.scatter_(2, slot[..., None], label[..., None])
        frames.scatter_(2, slot[..., None], t_par[..., None])
        durs.scatter_(2, slot[..., None], step[..., None])
        tokens[..., S], frames[..., S], durs[..., S] = -1, -1, -1
        if dur is None:
            at_frame = torch.where(is_blank, 0, at_frame.gather(1, parent) + is_lab.to(i64))
        else:
            at_frame = torch.where(is_ext & (step > 0), 0, at_frame.gather(1, parent) + is_lab.to(i64))
        t = t_par + step
        n_lab = k_par + is_lab.to(i64)
        hsh = torch.where(is_lab, _mix(hsh.gather(1, parent), label), hsh.gather(1, parent))
        last = torch.where(is_lab, label, last.gather(1, parent))
        score, acoustic = new_score, new_ac
        if lm is not None:
            lm_par = lm_state.gather(1, parent)
            lm_to = lm_next.reshape(N, K * V).gather(1, parent * V + label.clamp(min=0))
            lm_state = torch.where(is_lab, lm_to, lm_par)
        if boosting is not None:
            b_to = b_next.reshape(N, K * V).gather(1, parent * V + label.clamp(min=0))
            b_state = torch.where(is_lab, b_to, b_state.gather(1, parent))
        # the prediction network: the parent's, advanced by a label
        flat_parent = (rows * K + parent).reshape(-1)
        pred_par = tuple(s[:, flat_parent] if s.dim() == 3 else s[flat_parent] for s in pred_state)
        out_par = out[flat_parent]
        new_out, new_state = predict(w, label.clamp(min=0).reshape(-1), pred_par)
        m = is_lab.reshape(-1, 1)
        out = torch.where(m, new_out, out_par)
        pairs = zip(new_state, pred_par, strict=True)
        pred_state = tuple(torch.where(m if n.dim() == 2 else m[None], n, p) for n, p in pairs)
        g = torch.nn.functional.linear(out, w.pred_w, w.pred_b)
        # merges: the same tokens (TDT: at the same frame) -> the first most likely slot, the log-sum of scores
        same = (hsh[:, :, None] == hsh[:, None, :]) & (last[:, :, None] == last[:, None, :])
        same = same & (n_lab[:, :, None] == n_lab[:, None, :])
        if dur is not None:
            same = same & (t[:, :, None] == t[:, None, :])
        group = torch.where(same, score[:, None, :], ninf)  # [N, i, j]: the scores of slot i's group
        survivor = group.argmax(2)  # the first of the largest
        keep = survivor == o_k
        total = torch.logsumexp(group, 2)
        total_ac = torch.logsumexp(torch.where(same, acoustic[:, None, :], ninf), 2)
        merged = same.sum(2) > 1
        score = torch.where(keep, torch.where(merged, total, score), ninf)
        acoustic = torch.where(keep, torch.where(merged, total_ac, acoustic), ninf)
    key = score / (n_lab + 1).to(wd) if score_norm else score
    return _best(key, score, acoustic, n_lab, tokens, frames, durs if dur is not None else None, nbest, S)


def _best(key, score, acoustic, n_lab, tokens, frames, durs, nbest: int, S: int) -> BeamHypotheses:
    """The ``nbest`` slots of each utterance by ``key`` (descending; ties to the lower slot) as ``BeamHypotheses``:
    the per-slot histories ([N, K, S + 1]: tokens, frames, durations or None) cut to S, a slot without a
    hypothesis (score -inf) as -1 tokens and frames, length 0, -inf scores."""
    N, ninf = score.shape[0], float("-inf")
    order = torch.sort(key, dim=1, descending=True, stable=True).indices[:, :nbest]
    ok = score.gather(1, order) > ninf
    g3 = order[..., None].expand(N, nbest, S + 1)

    def rows(t):
        return torch.where(ok[..., None], t.gather(1, g3)[..., :S], -1)

    return BeamHypotheses(
        tokens=rows(tokens),
        lengths=torch.where(ok, n_lab.gather(1, order), 0),
        frames=rows(frames),
        scores=torch.where(ok, score.gather(1, order), ninf),
        acoustic=torch.where(ok, acoustic.gather(1, order), ninf),
        lm_scores=torch.where(ok, (score - acoustic).gather(1, order), ninf),
        durations=None if durs is None else rows(durs),
    )


def modified_beam_search_reference(
    w: TransducerWeights,
    x: torch.Tensor,
    lengths: torch.Tensor,
    beam_size: int,
    blank: int,
    nbest: int = 1,
    lm=None,
    lm_weight: float = 0.0,
    score_norm: bool = True,
    boosting=None,
    boosting_weight: float = 1.0,
) -> BeamHypotheses:
    """icefall's ``modified_beam_search`` (RNN-T, one symbol per frame) of encoder outputs x [N, T, E] with the
    networks ``w`` (frames past ``lengths`` [N], clamped to [0, T], unread), batched: the ``nbest`` best of the K
    = ``beam_size`` hypotheses, best first.

    Each frame every hypothesis proposes the blank (it stays) and every label (appended at this frame: a label
    uses the frame up); each proposal scores the hypothesis's score plus the output's log-probability (a label
    plus ``lm_weight`` times its LM log-probability); the K best of all proposals are taken (ties: the earlier
    hypothesis, then the lower class), and those with the same tokens merge, in that order, into the first with
    the log-sum of their scores (the merged one keeps its frames and states). A label's phrase boosting bonus
    (``boosting_weight`` times ``PhraseBooster``'s) is added after the selection, as icefall adds its context
    graph's score, and a pending partial match is taken back at the end. Ranking: score / (context_size +
    tokens) (``score_norm``: icefall's length norm over its hypotheses' ys, which start with context_size
    symbols), else score. ``acoustic``: the log-probabilities alone."""
    N, T, _ = x.shape
    dev = x.device
    K, i64 = beam_size, torch.int64
    V = w.out_w.shape[0]
    enc, act, lengths, wd, ninf, pred_state, out, g, score = search_start(w, x, lengths, K, blank)
    acoustic = score.clone()
    n_lab = torch.zeros(N, K, dtype=i64, device=dev)
    last = torch.full((N, K), -1, dtype=i64, device=dev)
    hsh = torch.zeros(N, K, dtype=i64, device=dev)
    tokens = torch.full((N, K, T + 1), -1, dtype=i64, device=dev)  # column T: a sink
    frames = tokens.clone()
    lm_state = torch.full((N, K), lm.start if lm is not None else 0, dtype=i64, device=dev)
    b_state = torch.full((N, K), boosting.start if boosting is not None else 0, dtype=i64, device=dev)
    rows = torch.arange(N, device=dev)[:, None]
    o_k = torch.arange(K, device=dev)
    for t in range(T):
        active = t < lengths  # [N]
        if not bool(active.any()):
            break
        joint = act(enc[:, t, None] + g.view(N, K, -1))
        lp = torch.nn.functional.linear(joint, w.out_w, w.out_b).to(wd).log_softmax(-1)  # [N, K, V]
        fused = lp
        if lm is not None:
            lm_lp, lm_next = lm.score(lm_state.reshape(-1))
            lm_lp, lm_next = lm_lp.to(wd).view(N, K, V), lm_next.view(N, K, V)
            fused = lp + lm_weight * lm_lp
            fused[..., blank] = lp[..., blank]
        cand = (score[..., None] + fused).reshape(N, K * V)
        cand_ac = (acoustic[..., None] + lp).reshape(N, K * V)
        pick = torch.sort(cand, dim=1, descending=True, stable=True).indices[:, :K]  # ties: the earlier index
        parent, label = pick // V, pick % V
        new_score, new_ac = cand.gather(1, pick), cand_ac.gather(1, pick)
        is_lab = (label != blank) & (new_score > float("-inf"))
        if boosting is not None:
            bonus, b_next = boosting.step(b_state.reshape(-1))
            bonus, b_next = bonus.to(wd).view(N, K * V), b_next.view(N, K * V)
            new_score = torch.where(is_lab, new_score + boosting_weight * bonus.gather(1, pick), new_score)
            b_new = torch.where(is_lab, b_next.gather(1, pick), b_state.gather(1, parent))
        k_par = n_lab.gather(1, parent)
        slot = torch.where(is_lab, k_par, T)
        g3 = parent[..., None].expand(N, K, T + 1)
        new_tokens, new_frames = tokens.gather(1, g3), frames.gather(1, g3)
        new_tokens.scatter_(2, slot[..., None], label[..., None])
        new_frames.scatter_(2, slot[..., None], torch.full_like(slot, t)[..., None])
        new_tokens[..., T], new_frames[..., T] = -1, -1
        new_n = k_par + is_lab.to(i64)
        new_hsh = torch.where(is_lab, _mix(hsh.gather(1, parent), label), hsh.gather(1, parent))
        new_last = torch.where(is_lab, label, last.gather(1, parent))
        # merges: the same tokens -> the first of them in the order of the selection, the log-sum of the scores
        same = (new_hsh[:, :, None] == new_hsh[:, None, :]) & (new_last[:, :, None] == new_last[:, None, :])
        same = same & (new_n[:, :, None] == new_n[:, None, :]) & (new_score > float("-inf"))[:, None, :]
        first = (same & (o_k[None, None, :] <= o_k[None, :, None])).to(torch.int8).argmax(2)  # the first of i's group
        keep = (first == o_k) & (new_score > float("-inf"))
        total = torch.logsumexp(torch.where(same, new_score[:, None, :], ninf), 2)
        total_ac = torch.logsumexp(torch.where(same, new_ac[:, None, :], ninf), 2)
        new_score = torch.where(keep, total, ninf)
        new_ac = torch.where(keep, total_ac, ninf)
        # the prediction network: the parent's, advanced by a label
        flat_parent = (rows * K + parent).reshape(-1)
        pred_par = tuple(s[:, flat_parent] if s.dim() == 3 else s[flat_parent] for s in pred_state)
        new_out, new_state = predict(w, label.reshape(-1), pred_par)
        m = is_lab.reshape(-1, 1)
        new_out = torch.where(m, new_out, out[flat_parent])
        new_pred = tuple(
            torch.where(m if n.dim() == 2 else m[None], n, p) for n, p in zip(new_state, pred_par, strict=True)
        )
        # utterances past their end keep their hypotheses
        a2, a3 = active[:, None], active[:, None, None]
        score, acoustic = torch.where(a2, new_score, score), torch.where(a2, new_ac, acoustic)
        tokens, frames = torch.where(a3, new_tokens, tokens), torch.where(a3, new_frames, frames)
        n_lab, hsh, last = (torch.where(a2, a, b) for a, b in ((new_n, n_lab), (new_hsh, hsh), (new_last, last)))
        if lm is not None:
            lm_to = lm_next.reshape(N, K * V).gather(1, pick)
            lm_new = torch.where(is_lab, lm_to, lm_state.gather(1, parent))
            lm_state = torch.where(a2, lm_new, lm_state)
        if boosting is not None:
            b_state = torch.where(a2, b_new, b_state)
        a_flat = active.repeat_interleave(K)[:, None]
        out = torch.where(a_flat, new_out, out)
        pred_state = tuple(
            torch.where(a_flat if n.dim() == 2 else a_flat[None], n, p)
            for n, p in zip(new_pred, pred_state, strict=True)
        )
        g = torch.nn.functional.linear(out, w.pred_w, w.pred_b)
    if boosting is not None:  # a pending partial match taken back
        score = score + boosting_weight * boosting.end_scores(b_state.reshape(-1)).to(wd).view(N, K)
    key = score / (n_lab + w.context_size).to(wd) if score_norm else score
    return _best(key, score, acoustic, n_lab, tokens, frames, None, nbest, T)
