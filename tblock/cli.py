"""Command line: ``tblock report`` (also ``python -m tblock report``)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tblock", description="A fast, verified transformer block for the CPU.")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="worked example through every backend, counts and timings")
    rep.add_argument("--d-model", type=int, default=768, help="d_model of the timed config (default 768)")
    rep.add_argument("--n-heads", type=int, default=12, help="heads of the timed config (default 12)")
    rep.add_argument("-T", "--tokens", type=int, default=1024, help="sequence length of the timed config")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "report":
        from .report import run_report
        try:
            return run_report(d_model=args.d_model, n_heads=args.n_heads, T=args.tokens)
        except (ValueError, TypeError) as e:
            print(f"tblock report: error: {e}", file=sys.stderr)
            return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
