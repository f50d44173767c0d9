"""speechkernels: GPU kernels for speech models, in Triton."""

from .ctc import CTCLoss, ctc_loss

__version__ = "0.1.0"
__all__ = ["CTCLoss", "ctc_loss", "__version__"]
