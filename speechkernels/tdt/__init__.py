from .reference import multiblank_rnnt_loss_reference, tdt_loss_reference

__all__ = ["multiblank_rnnt_loss_reference", "tdt_loss_reference"]
