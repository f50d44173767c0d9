"""Benchmarks of every capability against its peers:
python -m speechkernels.bench {ctc,rnnt,joint,tdt,align,decode,wavenet,all} [options].

Each benchmark prints a table (a legend of its columns first) and takes the same options: --device {cuda,cpu},
--rows ROWS (only these rows; the form is in each benchmark's --help), --json PATH (the rows and the environment:
device, versions, date), --plot PATH (a PNG of the speed-up over the best peer per row, for wavenet the kHz per
stream; needs matplotlib) and --reps N. Progress goes to stderr, the table to stdout. Without a CUDA GPU each
runs a short demo of the CPU paths (some 10 to 20 s for all of them); the GPU kernels are what the tables are about.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import speechkernels

if getattr(speechkernels, "__file__", None) is None:  # a folder named speechkernels shadows the package
    sys.exit(
        f"speechkernels imports as the folder {list(speechkernels.__path__)} (a namespace package without the "
        "library's code): run from another folder than the one holding the repository's clone"
    )

from . import align, common, ctc, decode, joint, rnnt, tdt, wavenet  # noqa: E402

CAPABILITIES = {
    "ctc": (ctc, "CTC loss: DeepBench table (T=150) and T=1500 rows"),
    "rnnt": (rnnt, "RNN-T loss: warp-rnnt's benchmark table"),
    "joint": (joint, "joint network + RNN-T loss: a transducer joint's training step"),
    "tdt": (tdt, "TDT and multi-blank transducer losses against rnnt_loss"),
    "align": (align, "CTC forced alignment against torchaudio's forced_align"),
    "decode": (decode, "greedy CTC and transducer decoding against the PyTorch loop and peers"),
    "wavenet": (wavenet, "WaveNet inference: the serial-chain proxy and the vocoder"),
}
START_SECONDS = 2  # importing torch and the package, once per process


def all_output(base: str, what: str, ext: str) -> str:
    """Where ``all`` writes one benchmark's file: BASE/WHAT.EXT if BASE is a folder (one that exists, or any path
    ending in /), else BASE_WHAT.EXT (an EXT already ending BASE dropped)."""
    if base.endswith(("/", os.sep)) or os.path.isdir(base):
        return os.path.join(base, what + ext)
    return f"{base.removesuffix(ext)}_{what}{ext}"


def all_rows(text: str) -> tuple[str, list]:
    """all --rows: BENCHMARK=ROWS, the rows in that benchmark's own form."""
    what, sep, rows = text.partition("=")
    if not sep or what not in CAPABILITIES:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not BENCHMARK=ROWS with BENCHMARK one of {', '.join(CAPABILITIES)}, e.g. ctc=150x8x28"
        )
    try:
        return what, CAPABILITIES[what][0].parse_rows(rows)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{what}: {err}") from None


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command line, and each subcommand's parser by name (for errors found after parsing)."""
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="python -m speechkernels.bench", description=__doc__, formatter_class=raw)
    sub = parser.add_subparsers(
        dest="what", required=True, metavar="BENCHMARK", help=f"one of {', '.join(CAPABILITIES)} or all"
    )
    subs = {}
    for name, (module, text) in CAPABILITIES.items():
        p = sub.add_parser(name, help=text, description=module.__doc__, formatter_class=raw)
        module.add_arguments(p)
        subs[name] = p
    p = sub.add_parser(
        "all",
        help="every benchmark above, one after the other",
        formatter_class=raw,
        description="Every benchmark with its default rows (on a CPU, short demos of each), one table after the other.",
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default=None,
        help="where to run (default: cuda when available, else cpu: a short demo of the CPU paths)",
    )
    p.add_argument(
        "--json",
        metavar="DIR/|PREFIX",
        default=None,
        help="one JSON file per benchmark: in a folder (an existing one, or a path ending in /, created "
        "if missing) as DIR/ctc.json, DIR/rnnt.json, ...; otherwise PREFIX_ctc.json, PREFIX_rnnt.json, "
        "...",
    )
    p.add_argument(
        "--plot",
        metavar="DIR/|PREFIX",
        default=None,
        help="one PNG per benchmark, named as --json names its files (DIR/ctc.png or PREFIX_ctc.png, "
        "...); needs matplotlib",
    )
    p.add_argument(
        "--rows",
        metavar="BENCHMARK=ROWS",
        type=all_rows,
        action="append",
        default=None,
        help="only these rows of one benchmark, in its own --rows form, e.g. --rows ctc=150x8x28 --rows "
        "rnnt=50x10x28x2 (repeat for others; the rest run their default rows)",
    )
    p.add_argument(
        "--reps",
        type=common.positive_int,
        default=None,
        help="timed repetitions for every benchmark (default: each benchmark's own)",
    )
    subs["all"] = p
    return parser, subs


def cpu_run(device: str | None) -> bool:
    return (device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cpu"


def main(argv: list[str] | None = None) -> int:
    parser, subs = build_parser()
    args = parser.parse_args(argv)
    if args.what != "all":
        module, p = CAPABILITIES[args.what][0], subs[args.what]
        common.check_common(p, args, [path for path in (args.json, args.plot) if path])
        if hasattr(module, "check"):
            module.check(p, args)
        if cpu_run(args.device):
            common.cpu_note(args.what, START_SECONDS + module.CPU_SECONDS)
        return module.run(args)

    p = subs["all"]
    common.check_common(p, args)
    for base in (args.json, args.plot):
        if base and base.endswith(("/", os.sep)):
            os.makedirs(base, exist_ok=True)
    rows = dict(args.rows or [])
    runs = []
    # every benchmark's arguments checked before the first runs: a mistake should not surface an hour in
    for what, (module, _) in CAPABILITIES.items():
        sub_args = subs[what].parse_args([])
        sub_args.device, sub_args.rows = args.device, rows.get(what)
        sub_args.json = all_output(args.json, what, ".json") if args.json else None
        sub_args.plot = all_output(args.plot, what, ".png") if args.plot else None
        if args.reps:
            sub_args.reps = args.reps
        common.check_common(p, sub_args, [path for path in (sub_args.json, sub_args.plot) if path])
        if hasattr(module, "check"):
            module.check(p, sub_args)
        runs.append((module, sub_args))
    if cpu_run(args.device):
        seconds = START_SECONDS + sum(module.CPU_SECONDS for module, _ in CAPABILITIES.values())
        common.cpu_note("every benchmark", seconds)
    rc = 0
    for module, sub_args in runs:
        rc |= module.run(sub_args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
