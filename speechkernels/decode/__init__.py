"""Decoding: greedy CTC decoding (ctc_greedy_decode) and greedy transducer decoding (TransducerDecoder) into
Hypotheses; a token n-gram LM from an ARPA file (NGramLM) for shallow fusion."""

from .api import TransducerDecoder, ctc_greedy_decode
from .networks import LSTMPredictor, StatelessPredictor, TransducerWeights
from .ngram import NGramLM
from .reference import Hypotheses, TransducerState, ctc_greedy_decode_reference, transducer_greedy_reference

__all__ = [
    "Hypotheses",
    "LSTMPredictor",
    "NGramLM",
    "StatelessPredictor",
    "TransducerDecoder",
    "TransducerState",
    "TransducerWeights",
    "ctc_greedy_decode",
    "ctc_greedy_decode_reference",
    "transducer_greedy_reference",
]
