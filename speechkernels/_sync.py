"""Triton helpers of kernels whose programs work together: waiting for a counter another program releases (the
wavefronts of the CTC loss and forced alignment, which split a recursion across programs), a grid-wide barrier
(the persistent greedy decoder), and taking one frame from a [BLOCK, F] tile (the frames the wavefronts pass)."""

import triton
import triton.language as tl


@triton.jit
def frame(tile, o_f, i: tl.constexpr):
    """Frame i of an integer [BLOCK, F] tile (bit patterns): integer selects and sums of zeros, which fold away
    when each thread holds its lanes' F frames (exact for any bit pattern, NaN and -inf included, unlike a float
    sum)."""
    return tl.sum(tl.where(o_f[None, :] == i, tile, 0), axis=1)


@triton.jit
def wait_counter(counter_ptr, need):
    """Spins until the int32 counter reaches ``need`` (acquire: the stores its producer made before releasing it
    are seen)."""
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire")
    while seen < need:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire")


@triton.jit
def grid_sync(bar_ptr, target):
    """Every program's stores before this are seen by every program after it (the counter reaches target =
    barriers passed x programs)."""
    tl.debug_barrier()
    tl.atomic_add(bar_ptr, 1, sem="release")
    wait_counter(bar_ptr, target)
    tl.debug_barrier()
