"""Triton helpers shared by the loss kernels: log-space arithmetic in base 2 on float64 state values.

Constants are jit functions rather than constexpr globals: Triton re-checks every global a kernel reads at each
launch, which costs host time on the small problems where the host is the limit.
"""

import triton
import triton.language as tl


@triton.jit
def _neg():
    """log2-probability of impossible states inside the recursions: finite, so that no -inf - -inf appears"""
    return -1e30


@triton.jit
def _log2e():
    return 1.4426950408889634


@triton.jit
def _ln2():
    return 0.6931471805599453


@triton.jit
def _log2_1p(y):
    """log2(1 + y) for y in [0, 1] in float32: y * (degree-8 polynomial), Chebyshev fit, abs error < 1.4e-7,
    mean error 2e-9, exactly 0 at y = 0. Ten FMAs instead of a logarithm."""
    p = 0.0055186552926898
    p = p * y - 0.033734794706106186
    p = p * y + 0.09695229679346085
    p = p * y - 0.18180975317955017
    p = p * y + 0.2671563923358917
    p = p * y - 0.3556952476501465
    p = p * y + 0.4802195727825165
    p = p * y - 0.7213010787963867
    p = p * y + 1.4426939487457275
    return p * y


@triton.jit
def _lae(a, b):
    """log2(2^a + 2^b) of float64 values.

    The values stay float64: they grow to thousands over long inputs, where float32 would lose the 1e-7
    absolute precision the occupancies need. Only the correction log2(1 + 2^-|a-b|), in [0, 1], is float32.
    No -inf reaches here (impossible states hold the finite _neg()), so no special cases are needed.
    """
    y = tl.exp2((-tl.abs(a - b)).to(tl.float32))
    return tl.maximum(a, b) + _log2_1p(y).to(tl.float64)
