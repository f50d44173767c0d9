"""Small helpers shared by the capabilities: backend choice, argument normalisation, dtype handling.

Argument normalisation: every public function takes its scalars, lengths and flags through the ``as_*``
functions below, so that every capability accepts the same forms and rejects the same mistakes with a
``ValueError`` that names the argument (and the offending element):

- an integer is anything with Python's integer protocol (``operator.index``: int, numpy integers, 0-d integer
  tensors), never a bool or a float (4.0 included, as torch's own functions refuse it);
- a real number is an int or float (numpy's and 0-d tensors' too), never a bool, a string or NaN;
- lengths are a 1-D integer tensor on any device, an integer numpy array, a sequence of integers or one integer.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import numbers
import operator
import os
from collections.abc import Sequence

import numpy as np
import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)


POISON_OUTPUTS = False  # tests: kernel outputs start as NaN (floats) or -123456789 (integers)


def kernel_output(*shape, dtype: torch.dtype, device) -> torch.Tensor:
    """Allocation of every kernel output; under ``POISON_OUTPUTS`` (the tests) filled with NaN (floats) or
    -123456789 (integers), so that an element a kernel leaves unwritten shows."""
    return _poison(torch.empty(*shape, dtype=dtype, device=device))


def kernel_output_like(x: torch.Tensor) -> torch.Tensor:
    return _poison(torch.empty_like(x))


def _poison(t: torch.Tensor) -> torch.Tensor:
    if POISON_OUTPUTS:
        t.fill_(math.nan if t.dtype.is_floating_point else -123456789)
    return t


def triton_missing(error: ImportError) -> None:
    """For the ``except ImportError as error`` around a kernels module's import: None where Triton itself is what
    is missing (the PyTorch path then serves every call); any other import error propagates."""
    if (error.name or "").split(".")[0] != "triton":
        raise error
    return None


def triton_interpreting() -> bool:
    """True when Triton kernels run on the CPU through the interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# PyTorch's CPU kernels split an operation over threads from about this many elements (at::internal::GRAIN_SIZE)
GRAIN_SIZE = 32768


@contextlib.contextmanager
def loop_threads(device: torch.device, elements_per_step: int, below: int = GRAIN_SIZE):
    """The threads for a loop of small sequential steps (a recursion over frames, a sample at a time): on the CPU,
    one where each step touches fewer than GRAIN_SIZE elements, else torch's setting. Steps that small gain
    nothing from more threads and, where another process shares the cores, wait at each parallel operation for
    the thread left on a busy core (WaveNet.generate 2 x 400 on two cores with one busy neighbour: 2.0-2.5x its
    idle time with two threads, 1.0x with one; benchmarks/NOTES.md). The large operations before and after the
    loop keep ``torch.get_num_threads()``; the setting is this thread's own and is restored on exit. ``below``:
    the threshold for other work of small operations."""
    n = torch.get_num_threads()
    if device.type != "cpu" or n == 1 or elements_per_step >= below or torch.compiler.is_compiling():
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def use_triton(x: torch.Tensor) -> bool:
    """Whether the Triton kernels handle ``x``: CUDA tensors of a kernel dtype, or, under the interpreter,
    CPU float32/float16 tensors (the interpreter has no bfloat16; float64 always takes the PyTorch path)."""
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    if x.is_cuda:
        return True
    return triton_interpreting() and x.device.type == "cpu" and x.dtype != torch.bfloat16


def kernel_layout(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the kernels read scores, so that their results depend on its values only: itself when contiguous
    and 16-byte aligned (no copy), else a contiguous copy. Triton compiles a kernel per layout (a unit stride and a
    16-byte alignment are compile-time facts that choose vector widths and register layouts), and the reductions
    of two such kernels round differently: a view (transposed, strided, at an odd offset) must give the bits of its
    contiguous copy. Under torch.compile (no addresses while tracing) contiguous only."""
    if torch.compiler.is_compiling():
        return x.contiguous()
    if x.is_contiguous() and x.data_ptr() % 16 == 0:
        return x
    return x.clone(memory_format=torch.contiguous_format)


class Launch:
    """``kernel[grid](*args, **options)`` with less host time: the first call of each specialisation goes through
    Triton's launcher (which compiles, or finds the compiled kernel in its cache); later calls with the same
    specialisation call the compiled kernel directly, skipping Triton's per-call argument binding (about 1 us per
    argument on the H100 machine's host: benchmarks/NOTES.md).

    The key is a superset of Triton's specialisation: every tensor's dtype and 16-byte alignment, every integer's
    equality to 1, divisibility by 16 and range (int32, int64), floats by type, other arguments (bool, None) and
    ``options`` (constexprs, num_warps) by value, and the current device. Positional arguments are the kernel's
    run-time parameters; constexprs and launch options are keywords. CPU tensors (the interpreter) and launches
    while a launch hook is set (profilers) take Triton's own path every time.
    """

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self._params = list(inspect.signature(kernel.fn).parameters.values())
        self._compiled: dict = {}
        self._keys: dict = {}  # argument types -> their key function

    def __getitem__(self, grid: tuple):
        return lambda *args, **options: self.launch(grid, args, options)

    def launch(self, grid: tuple, args: tuple, options: dict) -> None:
        if not args[0].is_cuda:
            self.kernel[grid](*args, **options)
            return
        dev = torch._C._cuda_getDevice()
        types = tuple(map(type, args))
        key_of = self._keys.get(types)
        if key_of is None:
            key_of = self._keys[types] = _key_function(types)
        key = key_of(dev, tuple(options.items()), *args)
        entry = self._compiled.get(key)
        if entry is None or _launch_hooks():
            compiled = self.kernel[grid](*args, **options)
            if entry is None and hasattr(compiled, "packed_metadata"):
                # the parameters after the positional ones (constexprs), as Triton binds them
                tail = [options[p.name] if p.name in options else p.default for p in self._params[len(args) :]]
                self._compiled[key] = (compiled, tuple(tail))
            return
        compiled, tail = entry
        compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                     torch._C._cuda_getCurrentRawStream(dev), compiled.function, compiled.packed_metadata, None, None,
                     None, *args, *tail)  # fmt: skip


_LAUNCHES: dict[int, Launch] = {}


def launch(kernel) -> Launch:
    """The :class:`Launch` of a @triton.jit kernel (one per kernel): ``launch(kernel)[grid](*args, **options)``."""
    found = _LAUNCHES.get(id(kernel))
    if found is None or found.kernel is not kernel:
        found = _LAUNCHES[id(kernel)] = Launch(kernel)
    return found


def _key_function(types: tuple):
    """A function (dev, options, *args) -> the specialisation key of arguments of these types (one expression,
    no call per argument)."""
    names = [f"a{i}" for i in range(len(types))]
    parts = []
    for a, t in zip(names, types, strict=True):
        if t is torch.Tensor:
            parts.append(f"{a}.dtype, {a}.data_ptr() & 15 == 0")
        elif t is int:
            parts.append(f"{a} == 1, {a} & 15 == 0, -0x80000000 <= {a} <= 0x7FFFFFFF")
        elif t is not float:  # a run-time float is never specialised on its value
            parts.append(a)
    source = f"def key(dev, options, {', '.join(names)}):\n    return (dev, options, {', '.join(parts)})\n"
    namespace: dict = {}
    exec(source, namespace)
    return namespace["key"]


def _launch_hooks() -> bool:
    """Whether a launch hook is set (a profiler's): Triton's hooks are None or chains of calls, empty by default."""
    runtime = _RUNTIME_KNOBS or _triton_runtime_knobs()
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return (enter is not None and bool(getattr(enter, "calls", True))) or (
        leave is not None and bool(getattr(leave, "calls", True))
    )


_RUNTIME_KNOBS = None


def _triton_runtime_knobs():
    global _RUNTIME_KNOBS
    from triton import knobs

    _RUNTIME_KNOBS = knobs.runtime
    return _RUNTIME_KNOBS


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


# ---------------------------------------------------------------------------------------------------------------
# argument normalisation


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
