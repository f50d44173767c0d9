"""One RNN-T forward+backward on the benchmark's inputs (for a profiler such as ncu to attach to).

python benchmarks/rnnt_once.py TxUxVxN
"""

import sys

import torch

from speechkernels._transducer.options import TransducerOptions
from speechkernels.bench.rnnt import make_inputs
from speechkernels.rnnt import kernels

T, U, V, N = (int(v) for v in sys.argv[1].split("x"))
logits, targets, il, tl = make_inputs(T, U, V, N, torch.device("cuda"))
il, tl = il.long(), tl.long()
opts = TransducerOptions(blank=0, reduction="none")
loss, (lse, occ, logp) = kernels.rnnt_forward(logits, targets, il, tl, opts, True)
g = kernels.rnnt_backward(torch.ones_like(loss), logits, targets, il, tl, (lse, occ, logp), opts)
torch.cuda.synchronize()
print("loss", loss.sum().item())
