"""Command line: ``tblock report``, ``tblock lesson``, ``tblock demo`` and ``tblock --version``
(also ``python -m tblock ...``)."""

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
    dem = sub.add_parser("demo", help="the interactive demo as a page, served from 127.0.0.1 "
                                      "(or --export a copy that opens from file://)",
                         description="Six tokens through one Post-LN block, stop by stop; every number "
                                     "on the page is computed by tblock. Ctrl-C stops the server.")
    dem.add_argument("--port", type=int, default=8013, help="port on 127.0.0.1 (default 8013; 0 picks a free one)")
    dem.add_argument("--no-browser", action="store_true", help="print the URL without opening a browser")
    dem.add_argument("--export", metavar="DIR", help="write a static copy, every toggle precomputed, into DIR")
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
    if args.command == "demo":
        from .lesson.demo_server import main as demo_main
        return demo_main(args)
    return 1


if __name__ == "__main__":
    sys.exit(main())
