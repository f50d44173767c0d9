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
