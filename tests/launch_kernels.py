"""A small Triton kernel for the tests of ``speechkernels._launch.Launch``."""

import triton
import triton.language as tl


@triton.jit
def axpy_kernel(x_ptr, y_ptr, n, a, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    m = o < n
    b_x = tl.load(x_ptr + o, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + o, (b_x * a * SCALE + n).to(y_ptr.dtype.element_ty), mask=m)
