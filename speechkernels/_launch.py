"""Launching Triton kernels with less host time (``launch``): the compiled kernel of each specialisation kept and
run directly; ``next_power_of_2`` and ``cdiv`` for block sizes and grids (plain Python: ``triton.cdiv`` is a
constexpr function whose call from the host unwraps its arguments, a few microseconds a call)."""

from __future__ import annotations

import inspect

import torch


class Launch:
    """``kernel[grid](*args, **options)`` with less host time: the first call of each specialisation goes through
    Triton's launcher (which compiles, or finds the compiled kernel in its cache); later calls with the same
    specialisation call the compiled kernel directly, skipping Triton's per-call argument binding (about 1 us per
    argument on the H100 machine's host: benchmarks/notes/package.md).

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

    def launch(self, grid: tuple, args: tuple, options: dict, key: tuple | None = None) -> None:
        """``key``: the caller's own specialisation key, in place of the one derived from the arguments (a caller
        whose arguments but a few are fixed: a key naming the fixed ones once, e.g. by a serial number, plus the
        alignment of the others; the caller answers for it)."""
        if not args[0].is_cuda:
            self.kernel[grid](*args, **options)
            return
        dev = torch._C._cuda_getDevice()
        if key is not None:
            key = (dev, "caller", key)
        else:
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
        compiled.run(
            grid[0],
            grid[1] if len(grid) > 1 else 1,
            grid[2] if len(grid) > 2 else 1,
            torch._C._cuda_getCurrentRawStream(dev),
            compiled.function,
            compiled.packed_metadata,
            None,
            None,
            None,
            *args,
            *tail,
        )


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


def prev_power_of_2(n: int) -> int:
    """The largest power of two <= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (int(n).bit_length() - 1)


def split_blocks(n: int, block: int) -> tuple[int, int]:
    """(full blocks of ``block`` in n, the power-of-two width of a block holding the rest; 0 when none): a loop over
    the full blocks unmasked, then one block for the rest, so that n = 1025 in blocks of 1024 reads 1024 + 1 lanes."""
    full = n // block
    return full, next_power_of_2(n - full * block) if n > full * block else 0


def cdiv(n: int, d: int) -> int:
    """ceil(n / d) of non-negative integers, as ``triton.cdiv`` on the host."""
    return -(-n // d)
