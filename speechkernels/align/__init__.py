"""CTC forced alignment: ctc_forced_align (Viterbi, batched) and ctc_token_spans."""

from .api import TokenSpans, ctc_forced_align, ctc_token_spans
from .reference import ctc_forced_align_reference

__all__ = ["TokenSpans", "ctc_forced_align", "ctc_token_spans", "ctc_forced_align_reference"]
