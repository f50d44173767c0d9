"""A transducer's prediction and joint networks as plain tensors (``TransducerWeights``, what the decoding kernels
and the PyTorch path take), read from the modules that hold them: NeMo's ``RNNTDecoder`` / ``RNNTJoint``, icefall's
stateless ``Decoder`` / ``Joiner``, this library's joint losses with ``LSTMPredictor`` or ``StatelessPredictor``
(prediction networks to train with them), or the layers themselves. NeMo and icefall are never imported: their
modules are read through the attributes named in each reader, and a missing one is named in the error. Below them,
the prediction network's step in PyTorch (``predict``, ``start_state``) and a search's start (``search_start``),
shared by the PyTorch path and the launchers that run the networks in PyTorch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._args import as_choice, as_int
from .._transducer.activations import ACTIVATIONS, activation_fn
from ..tdt.api import durations_of
from .hypotheses import TransducerState

_ACTIVATION_MODULES = {torch.nn.ReLU: "relu", torch.nn.Tanh: "tanh", torch.nn.Sigmoid: "sigmoid"}


class TransducerWeights(NamedTuple):
    """A transducer's prediction and joint networks as tensors (one dtype, one device).

    Prediction network: ``embedding`` [R, P] (R token rows), then either ``lstm`` (per layer ``(w_ih [4H, in],
    w_hh [4H, H], b_ih [4H] or None, b_hh [4H] or None)``, torch.nn.LSTM's layout and gate order i, f, g, o) or,
    stateless, ``conv`` [P, P / groups, K] over the last K = ``context_size`` tokens' embeddings (tokens before the
    start embed as zeros) followed by a relu (icefall's ``Decoder``); with neither, the embedding itself.
    Joint: ``act(enc_w @ x + enc_b + pred_w @ g + pred_b)`` then ``out_w`` [V (+ D), J] @ . + ``out_b``: V token
    classes (the blank among them), then D duration logits (TDT).
    """

    embedding: torch.Tensor
    lstm: tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None], ...]
    conv: torch.Tensor | None
    groups: int
    context_size: int
    enc_w: torch.Tensor
    enc_b: torch.Tensor | None
    pred_w: torch.Tensor
    pred_b: torch.Tensor | None
    out_w: torch.Tensor
    out_b: torch.Tensor | None
    activation: str

    def tensors(self) -> list[torch.Tensor]:
        return [
            t
            for t in (
                self.embedding,
                *(x for layer in self.lstm for x in layer),
                self.conv,
                self.enc_w,
                self.enc_b,
                self.pred_w,
                self.pred_b,
                self.out_w,
                self.out_b,
            )
            if t is not None
        ]

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> TransducerWeights:
        def cast(t):
            return None if t is None else t.detach().to(device=device, dtype=dtype)

        return self._replace(
            embedding=cast(self.embedding),
            lstm=tuple(tuple(cast(t) for t in layer) for layer in self.lstm),
            conv=cast(self.conv),
            **{k: cast(getattr(self, k)) for k in ("enc_w", "enc_b", "pred_w", "pred_b", "out_w", "out_b")},
        )

    @property
    def stateless(self) -> bool:
        return not self.lstm


class LSTMPredictor(torch.nn.Module):
    """An LSTM prediction network (NeMo's ``RNNTDecoder``): an embedding of the ``vocab_size`` token classes (the
    blank's row is the start symbol's), then ``num_layers`` LSTM layers.

    ``forward(targets [N, U])`` gives the states before each label and after the last, [N, U + 1, hidden_size]: what
    :class:`~speechkernels.RNNTJointLoss` and :class:`~speechkernels.TDTJointLoss` take as ``predictor_outputs``.
    Entries of ``targets`` outside [0, vocab_size) (padding such as -1) are read as the blank: past a label's
    length they change nothing before it.

    Example:
        >>> predictor = LSTMPredictor(vocab_size=129, embed_dim=64, hidden_size=64, blank=-1)
        >>> joint = TDTJointLoss(80, 64, 64, 129, durations=[0, 1, 2])
        >>> loss = joint(encoder_out, predictor(targets), targets, frames, labels)
        >>> decoder = TransducerDecoder.from_joint(joint, predictor)
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        hidden_size: int,
        num_layers: int = 1,
        blank: int = -1,
        *,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        vocab_size = as_int(vocab_size, "vocab_size", minimum=1)
        self.blank = _blank_index(blank, vocab_size)
        self.embedding = torch.nn.Embedding(
            vocab_size, as_int(embed_dim, "embed_dim", minimum=1), device=device, dtype=dtype
        )
        self.lstm = torch.nn.LSTM(
            embed_dim,
            as_int(hidden_size, "hidden_size", minimum=1),
            as_int(num_layers, "num_layers", minimum=1),
            batch_first=True,
            device=device,
            dtype=dtype,
        )

    def forward(self, targets: torch.Tensor) -> torch.Tensor:
        return self.lstm(self.embedding(_with_start(targets, self.blank, self.embedding.num_embeddings, 1)))[0]


class StatelessPredictor(torch.nn.Module):
    """A stateless prediction network (icefall's ``Decoder``): the embeddings of the last ``context_size`` tokens
    (before the start: zeros; the start symbol: the blank), mixed by a grouped Conv1d without bias and a relu when
    ``context_size`` > 1. ``forward(targets [N, U])`` gives [N, U + 1, dim] as :class:`LSTMPredictor`'s."""

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        context_size: int = 2,
        blank: int = 0,
        groups: int | None = None,
        *,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        vocab_size = as_int(vocab_size, "vocab_size", minimum=1)
        dim = as_int(dim, "dim", minimum=1)
        self.blank = _blank_index(blank, vocab_size)
        self.context_size = as_int(context_size, "context_size", minimum=1)
        groups = (dim // 4 if dim % 4 == 0 else 1) if groups is None else as_int(groups, "groups", minimum=1)
        self.embedding = torch.nn.Embedding(vocab_size, dim, device=device, dtype=dtype)
        self.conv = None
        if self.context_size > 1:
            self.conv = torch.nn.Conv1d(
                dim, dim, self.context_size, groups=groups, bias=False, device=device, dtype=dtype
            )

    def forward(self, targets: torch.Tensor) -> torch.Tensor:
        y = _with_start(targets, self.blank, self.embedding.num_embeddings, self.context_size)
        e = self.embedding(y.clamp(min=0)) * (y >= 0)[..., None].to(self.embedding.weight.dtype)
        if self.conv is None:
            return e
        return torch.relu(self.conv(e.transpose(1, 2)).transpose(1, 2))


def _with_start(targets: torch.Tensor, blank: int, V: int, K: int) -> torch.Tensor:
    """[N, K - 1 + 1 + U]: K - 1 tokens -1 (zeros when embedded), the blank as the start symbol, then ``targets``
    with values outside [0, V) read as the blank."""
    if not isinstance(targets, torch.Tensor) or targets.dim() != 2 or targets.dtype.is_floating_point:
        raise ValueError("targets must be an integer tensor [N, U]")
    y = torch.where((targets >= 0) & (targets < V), targets, blank).long()
    start = torch.full((y.shape[0], K), -1, dtype=torch.long, device=y.device)
    start[:, -1] = blank
    return torch.cat((start, y), 1)


def _blank_index(blank, V: int) -> int:
    blank = as_int(blank, "blank")
    if not -V <= blank < V:
        raise ValueError(f"blank={blank} is outside [-V, V) for V={V} token classes")
    return blank % V


def _attr(obj, path: str, what: str):
    """obj.<path> (dots for attributes, [key] for items), or ValueError naming the missing step."""
    cur, done = obj, what
    for part in path.replace("[", ".[").split("."):
        if not part:
            continue
        try:
            cur = cur[part[1:-1].strip("\"'")] if part.startswith("[") else getattr(cur, part)
        except (AttributeError, KeyError, TypeError):
            raise ValueError(
                f"{what} has no {done}{part if part.startswith('[') else '.' + part} (an unsupported "
                f"layout: {path} is read)"
            ) from None
        done += part if part.startswith("[") else "." + part
    return cur


def _linear(module, name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not isinstance(module, torch.nn.Linear):
        raise ValueError(f"{name} must be a torch.nn.Linear, got {type(module).__name__}")
    return module.weight, module.bias


def _lstm_layers(lstm, name: str):
    if not isinstance(lstm, torch.nn.LSTM):
        raise ValueError(f"{name} must be a torch.nn.LSTM, got {type(lstm).__name__}")
    if lstm.bidirectional or lstm.proj_size:
        raise ValueError(f"{name}: a bidirectional LSTM or one with proj_size cannot predict (unsupported layout)")
    return tuple(
        tuple(getattr(lstm, f"{k}_l{layer}", None) for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
        for layer in range(lstm.num_layers)
    )


def transducer_weights(
    embedding, enc, pred, out, *, lstm=None, conv=None, activation: str = "relu", stateless_context: int = 1
) -> TransducerWeights:
    """TransducerWeights of the layers (the tensors themselves, not copies): ``embedding`` (torch.nn.Embedding),
    ``enc``/``pred``/``out`` (torch.nn.Linear), ``lstm`` (torch.nn.LSTM) or ``conv`` (torch.nn.Conv1d over
    ``stateless_context`` tokens) or neither."""
    if not isinstance(embedding, torch.nn.Embedding):
        raise ValueError(f"embedding must be a torch.nn.Embedding, got {type(embedding).__name__}")
    if lstm is not None and conv is not None:
        raise ValueError("a prediction network has an lstm or a conv, not both")
    P = embedding.embedding_dim
    layers = ()
    if lstm is not None:
        layers = _lstm_layers(lstm, "lstm")
        if lstm.input_size != P:
            raise ValueError(f"lstm.input_size={lstm.input_size} does not match the embedding's width {P}")
    K, groups, conv_w = 1, 1, None
    if conv is not None:
        if not isinstance(conv, torch.nn.Conv1d):
            raise ValueError(f"conv must be a torch.nn.Conv1d, got {type(conv).__name__}")
        K = conv.kernel_size[0]
        if (
            conv.in_channels != P
            or conv.out_channels != P
            or conv.bias is not None
            or conv.stride != (1,)
            or (conv.dilation != (1,) or conv.padding not in ((0,), "valid"))
        ):
            raise ValueError(
                f"conv must map the embedding's {P} channels to {P} over {K} tokens without bias, "
                "stride, dilation or padding (icefall's Decoder layout)"
            )
        if K != stateless_context:
            raise ValueError(f"context_size={stateless_context} does not match conv.kernel_size={K}")
        groups, conv_w = conv.groups, conv.weight
    elif stateless_context != 1:
        raise ValueError(f"context_size={stateless_context} needs a conv")
    w = TransducerWeights(
        embedding.weight,
        layers,
        conv_w,
        groups,
        K,
        *_linear(enc, "enc"),
        *_linear(pred, "pred"),
        *_linear(out, "out"),
        as_choice(activation, "activation", ACTIVATIONS),
    )
    H = layers[-1][1].shape[1] if layers else P
    if w.pred_w.shape[1] != H:
        raise ValueError(f"pred.in_features={w.pred_w.shape[1]} does not match the prediction network's width {H}")
    J = w.enc_w.shape[0]
    if w.pred_w.shape[0] != J or w.out_w.shape[1] != J:
        raise ValueError(
            f"the joint's widths disagree: enc.out_features={J}, pred.out_features={w.pred_w.shape[0]}, "
            f"out.in_features={w.out_w.shape[1]}"
        )
    tensors = tuple(w.tensors())
    dtypes = {t.dtype for t in tensors}
    devices = {t.device for t in tensors}
    if len(dtypes) > 1 or len(devices) > 1:
        raise ValueError(
            f"the networks' tensors must share one dtype and one device, got {sorted(map(str, dtypes))} "
            f"on {sorted(map(str, devices))}"
        )
    if not next(iter(dtypes)).is_floating_point:
        raise ValueError(f"the networks' tensors must be floating point, got {next(iter(dtypes))}")
    return w


def nemo_layers(decoder, joint, durations) -> dict:
    """The layers and settings of NeMo's ``RNNTDecoder`` (``prediction["embed"]``, ``prediction["dec_rnn"].lstm``,
    ``blank_idx``) and ``RNNTJoint`` (``enc``, ``pred``, ``joint_net``: an activation, optional dropout, a Linear;
    ``num_classes_with_blank``: NeMo's count of the joint's outputs, the tokens with the blank and the
    ``num_extra_outputs`` durations; ``vocab_size``: the tokens with the blank)."""
    embed = _attr(decoder, "prediction[embed]", "decoder")
    lstm = _attr(decoder, "prediction[dec_rnn].lstm", "decoder")
    blank = as_int(_attr(decoder, "blank_idx", "decoder"), "decoder.blank_idx")
    net = list(_attr(joint, "joint_net", "joint"))
    acts = [_ACTIVATION_MODULES[type(m)] for m in net if type(m) in _ACTIVATION_MODULES]
    plain = (torch.nn.Dropout, torch.nn.Linear)
    others = [m for m in net if type(m) not in _ACTIVATION_MODULES and not isinstance(m, plain)]
    if len(acts) != 1 or others or not isinstance(net[-1], torch.nn.Linear):
        raise ValueError(
            "joint.joint_net must hold one activation (ReLU, Tanh or Sigmoid), optional Dropout and a "
            f"final Linear (an unsupported layout: {[type(m).__name__ for m in net]})"
        )
    C = as_int(_attr(joint, "num_classes_with_blank", "joint"), "joint.num_classes_with_blank")
    D = as_int(_attr(joint, "num_extra_outputs", "joint"), "joint.num_extra_outputs")
    V = C - D  # (NeMo's RNNTJoint: num_classes + 1 + num_extra_outputs)
    if D and durations is None:
        raise ValueError(f"joint.num_extra_outputs={D}: a TDT joint needs durations (e.g. [0, 1, 2, 3, 4])")
    if durations is not None:
        durations = durations_of(durations)
        if len(durations) != D:
            raise ValueError(f"durations has {len(durations)} entries but joint.num_extra_outputs={D}")
    return dict(
        embedding=embed,
        enc=_attr(joint, "enc", "joint"),
        pred=_attr(joint, "pred", "joint"),
        out=net[-1],
        lstm=lstm,
        activation=acts[0],
        blank=blank,
        vocab_size=V,
        durations=durations,
    )


def icefall_layers(decoder, joiner) -> dict:
    """The layers and settings of icefall's stateless ``Decoder`` (``embedding``, ``conv`` when ``context_size`` >
    1, ``blank_id``) and ``Joiner`` (``encoder_proj``, ``decoder_proj``, ``output_linear``; tanh)."""
    K = as_int(_attr(decoder, "context_size", "decoder"), "decoder.context_size", minimum=1)
    embed = _attr(decoder, "embedding", "decoder")
    return dict(
        embedding=embed,
        conv=_attr(decoder, "conv", "decoder") if K > 1 else None,
        context_size=K,
        blank=as_int(_attr(decoder, "blank_id", "decoder"), "decoder.blank_id"),
        enc=_attr(joiner, "encoder_proj", "joiner"),
        pred=_attr(joiner, "decoder_proj", "joiner"),
        out=_attr(joiner, "output_linear", "joiner"),
        activation="tanh",
        vocab_size=_attr(joiner, "output_linear", "joiner").out_features,
    )


def predict(
    w: TransducerWeights,
    tokens: torch.Tensor,
    state: tuple[torch.Tensor, ...],
    input_gates=None,
    linear=torch.nn.functional.linear,
):
    """One step of the prediction network for tokens [N]: (output [N, P], state). ``input_gates``: the first LSTM
    layer's input term of every token, ``input_gates_table(w)``, or None (computed per step); ``linear``: the
    LSTM's products (x, weight, bias)."""
    if not w.stateless:
        h, c = state
        x = w.embedding[tokens] if input_gates is None else None  # (the table holds layer 0's term)
        hs, cs = [], []
        for layer, (w_ih, w_hh, b_ih, b_hh) in enumerate(w.lstm):
            x_term = input_gates[tokens] if layer == 0 and input_gates is not None else linear(x, w_ih, b_ih)
            gates = x_term + linear(h[layer], w_hh, b_hh)
            i, f, g, o = gates.chunk(4, 1)
            c_new = torch.sigmoid(f) * c[layer] + torch.sigmoid(i) * torch.tanh(g)
            x = torch.sigmoid(o) * torch.tanh(c_new)
            hs.append(x)
            cs.append(c_new)
        return x, (torch.stack(hs), torch.stack(cs))
    (context,) = state
    context = torch.cat((context[:, 1:], tokens[:, None]), 1)
    return stateless_output(w, context), (context,)


def input_gates_table(w: TransducerWeights) -> torch.Tensor | None:
    """The first LSTM layer's input term (W_ih e + b_ih) of every token's embedding e: [V, 4H] (None for a
    stateless prediction network)."""
    if w.stateless:
        return None
    w_ih, _, b_ih, _ = w.lstm[0]
    return torch.nn.functional.linear(w.embedding, w_ih, b_ih)


def stateless_output(w: TransducerWeights, context: torch.Tensor) -> torch.Tensor:
    """The stateless prediction network's output [N, P] for the last K tokens ``context`` [N, K] (-1: zeros)."""
    e = w.embedding[context.clamp(min=0)] * (context >= 0)[..., None].to(w.embedding.dtype)  # [N, K, P]
    if w.conv is None:
        return e[:, -1]
    return torch.relu(torch.nn.functional.conv1d(e.transpose(1, 2), w.conv, groups=w.groups)[..., 0])


def start_state(w: TransducerWeights, N: int, blank: int, device) -> TransducerState:
    """The state before the first frame: the prediction network after the start symbol (the blank)."""
    tokens = torch.full((N,), blank, dtype=torch.int64, device=device)
    if w.stateless:
        context = torch.full((N, w.context_size), -1, dtype=torch.int64, device=device)
        out, pred = predict(w, tokens, (context,))
    else:
        L, H = len(w.lstm), w.lstm[0][1].shape[1]
        zeros = torch.zeros(L, N, H, dtype=w.embedding.dtype, device=device)
        out, pred = predict(w, tokens, (zeros, zeros))
    zero = torch.zeros(N, dtype=torch.int64, device=device)
    return TransducerState(pred, out, zero, zero)


class SearchStart(NamedTuple):
    """What both searches start from: the projected encoder outputs, the activation, the clamped lengths, the
    prediction network's state and output (after the start symbol) and its projection for the N x K slots, and the
    slots' scores (slot 0 at 0, the others empty)."""

    enc: torch.Tensor
    act: object
    lengths: torch.Tensor
    wd: torch.dtype
    ninf: torch.Tensor
    pred_state: tuple
    out: torch.Tensor
    g: torch.Tensor
    score: torch.Tensor


def search_start(w: TransducerWeights, x: torch.Tensor, lengths: torch.Tensor, K: int, blank: int) -> SearchStart:
    """The start of a search of K slots per utterance over x [N, T, E] (``SearchStart``)."""
    N, T, _ = x.shape
    dev = x.device
    wd = torch.float64 if w.enc_w.dtype == torch.float64 else torch.float32
    st = start_state(w, N * K, blank, dev)
    score = torch.full((N, K), float("-inf"), dtype=wd, device=dev)
    score[:, 0] = 0.0
    return SearchStart(
        enc=torch.nn.functional.linear(
            x.to(w.enc_w.dtype).contiguous(), w.enc_w, w.enc_b
        ),  # [N, T, J] (a view: its copy's)
        act=activation_fn(w.activation),
        lengths=lengths.to(dev, torch.int64).clamp(0, T),
        wd=wd,
        ninf=torch.tensor(float("-inf"), dtype=wd, device=dev),
        pred_state=st.predictor,
        out=st.output,
        g=torch.nn.functional.linear(st.output, w.pred_w, w.pred_b),  # [NK, J]
        score=score,
    )
