"""The serial-chain proxy of autoregressive WaveNet inference: ``serial_chain`` (its designs side by side) and
its float64 reference."""

from .api import DESIGNS, auto_design, serial_chain
from .reference import serial_chain_reference

__all__ = ["serial_chain", "serial_chain_reference", "auto_design", "DESIGNS"]
