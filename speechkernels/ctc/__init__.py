from .api import CTCLoss, ctc_loss
from .reference import ctc_forward_backward_reference, ctc_loss_reference

__all__ = ["CTCLoss", "ctc_loss", "ctc_forward_backward_reference", "ctc_loss_reference"]
