"""The op skeleton every loss is built on: from one spec, an eager ``torch.autograd.Function`` and a pair of
``torch.library`` ops (forward, backward) with their fake shapes and autograd registration, both calling the same
forward and backward functions.

A loss's kernels give ``forward(*inputs) -> (out, state)`` (state: tensors the backward needs, not
differentiable) and ``backward(grad_out, *saved, *state, *backward_args)`` (saved: the inputs the backward reads;
backward_args: its non-tensor inputs) returning one gradient per input named in ``grads`` (None where that input
is None). ``LossOp.apply`` runs the autograd.Function in eager mode (no dispatcher overhead) and the library op
under torch.compile, which traces it as one opaque op through the fake function.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import typing
from collections.abc import Callable, Iterator

import torch


class LossOp:
    """A loss as an autograd.Function and a torch.library op pair built from one spec.

    Args:
        name: the op's qualified name ("speechkernels::ctc_loss"): the ops are ``name + "_forward"`` and
            ``name + "_backward"``.
        inputs: the forward's arguments as a schema string ("Tensor x, Tensor? bias, int blank, float clamp, bool
            rna, str reduction"), in the order ``apply`` and ``forward`` take them.
        forward: ``(*inputs) -> (out, state)``, state a tuple of ``n_state`` tensors.
        forward_fake: ``(*inputs) -> (out, *state)``: empty tensors of the shapes and dtypes ``forward`` gives.
        backward: ``(grad_out, *saved, *state, *args) -> gradient or tuple of gradients`` (one for each of
            ``grads``; None for an input that is None). Its parameter names say what it takes: first the inputs
            it reads (tensors, optional ones included: they are saved for it), then ``n_state`` state tensors
            (names other than the inputs'), then non-tensor inputs; parameters after those need defaults.
        n_state: how many state tensors ``forward`` returns.
        grads: names of the inputs that have gradients, space-separated, in the order ``backward`` returns them
            (saved inputs: the backward op's fake makes its gradients' shapes from them).
        options: the op's option values by name ({"opts": TransducerOptions, ...}: NamedTuple types whose fields
            are int, float, bool, str or tuple[int, ...]): the last inputs of ``apply``, ``forward`` and
            ``forward_fake`` are one value of each, in this order, and the backward takes those it names as
            parameters, after its non-tensor inputs and in this order; the ops' schemas hold their fields as
            scalars, after ``inputs`` (the eager Function takes the values whole; only the library ops, under
            torch.compile, flatten them).
    """

    def __init__(
        self,
        name: str,
        inputs: str,
        forward: Callable,
        forward_fake: Callable,
        backward: Callable,
        *,
        n_state: int,
        grads: str,
        options: dict[str, type] | None = None,
    ) -> None:
        self.name = name
        self._options = options = dict(options or {})
        # the eager path takes the option values whole (no flattening per call); the library ops their fields
        self._eager_forward, self._eager_backward = forward, backward
        named = inspect.signature(backward).parameters
        if options:
            inputs = ", ".join([inputs, *map(options_schema, options.values())])
            forward, forward_fake = _with_options(forward, options), _with_options(forward_fake, options)
            backward = _with_options(backward, {k: t for k, t in options.items() if k in named})
        params = [p.strip().rsplit(" ", 1) for p in inputs.split(",")]
        self.types = {arg: typ for typ, arg in params}
        self.names = [arg for _typ, arg in params]
        saved, backward_args = self._backward_inputs(backward, n_state)
        grads = tuple(grads.split())
        index = {arg: i for i, arg in enumerate(self.names)}
        for arg in grads:
            if arg not in saved:
                raise ValueError(f"{name}: the input {arg!r} with a gradient is not one the backward takes")
        self._saved = [index[a] for a in saved]
        self._args = [index[a] for a in backward_args]
        self._grads = [index[a] for a in grads]
        self._optional_grads = [index[a] for a in grads if self.types[a].endswith("?")]
        self._no_grads = (None,) * len(self.names)
        # the eager inputs: the inputs before the options (the same positions), then one value per option type
        n_plain = len(self.names) - sum(len(t._fields) for t in options.values())
        fields = {f for t in options.values() for f in t._fields}
        self._eager_args = [index[a] for a in backward_args if a not in fields]
        self._eager_args += [n_plain + i for i, key in enumerate(options) if key in named]
        self._eager_no_grads = (None,) * (n_plain + len(options))
        self._forward, self._backward, self._n_state = forward, backward, n_state
        self._function = self._eager_function()
        self._fwd_op, self._bwd_op = self._library_ops(forward_fake, saved, backward_args)

    def _backward_inputs(self, backward: Callable, n_state: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The inputs the backward reads (saved) and its non-tensor inputs, from its parameter names."""
        params = list(inspect.signature(backward).parameters.values())[1:]
        saved = []
        while params and params[0].name in self.types:
            saved.append(params.pop(0).name)
        state, params = params[:n_state], params[n_state:]
        args = []
        while params and params[0].name in self.types:
            args.append(params.pop(0).name)
        for key, options in self._options.items():  # an option value's fields, in order
            if params and params[0].name == key:
                params.pop(0)
                args += options._fields
        if len(state) < n_state or any(p.name in self.types for p in state):
            raise ValueError(
                f"{self.name}: the backward's parameters {[p.name for p in state]} are not n_state="
                f"{n_state} state tensors after the saved inputs {saved}"
            )
        if any(p.default is inspect.Parameter.empty for p in params):
            raise ValueError(f"{self.name}: the backward's parameters {[p.name for p in params]} are not inputs")
        return tuple(saved), tuple(args)

    def apply(self, *inputs):
        """The loss (``forward``'s out), differentiable with respect to the ``grads`` inputs."""
        if not torch.compiler.is_compiling():
            return self._function.apply(*inputs)
        if self._options:
            k = len(inputs) - len(self._options)
            flat = inputs[:k]
            for value in inputs[k:]:
                flat += tuple(value)  # a NamedTuple's fields (tuple(): torch.compile adds no NamedTuple to a tuple)
            inputs = flat
        return self._fwd_op(*inputs)[0]

    # -----------------------------------------------------------------------------------------------------------

    def _grads_of_inputs(self, grads, missing: tuple, no_grads: tuple | None = None) -> tuple:
        """The backward's gradients placed at their inputs' positions (``no_grads``: one None per input, the
        library op's by default): None for every other input, and for the inputs in ``missing`` (optional inputs
        with a gradient that were None)."""
        out = list(self._no_grads if no_grads is None else no_grads)
        if isinstance(grads, (tuple, list)):
            for i, g in zip(self._grads, grads, strict=True):
                out[i] = g
        else:
            (i,) = self._grads
            out[i] = grads
        for i in missing:
            out[i] = None
        return tuple(out)

    def _save(self, ctx, inputs, state, args: list[int] | None = None) -> None:
        """What the backward needs, on ``ctx``: the saved inputs and the state as tensors, the non-tensor inputs
        (those at ``args``, the library op's by default), and which optional inputs with a gradient were None."""
        ctx.save_for_backward(*[inputs[i] for i in self._saved], *state)
        ctx.args = [inputs[i] for i in (self._args if args is None else args)]
        ctx.missing = [i for i in self._optional_grads if inputs[i] is None] if self._optional_grads else ()

    def _eager_function(self) -> type:
        op = self

        class Function(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *inputs):
                out, state = op._eager_forward(*inputs)
                op._save(ctx, inputs, state, op._eager_args)
                return out

            @staticmethod
            def backward(ctx, grad_out):
                grads = op._eager_backward(grad_out, *ctx.saved_tensors, *ctx.args)
                return op._grads_of_inputs(grads, ctx.missing, op._eager_no_grads)

        Function.__name__ = Function.__qualname__ = _camel(self.name) + "Function"
        return Function

    def _library_ops(self, forward_fake, saved, backward_args):
        n_out = 1 + self._n_state
        fwd_schema = f"({', '.join(f'{self.types[a]} {a}' for a in self.names)}) -> ({', '.join(['Tensor'] * n_out)})"
        bwd_params = ["Tensor grad_out", *(f"{self.types[a]} {a}" for a in saved)]
        bwd_params += [f"Tensor state{k}" for k in range(self._n_state)]
        bwd_params += [f"{self.types[a]} {a}" for a in backward_args]
        bwd_schema = f"({', '.join(bwd_params)}) -> ({', '.join(['Tensor'] * len(self._grads))})"
        n_saved = len(saved)

        def fwd(*inputs):
            out, state = self._forward(*inputs)
            # an op's outputs start their storage (a batch reduction may be an element after the per-sample
            # losses: compiled graphs expect aligned outputs; inside the op, views do not record their base)
            return (out if out.storage_offset() == 0 else out.clone(), *state)

        def bwd(grad_out, *rest):
            grads = self._backward(grad_out, *rest)
            if not isinstance(grads, (tuple, list)):
                grads = (grads,)
            # an op returns tensors: an empty one for a missing input's gradient
            return _one_or_tuple(tuple(grad_out.new_empty(0) if g is None else g for g in grads))

        def bwd_fake(grad_out, *rest):
            saved_inputs = rest[:n_saved]
            by_name = dict(zip(saved, saved_inputs, strict=True))
            inputs = [by_name.get(self.names[i]) for i in self._grads]
            return _one_or_tuple(tuple(grad_out.new_empty(0) if x is None else torch.empty_like(x) for x in inputs))

        fwd_op = torch.library.custom_op(self.name + "_forward", fwd, mutates_args=(), schema=fwd_schema)
        bwd_op = torch.library.custom_op(self.name + "_backward", bwd, mutates_args=(), schema=bwd_schema)
        fwd_op.register_fake(forward_fake)
        bwd_op.register_fake(bwd_fake)

        def setup_context(ctx, inputs, output):
            _out, *state = output
            self._save(ctx, inputs, state)
            ctx.mark_non_differentiable(*state)

        def backward(ctx, grad_out, *_grads_of_the_state):
            return self._grads_of_inputs(bwd_op(grad_out, *ctx.saved_tensors, *ctx.args), ctx.missing)

        fwd_op.register_autograd(backward, setup_context=setup_context)
        return fwd_op, bwd_op


def _float32_but_float64(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def pytorch_path_op(
    name: str,
    inputs: str,
    losses: Callable,
    batch_dim: int,
    grad_dtype: Callable = _float32_but_float64,
    options: dict[str, type] | None = None,
) -> LossOp:
    """A loss's PyTorch path as a LossOp, so that under torch.compile it is one opaque op whose checks of the
    tensors' contents and per-sample branches run on real values (whole graph, no recompilation per length).

    ``inputs`` starts with "Tensor x" (the scores, differentiable) and has a "bool need_grad";
    ``losses(*inputs) -> (per-sample losses [N], gradient of their sum with x's shape or None)`` gets x
    contiguous (a reduction's rounding depends on its layout: a view gives the bits of its contiguous copy).
    The op's loss is float32 (float64 for float64 x); its gradient, of dtype ``grad_dtype(x.dtype)``, is kept
    and scaled by the upstream gradient along x's ``batch_dim`` in the backward, then cast to x's dtype (by
    default float32, float64 for float64 x). ``options``: as LossOp's (``losses`` takes the values last)."""
    names = [p.strip().rsplit(" ", 1)[1] for p in inputs.split(",")]
    if names[0] != "x" or "need_grad" not in names:
        raise ValueError(f"{name}: the inputs must start with x and have need_grad, got {names}")
    need_grad_at = names.index("need_grad")

    def loss_dtype(x: torch.Tensor) -> torch.dtype:
        return _float32_but_float64(x.dtype)

    def forward(x, *rest):
        loss, grad = losses(x.contiguous(), *rest)
        if grad is None:
            grad = x.new_empty(0, dtype=grad_dtype(x.dtype))
        return loss.to(loss_dtype(x)), (grad,)

    def forward_fake(x, *rest):
        N = x.shape[batch_dim]
        need_grad = rest[need_grad_at - 1]
        grad = x.new_empty(x.shape if need_grad else (0,), dtype=grad_dtype(x.dtype))
        return x.new_empty(N, dtype=loss_dtype(x)), grad

    def backward(grad_out, x, kept_grad):
        shape = [1] * kept_grad.dim()
        shape[batch_dim] = -1
        return (kept_grad * grad_out.to(kept_grad.dtype).view(shape)).to(x.dtype)

    return LossOp(name, inputs, forward, forward_fake, backward, n_state=1, grads="x", options=options)


_AUTOGRAD_KEYS = [
    getattr(torch._C.DispatchKey, k)
    for k in ("ADInplaceOrView", "AutogradFunctionality")
    if hasattr(torch._C.DispatchKey, k)
]


@contextlib.contextmanager
def autograd_inside_op() -> Iterator[None]:
    """Autograd inside an op's implementation, for the float64 references that take their gradient by autograd:
    the dispatcher runs a torch.library op below autograd (its dispatch keys excluded, grad mode aside)."""
    is_excluded = getattr(torch._C, "_dispatch_tls_is_dispatch_key_excluded", None)
    set_excluded = getattr(torch._C, "_dispatch_tls_set_dispatch_key_excluded", None)
    if is_excluded is None or set_excluded is None:
        with torch.enable_grad():
            yield
        return
    was = [is_excluded(k) for k in _AUTOGRAD_KEYS]
    try:
        for k in _AUTOGRAD_KEYS:
            set_excluded(k, False)
        with torch.enable_grad():
            yield
    finally:
        for k, w in zip(_AUTOGRAD_KEYS, was, strict=True):
            set_excluded(k, w)


class LossModule(torch.nn.Module):
    """The module form of a loss function: ``class CTCLoss(LossModule, loss=ctc_loss, inputs=4)`` takes the
    function's options (its arguments after the first ``inputs``) in its constructor, with their names, order and
    defaults, keeps each as an attribute of that name, and ``forward(*inputs)`` calls the function with them. The
    two forms share one signature, so they cannot drift apart; ``inspect.signature`` and ``help`` show it."""

    _loss: Callable
    _option_names: tuple[str, ...] = ()
    _constructor: inspect.Signature

    def __init_subclass__(cls, loss: Callable | None = None, inputs: int = 4, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if loss is None:
            return
        params = list(inspect.signature(loss).parameters.values())
        cls._loss = staticmethod(loss)
        cls._option_names = tuple(p.name for p in params[inputs:])
        cls._constructor = inspect.Signature(params[inputs:], return_annotation=None)
        cls.__signature__ = cls._constructor

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()
        for name, value in bound_arguments(self, self._constructor, args, kwargs).items():
            setattr(self, name, value)

    def forward(self, *inputs) -> torch.Tensor:
        return self._loss(*inputs, **{name: getattr(self, name) for name in self._option_names})

    def extra_repr(self) -> str:
        return ", ".join(f"{name}={getattr(self, name)!r}" for name in self._option_names)


def bound_arguments(module: torch.nn.Module, signature: inspect.Signature, args, kwargs, hint: str = "") -> dict:
    """A module constructor's arguments bound to ``signature``, defaults applied, by name; a TypeError names the
    module's class (then ``hint``)."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{type(module).__name__}: {e}{hint}") from None
    bound.apply_defaults()
    return bound.arguments


def _camel(name: str) -> str:
    return "".join(w.capitalize() for w in name.split("::")[-1].split("_"))


def _one_or_tuple(xs: tuple):
    """An op's outputs as its schema has them: "-> (Tensor)" is one tensor, not a tuple of one."""
    return xs[0] if len(xs) == 1 else xs


_SCHEMA_TYPES = {int: "int", float: "float", bool: "bool", str: "str", tuple[int, ...]: "int[]"}


def options_schema(options: type) -> str:
    """The scalar inputs of an op's schema for a NamedTuple type of options: "int blank, float clamp, ..."."""
    hints = typing.get_type_hints(options)
    return ", ".join(f"{_SCHEMA_TYPES[hints[f]]} {f}" for f in options._fields)


def _with_options(fn: Callable, options: dict[str, type]) -> Callable:
    """``fn(*inputs, *values)`` (one value of each of ``options``' types) called with the ops' flat inputs, each
    value's fields in turn (``inspect.signature`` still shows fn's, which LossOp reads for the backward)."""
    if not options:
        return fn
    spans, end = [], 0  # each type's fields as a slice counted from the end of the arguments
    for t in reversed(options.values()):
        spans.insert(0, (t, -end - len(t._fields), -end or None))
        end += len(t._fields)
    new = tuple.__new__

    @functools.wraps(fn)
    def flat(*args):
        return fn(*args[:-end], *[new(t, args[a:b]) for t, a, b in spans])

    return flat
