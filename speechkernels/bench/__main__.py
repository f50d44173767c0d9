"""Benchmarks of every capability against its peers:
python -m speechkernels.bench {ctc,rnnt,joint,tdt,align,wavenet,all}."""

import argparse
import sys

from . import align, ctc, joint, rnnt, tdt, wavenet


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m speechkernels.bench", description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("ctc", help="CTC loss: DeepBench table (T=150) and T=1500 rows")
    ctc.add_arguments(p)
    p = sub.add_parser("rnnt", help="RNN-T loss: warp-rnnt's benchmark table")
    rnnt.add_arguments(p)
    p = sub.add_parser("joint", help="joint network + RNN-T loss: a transducer joint's training step")
    joint.add_arguments(p)
    p = sub.add_parser("tdt", help="TDT and multi-blank transducer losses against rnnt_loss")
    tdt.add_arguments(p)
    p = sub.add_parser("align", help="CTC forced alignment against torchaudio's forced_align")
    align.add_arguments(p)
    p = sub.add_parser("wavenet", help="WaveNet inference: the serial-chain proxy and the vocoder")
    wavenet.add_arguments(p)
    p = sub.add_parser("all", help="every benchmark above with its defaults")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    args = parser.parse_args(argv)
    if args.what == "all":
        device = ["--device", args.device] if args.device else []
        rc = 0
        for what, run in (
            ("ctc", ctc.run),
            ("rnnt", rnnt.run),
            ("joint", joint.run),
            ("tdt", tdt.run),
            ("align", align.run),
            ("wavenet", wavenet.run),
        ):
            rc |= run(parser.parse_args([what, *device]))
        return rc
    if args.what == "ctc":
        return ctc.run(args)
    if args.what == "rnnt":
        return rnnt.run(args)
    if args.what == "joint":
        return joint.run(args)
    if args.what == "tdt":
        return tdt.run(args)
    if args.what == "align":
        return align.run(args)
    if args.what == "wavenet":
        return wavenet.run(args)
    return 1


if __name__ == "__main__":
    sys.exit(main())
