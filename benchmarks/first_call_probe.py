"""Where a first call's time goes on the GPU: F.linear and index_select at a shape not seen before in the process
(each after the same operation at another shape), against the same call again. One JSON line per measurement."""

from __future__ import annotations

import json
import time

import torch
import torch.nn.functional as F


def ms(fn) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return round(1e3 * (time.perf_counter() - t), 3)


def main() -> None:
    dev = torch.device("cuda")
    w = torch.randn(128, 80, device=dev)
    big = torch.randn(2560, 80, device=dev)
    for B, frames in [(1, 1), (1, 9), (60, 9), (128, 9), (128, 10), (7, 9), (200, 9)]:
        x = torch.randn(B, frames, 80, device=dev)
        first = ms(lambda x=x: F.linear(x, w))
        again = ms(lambda x=x: F.linear(x, w))
        one = ms(lambda x=x: F.linear(x.reshape(-1, 80), big))
        one_again = ms(lambda x=x: F.linear(x.reshape(-1, 80), big))
        print(
            json.dumps(
                dict(
                    op="linear",
                    B=B,
                    frames=frames,
                    first_ms=first,
                    again_ms=again,
                    one_gemm_first_ms=one,
                    one_gemm_again_ms=one_again,
                )
            )
        )
    cond = torch.randn(80, 100, device=dev)
    for n in [1, 2, 9, 10]:
        idx = torch.arange(n, device=dev)
        print(
            json.dumps(
                dict(
                    op="index_select",
                    n=n,
                    first_ms=ms(lambda idx=idx: cond.index_select(1, idx)),
                    again_ms=ms(lambda idx=idx: cond.index_select(1, idx)),
                )
            )
        )


if __name__ == "__main__":
    main()
