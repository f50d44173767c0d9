"""The beam search kernels' registers and spills per variant, without a GPU: each variant of the CTC beam kernel
(beam, fusion) and of the transducer search's step kernel (beam, RNN-T or TDT, fusion) compiled for sm_90 by the
installed Triton at its launcher's tiles, its PTX assembled by Triton's own ptxas with -v. A spill (local memory
traffic in a search's inner loop) shows here before any timing does.

    PYTHONPATH=$PWD python benchmarks/beam_kernel_registers.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

from speechkernels._launch import next_power_of_2
from speechkernels.decode.beam_kernels import BEAM_TILES, _ctc_beam_kernel
from speechkernels.decode.transducer_beam_kernels import STEP_TILES, _malsd_step_kernel

SIGNATURE = dict(  # (the CTC kernel's; the fusion's pointers shared with the step kernel)
    x_ptr="*fp32", len_ptr="*i64", node_ptr="*i32", tok_ptr="*i64", frm_ptr="*i64", olen_ptr="*i64",
    score_ptr="*fp32", ac_ptr="*fp32", lm_ptr="*fp32", T="i32", C="i32", blank="i32", bonus="fp32", prune="fp32",
    ovl_ptr="*i64", nxl_ptr="*i64", lm_w="fp32", lm_start="i32", chain_ptr="*i64", above_ptr="*fp32",
    base_ptr="*fp32", as_ptr="*i64", at_ptr="*i64", al_ptr="*fp32", an_ptr="*i64", uni_ptr="*fp32",
    unext_ptr="*i64", col_ptr="*i64", end_ptr="*fp32", gn_ptr="*fp32", bnx_ptr="*i64", rg_ptr="*fp32",
    ns_ptr="*fp32",
)  # fmt: skip


def variant(beam: int, lm: bool, boost: bool) -> dict:
    """The CTC kernel's registers, spill stores and loads (bytes) of one variant at the launcher's tiles (4-gram
    LM, depth 8 trie)."""
    KP = max(2, next_power_of_2(beam))
    wide = KP >= BEAM_TILES["wide"]
    bc = BEAM_TILES["block_c_wide"] if wide else BEAM_TILES["block_c"]
    consts = dict(K=beam, KP=KP, B=1, BP=2, BC=bc, PRUNE=False, BT=256, LM=lm, DEPTH=3 if lm else 0,
                  DP=4 if lm else 1, BOOST=boost, BA=BEAM_TILES["block_arcs"],
                  WIDE=wide)  # fmt: skip
    found = assemble(_ctc_beam_kernel, SIGNATURE, consts, BEAM_TILES["warps"])
    return dict(kernel="ctc", beam=beam, lm=lm, boost=boost, block_c=bc, warps=BEAM_TILES["warps"], **found)


STEP_POINTERS = dict(
    x_ptr="*fp32", len_ptr="*i64", go_ptr="*u8", step_ptr="*i32", dur_ptr="*i32", sf_ptr="*fp32", si_ptr="*i32",
    hsh_ptr="*i64", hist_ptr="*i32", row_ptr="*i64", lab_ptr="*i64", islab_ptr="*i1", frm_ptr="*i64",
)  # fmt: skip


def step_variant(beam: int, durations: int, lm: bool, boost: bool, modified: bool = False) -> dict:
    """The same for the transducer search's step kernel (1,025 classes; ``durations`` 0: RNN-T; ``modified``:
    icefall's search)."""
    names = list(_malsd_step_kernel.arg_names)
    fusion = {k: v for k, v in SIGNATURE.items() if k in names}
    scalars = dict.fromkeys(("NK", "T", "V", "W", "blank", "max_symbols"), "i32")
    scalars.update(dict.fromkeys(("fusion", "one_fusion", "b_w"), "fp32"))
    KP = max(2, next_power_of_2(beam))
    wide = KP >= STEP_TILES["wide"]
    bc = STEP_TILES["block_c_wide" if wide else "block_c"]
    warps = STEP_TILES["warps_wide" if wide else "warps"]
    consts = dict(K=beam, KP=KP, BC=bc, D=durations, DD=max(2, next_power_of_2(max(durations, 1))), LM=lm,
                  DEPTH=3 if lm else 0, DP=4 if lm else 1, BOOST=boost,
                  BA=STEP_TILES["block_arcs"], MODIFIED=modified)  # fmt: skip
    signature = {n: {**STEP_POINTERS, **scalars, **fusion}[n] for n in names if n not in consts}
    found = assemble(_malsd_step_kernel, signature, consts, warps)
    return dict(kernel="modified step" if modified else "malsd step", beam=beam, durations=durations, lm=lm,
                boost=boost, block_c=bc, warps=warps, **found)  # fmt: skip


def assemble(fn, signature: dict, consts: dict, warps: int) -> dict:
    """Registers and spills of ``fn`` compiled for sm_90 with these constexprs."""
    src = ASTSource(fn=fn, signature={**signature, **dict.fromkeys(consts, "constexpr")}, constexprs=consts)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(kernel.asm["ptx"])
        f.flush()
        info = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"],
                              capture_output=True, text=True, check=True).stderr  # fmt: skip
    number = lambda pattern: int(re.search(pattern, info).group(1))  # noqa: E731
    return dict(registers=number(r"Used (\d+) registers"), spill_stores=number(r"(\d+) bytes spill stores"),
                spill_loads=number(r"(\d+) bytes spill loads"))  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    rows = []
    fusions = ((False, False), (True, False), (True, True))
    for beam in (4, 10, 32):
        for lm, boost in fusions:
            rows.append(variant(beam, lm, boost))
            print(rows[-1], flush=True)
    for beam in (4, 8):
        for durations in (0, 5):
            for lm, boost in fusions:
                rows.append(step_variant(beam, durations, lm, boost))
                print(rows[-1], flush=True)
        for lm, boost in fusions:
            rows.append(step_variant(beam, 0, lm, boost, True))
            print(rows[-1], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"triton": triton.__version__, "ptxas": get_ptxas(90).version, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
