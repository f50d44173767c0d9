"""CTC loss: ``ctc_loss`` and ``CTCLoss`` (torch.nn.functional.ctc_loss's signature), Triton kernels on the GPU,
a PyTorch path on the CPU, and the float64 reference they are tested against."""

from .api import CTCLoss, ctc_loss
from .reference import ctc_forward_backward_reference, ctc_loss_reference

__all__ = ["CTCLoss", "ctc_loss", "ctc_forward_backward_reference", "ctc_loss_reference"]
