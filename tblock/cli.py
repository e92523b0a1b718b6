"""Command line: ``tblock report`` (also ``python -m tblock report``)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tblock", description="A fast, verified transformer block for the CPU.")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="time every component of every backend over a T sweep; "
                                        "write report.md, report.json and plots",
                         description="Worked example through every backend, GEMM ceilings, then every "
                                     "component timed over a sweep of T: where attention overtakes the FFN.")
    from .report import add_arguments
    add_arguments(rep)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "report":
        from . import report
        return report.main(args, "tblock " + " ".join(sys.argv[1:] if argv is None else argv))
    return 1


if __name__ == "__main__":
    sys.exit(main())
