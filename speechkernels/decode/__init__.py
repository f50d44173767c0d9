"""Decoding: greedy CTC decoding (ctc_greedy_decode) into Hypotheses."""

from .api import ctc_greedy_decode
from .reference import Hypotheses, ctc_greedy_decode_reference

__all__ = ["Hypotheses", "ctc_greedy_decode", "ctc_greedy_decode_reference"]
