"""Where a decode step's time goes, by compiled function: perf's samples of a process taking
decode steps, named through gdb.

    python bench/profile_decode.py PATH --weights int8 --dot int8
    python bench/profile_decode.py PATH --weights int4 --dot int8 --kv bf16 --threads 1 --seconds 8

PATH: a checkpoint tblock.load reads (GPT2 or Llama; bench_engines' models are under
~/.cache/tblock-engines/models/*/hf).  A child process loads it, fills a KV cache with a
prompt of --context tokens and then takes next_logits steps at that context until it is
killed; ``perf record -p`` samples its threads for --seconds.  Numba's compiled code is
anonymous memory to perf, but Numba registers each function with gdb's JIT interface, so
the parent asks ``gdb -p`` for the symbol of each sampled address (16-byte granules, the
most sampled first) and sums the samples by function: a kernel by its module and name
(the ABI tags and argument types dropped), other code by its shared object.

A share is of all samples of the child's threads, busy or spinning: a worker that waits
for the other at the end of a stage shows as the parallel region's own body
(``parfor_gufunc``: the task counters and their spin waits), one that waits for the next
region as libgomp.  Not in CI: it needs Linux perf (kernel.perf_event_paranoid <= 2) and
gdb, and nothing is asserted; the figures go to docs/perf-log.md.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

GRANULE = 16            # bytes of code a sample is counted to before gdb names it
NAMED = 600             # granules named through gdb, the most sampled first


def child(args) -> None:
    """Take decode steps until killed; print the median step once, then 'ready'."""
    import numpy as np
    import tblock
    m = tblock.load(args.path, weights=args.weights, dot=args.dot)
    buf = np.empty((1, m.vocab_size), np.float32)
    cache = m.make_cache(args.context + 8, format=args.kv)
    m.next_logits(np.arange(args.context) % m.vocab_size, cache, out=buf)
    tok = np.array([1])

    def steps(n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            for c in cache:
                c.length = args.context
            m.next_logits(tok, cache, out=buf)
        return (time.perf_counter() - t) / n

    steps(10)
    print(f"step {1e3 * sorted(steps(20) for _ in range(5))[2]:.3f} ms", flush=True)
    print("ready", flush=True)
    while True:
        steps(100)


def short_name(symbol: str) -> str:
    """tblock.kernels.qgroups.gemv_groups for a Numba function's symbol as gdb prints it
    (tblock::kernels::qgroups::gemv_groups[abi:...](argument types)); anything else as it is."""
    if "::" not in symbol:
        return symbol
    name = re.split(r"\[abi:|\(", symbol, maxsplit=1)[0].replace("::", ".")
    name = re.sub(r"_3clocals_3e|_3clambda_3e|_3cdynamic_3e|<locals>|<lambda>|<dynamic>", "", name)
    name = re.sub(r"_0x[0-9a-f]+$", "", name)          # a parallel region's body: one name for all
    return re.sub(r"\.{2,}", ".", name).strip(".")


def gdb_symbols(pid: int, addrs: list[int]) -> list[str]:
    """gdb's 'info symbol' of each address in the live process pid ('' where none)."""
    cmds = []
    for a in addrs:
        cmds += ["-ex", f"info symbol {a:#x}"]
    out = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx"] + cmds, capture_output=True, text=True).stdout
    lines = [ln for ln in out.splitlines() if " in section " in ln or ln.startswith("No symbol matches")]
    if len(lines) != len(addrs):
        raise SystemExit(f"gdb answered {len(lines)} of {len(addrs)} addresses: {out[-400:]}")
    return [re.sub(r" \+ \d+$", "", ln.split(" in section ")[0]) if " in section " in ln else "" for ln in lines]


def samples(data: str) -> tuple[collections.Counter, collections.Counter]:
    """perf's samples in data: (JIT code granule -> count, other code's symbol -> count)."""
    out = subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym,dso"], capture_output=True, text=True,
                         check=True).stdout
    jit, other = collections.Counter(), collections.Counter()
    for line in out.splitlines():
        parts = line.split(None, 1)
        if not parts:
            continue
        if "perf-" in line or "[JIT]" in line:
            jit[int(parts[0], 16) // GRANULE] += 1
        else:
            rest = parts[1] if len(parts) > 1 else "?"
            sym, _, dso = rest.rpartition(" (")
            lib = os.path.basename(dso.rstrip(")"))
            other[(sym.strip() if sym.strip() not in ("", "[unknown]") else "?") + f" [{lib}]"] += 1
    return jit, other


def profile(args) -> None:
    for tool in ("perf", "gdb"):
        if shutil.which(tool) is None:
            raise SystemExit(f"profile_decode needs {tool} on PATH")
    env = dict(os.environ, NUMBA_NUM_THREADS=str(args.threads))
    cmd = [sys.executable, __file__, args.path, "--child", "--weights", args.weights, "--kv", args.kv,
           "--context", str(args.context), "--dot", args.dot]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    try:
        step = proc.stdout.readline().strip()
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"the child did not start: {step}")
        with tempfile.TemporaryDirectory() as tmp:
            data = os.path.join(tmp, "perf.data")
            subprocess.run(["perf", "record", "-q", "-p", str(proc.pid), "-F", str(args.freq), "-o", data, "--",
                            "sleep", str(args.seconds)], check=True, stderr=subprocess.DEVNULL)
            jit, other = samples(data)
        top = [g for g, _ in jit.most_common(NAMED)]
        names = gdb_symbols(proc.pid, [g * GRANULE for g in top])
    finally:
        proc.kill()
        proc.wait()
    total = sum(jit.values()) + sum(other.values())
    by = collections.Counter()
    for g, name in zip(top, names):
        by[short_name(name) if name else "(unnamed compiled code)"] += jit[g]
    by["(compiled code, less sampled granules)"] += sum(jit.values()) - sum(jit[g] for g in top)
    for sym, n in other.items():
        by[sym] += n
    print(f"{args.path}: weights {args.weights}, dot {args.dot}, KV {args.kv}, context {args.context}, "
          f"{args.threads} threads; {step} (before sampling); {total} samples in {args.seconds} s")
    for name, n in by.most_common():
        if 100 * n / total >= args.min_share:
            print(f"{100 * n / total:6.1f}%  {name}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", help="a checkpoint folder tblock.load reads")
    ap.add_argument("--weights", default="fp32", help="tblock.load's weights (default fp32)")
    ap.add_argument("--dot", default="fp32", help="tblock.load's dot (default fp32)")
    ap.add_argument("--kv", default="fp32", help="the KV cache's format (default fp32)")
    ap.add_argument("--context", type=int, default=128, help="tokens in the cache at each step (default 128)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=5.0, help="how long perf samples (default 5)")
    ap.add_argument("--freq", type=int, default=4000, help="samples a second a thread (default 4000)")
    ap.add_argument("--min-share", type=float, default=0.3, help="leave out functions under this %% (default 0.3)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    (child if args.child else profile)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
