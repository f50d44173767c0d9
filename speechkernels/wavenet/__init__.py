from .model import WaveNet
from .proxy import serial_chain
from .reference import mu_law_decode, mu_law_encode, save_wav, serial_chain_reference

__all__ = ["WaveNet", "serial_chain", "serial_chain_reference", "mu_law_encode", "mu_law_decode", "save_wav"]
