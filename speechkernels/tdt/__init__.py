"""Token-and-Duration and multi-blank transducer losses (``tdt_loss``, ``multiblank_rnnt_loss`` and their module
forms), fused with the joint network (``tdt_joint_loss``, ``multiblank_joint_loss``), and the float64 references."""

from .api import MultiblankRNNTLoss, TDTLoss, multiblank_rnnt_loss, tdt_loss
from .joint import MultiblankJointLoss, TDTJointLoss, multiblank_joint_loss, tdt_joint_loss
from .reference import multiblank_rnnt_loss_reference, tdt_loss_reference

__all__ = [
    "MultiblankJointLoss",
    "MultiblankRNNTLoss",
    "TDTJointLoss",
    "TDTLoss",
    "multiblank_joint_loss",
    "multiblank_rnnt_loss",
    "multiblank_rnnt_loss_reference",
    "tdt_joint_loss",
    "tdt_loss",
    "tdt_loss_reference",
]
