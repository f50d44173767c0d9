"""Triton helpers shared by the kernels: log-space arithmetic in base 2 on float64 state values (the helpers of
programs that work together are in ``_sync``).

Constants are jit functions rather than constexpr globals: Triton re-checks every global a kernel reads at each
launch, which costs host time on the small problems where the host is the limit.
"""

import triton
import triton.language as tl


@triton.jit
def neg():
    """log2-probability of impossible states inside the recursions: finite, so that no -inf - -inf appears"""
    return -1e30


@triton.jit
def log2e():
    return 1.4426950408889634


@triton.jit
def ln2():
    return 0.6931471805599453


@triton.jit
def log2_1p(y):
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
def lae(a, b):
    """log2(2^a + 2^b) of float64 values.

    The values stay float64: they grow to thousands over long inputs, where float32 would lose the 1e-7
    absolute precision the occupancies need. Only the correction log2(1 + 2^-|a-b|), in [0, 1], is float32.
    No -inf reaches here (impossible states hold the finite neg()), so no special cases are needed.
    """
    y = tl.exp2((-tl.abs(a - b)).to(tl.float32))
    return tl.maximum(a, b) + log2_1p(y).to(tl.float64)


@triton.jit
def lse_step(b_m, b_s, b_x):
    """One step of an online log-sum-exp kept per lane, in log2 units: the running maximum b_m and sum b_s of
    exp2(x - b_m) after the values b_x (-inf: none). A lane that has seen only -inf keeps (-inf, 0)."""
    m_new = tl.maximum(b_m, b_x)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, b_s * tl.exp2(b_m - m_safe) + tl.exp2(b_x - m_safe)


@triton.jit
def lse_step_rows(b_m, b_s, x2):
    """``lse_step`` for rows taking a block of values at once: b_m, b_s [R] after x2 [R, C] (log2 units)."""
    m_new = tl.maximum(b_m, tl.max(x2, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, b_s * tl.exp2(b_m - m_safe) + tl.sum(tl.exp2(x2 - m_safe[:, None]), axis=1)


@triton.jit
def lse_total(b_m, b_s, AXIS: tl.constexpr):
    """The log-sum-exp (log2 units) of lanes along AXIS holding running maxima b_m and sums b_s (``lse_step``;
    b_s = 1 for lanes of single values); -inf when every lane is empty."""
    m_all = tl.max(b_m, axis=AXIS)
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    return m_safe + tl.log2(tl.sum(b_s * tl.exp2(b_m - tl.expand_dims(m_safe, AXIS)), axis=AXIS))
