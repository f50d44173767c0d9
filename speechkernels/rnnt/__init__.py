"""RNN-Transducer loss: ``rnnt_loss`` and ``RNNTLoss`` (torchaudio.functional.rnnt_loss's signature), the joint
network fused with it (``rnnt_joint_loss``, ``RNNTJointLoss``), and the float64 references."""

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
