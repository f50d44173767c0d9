"""Design-space probe for the WaveNet proxy on the GPU (not part of the benchmark's table): one SM's L2 read
bandwidth and the whole GPU's (part l2), the Triton stream kernel's warps (stream), the cluster kernel's cluster
size C, streams per cluster S, lanes per row LPR and prefetch depth D (cluster, many), the layer-split pipeline
kernel's rate against layers, waits, accumulators and streams (pipe) and its SM-clock profile with the global
timer's hops (pipeprof), tanh against relu and lanes per row in the cluster kernel (ablate), its prefetch depth
(depth), the partials design's cluster size and depth (partials), the cluster kernel's critical-path options
(variants), the cluster vocoder's wait semantics and column layout (vocacq). One JSON object per line on stdout.

    PYTHONPATH=$PWD python benchmarks/wavenet_probe.py [--quick] [--parts l2,stream,...,ablate,depth]
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib

import numpy as np
import torch

from speechkernels.wavenet import cuda_runtime, serial_chain_reference
from speechkernels.wavenet.proxy import cluster
from speechkernels.wavenet.proxy.triton_designs import serial_chain_barrier, serial_chain_stream

READ_SRC = (pathlib.Path(__file__).parent / "csrc" / "read_l2.cu").read_text()


def event_time(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / 1e3)
    return sorted(ts)[len(ts) // 2]


def emit(**row):
    print(json.dumps(row), flush=True)


def l2_bandwidth():
    core = cuda_runtime.cuda_core()
    kern = cuda_runtime.compile_kernel("read_l2", READ_SRC, cuda_runtime.device_arch())
    core.Device(0).set_current()
    stream = cuda_runtime.current_stream()
    out = torch.zeros(1024, device="cuda")
    for mb in (2.62, 5.24):
        buf = torch.randn(int(mb * 1e6 / 4), device="cuda")
        n4 = buf.numel() // 4
        for blocks, threads in ((1, 256), (1, 512), (1, 1024), (132, 1024), (264, 512)):
            reps = 20 if blocks == 1 else 5
            cfg = core.LaunchConfig(grid=blocks, block=threads)
            args = (np.uint64(buf.data_ptr()), np.int64(n4), np.int32(reps), np.uint64(out.data_ptr()))
            t = event_time(lambda cfg=cfg, args=args: core.launch(stream, cfg, kern, *args))
            gbs = blocks * reps * n4 * 16 / t / 1e9
            emit(probe="l2_read", MB=mb, blocks=blocks, threads=threads, GBps=gbs, GBps_per_block=gbs / blocks)


def rate(fn, n):
    t = event_time(lambda: fn(n), reps=3)
    return n / t


def pipeline_probe():
    """The layer-split design: time against the number of layers (one CTA per 5 layers, so the hops grow with
    L), the wait (try_wait or test_wait spinning), several streams, and the compiled kernel's resources."""
    from speechkernels.wavenet.proxy import pipeline as cp

    H, n = 128, 2000
    g = torch.Generator().manual_seed(0)
    for L, C in ((5, None), (40, None), (80, None), (80, 16)):
        w = (torch.randn(L, H, H, generator=g) / math.sqrt(H)).to(torch.bfloat16).cuda()
        for B in (1, 2, 8, 132) if L == 80 else (1,):
            x0 = torch.randn(B, H, generator=g).cuda()
            for tw, nacc in ((0, 4), (1, 4), (0, 2)) if B == 1 else ((0, 4),):
                r = rate(
                    lambda k, w=w, x0=x0, C=C, tw=tw, nacc=nacc: cp.serial_chain_pipeline(
                        w, x0, k, False, C=C, TW=tw, NACC=nacc
                    ),
                    n,
                )
                emit(
                    part="pipe",
                    L=L,
                    B=B,
                    TW=tw,
                    NACC=nacc,
                    C=cp.pipeline_config(L, H, C=C)["C"],
                    khz=r / 1e3,
                    ns_per_layer=1e9 / r / L,
                    total_msps=r * B / 1e6,
                )
    k = cp.pipeline_kernel(**cp.pipeline_config(80, H), RELU=0, arch=cuda_runtime.device_arch())
    a = k.attributes
    emit(part="pipe_kernel", regs=a.num_regs, local_bytes=a.local_size_bytes, smem=a.shared_size_bytes)


def cluster_ablation():
    """What parts of the row-split cluster layer cost: tanh against relu (the activation's share), lanes per row
    (shuffle rounds against columns per lane; prefetch depth 4 throughout, which the sweeps found not to matter), and
    the partials design beside it; one stream, 80 layers."""
    from speechkernels.wavenet.proxy.partials import serial_chain_partials

    g = torch.Generator().manual_seed(0)
    L, H, n = 80, 128, 4000
    for dtype in (torch.float32, torch.bfloat16):
        w = (torch.randn(L, H, H, generator=g) / math.sqrt(H)).to(dtype).cuda()
        x1 = torch.randn(1, H, generator=g).cuda()
        for relu in (False, True):
            for lpr in (4, 8, 16):
                fn = lambda k, w=w, x1=x1, relu=relu, lpr=lpr: cluster.serial_chain_cluster(  # noqa: E731
                    w, x1, k, relu, C=16, LPR=lpr, D=4
                )
                r = rate(fn, n)
                emit(
                    part="ablate",
                    design="cluster",
                    weights=str(dtype)[6:],
                    relu=relu,
                    LPR=lpr,
                    khz=r / 1e3,
                    ns_per_layer=1e9 / r / L,
                )
            r = rate(lambda k, w=w, x1=x1, relu=relu: serial_chain_partials(w, x1, k, relu), n)
            emit(
                part="ablate",
                design="partials",
                weights=str(dtype)[6:],
                relu=relu,
                khz=r / 1e3,
                ns_per_layer=1e9 / r / L,
            )


def cluster_sweep(part, options, reps=2):
    """One stream, tanh, 80 layers of 128x128: the row-split cluster kernel with each of ``options`` (keyword
    overrides of its configuration; C = 16 unless given), float32 and bfloat16 weights (options with WIL: bfloat16
    only), ``reps`` times in turn."""
    g = torch.Generator().manual_seed(0)
    L, H, n = 80, 128, 4000
    for dtype in (torch.float32, torch.bfloat16):
        w = (torch.randn(L, H, H, generator=g) / math.sqrt(H)).to(dtype).cuda()
        x0 = torch.randn(1, H, generator=g).cuda()
        for rep in range(reps):
            for o in options:
                if o.get("WIL") and dtype != torch.bfloat16:
                    continue
                kw = {"C": 16, **o}
                r = rate(lambda k, w=w, x0=x0, kw=kw: cluster.serial_chain_cluster(w, x0, k, False, **kw), n)
                base = cluster.row_split_config(H, kw["C"], 1, dtype == torch.bfloat16)
                cfg = {"ACQ": "default", **base, **kw}  # as run
                emit(part=part, weights=str(dtype)[6:], B=1, **cfg, rep=rep, khz=r / 1e3, ns_per_layer=1e9 / r / L)


def cluster_depth():
    """The row-split cluster kernel's prefetch depth D."""
    cluster_sweep("depth", [dict(D=d) for d in (2, 4, 6, 8)])


VARIANTS = (  # the row-split kernel's critical-path options (v15-v20 ran other sets)
    dict(ACQ=0, RED=0, FCH=2, LIW=0, WIL=0, CIL=0),
    dict(ACQ=1, RED=1, FCH=2, LIW=0, WIL=0, CIL=0),
    dict(ACQ=1, RED=1, FCH=2, LIW=0, WIL=0, CIL=1),
    dict(ACQ=1, RED=1, FCH=4, LIW=0, WIL=0, CIL=1),
    dict(ACQ=1, RED=1, FCH=4, LIW=1, WIL=1, CIL=0),
    dict(ACQ=1, RED=1, FCH=4, LIW=1, WIL=1, CIL=1),
    dict(ACQ=1, RED=1, FCH=2, LIW=1, WIL=1, CIL=1),
)


def cluster_variants():
    """The row-split cluster kernel's critical-path options, one stream, tanh: ACQ the wait's acquire (0:
    acquire.cluster on the poll, which adds an L1 invalidation; 1: relaxed poll and a fence restricted to
    shared::cluster), RED the row reduction (0: log2(LPR) dependent xor shuffles; 1: one round of LPR indexed
    shuffles), FCH independent FMA chains per lane, LIW the input loads inside the polling loop, WIL the bfloat16
    conversion inside it too (before the poll), TW test_wait instead of try_wait, WAIT_HINT try_wait's suspend-time
    hint (ns), POLL relaxed stores and spinning on the data (three buffers, no mbarriers), CIL interleaved columns
    (lane l of a row: columns 4 (l + LPR j) + 0..3), D the prefetch depth, LPR lanes per row, C the cluster size (16
    unless given). Options with WIL run with bfloat16 weights only; WAIT_HINT and POLL were removed after v18 and
    v20 (slower or equal). Each row names every option as run (v15-v21 named only those set; the others were off,
    D = 4 and LPR = 8; v25 named only those set, the others the final defaults)."""
    cluster_sweep("variants", VARIANTS)


def vocoder_acq():
    """The cluster vocoder (20 layers, one stream, sampling included) with the wait's two semantics (ACQ of
    cluster_common.cuh: 0 acquire.cluster on the poll, 1 relaxed poll and a restricted fence) and the lanes'
    columns contiguous or interleaved (VIL 0 / 1; v23 ran before VIL, as VIL 0), both weight types."""
    from speechkernels.wavenet import WaveNet, cluster_vocoder

    orig = cluster_vocoder.vocoder_cluster_kernel
    torch.manual_seed(0)
    net = WaveNet(layers=20, cycle=10).cuda().eval()
    n = 4000
    cond = torch.randn(1, net.cond_channels, math.ceil(n / net.hop_length)).cuda()
    gen = torch.Generator(device="cuda").manual_seed(0)
    try:
        for rep in range(2):
            for acq, vil in ((0, 0), (0, 1), (1, 1)):
                cluster_vocoder.vocoder_cluster_kernel = lambda acq=acq, vil=vil, **kw: orig(**kw, ACQ=acq, VIL=vil)
                for wd in (torch.float32, torch.bfloat16):
                    fn = lambda k, wd=wd: net.generate(cond, k, generator=gen, kernel="cluster", weights_dtype=wd)  # noqa: E731
                    r = rate(fn, n)
                    emit(part="vocoder_acq", layers=20, weights=str(wd)[6:], ACQ=acq, VIL=vil, rep=rep, khz=r / 1e3)
    finally:
        cluster_vocoder.vocoder_cluster_kernel = orig


def partials_sweep():
    """The column-split (partials) design's cluster size C and prefetch depth D, one stream, tanh."""
    from speechkernels.wavenet.proxy.partials import serial_chain_partials

    g = torch.Generator().manual_seed(0)
    L, H, n = 80, 128, 4000
    for dtype in (torch.float32, torch.bfloat16):
        w = (torch.randn(L, H, H, generator=g) / math.sqrt(H)).to(dtype).cuda()
        x1 = torch.randn(1, H, generator=g).cuda()
        for C in (4, 8, 16):
            for d in (2, 4, 8):
                r = rate(lambda k, w=w, x1=x1, C=C, d=d: serial_chain_partials(w, x1, k, False, C=C, D=d), n)
                emit(part="partials", weights=str(dtype)[6:], C=C, D=d, khz=r / 1e3, ns_per_layer=1e9 / r / L)


def pipeline_profile():
    """SM clocks inside the layer-split design (thread 0 of each CTA, samples 100-103): per layer the B loads
    and tensor-core products (0-1), reduction, activation, split and stores (1-2), the block barrier (2-3); per
    CTA its span from the end of its wait to its send, and the sample period; the hop is what the period leaves
    after the CTAs' spans."""
    from speechkernels.wavenet.proxy import pipeline as cp

    H, n, P = 128, 400, 100
    g = torch.Generator().manual_seed(0)
    for L, C in ((5, 1), (40, 8), (80, 16)):
        cfg = cp.pipeline_config(L, H, C=C)
        C, LPC = cfg["C"], cfg["LPC"]
        w = (torch.randn(L, H, H, generator=g) / math.sqrt(H)).to(torch.bfloat16).cuda()
        x0 = torch.randn(1, H, generator=g).cuda()
        prof = torch.zeros(C * (4 * (LPC + 1) * 4 + 2048), dtype=torch.int64, device="cuda")
        wall = event_time(
            lambda w=w, x0=x0, C=C, prof=prof: cp.serial_chain_pipeline(w, x0, n, False, C=C, PROF=P, prof=prof), reps=3
        )
        allp = prof.cpu().numpy().astype(np.int64)
        q = allp[: C * 4 * (LPC + 1) * 4].reshape(C, 4, LPC + 1, 4)
        gt = allp[C * 4 * (LPC + 1) * 4 :].reshape(C, 1024, 2)[:, :n]  # ns: start, end of each CTA's part
        gstart = gt[0, 1:, 0] - gt[0, :-1, 0]  # CTA 0's sample period
        gspan = gt[:, 10:, 1] - gt[:, 10:, 0]  # each CTA's part
        timeline = {
            "period_ns": np.percentile(gstart[10:], [10, 50, 90, 99]).tolist(),
            "max_period_ns": int(gstart.max()),
            "span_ns_median_per_cta": np.median(gspan, axis=1).astype(int).tolist(),
        }
        if C > 1:
            hops = gt[1:, 10:, 0] - gt[:-1, 10:, 1]  # CTA c+1 starts after CTA c ends, same sample
            timeline["hop_ns_median_per_cta"] = np.median(hops, axis=1).astype(int).tolist()
        seg = {k: [] for k in ("mma", "tail", "sync", "layer")}
        span, period = [], []
        for c in range(C):
            for s in range(4):
                for j in range(LPC):
                    a = q[c, s, j]
                    seg["mma"].append(a[1] - a[0])
                    seg["tail"].append(a[2] - a[1])
                    seg["sync"].append(a[3] - a[2])
                    if j + 1 < LPC:
                        seg["layer"].append(q[c, s, j + 1, 0] - a[0])
                if c > 0 or s > 0:
                    span.append(q[c, s, LPC - 1, 2] - q[c, s, LPC, 0])
                if s > 0 and (c > 0 or s > 1):
                    period.append(q[c, s, LPC, 0] - q[c, s - 1, LPC, 0])
        row = {k: float(np.median(v)) for k, v in seg.items() if v}
        row.update(span=float(np.median(span)), period=float(np.median(period)) if period else None)
        if row["period"]:
            row["hop"] = (row["period"] - C * row["span"]) / C
        # SM clock: the sample period in clocks over its wall time (the whole run's, per sample)
        emit(
            part="pipe_profile",
            L=L,
            C=C,
            LPC=LPC,
            clocks=row,
            us_per_sample=wall / n * 1e6,
            ghz=(row["period"] or 0) / (wall / n) / 1e9,
            timeline=timeline,
        )


def proxy_sweeps(quick, parts=("stream", "cluster", "many"), cs=(1, 2, 4, 8)):
    g = torch.Generator().manual_seed(0)
    L, H = 80, 128
    w32 = (torch.randn(L, H, H, generator=g) / math.sqrt(H)).cuda()
    for dtype in ("float32", "bfloat16"):
        w = w32.to(getattr(torch, dtype))
        x1 = torch.randn(1, H, generator=g).cuda()
        ref = serial_chain_reference(w.float().cpu(), x1.cpu(), n_samples=50)
        for nw in (4, 8, 16, 32) if "stream" in parts else ():
            khz = rate(lambda n, nw=nw, w=w, x1=x1: serial_chain_stream(w, x1, n, False, num_warps=nw), 2000) / 1e3
            emit(probe="stream", weights=dtype, B=1, num_warps=nw, kHz=khz)
        if "stream" in parts:
            khz = rate(lambda n, w=w, x1=x1: serial_chain_barrier(w, x1, n, False), 500) / 1e3
            emit(probe="barrier", weights=dtype, B=1, kHz=khz)
        for C in cs if "cluster" in parts else ():
            base = cluster.row_split_config(H, C, 1, dtype == "bfloat16")
            variants = [(8, d, 0) for d in sorted({2, 4, 8, base["D"]})] + [(lpr, base["D"], 0) for lpr in (4, 16, 32)]
            variants += [(lpr, 4, 1) for lpr in (8, 16)]  # mbarrier.test_wait spinning instead of try_wait
            for lpr, d, tw in variants:
                if True:
                    over = {"LPR": lpr, "D": d, "TW": tw}
                    try:
                        cluster.check_row_split_config({**base, **over})
                        out = cluster.serial_chain_cluster(w, x1, 50, False, C=C, **over)
                        err = (out.cpu().double() - ref).abs().max().item()
                        fn = lambda n, C=C, over=over, w=w, x1=x1: cluster.serial_chain_cluster(  # noqa: E731
                            w, x1, n, False, C=C, **over
                        )
                        khz = rate(fn, 4000) / 1e3
                        emit(
                            probe="cluster",
                            weights=dtype,
                            B=1,
                            C=C,
                            LPR=lpr,
                            D=d,
                            kHz=khz,
                            max_err=err,
                            default=over == {"LPR": base["LPR"], "D": base["D"], "TW": 0},
                        )
                    except Exception as e:  # noqa: BLE001
                        emit(probe="cluster", weights=dtype, B=1, C=C, LPR=lpr, D=d, error=str(e)[:300])
                if quick:
                    break
        for B in (132, 1024) if "many" in parts else ():
            xb = torch.randn(B, H, generator=g).cuda()
            for C in (2, 4):
                for S in (1, 2, 4, 8):
                    try:
                        hz = rate(
                            lambda n, C=C, S=S, w=w, xb=xb: cluster.serial_chain_cluster(w, xb, n, False, C=C, S=S), 400
                        )
                        emit(
                            probe="cluster_many",
                            weights=dtype,
                            B=B,
                            C=C,
                            S=S,
                            kHz_per_stream=hz / 1e3,
                            MSps_total=hz * B / 1e6,
                        )
                    except Exception as e:  # noqa: BLE001
                        emit(probe="cluster_many", weights=dtype, B=B, C=C, S=S, error=str(e)[:300])


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--parts", default="l2,stream,cluster,many")
    ap.add_argument("--C", default="1,2,4,8,16")
    a = ap.parse_args()
    parts = a.parts.split(",")
    cs = tuple(int(c) for c in a.C.split(","))
    emit(device=torch.cuda.get_device_name(), torch=torch.__version__)
    try:
        import cuda.core

        emit(cuda_core=getattr(cuda.core, "__version__", "?"))
    except ImportError as e:
        emit(cuda_core_error=str(e))
    for part in (
        ([l2_bandwidth] if "l2" in parts else [])
        + ([pipeline_probe] if "pipe" in parts else [])
        + ([pipeline_profile] if "pipeprof" in parts else [])
        + ([cluster_ablation] if "ablate" in parts else [])
        + ([cluster_depth] if "depth" in parts else [])
        + ([partials_sweep] if "partials" in parts else [])
        + ([cluster_variants] if "variants" in parts else [])
        + ([vocoder_acq] if "vocacq" in parts else [])
        + [lambda: proxy_sweeps(a.quick, parts, cs)]
    ):
        try:
            part()
        except Exception as e:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            emit(part_error=str(e)[:500])
