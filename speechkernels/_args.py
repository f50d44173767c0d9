"""Argument normalisation and checks shared by the capabilities' public functions.

Argument normalisation: every public function takes its scalars, lengths and flags through the ``as_*``
functions below, so that every capability accepts the same forms and rejects the same mistakes with a
``ValueError`` that names the argument (and the offending element):

- an integer is anything with Python's integer protocol (``operator.index``: int, numpy integers, 0-d integer
  tensors), never a bool or a float (4.0 included, as torch's own functions refuse it);
- a real number is an int or float (numpy's and 0-d tensors' too), never a bool, a string or NaN;
- lengths are a 1-D integer tensor on any device, an integer numpy array, a sequence of integers or one integer.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence

import numpy as np
import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    text = repr(value)
    return f"{text if len(text) <= 40 else text[:37] + '...'} ({type(value).__name__})"


def as_int(value, name: str, *, minimum: int | None = None) -> int:
    """``value`` as a Python int: an int, a numpy integer or a 0-d integer tensor (not a bool or a float)."""
    if type(value) is not int:
        if isinstance(value, (bool, np.bool_)) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
            raise ValueError(f"{name} must be an integer, got {_describe(value)}")
        try:
            value = operator.index(value)
        except TypeError:
            raise ValueError(f"{name} must be an integer, got {_describe(value)}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def as_float(value, name: str, *, minimum: float | None = None, finite: bool = False) -> float:
    """``value`` as a Python float: an int or float (numpy's, or a 0-d real tensor), never a bool, a string
    or NaN; with ``finite``, never infinite either."""
    if type(value) is not float and type(value) is not int:
        bad = isinstance(value, (bool, np.bool_, str, bytes, complex))
        if isinstance(value, torch.Tensor):
            bad = value.numel() != 1 or value.dim() != 0 or value.dtype == torch.bool or value.dtype.is_complex
        elif not bad:
            bad = not isinstance(value, (numbers.Real, np.floating, np.integer))
        if bad:
            raise ValueError(f"{name} must be a real number, got {_describe(value)}")
    value = float(value)
    if math.isnan(value) or (finite and math.isinf(value)):
        raise ValueError(f"{name} must be a {'finite ' if finite else ''}number, got {value}")
    if minimum is not None and not value >= minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def as_bool(value, name: str) -> bool:
    """``value`` as a bool: True/False (numpy's too); anything else, truthy or not, is refused."""
    if type(value) is bool:
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {_describe(value)}")


def as_choice(value, name: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {listed}, got {_describe(value)}")
    return value


def as_generator(value, name: str = "generator") -> torch.Generator | None:
    if value is not None and not isinstance(value, torch.Generator):
        raise ValueError(f"{name} must be a torch.Generator or None, got {_describe(value)}")
    return value


def as_index_tensor(
    value: torch.Tensor | np.ndarray | Sequence[int] | int,
    name: str,
    device: torch.device,
    keep: tuple[torch.dtype, ...] = (torch.int64,),
) -> torch.Tensor:
    """Lengths as a 1-D tensor on ``device``: given as a tensor (any device, integer dtype), an integer numpy
    array, a sequence of integers or one integer. A tensor keeps its dtype if it is in ``keep`` (no conversion
    launch), else becomes int64. Floats, bools and non-integral values are refused, naming the element. The result
    is contiguous (the kernels read lengths as packed arrays): a view's values are copied once, tiny as they are."""
    if isinstance(value, torch.Tensor):
        check_integer_tensor(value, name)
        if value.dim() > 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(value.shape)}")
        dtype = value.dtype if value.dtype in keep else torch.int64
        return value.to(device=device, dtype=dtype, non_blocking=True).reshape(-1).contiguous()
    if isinstance(value, np.ndarray):
        if value.ndim > 1:
            raise ValueError(f"{name} must be 1-D, got shape {value.shape}")
        value = value.reshape(-1)
        if not np.issubdtype(value.dtype, np.integer):
            items = value.tolist()
            j = next((j for j, v in enumerate(items) if type(v) is not int), 0)
            raise ValueError(f"{name} must hold integers: {name}[{j}] is {items[j]!r} (numpy {value.dtype})")
        return torch.from_numpy(value.astype(np.int64)).to(device, non_blocking=True)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        return torch.tensor([as_int(value, name)], dtype=torch.int64).to(device, non_blocking=True)
    ints = []
    for j, v in enumerate(value):
        if type(v) is int:
            ints.append(v)
            continue
        try:
            ints.append(as_int(v, f"{name}[{j}]"))
        except ValueError:
            raise ValueError(f"{name} must hold integers: {name}[{j}] is {_describe(v)}") from None
    return torch.tensor(ints, dtype=torch.int64).to(device, non_blocking=True)


def check_integer_tensor(x: torch.Tensor, name: str, what: str = "integers") -> None:
    """``x`` is a tensor of an integer dtype (not bool) holding ``what``."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise ValueError(f"{name} must hold {what}, got a tensor of dtype {x.dtype}")


def check_in_range(x: torch.Tensor, name: str, high: int, bound: str, what: str | None = None) -> None:
    """Raises ValueError naming the first element of the integer tensor ``x`` outside [0, high) (``bound`` spells
    ``high`` in the message, ``what`` the values). One read of x's min and max (a synchronisation on the GPU);
    the search only on error."""
    if x.numel() == 0:
        return
    lo, hi = torch.stack(torch.aminmax(x)).tolist()
    if lo >= 0 and hi < high:
        return
    idx = ((x < 0) | (x >= high)).nonzero()[0].tolist()
    element = f"{name}[{', '.join(map(str, idx))}]" if idx else name
    raise ValueError(f"{what or name} must be in [0, {bound}), got {element}={x[tuple(idx)].item()}")


def check_float_input(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float16, bfloat16, float32 or float64, got {x.dtype}")
