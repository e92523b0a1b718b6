"""A/B of this checkout against a base commit: outputs bit for bit, and paired call times.

    python bench/ab.py --base REV outputs     every case of bench/ab_worker.py, bitwise
    python bench/ab.py --base REV speed       paired rounds: the toy block, 384/64,
                                              768/1024, a GPT-2-small decode step,
                                              768/128 on bf16 and int8 weights, and a
                                              SmolLM2-shaped int8 decode step

The base is `git archive`d into a temporary folder and imported from there (its kernels/
mapped to tblock.kernels by a link, the C reference's built extension copied in); each
side runs bench/ab_worker.py in a process of its own.  Timing alternates the sides round
by round (which goes first alternates too), so both see the same moments of a noisy host;
the figure is the median of the per-round ratios new / base, with a bootstrap 90% interval
of that median: where it holds 1.0 the rounds did not tell the sides apart (on a shared
host a null run, no change against HEAD, can land several percent from 1.0:
docs/perf-log.md).  TBLOCK_ISA passes through.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "bench" / "ab_worker.py"
ROUNDS = {"toy": (40, 2000), "384x64": (30, 20), "768x1024": (12, 1), "decode": (30, 10),     # rounds, calls a round
          "bf16-768x128": (20, 5), "int8-768x128": (20, 5), "llama-int8-decode": (30, 20)}


def base_tree(rev: str, into: Path) -> Path:
    """The tree of ``rev`` under ``into``, importable as tblock (with tblock.kernels)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "tblock" / "kernels").symlink_to(into / "kernels", target_is_directory=True)
    for so in (ROOT / "tblock").glob("_cref*.so"):
        shutil.copy(so, into / "tblock" / so.name)
    return into


class Side:
    """A worker process importing tblock from ``path`` (None: this checkout's install)."""

    def __init__(self, path: Path | None, cache_dir: Path):
        env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
        if path is not None:
            env["PYTHONPATH"] = str(path)
        self.proc = subprocess.Popen([sys.executable, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env, cwd=str(path or ROOT))

    def ask(self, **msg) -> dict:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker died (exit {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def median_interval(ratios: list[float], level: float = 0.90, draws: int = 4000) -> tuple[float, float]:
    """A bootstrap interval of the median of ``ratios`` (rounds resampled with replacement;
    a fixed seed, so one set of rounds always prints the same interval)."""
    x = np.asarray(ratios)
    medians = np.median(np.random.default_rng(0).choice(x, size=(draws, x.size)), axis=1)
    tail = (1.0 - level) / 2 * 100
    return float(np.percentile(medians, tail)), float(np.percentile(medians, 100 - tail))


def compare_outputs(a: Path, b: Path) -> int:
    """Print the cases whose arrays differ in any bit; the number of them."""
    old, new = np.load(a), np.load(b)
    bad = 0
    for key in sorted(set(old.files) | set(new.files)):
        if key not in old.files or key not in new.files:
            print(f"  {key}: only in {'new' if key in new.files else 'base'}")
            bad += 1
            continue
        x, y = old[key], new[key]
        if x.shape != y.shape or x.dtype != y.dtype or x.tobytes() != y.tobytes():
            diff = np.max(np.abs(x.astype(float) - y.astype(float))) if x.shape == y.shape else "shape"
            print(f"  {key}: differs (max abs {diff})")
            bad += 1
    print(f"{len(new.files)} cases, {bad} differ")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the commit to compare with")
    ap.add_argument("what", choices=("outputs", "speed"))
    ap.add_argument("--cases", default=",".join(ROUNDS), help="speed: comma-separated cases")
    ap.add_argument("--rounds", type=int, default=0, help="speed: rounds of every case (default: the case's own)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tblock-ab-") as tmp:
        tmp = Path(tmp)
        (tmp / "base").mkdir()
        base = Side(base_tree(args.base, tmp / "base"), tmp / "cache-base")
        new = Side(None, tmp / "cache-new")
        try:
            if args.what == "outputs":
                base.ask(cmd="outputs", path=str(tmp / "base.npz"))
                new.ask(cmd="outputs", path=str(tmp / "new.npz"))
                return 1 if compare_outputs(tmp / "base.npz", tmp / "new.npz") else 0
            for case in args.cases.split(","):
                rounds, n = ROUNDS[case]
                rounds = args.rounds or rounds
                for side in (base, new):
                    side.ask(cmd="time", case=case, n=n)        # warm: compiled, caches touched
                ratios, times = [], {"base": [], "new": []}
                for r in range(rounds):
                    order = ((base, "base"), (new, "new")) if r % 2 == 0 else ((new, "new"), (base, "base"))
                    got = {}
                    for side, name in order:
                        got[name] = side.ask(cmd="time", case=case, n=n)["seconds"] / n
                        times[name].append(got[name])
                    ratios.append(got["new"] / got["base"])
                q = statistics.quantiles(ratios, n=4)
                lo, hi = median_interval(ratios)
                print(f"{case:9s} base {statistics.median(times['base']) * 1e6:10.1f} us  new "
                      f"{statistics.median(times['new']) * 1e6:10.1f} us  new/base median {statistics.median(ratios):.3f}"
                      f" (90% interval {lo:.3f}-{hi:.3f}; IQR {q[0]:.3f}-{q[2]:.3f}, {rounds} rounds)", flush=True)
            return 0
        finally:
            base.close()
            new.close()


if __name__ == "__main__":
    sys.exit(main())
