"""The PyTorch (CPU) paths of ctc_loss and rnnt_loss against the CPU peers (torch's ctc_loss, torchaudio's
rnnt_loss) on the CPU benchmark rows and larger ones: forward+backward from activations, median milliseconds of
7 calls after one warm-up, with the number of intra-op threads given (default 2).

    python benchmarks/cpu_peers.py [threads]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torchaudio.functional as taf

import speechkernels as sk
from speechkernels.bench.ctc import make_inputs as ctc_inputs
from speechkernels.bench.rnnt import make_inputs as rnnt_inputs

RNNT_ROWS = [
    (50, 10, 28, 2),
    (50, 10, 500, 2),
    (150, 40, 28, 1),
    (150, 40, 28, 8),
    (150, 21, 500, 4),
    (150, 20, 5000, 1),
]
CTC_ROWS = [
    (150, 1, 28, 150),
    (150, 8, 28, 150),
    (150, 8, 500, 150),
    (200, 16, 40, 40),
    (1000, 4, 100, 100),
    (150, 16, 5000, 150),
]
FULL_LABELS = [(200, 16, 40, 40), (1000, 4, 100, 100)]  # every sample with S labels


def median_ms(step, v, n=7) -> float:
    def run():
        v.grad = None
        step(v).backward()

    run()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    torch.set_num_threads(threads)
    cpu = torch.device("cpu")
    for T, U, V, N in RNNT_ROWS:
        x, tg, il, tl = rnnt_inputs(T, U, V, N, cpu)
        v = x.clone().requires_grad_()
        ours = median_ms(lambda v, a=(tg, il, tl): sk.rnnt_loss(v, *a, blank=0), v)
        theirs = median_ms(lambda v, a=(tg, il, tl): taf.rnnt_loss(v, *a, blank=0), v)
        print(
            f"threads {threads} rnnt {T}x{U}x{V}x{N}: ours {ours:.2f} ms, torchaudio {theirs:.2f} ms, "
            f"{theirs / ours:.2f}x",
            flush=True,
        )
    for T, N, C, S in CTC_ROWS:
        x, tg, il, tl = ctc_inputs(T, N, C, cpu, S=S)
        if (T, N, C, S) in FULL_LABELS:
            tl, tg = torch.full((N,), S), torch.randint(1, C, (N, S))
        v = x.clone().requires_grad_()
        a = (tg, il, tl)
        ours = median_ms(lambda v, a=a: sk.ctc_loss(v, *a, logits=True), v)
        ours_lp = median_ms(lambda v, a=a: sk.ctc_loss(v.log_softmax(-1), *a), v)
        theirs = median_ms(lambda v, a=a: torch.nn.functional.ctc_loss(v.log_softmax(-1), *a), v)
        print(
            f"threads {threads} ctc {T}x{N}x{C}x{S}: ours logits {ours:.2f} / log-probs {ours_lp:.2f} ms, torch "
            f"{theirs:.2f} ms, {theirs / ours:.2f}x / {theirs / ours_lp:.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
