from .api import RNNTLoss, rnnt_loss
from .joint import RNNTJointLoss, rnnt_joint_loss
from .reference import rnnt_forward_backward_reference, rnnt_loss_reference

__all__ = [
    "RNNTLoss",
    "rnnt_loss",
    "RNNTJointLoss",
    "rnnt_joint_loss",
    "rnnt_forward_backward_reference",
    "rnnt_loss_reference",
]
