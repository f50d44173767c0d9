"""One RNN-T forward+backward on the benchmark's inputs (for a profiler such as ncu to attach to).

python benchmarks/rnnt_once.py TxUxVxN
"""

import sys

import torch

from speechkernels.bench.rnnt import make_inputs
from speechkernels.rnnt import kernels

T, U, V, N = (int(v) for v in sys.argv[1].split("x"))
logits, targets, il, tl = make_inputs(T, U, V, N, torch.device("cuda"))
il, tl = il.long(), tl.long()
loss, (lse, occ, logp) = kernels.rnnt_forward(logits, targets, il, tl, 0, True, 1.0, False, True)
g = kernels.rnnt_backward(torch.ones_like(loss), logits, targets, il, tl, (lse, occ, logp), 0, True, 0.0, -1.0, False)
torch.cuda.synchronize()
print("loss", loss.sum().item())
