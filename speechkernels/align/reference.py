"""CTC forced alignment (Viterbi) on the CPU: the CPU path and the oracle of the GPU kernels.

The same recursion and tie rule as the kernels (see kernels.py): per frame, every state's best predecessor among
staying, the state before, and the skip over a blank between two different labels, in float32 (float64 for
float64 input) in the same order of operations, so the kernels agree with it bit for bit. Vectorised over the
whole batch with NumPy, one frame per loop iteration: the lanes of all samples lie in one flat array (lane j of
sample n at n * (Lmax + 1) + j), so that "the label before" is the same array shifted by one element and every
operation runs on contiguous memory; a padding lane per sample whose label score stays -inf separates the samples.
NumPy's per-call overhead is a few times lower than PyTorch's, which is what small batches pay for.

Each frame's three choices are kept as bits (packed 8 to a byte when the input is long), and the path is read
back from the end, all samples at once.
"""

from __future__ import annotations

import numpy as np
import torch

CHUNK = 64  # frames whose emissions are gathered at once
PACK_BYTES = 1 << 30  # above this, the choices are packed 8 to a byte


@np.errstate(invalid="ignore")  # inf - inf in the lanes of a sample that reads +inf (it gets NaN scores)
def ctc_forced_align_reference(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Viterbi path of each sample through the CTC lattice.

    Args:
        log_probs: [N, T, C] float tensor on the CPU (any strides).
        targets: [N, S] padded labels (int32/int64); labels are clamped to [0, C).
        input_lengths: [N] frames per sample, in [0, T].
        target_lengths: [N] labels per sample, in [0, S].
        blank: index of the blank class.

    Returns:
        alignments [N, T] int64 (the token of each frame, -1 past the input length or where no path exists) and
        scores [N, T] (each frame's log-probability of its token; 0 past the input length; -inf where no path
        exists, NaN where the sample reads a NaN or +inf emission), float64 for float64 input, else float32.
    """
    N, T, C = log_probs.shape
    dtype = np.float64 if log_probs.dtype == torch.float64 else np.float32
    neg = dtype(-np.inf)
    t_n = input_lengths.cpu().to(torch.int64).numpy()
    L = target_lengths.cpu().to(torch.int64).numpy()
    Lmax = int(L.max()) if N else 0
    W = Lmax + 1
    M = N * W
    lab = np.zeros((N, W), np.int64)
    if Lmax:
        lab[:, :Lmax] = targets[:, :Lmax].cpu().to(torch.int64).clamp(0, C - 1).numpy()
    j = np.arange(W)
    on_label = j[None, :] < L[:, None]  # the sample's real label lanes
    prev = np.concatenate([np.zeros((N, 1), np.int64), lab[:, :-1]], axis=1)
    skip_add = np.where(on_label & (j[None, :] > 0) & (lab != prev), 0, neg).astype(dtype).reshape(M)
    # the label lane j = Lmax does not exist: it is held at -inf, which keeps each sample apart from the next
    pad = 1 + np.arange(N) * W + Lmax
    lane_c = lab.reshape(M)
    lab_t = torch.from_numpy(lab)
    x = log_probs.detach()
    tdtype = torch.float64 if dtype == np.float64 else torch.float32

    steps = int(t_n.max()) if N else 0
    packed = 3 * steps * M > PACK_BYTES
    # per frame: the blank came from the label before; the label from its blank; the label skipped a blank
    planes = [np.zeros((steps, (M + 7) // 8 if packed else M), np.uint8 if packed else np.bool_) for _ in range(3)]
    chunk_bits = [np.empty((CHUNK, M), np.bool_) for _ in range(3)] if packed else None
    b = np.full(M, neg, dtype)
    b[::W] = 0  # the virtual frame -1: only the first blank
    nb = np.empty_like(b)
    nb_rows = nb.reshape(N, W)
    lbuf = np.full(M + 1, neg, dtype)  # lbuf[1 + m] is lane m's label score, so lbuf[m] is the label before it
    lab_now, lab_prev = lbuf[1:], lbuf[:M]
    best = np.empty_like(b)
    ss = np.empty_like(b)
    end_b = np.full(N, neg, dtype)
    end_l = np.full(N, neg, dtype)
    bad = np.zeros(N, np.bool_)
    ends: dict[int, list[int]] = {}
    for n in range(N):
        if t_n[n] > 0:
            ends.setdefault(int(t_n[n]) - 1, []).append(n)
    for c0 in range(0, steps, CHUNK):
        f = min(CHUNK, steps - c0)
        xs = x[:, c0 : c0 + f, :]
        # sample-major gathers (each reads its rows in order), then frame-major copies for the loop
        e_l = torch.gather(xs, 2, lab_t[:, None, :].expand(N, f, W)).to(tdtype).transpose(0, 1).contiguous()
        e_l = e_l.numpy().reshape(f, M)
        e_b = xs[:, :, blank].to(tdtype).t().contiguous().numpy()  # [f, N]
        if not (np.max(e_l) < np.inf and np.max(e_b) < np.inf):  # a NaN or +inf somewhere: who reads it
            wrong = (~(e_l < np.inf)).reshape(f, N, W) & on_label[None]
            live = np.arange(c0, c0 + f)[:, None] < t_n[None, :]
            bad |= ((wrong.any(axis=2) | ~(e_b < np.inf)) & live).any(axis=0)
        for i in range(f):
            t = c0 + i
            out = [bits[i] for bits in chunk_bits] if packed else [plane[t] for plane in planes]
            np.greater(lab_prev, b, out=out[0])
            np.maximum(b, lab_prev, out=nb)
            np.add(nb_rows, e_b[i][:, None], out=nb_rows)
            np.greater(b, lab_now, out=out[1])
            np.maximum(lab_now, b, out=best)
            np.add(lab_prev, skip_add, out=ss)
            np.greater(ss, best, out=out[2])
            np.maximum(best, ss, out=best)
            np.add(best, e_l[i], out=lab_now)
            lbuf[pad] = neg
            b, nb = nb, b
            nb_rows = nb.reshape(N, W)
            for n in ends.get(t, ()):
                end_b[n] = b[n * W + L[n]]
                if L[n] > 0:
                    end_l[n] = lab_now[n * W + L[n] - 1]
        if packed:
            for plane, bits in zip(planes, chunk_bits, strict=True):
                plane[c0 : c0 + f] = np.packbits(bits[:f], axis=1)

    ok = (np.maximum(end_b, end_l) > neg) & ~bad
    # read the path back from its end, all samples at once: the last blank or, on a tie, the last label
    on_l = ~(end_b > end_l) & ok
    lane = np.where(ok, np.arange(N) * W + np.where(on_l, L - 1, L), 0)
    path_lane = np.zeros((T, N), np.int64)
    path_l = np.zeros((T, N), np.bool_)
    act_all = (np.arange(steps)[:, None] < t_n[None, :]) & ok[None, :]
    for t in range(steps - 1, -1, -1):
        act = act_all[t]
        path_lane[t] = lane
        path_l[t] = on_l
        if packed:
            came_b, came_l, skipped = ((plane[t, lane >> 3] >> (7 - (lane & 7))) & 1 != 0 for plane in planes)
        else:
            came_b, came_l, skipped = (plane[t].take(lane) for plane in planes)
        lane = lane - (np.where(on_l, skipped, came_b) & act)
        on_l = np.where(act, np.where(on_l, skipped | ~came_l, came_b), on_l)
    path_lane, path_l = path_lane.T, path_l.T

    frames = np.arange(T)[None, :] < t_n[:, None]
    valid = frames & ok[:, None]
    token = np.where(valid, np.where(path_l, lane_c[path_lane], blank), -1)
    out_dtype = torch.float64 if dtype == np.float64 else torch.float32
    index = torch.from_numpy(np.maximum(token, 0))[:, :, None]
    scores = log_probs.detach().gather(2, index)[:, :, 0].to(out_dtype)
    none = torch.from_numpy(np.where(bad, np.nan, -np.inf)).to(out_dtype)[:, None].expand(N, T)
    scores = torch.where(torch.from_numpy(valid), scores, torch.where(torch.from_numpy(frames), none, 0.0))
    return torch.from_numpy(token), scores
