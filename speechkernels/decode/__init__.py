"""Decoding: greedy CTC decoding (ctc_greedy_decode) and greedy transducer decoding (TransducerDecoder.greedy) into
Hypotheses; CTC prefix beam search (ctc_beam_search) and transducer beam search (TransducerDecoder.beam_search:
NeMo's malsd_batch, icefall's modified_beam_search) into BeamHypotheses; a token n-gram LM from an ARPA file
(NGramLM) for shallow fusion and phrase boosting (PhraseBooster)."""

from .api import TransducerDecoder, ctc_beam_search, ctc_greedy_decode
from .beam_reference import ctc_beam_search_reference
from .boosting import PhraseBooster
from .hypotheses import BeamHypotheses, Hypotheses, TransducerState
from .networks import LSTMPredictor, StatelessPredictor, TransducerWeights
from .ngram import NGramLM, write_arpa
from .reference import ctc_greedy_decode_reference, transducer_greedy_reference

__all__ = [
    "BeamHypotheses",
    "Hypotheses",
    "LSTMPredictor",
    "NGramLM",
    "PhraseBooster",
    "StatelessPredictor",
    "TransducerDecoder",
    "TransducerState",
    "TransducerWeights",
    "ctc_beam_search",
    "ctc_beam_search_reference",
    "ctc_greedy_decode",
    "ctc_greedy_decode_reference",
    "transducer_greedy_reference",
    "write_arpa",
]
