"""Command line: ``tblock report``, ``tblock lesson`` and ``tblock --version`` (also ``python -m tblock ...``)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    parser = argparse.ArgumentParser(prog="tblock", description="A fast, verified transformer block for the CPU.")
    parser.add_argument("--version", action="version", version=f"tblock {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="time every component of every backend over a T sweep; "
                                        "write report.md, report.json and plots",
                         description="Worked example through every backend, GEMM ceilings, then every "
                                     "component timed over a sweep of T: where attention overtakes the FFN.")
    from .report import add_arguments
    add_arguments(rep)
    les = sub.add_parser("lesson", help="Lesson 13's walk-through on its worked example beside the lesson's "
                                        "numbers; writes the lesson's figures as PNG")
    les.add_argument("--out", default="lesson13-figures", metavar="DIR",
                     help="folder for the figures (default ./lesson13-figures)")
    les.add_argument("--backend", default="numpy", help="backend to run the block on (default numpy)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "report":
        from . import report
        return report.main(args, "tblock " + " ".join(sys.argv[1:] if argv is None else argv))
    if args.command == "lesson":
        from .lesson import run_lesson
        try:
            return run_lesson(out_dir=args.out, backend=args.backend)
        except (ValueError, TypeError) as e:
            print(f"tblock lesson: error: {e}", file=sys.stderr)
            return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
