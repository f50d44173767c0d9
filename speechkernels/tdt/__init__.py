from .api import MultiblankRNNTLoss, TDTLoss, multiblank_rnnt_loss, tdt_loss
from .joint import TDTJointLoss, tdt_joint_loss
from .reference import multiblank_rnnt_loss_reference, tdt_loss_reference

__all__ = [
    "MultiblankRNNTLoss",
    "TDTJointLoss",
    "TDTLoss",
    "multiblank_rnnt_loss",
    "multiblank_rnnt_loss_reference",
    "tdt_joint_loss",
    "tdt_loss",
    "tdt_loss_reference",
]
