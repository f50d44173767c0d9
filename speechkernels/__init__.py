"""speechkernels: GPU kernels for speech models, in Triton."""

from . import wavenet
from .align import TokenSpans, ctc_forced_align, ctc_token_spans
from .ctc import CTCLoss, ctc_loss
from .decode import (
    BeamHypotheses,
    Hypotheses,
    LSTMPredictor,
    NGramLM,
    PhraseBooster,
    StatelessPredictor,
    TransducerDecoder,
    TransducerState,
    ctc_beam_search,
    ctc_greedy_decode,
)
from .rnnt import RNNTJointLoss, RNNTLoss, rnnt_joint_loss, rnnt_loss
from .tdt import (
    MultiblankJointLoss,
    MultiblankRNNTLoss,
    TDTJointLoss,
    TDTLoss,
    multiblank_joint_loss,
    multiblank_rnnt_loss,
    tdt_joint_loss,
    tdt_loss,
)

__version__ = "0.1.0"
__all__ = [
    "CTCLoss",
    "ctc_loss",
    "ctc_forced_align",
    "ctc_token_spans",
    "TokenSpans",
    "ctc_greedy_decode",
    "Hypotheses",
    "ctc_beam_search",
    "BeamHypotheses",
    "TransducerDecoder",
    "TransducerState",
    "LSTMPredictor",
    "StatelessPredictor",
    "NGramLM",
    "PhraseBooster",
    "RNNTLoss",
    "rnnt_loss",
    "RNNTJointLoss",
    "rnnt_joint_loss",
    "TDTLoss",
    "tdt_loss",
    "TDTJointLoss",
    "tdt_joint_loss",
    "MultiblankRNNTLoss",
    "multiblank_rnnt_loss",
    "MultiblankJointLoss",
    "multiblank_joint_loss",
    "wavenet",
    "__version__",
]
