"""Generate audio with a WaveNet vocoder and write it to a WAV file, on the GPU when there is one, else the CPU.

    python examples/wavenet_generate.py [--samples 4000] [--out wavenet.wav] [--layers 8] [--device cpu]

The weights are random (train the model's ``forward`` with teacher forcing, or load trained ones, for speech):
the point is the generation loop, one sample at a time with the conditioning of a mel spectrogram.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from speechkernels.bench.common import example_device, positive_int
from speechkernels.wavenet import WaveNet, mu_law_decode, save_wav


def main(argv: list[str] | None = None) -> tuple[str, int]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=positive_int, default=4000)
    p.add_argument("--out", default="wavenet.wav")
    p.add_argument("--layers", type=positive_int, default=8)
    p.add_argument("--rate", type=positive_int, default=16000, help="sample rate of the WAV file, Hz")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    args = p.parse_args(argv)
    device = example_device(p, args.device)
    torch.manual_seed(0)

    hop = 256
    net = WaveNet(layers=args.layers, cycle=min(args.layers, 10), cond_channels=80, hop_length=hop)
    net = net.to(device).eval()
    mel = torch.randn(1, 80, math.ceil(args.samples / hop), device=device)  # [B, mel bins, frames]
    g = torch.Generator(device).manual_seed(0)
    t0 = time.perf_counter()
    classes = net.generate(mel, args.samples, generator=g, progress=device.type == "cpu")  # [1, samples] mu-law
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    save_wav(args.out, mu_law_decode(classes[0]), args.rate)
    print(
        f"{device.type}: {args.samples} samples in {seconds:.2f} s ({args.samples / seconds / 1e3:.1f} kHz, the "
        f"first call includes compilation on a GPU); wrote {args.out}"
    )
    return args.out, args.samples


if __name__ == "__main__":
    main()
