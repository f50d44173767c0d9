"""Public decoding: argument checks and dispatch for ``ctc_greedy_decode``, ``ctc_beam_search`` and
``TransducerDecoder``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._args import as_bool, as_float, as_int, check_float_input
from .._backend import kernel_layout, triton_missing, use_triton
from .._loss_inputs import Lengths, batch_first_scores, batch_lengths, check_lengths
from ..tdt.api import durations_of
from .beam_reference import ctc_beam_search_reference
from .boosting import PhraseBooster
from .hypotheses import BeamHypotheses, Hypotheses, TransducerState
from .networks import TransducerWeights, icefall_layers, nemo_layers, start_state, transducer_weights
from .ngram import NGramLM
from .reference import ctc_greedy_decode_reference, transducer_greedy_reference
from .transducer_beam import modified_beam_search_reference, transducer_beam_search_reference

try:  # the Triton kernels; without Triton (error names it) the PyTorch path serves every call
    from . import beam_kernels, kernels, transducer_beam_kernels, transducer_kernels
except ImportError as error:
    kernels = triton_missing(error)
    transducer_kernels = beam_kernels = transducer_beam_kernels = None
KERNEL_DTYPES = (torch.float32, torch.bfloat16)  # measured on the GPU; float16 networks take the PyTorch path
GREEDY_STEP_ROWS = 64  # greedy decoding of float32 LSTM networks from this many utterances up (no LM, no boosting,
# not while a CUDA graph is captured): the beam search's steps at one hypothesis (the LSTM over the rows that
# emitted, three TF32 products, CUDA graphs of steps) rather than the one-launch kernel: at 64 rows as fast (TDT)
# or faster (RNN-T 21.4 against 27.0 ms on the H200), at 32 slower or even (benchmarks/notes/decode.md, "Plain
# greedy decoding through the beam search's steps")


def _greedy_takes_steps(w: TransducerWeights, N: int) -> bool:
    """Whether greedy decoding without fusion of N utterances with these networks runs the beam search's steps at
    one hypothesis (GREEDY_STEP_ROWS) rather than the one-launch kernel (outside a CUDA graph's capture)."""
    return N >= GREEDY_STEP_ROWS and w.enc_w.dtype == torch.float32 and not w.stateless


class _Plans(dict):
    """A decoder's launch plans (``transducer_kernels.GreedyPlan`` by configuration) for its current weights
    (``weights``, identified by ``fingerprint``); empty in a copy or a pickle of the decoder."""

    def __init__(self) -> None:
        super().__init__()
        self.weights, self.fingerprint = None, None
        self.beam = None  # the last beam search's buffers and CUDA graph (transducer_beam_kernels._Search)

    def reset(self, weights: TransducerWeights | None = None, fingerprint: list | None = None) -> None:
        self.clear()
        self.weights, self.fingerprint, self.beam = weights, fingerprint, None

    def valid_for(self, weights: TransducerWeights) -> _Plans | None:
        return self if weights is self.weights else None

    def __deepcopy__(self, memo) -> _Plans:
        return _Plans()

    def __reduce__(self):
        return (_Plans, ())


def ctc_greedy_decode(
    log_probs: torch.Tensor,
    input_lengths: Lengths | None = None,
    blank: int = 0,
    *,
    batch_first: bool = True,
    logits: bool = False,
    validate: bool = True,
) -> Hypotheses:
    """Greedy (best-path) CTC decoding of a batch: each frame's most likely class, runs of one class merged,
    blanks dropped.

    Args:
        log_probs: [N, T, C] (or [T, N, C] with ``batch_first=False``, or [T, C] unbatched) log-probabilities, or
            raw scores with ``logits=True``: float32/float16/bfloat16 on the GPU (one read of the scores by a
            kernel), any float dtype on the CPU.
        input_lengths: [N] frames per sample, each in [0, T] (an integer tensor on any device, an integer numpy
            array or a sequence of integers); default: T for every sample. Frames past a sample's length are not
            read.
        blank: index of the blank class, in [0, C).
        batch_first: ``log_probs`` is [N, T, C] (the default); False for [T, N, C].
        logits: the scores are raw (a model's output): the reported scores are their log_softmax.
        validate: check the lengths' values (on the GPU a read of device memory); unchecked, they are clamped to
            [0, T].

    Returns:
        ``Hypotheses`` with S = T (the longest possible hypothesis; no host synchronisation): ``tokens`` [N, T]
        int64 padded with -1, ``lengths`` [N], ``frames`` [N, T] (the first frame of each token's run, -1 past),
        ``scores`` [N, T] (the token's log-probability at that frame; float32, float64 for float64 input; 0
        past), ``durations`` None. Unbatched input gives [T] rows and a 0-d length. Ties between classes go to
        the lowest index and a NaN counts as the largest score (``torch.argmax``'s rules).

    Raises:
        ValueError: an argument of the wrong type, shape or value, naming it (and the offending element).

    Example:
        >>> hyp = ctc_greedy_decode(torch.randn(2, 50, 20).log_softmax(-1), [50, 42])
        >>> transcripts = [hyp.tokens[n, : hyp.lengths[n]].tolist() for n in range(2)]
    """
    check_float_input(log_probs, "log_probs")
    blank = as_int(blank, "blank")
    batch_first, logits = as_bool(batch_first, "batch_first"), as_bool(logits, "logits")
    validate = as_bool(validate, "validate")
    x, unbatched, il = _ctc_batch(log_probs, input_lengths, blank, batch_first, validate)
    N, T = x.shape[:2]
    if kernels is not None and use_triton(x) and N > 0 and T > 0:
        hyp = Hypotheses(*kernels.ctc_greedy(kernel_layout(x), il, blank, logits))
    else:
        hyp = ctc_greedy_decode_reference(x, il, blank, logits)
    if unbatched:
        return Hypotheses(*(None if v is None else v[0] for v in hyp))
    return hyp


def _ctc_batch(log_probs: torch.Tensor, input_lengths, blank: int, batch_first: bool, validate: bool):
    """(scores [N, T, C], whether they came unbatched, the lengths [N] int64 on their device) of a CTC decoder's
    arguments, checked: the blank in [0, C), the lengths (default T each; their values when ``validate``)."""
    x, unbatched = batch_first_scores(log_probs, batch_first)
    N, T, C = x.shape
    if not 0 <= blank < C:
        raise ValueError(f"blank={blank} is outside [0, C={C})")
    if input_lengths is None:
        input_lengths = torch.full((N,), T, dtype=torch.int64, device=x.device)
    (il,) = batch_lengths(N, x.device, "none", input_lengths=input_lengths)
    if validate:
        check_lengths(il, "input_lengths", T, f"T={T}")
    return x, unbatched, il


def check_fusion(lm, boosting, C: int, classes: str, dev: torch.device, owner: str) -> None:
    """``lm`` and ``boosting``: None, or an ``NGramLM`` / ``PhraseBooster`` over C classes on ``dev`` (``classes``
    and ``owner`` name the other side in the errors)."""
    for name, table, kind in (("lm", lm, NGramLM), ("boosting", boosting, PhraseBooster)):
        if table is None:
            continue
        if not isinstance(table, kind):
            raise ValueError(f"{name} must be an instance of {kind.__name__} or None, got {type(table).__name__}")
        if table.vocab_size != C:
            raise ValueError(f"{name} has vocab_size={table.vocab_size} but {classes}")
        if table.device != dev:
            raise ValueError(f"{name} is on {table.device} but {owner} on {dev} (move it with {name}.to(device))")


def ctc_beam_search(
    log_probs: torch.Tensor,
    input_lengths: Lengths | None,
    beam_size: int,
    *,
    blank: int = 0,
    lm: NGramLM | None = None,
    lm_weight: float = 0.0,
    token_insertion_bonus: float = 0.0,
    nbest: int = 1,
    prune_threshold: float | None = None,
    boosting: PhraseBooster | None = None,
    batch_first: bool = True,
    validate: bool = True,
) -> BeamHypotheses:
    """CTC prefix beam search of a batch, with shallow fusion of a token n-gram LM.

    Each frame extends every prefix in the beam by the blank, by a repeat of its last token (both keep the prefix)
    and by every other class (a new token; its last token again only after a blank); the alignments that reach one
    prefix add up. A new token adds ``lm_weight`` times its LM log-probability, ``token_insertion_bonus`` and its
    phrase boosting bonus. The
    ``beam_size`` best prefixes survive each frame, ranked by acoustic log-probability plus those terms, ties to
    the prefix reached first (its parent's rank, then the blank before the classes in order); at the end the
    LM's ``</s>`` term is added.

    Args:
        log_probs: [N, T, C] (or [T, N, C] with ``batch_first=False``, or [T, C] unbatched) log-probabilities,
            any float dtype (searched in float64 for float64 input, else float32; on the GPU without an LM or
            boosting by one kernel, else by PyTorch operations).
        input_lengths: [N] frames per sample, each in [0, T] (a tensor, numpy array or sequence of integers), or
            None: T each.
        beam_size: prefixes kept per frame (>= 1).
        blank: index of the blank class, in [0, C).
        lm: an ``NGramLM`` over the C classes (token c is class c; the blank's column unused), on the scores'
            device, or None.
        lm_weight, token_insertion_bonus: the LM's weight and the bonus per token (finite).
        nbest: hypotheses returned per sample, in [1, beam_size].
        prune_threshold: only the classes within this of the frame's best log-probability extend or repeat (None:
            all classes).
        boosting: a ``PhraseBooster`` over the C classes, on the scores' device, or None.
        batch_first: ``log_probs`` is [N, T, C] (the default); False for [T, N, C].
        validate: check the lengths' values (on the GPU a read of device memory); unchecked, they are clamped.

    Returns:
        ``BeamHypotheses`` (tokens [N, nbest, T], lengths, frames, scores, acoustic and LM scores [N, nbest]), best
        first; unbatched input drops the N dimension.

    Raises:
        ValueError: an argument of the wrong type, shape or value, naming it (and the offending element).

    Example:
        >>> hyp = ctc_beam_search(torch.randn(2, 50, 20).log_softmax(-1), [50, 42], beam_size=8, nbest=2)
        >>> best = [hyp.tokens[n, 0, : hyp.lengths[n, 0]].tolist() for n in range(2)]
    """
    check_float_input(log_probs, "log_probs")
    beam_size = as_int(beam_size, "beam_size", minimum=1)
    blank = as_int(blank, "blank")
    nbest = as_int(nbest, "nbest", minimum=1)
    if nbest > beam_size:
        raise ValueError(f"nbest={nbest} is larger than beam_size={beam_size}")
    lm_weight = as_float(lm_weight, "lm_weight", finite=True)
    token_insertion_bonus = as_float(token_insertion_bonus, "token_insertion_bonus", finite=True)
    if prune_threshold is not None:
        prune_threshold = as_float(prune_threshold, "prune_threshold", minimum=0.0)
    batch_first, validate = as_bool(batch_first, "batch_first"), as_bool(validate, "validate")
    x, unbatched, il = _ctc_batch(log_probs, input_lengths, blank, batch_first, validate)
    N, T, C = x.shape
    check_fusion(lm, boosting, C, f"log_probs has C={C} classes", x.device, "log_probs")
    if beam_kernels is not None and use_triton(x) and N > 0 and T > 0:
        hyp = BeamHypotheses(
            *beam_kernels.ctc_beam(
                kernel_layout(x),
                il,
                beam_size,
                blank,
                token_insertion_bonus,
                nbest,
                prune_threshold,
                lm,
                lm_weight,
                boosting,
            )
        )
    else:
        hyp = ctc_beam_search_reference(
            x, il, beam_size, blank, lm, lm_weight, token_insertion_bonus, nbest, prune_threshold, boosting
        )
    if unbatched:
        return BeamHypotheses(*(None if v is None else v[0] for v in hyp))
    return hyp


class TransducerDecoder(torch.nn.Module):
    """Greedy decoding of a transducer (RNN-T or TDT) from its prediction and joint networks.

    The decoder holds the networks' layers themselves (not copies: a model trained further decodes with its new
    weights); build it from the models that hold them with :meth:`from_nemo`, :meth:`from_icefall` or
    :meth:`from_joint`, or from the layers:

    Args:
        embedding: torch.nn.Embedding of the prediction network's input tokens.
        enc, pred: torch.nn.Linear projections of the encoder's and the prediction network's outputs to the joint
            width J.
        out: torch.nn.Linear from J to the V token classes (the blank among them), then the D duration logits
            for TDT.
        lstm: the prediction network's torch.nn.LSTM (NeMo's ``RNNTDecoder``; the GPU kernel takes up to four
            layers, deeper ones decode on the PyTorch path), or
        conv: a stateless prediction network's torch.nn.Conv1d over the last ``context_size`` tokens' embeddings,
            followed by a relu (icefall's ``Decoder``); with neither, the embedding of the last token.
        context_size: the tokens ``conv`` reads (1 without it).
        activation: the joint's activation ("relu", "tanh" or "sigmoid").
        blank: the blank's index among the V token classes (negative: counted from the end).
        durations: TDT's D durations (distinct integers >= 0), or None for RNN-T.
        max_symbols_per_frame: the labels emitted at one frame before decoding moves to the next.

    ``greedy(...)`` follows NeMo's label-looping greedy decoders: at frame t the joint's most likely token class and,
    for TDT, its most likely duration; a blank moves to frame t + its duration (at least 1; RNN-T: 1), a label is
    emitted at frame t, advances the prediction network and moves to t + its duration (RNN-T: t); after
    ``max_symbols_per_frame`` labels at one frame, decoding moves on one frame. Ties go to the lowest index.

    Example:
        >>> decoder = TransducerDecoder.from_nemo(model.decoder, model.joint, durations=[0, 1, 2, 3, 4])
        >>> hyp, _ = decoder.greedy(encoder_out, encoder_lengths)  # encoder_out [N, T, E]
        >>> transcripts = [hyp.tokens[n, : hyp.lengths[n]].tolist() for n in range(len(hyp.lengths))]
    """

    def __init__(
        self,
        embedding: torch.nn.Embedding,
        enc: torch.nn.Linear,
        pred: torch.nn.Linear,
        out: torch.nn.Linear,
        *,
        lstm: torch.nn.LSTM | None = None,
        conv: torch.nn.Conv1d | None = None,
        context_size: int = 1,
        activation: str = "relu",
        blank: int = -1,
        durations: Sequence[int] | None = None,
        max_symbols_per_frame: int = 10,
    ) -> None:
        super().__init__()
        self.embedding, self.lstm, self.conv, self.enc, self.pred, self.out = embedding, lstm, conv, enc, pred, out
        self._plans = _Plans()  # the kernel's launch plans for the current weights (greedy)
        self.activation = activation
        self.context_size = as_int(context_size, "context_size", minimum=1)
        self.durations = None if durations is None else durations_of(durations)
        self.max_symbols_per_frame = as_int(max_symbols_per_frame, "max_symbols_per_frame", minimum=1)
        w = self.weights()
        D = len(self.durations) if self.durations else 0
        V = w.out_w.shape[0] - D
        if V < 1:
            raise ValueError(f"out has {w.out_w.shape[0]} rows, fewer than the {D} durations plus a token class")
        self.vocab_size = V
        blank = as_int(blank, "blank")
        if not -V <= blank < V:
            raise ValueError(f"blank={blank} is outside [-V, V) for the V={V} token classes of out")
        self.blank = blank % V
        if self.blank >= w.embedding.shape[0]:
            raise ValueError(
                f"blank={self.blank} (the start symbol) has no row in the embedding's {w.embedding.shape[0]}"
            )

    def weights(self) -> TransducerWeights:
        """The networks' tensors (their current values, not copies)."""
        return transducer_weights(
            self.embedding,
            self.enc,
            self.pred,
            self.out,
            lstm=self.lstm,
            conv=self.conv,
            activation=self.activation,
            stateless_context=self.context_size,
        )

    @classmethod
    def from_nemo(
        cls, decoder, joint, durations: Sequence[int] | None = None, max_symbols_per_frame: int = 10
    ) -> TransducerDecoder:
        """From NeMo's ``RNNTDecoder`` and ``RNNTJoint`` (read through their attributes; NeMo is not imported):
        the embedding ``decoder.prediction["embed"]``, the LSTM ``decoder.prediction["dec_rnn"].lstm``, the blank
        ``decoder.blank_idx``; ``joint.enc``, ``joint.pred``, ``joint.joint_net`` (activation, optional dropout,
        Linear), ``joint.num_classes_with_blank`` (as NeMo counts it: the tokens, the blank and the D durations)
        and ``joint.num_extra_outputs`` (D: a TDT joint, which needs the model's ``durations``)."""
        layers = nemo_layers(decoder, joint, durations)
        V = layers.pop("vocab_size")
        self = cls(**layers, max_symbols_per_frame=max_symbols_per_frame)
        if self.vocab_size != V:
            D = len(self.durations or ())
            raise ValueError(
                f"joint.num_classes_with_blank={V + D} (tokens with the blank, and {D} durations) but joint_net's "
                f"last Linear has {self.vocab_size + D} rows"
            )
        return self

    @classmethod
    def from_icefall(cls, decoder, joiner) -> TransducerDecoder:
        """From icefall's stateless ``Decoder`` (``embedding``, ``conv`` when ``context_size`` > 1,
        ``context_size``, ``blank_id``) and ``Joiner`` (``encoder_proj``, ``decoder_proj``, ``output_linear``,
        tanh): ``greedy`` then gives icefall's ``greedy_search_batch`` (one symbol per frame)."""
        layers = icefall_layers(decoder, joiner)
        layers.pop("vocab_size")
        return cls(**layers, max_symbols_per_frame=1)

    @classmethod
    def from_joint(
        cls, joint: torch.nn.Module, predictor: torch.nn.Module, max_symbols_per_frame: int = 10
    ) -> TransducerDecoder:
        """From this library's :class:`~speechkernels.RNNTJointLoss` or :class:`~speechkernels.TDTJointLoss` (its
        layers, activation, blank and durations) and the prediction network trained with it
        (:class:`LSTMPredictor`, :class:`StatelessPredictor`, or any module with an ``embedding`` and an ``lstm``,
        or a ``conv`` and a ``context_size``)."""
        for name in ("enc", "pred", "out", "activation", "loss_args"):
            if not hasattr(joint, name):
                raise ValueError(f"joint has no {name}: pass an RNNTJointLoss or a TDTJointLoss")
        if getattr(joint, "big_blank_durations", None) is not None:
            raise ValueError("joint is a multi-blank joint: greedy decoding supports RNN-T and TDT joints")
        embedding = getattr(predictor, "embedding", None)
        if embedding is None:
            raise ValueError("predictor has no embedding (an LSTMPredictor or a StatelessPredictor is expected)")
        K = getattr(predictor, "context_size", 1)
        return cls(
            embedding,
            joint.enc,
            joint.pred,
            joint.out,
            lstm=getattr(predictor, "lstm", None),
            conv=getattr(predictor, "conv", None),
            context_size=K,
            activation=joint.activation,
            blank=joint.loss_args.get("blank", -1),
            durations=getattr(joint, "durations", None),
            max_symbols_per_frame=max_symbols_per_frame,
        )

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> TransducerState:
        """The state before an utterance's first frame (``greedy``'s when ``state`` is None)."""
        w = self.weights()
        N = as_int(batch_size, "batch_size", minimum=0)
        one = start_state(w, 1, self.blank, torch.device(device) if device is not None else w.enc_w.device)
        # the same for every utterance: one computed, expanded (views; the kernel path copies what it writes)
        return TransducerState(
            tuple(t.expand(*t.shape[:-2], N, t.shape[-1]) if t.dim() == 3 else t.expand(N, -1) for t in one.predictor),
            one.output.expand(N, -1),
            one.time_jumps.expand(N),
            one.frames.expand(N),
        )

    @torch.no_grad()
    def greedy(
        self,
        encoder_out: torch.Tensor,
        encoder_lengths: Lengths | None = None,
        state: TransducerState | None = None,
        *,
        lm: NGramLM | None = None,
        lm_weight: float = 0.0,
        boosting: PhraseBooster | None = None,
        boosting_weight: float = 1.0,
        validate: bool = True,
    ) -> tuple[Hypotheses, TransducerState]:
        """Greedy decoding of a batch of encoder outputs.

        Args:
            encoder_out: [N, T, E] (E = ``enc.in_features``), any float dtype: cast to the networks' dtype.
            encoder_lengths: [N] frames per utterance, each in [0, T] (a tensor, numpy array or sequence of
                integers); default T each.
            state: where a previous call stopped (the chunk before this one of the same utterances), or None to
                start the utterances.
            lm: an ``NGramLM`` over the V token classes (the blank's column unused), on the networks' device, or
                None; shallow fusion as NeMo's label-looping decoders fuse theirs: whether a frame emits is the
                joint's own decision (its argmax is the blank or not), the label emitted is the argmax over the
                non-blank classes of logit + a log p_LM + b bonus.
            lm_weight: a (finite).
            boosting: a ``PhraseBooster`` over the V token classes, on the networks' device, or None.
            boosting_weight: b (finite).
            validate: check the lengths' values (a read of device memory on the GPU); unchecked, they are clamped.

        Returns:
            (``Hypotheses``, state). Hypotheses with S = T * ``max_symbols_per_frame``: ``tokens`` [N, S] int64
            (-1 past each hypothesis), ``lengths`` [N], ``frames`` [N, S] (each token's frame, counted from the
            utterance's start across chunks), ``scores`` [N, S] (each token's log_softmax over the token logits;
            float32, float64 for float64 networks; fused or not), ``durations`` [N, S] (TDT: each token's
            duration) or None. Decoding an utterance chunk by chunk, each call with the state the previous one
            returned, gives the tokens, frames and durations of decoding it whole (with fusion the state holds
            the LM's and the booster's states too). With an LM or boosting, on the GPU each step's decisions run
            in one Triton kernel (the beam search's, at one hypothesis), the networks in PyTorch, the steps
            replayed as CUDA graphs; the same for float32 LSTM networks from ``GREEDY_STEP_ROWS`` utterances up
            (faster there), except while a CUDA graph is being captured (that path synchronises with the host);
            otherwise the whole decode is one kernel launch.

        Raises:
            ValueError: a bad argument, naming it (and the offending element).
        """
        check_float_input(encoder_out, "encoder_out")
        validate = as_bool(validate, "validate")
        lm_weight = as_float(lm_weight, "lm_weight", finite=True)
        boosting_weight = as_float(boosting_weight, "boosting_weight", finite=True)
        w, N, T, dev = self._weights_for(encoder_out)
        check_fusion(lm, boosting, self.vocab_size, f"the decoder has {self.vocab_size} classes", dev, "the networks")
        lengths = None
        if encoder_lengths is not None:
            (lengths,) = batch_lengths(N, dev, "none", encoder_lengths=encoder_lengths)
            if validate:
                check_lengths(lengths, "encoder_lengths", T, f"T={T}")
        if state is not None:
            state = self._checked_state(state, N, w, lm, boosting)
        wd = w.enc_w.dtype
        step_path = _greedy_takes_steps(w, N) and not (
            encoder_out.is_cuda and torch.cuda.is_current_stream_capturing()  # (that path synchronises)
        )
        if lm is not None or boosting is not None or step_path:
            if lengths is None:
                lengths = torch.full((N,), T, dtype=torch.int64, device=dev)
            if state is None:
                state = self.initial_state(N, dev)
            fusion = (lm, lm_weight, boosting, boosting_weight)
            if (
                transducer_beam_kernels is not None
                and use_triton(encoder_out)
                and wd in KERNEL_DTYPES
                and use_triton(w.enc_w)
                and N > 0
                and T > 0
            ):
                return transducer_beam_kernels.greedy_search(
                    w, encoder_out, lengths, state, self.blank, self.durations, self.max_symbols_per_frame, *fusion,
                    plans=self._plans.valid_for(w),
                )  # fmt: skip
            return transducer_greedy_reference(
                w, encoder_out, lengths, state, self.blank, self.durations, self.max_symbols_per_frame, *fusion
            )
        if (
            transducer_kernels is not None
            and use_triton(encoder_out)
            and wd in KERNEL_DTYPES
            and N > 0
            and T > 0
            and len(w.lstm) <= transducer_kernels.MAX_LAYERS
        ):
            x = kernel_layout(encoder_out.to(wd))  # packed and aligned: a view decodes as its copy
            *hyp, predictor, out, jumps, done = transducer_kernels.transducer_greedy(
                w, x, lengths, state, self.blank, self.durations, self.max_symbols_per_frame, self._plans.valid_for(w)
            )
            fusion_states = (state.lm_states, state.boosting_states) if state is not None else ()
            return Hypotheses(*hyp), TransducerState(predictor, out, jumps, done, *fusion_states)
        if lengths is None:
            lengths = torch.full((N,), T, dtype=torch.int64, device=dev)
        if state is None:
            state = self.initial_state(N, dev)
        return transducer_greedy_reference(
            w, encoder_out, lengths, state, self.blank, self.durations, self.max_symbols_per_frame
        )

    @torch.no_grad()
    def beam_search(
        self,
        encoder_out: torch.Tensor,
        encoder_lengths: Lengths | None = None,
        beam_size: int = 4,
        *,
        nbest: int = 1,
        lm: NGramLM | None = None,
        lm_weight: float = 0.0,
        boosting: PhraseBooster | None = None,
        boosting_weight: float = 1.0,
        score_norm: bool = True,
        algorithm: str = "malsd",
        validate: bool = True,
    ) -> BeamHypotheses:
        """Beam search of a batch of encoder outputs, with the semantics of NeMo's ``malsd_batch`` (modified
        alignment-length synchronous decoding: the beam's hypotheses advance one symbol a step together; those
        that reach the same tokens, for TDT at the same frame, merge with the log-sum of their scores; details in
        ``speechkernels.decode.transducer_beam``) or, with ``algorithm="modified"``, of icefall's
        ``modified_beam_search`` (RNN-T, one symbol per frame: every hypothesis takes the blank or one label at
        each frame; the K best of all of them survive, those with the same tokens merged). On the GPU (float32 and
        bfloat16 networks) each step's decisions run in one Triton kernel, the networks in PyTorch, the steps
        replayed as CUDA graphs; elsewhere PyTorch operations.

        Args:
            encoder_out: [N, T, E], any float dtype: cast to the networks' dtype.
            encoder_lengths: [N] frames per utterance, each in [0, T]; default T each.
            beam_size: hypotheses kept per utterance (>= 1); beam 1 gives ``greedy``'s tokens, frames and
                durations.
            nbest: hypotheses returned per utterance, in [1, beam_size].
            lm: an ``NGramLM`` over the V token classes (the blank's column unused), on the networks' device, or
                None; fused as NeMo's fusion models are by default (``lm_weighted_full``): with A the sum of the
                weights, a label scores log p + A log(1 - p(blank)) + a log p_LM + b bonus, the blank (1 + A) log
                p(blank).
            lm_weight: a (finite).
            boosting: a ``PhraseBooster`` over the V token classes, on the networks' device, or None.
            boosting_weight: b (finite).
            score_norm: rank by score / (tokens + 1) (NeMo's default; "modified": score / (tokens +
                context_size), icefall's length norm), else by score.
            algorithm: "malsd" (NeMo's ``malsd_batch``) or "modified" (icefall's ``modified_beam_search``; RNN-T
                only; ``max_symbols_per_frame`` does not apply; the LM fuses as plain shallow fusion, a label
                scoring log p + a log p_LM, the blank log p; boosting's bonus b bonus(v) is added after each
                frame's selection, as icefall adds its context graph's score).
            validate: check the lengths' values.

        Returns:
            ``BeamHypotheses`` (tokens, frames [N, nbest, T * max_symbols_per_frame], lengths, scores and their
            acoustic and LM parts [N, nbest], ``durations`` for TDT), best first. An utterance whose scores turn
            NaN (NaN encoder outputs within its length) has no hypotheses (lengths 0, scores -inf); the others'
            are unaffected.
        """
        check_float_input(encoder_out, "encoder_out")
        beam_size = as_int(beam_size, "beam_size", minimum=1)
        nbest = as_int(nbest, "nbest", minimum=1)
        if nbest > beam_size:
            raise ValueError(f"nbest={nbest} is larger than beam_size={beam_size}")
        lm_weight = as_float(lm_weight, "lm_weight", finite=True)
        boosting_weight = as_float(boosting_weight, "boosting_weight", finite=True)
        score_norm, validate = as_bool(score_norm, "score_norm"), as_bool(validate, "validate")
        if algorithm not in ("malsd", "modified"):
            raise ValueError(f"algorithm={algorithm!r} must be 'malsd' or 'modified'")
        if algorithm == "modified" and self.durations is not None:
            raise ValueError(
                "algorithm='modified' (icefall's modified_beam_search) is for RNN-T: the decoder has durations"
            )
        w, N, T, dev = self._weights_for(encoder_out)
        check_fusion(lm, boosting, self.vocab_size, f"the decoder has {self.vocab_size} classes", dev, "the networks")
        if encoder_lengths is None:
            lengths = torch.full((N,), T, dtype=torch.int64, device=dev)
        else:
            (lengths,) = batch_lengths(N, dev, "none", encoder_lengths=encoder_lengths)
            if validate:
                check_lengths(lengths, "encoder_lengths", T, f"T={T}")
        kernel = (
            transducer_beam_kernels is not None
            and use_triton(encoder_out)
            and w.enc_w.dtype in KERNEL_DTYPES
            and use_triton(w.enc_w)
            and N > 0
            and T > 0
        )
        if algorithm == "modified":
            search = transducer_beam_kernels.modified_search if kernel else modified_beam_search_reference
            return search(
                w, encoder_out, lengths, beam_size, self.blank, nbest, lm, lm_weight, score_norm, boosting,
                boosting_weight, **({"plans": self._plans.valid_for(w)} if kernel else {}),
            )  # fmt: skip
        search = transducer_beam_kernels.malsd_search if kernel else transducer_beam_search_reference
        return search(
            w,
            encoder_out,
            lengths,
            beam_size,
            self.blank,
            self.durations,
            self.max_symbols_per_frame,
            nbest,
            lm,
            lm_weight,
            score_norm,
            boosting,
            boosting_weight,
            **({"plans": self._plans.valid_for(w)} if kernel else {}),
        )

    def _weights_for(self, encoder_out: torch.Tensor) -> tuple[TransducerWeights, int, int, torch.device]:
        """The current weights and encoder_out's N and T, checked against them (width E, device)."""
        w = self._current_weights()
        E = w.enc_w.shape[1]
        if encoder_out.dim() != 3 or encoder_out.shape[2] != E:
            raise ValueError(
                f"encoder_out must be [N, T, E={E}] (E: enc.in_features), got shape {tuple(encoder_out.shape)}"
            )
        dev = w.enc_w.device
        if encoder_out.device != dev:
            raise ValueError(f"encoder_out is on {encoder_out.device} but the networks are on {dev}")
        return w, encoder_out.shape[0], encoder_out.shape[1], dev

    def _current_weights(self) -> TransducerWeights:
        """``weights()``, kept while the layers, their tensors' places and layouts and the settings are unchanged
        (a fingerprint of a few reads per tensor: a call's host time is the eager decode's)."""
        fingerprint = [self.activation, self.context_size]
        for module in self._modules.values():
            fingerprint.append(id(module))
            if module is not None:
                for t in module._parameters.values():
                    fingerprint.append(None if t is None else (t.data_ptr(), t.dtype, t.shape, t.stride()))
        kept = self._plans.weights
        if kept is None or self._plans.fingerprint != fingerprint:
            kept = self.weights()
            self._plans.reset(kept, fingerprint)
        return kept

    def _apply(self, fn, *args, **kwargs):
        self._plans.reset()  # the networks move or change dtype: nothing kept refers to the old tensors
        return super()._apply(fn, *args, **kwargs)

    def _checked_state(self, state, N: int, w: TransducerWeights, lm=None, boosting=None) -> TransducerState:
        if not isinstance(state, TransducerState):
            raise ValueError(
                f"state must be a TransducerState (from greedy or initial_state), got {type(state).__name__}"
            )
        for name, tables in (("lm_states", lm), ("boosting_states", boosting)):
            got = getattr(state, name)
            if got is None or tables is None:
                continue
            if not isinstance(got, torch.Tensor) or got.shape != (N,) or got.dtype != torch.int64:
                what = f"{tuple(got.shape)} {got.dtype}" if isinstance(got, torch.Tensor) else type(got).__name__
                raise ValueError(f"state.{name} must be None or [{N}] int64 for this batch, got {what}")
            try:
                tables._checked(got)
            except ValueError as e:
                raise ValueError(f"state.{name}: {e}") from None
        want = self.initial_state(N, w.enc_w.device)
        for name in TransducerState._fields[:4]:
            got, ref = getattr(state, name), getattr(want, name)
            if name == "predictor" and (not isinstance(got, tuple) or len(got) != len(ref)):
                raise ValueError(f"state.predictor must be a tuple of {len(ref)} tensors for this prediction network")
            pairs = zip(got, ref, strict=True) if name == "predictor" else [(got, ref)]
            for a, b in pairs:
                if not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
                    what = (
                        f"a {type(a).__name__}"
                        if not isinstance(a, torch.Tensor)
                        else (f"{tuple(a.shape)} {a.dtype} on {a.device}")
                    )
                    raise ValueError(
                        f"state.{name} must be {tuple(b.shape)} {b.dtype} on {b.device} for this batch "
                        f"and network, got {what}"
                    )
        return state

    def extra_repr(self) -> str:
        kind = "TDT" if self.durations else "RNN-T"
        return (
            f"{kind}, vocab_size={self.vocab_size}, blank={self.blank}, durations={self.durations}, "
            f"activation={self.activation!r}, context_size={self.context_size}, "
            f"max_symbols_per_frame={self.max_symbols_per_frame}"
        )
