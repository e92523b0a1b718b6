"""One timing harness: warm-up, looped repeats, interleaved rounds, the T grid and a progress bar."""

from __future__ import annotations

import math
import statistics
import sys
import time


def settle(seconds: float) -> None:
    """Let the previous library's thread pools fall asleep (they spin for a while after a call)."""
    time.sleep(seconds)


def seconds(fn, *args) -> float:
    """Wall time of one call."""
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def first_calls(fn, args) -> tuple[float, float]:
    """Seconds of the first call (compilation and first touch land there) and of the second,
    which sizes what follows."""
    return seconds(fn, *args), seconds(fn, *args)


def measure(fn, args, repeats: int, min_repeat_s: float, target_s: float = 0.0) -> dict:
    """Time ``fn(*args)``: the two first calls on their own, then at least ``repeats``
    repeats of ``inner`` calls each (more, up to 25, while they fit in ``target_s``: cheap
    points get a sturdier median on a noisy machine); per-call median and minimum."""
    first, second = first_calls(fn, args)
    # loop short calls so a repeat is well above the timer's resolution and call overhead
    inner = int(min(10_000, max(1, math.ceil(min_repeat_s / max(second, 1e-9)))))
    n = max(repeats, min(25, int(target_s / max(inner * second, 1e-9))))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn(*args)
        times.append((time.perf_counter() - t0) / inner)
    return {"first_call_s": first, "median_s": statistics.median(times), "min_s": min(times),
            "times_s": times, "inner": inner, "repeats": n}


# Thread pools (torch's OpenMP, ONNX Runtime's, Numba's "omp" layer) spin for a few
# milliseconds after a parallel region; a call started meanwhile shares the cores with them.
# So interleaved() runs each implementation in blocks of back-to-back calls, after a pause
# and one uncounted call: each is timed as it runs in a loop, none pays for another's threads.
PAUSE_S = 0.05
PER_BLOCK = 4          # timed samples per implementation per round
SAMPLE_S = 0.005       # cheap calls are looped until a sample lasts this long


def interleaved(fns, min_reps, budget_s, max_reps=200):
    """Rounds of every fn in turn, so all share the machine's load, until each has
    ``min_reps`` samples and ``budget_s`` is spent; {name: [seconds per call, a sample each]}."""
    if not fns:
        return {}
    inner = {}
    for name, f in fns.items():
        f()
        inner[name] = max(1, math.ceil(SAMPLE_S / max(seconds(f), 1e-9)))
    times = {name: [] for name in fns}
    start = time.perf_counter()
    while True:
        n = min(len(t) for t in times.values())
        if n >= max_reps or (n >= min_reps and time.perf_counter() - start >= budget_s):
            return times
        for name, f in fns.items():
            settle(PAUSE_S)
            f()                                 # wakes the thread pool; not counted
            for _ in range(PER_BLOCK):
                t = time.perf_counter()
                for _ in range(inner[name]):
                    f()
                times[name].append((time.perf_counter() - t) / inner[name])


def paired(a, b, n):
    """n pairs (seconds of one call of a, seconds of one call of b), the two calls side by
    side, in alternating order (a b, b a, ...): a ratio of a to b at the same moments, where
    a shared host's speed moves between interleaved()'s blocks (its memory bandwidth by a
    third within minutes).  For calls of milliseconds and up, a call a sample."""
    a()
    b()
    pairs = []
    for i in range(n):
        first, second = (a, b) if i % 2 == 0 else (b, a)
        t0 = time.perf_counter()
        first()
        t1 = time.perf_counter()
        second()
        t2 = time.perf_counter()
        pairs.append((t1 - t0, t2 - t1) if i % 2 == 0 else (t2 - t1, t1 - t0))
    return pairs


def t_grid(d_model: int, top: int, per_doubling: int = 1, lo: int | None = None, hi: int | None = None) -> list[int]:
    """Geometric T from d_model/8 to ``top`` d_model, ``per_doubling`` points per doubling;
    the points land on d_model * 2^k, so 4 d_model and 8 d_model, the FLOP model's
    crossovers, are measured. ``lo`` and ``hi``, when given, are measured too."""
    lo = max(1, d_model // 8) if lo is None else lo
    hi = top * d_model if hi is None else hi
    grid = set()
    for k in range(-40 * per_doubling, 40 * per_doubling + 1):
        T = int(round(d_model * 2.0 ** (k / per_doubling)))
        if lo <= T <= hi:
            grid.add(T)
    grid.update(T for T in (lo, hi) if T >= 1)      # the requested ends are always measured
    return sorted(grid)


class Progress:
    """A text progress bar on stderr: redrawn in place on a terminal, a line per step otherwise."""

    def __init__(self, total: int, stream=None, width: int = 28):
        self.total, self.done, self.width = max(1, total), 0, width
        self.stream = sys.stderr if stream is None else stream
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()

    def step(self, label: str, n: int = 1):
        self.done = min(self.total, self.done + n)
        filled = self.width * self.done // self.total
        bar = "#" * filled + "-" * (self.width - filled)
        line = f"[{bar}] {self.done:>3}/{self.total} {time.perf_counter() - self.t0:6.1f}s {label}"
        if self.tty:
            self.stream.write("\r" + line[:110].ljust(110))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self):
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
