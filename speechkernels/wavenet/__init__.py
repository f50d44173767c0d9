"""WaveNet inference: the vocoder (``WaveNet``, its generation on the GPU), the serial-chain proxy
(``serial_chain``), the serving loop (``WaveNetServer``) and the audio helpers. Imports run one way: model ->
server -> generation -> kernels -> cuda_runtime."""

from .audio import mu_law_decode, mu_law_encode, save_wav
from .model import WaveNet
from .proxy import serial_chain, serial_chain_reference
from .server import WaveNetServer

__all__ = [
    "WaveNet",
    "WaveNetServer",
    "serial_chain",
    "serial_chain_reference",
    "mu_law_encode",
    "mu_law_decode",
    "save_wav",
]
