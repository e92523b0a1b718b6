"""What the bench scripts share: their options, the record of the machine a run measured on
(printed as the run's header, saved in its JSON), the record's end, child processes, and
the GPT-2-small-shaped model that bench_gpt2.py and bench_decode.py time against
transformers.

The scripts import it as ``common``: Python puts a script's own folder first on sys.path.
Nothing is measured here."""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tblock import perf

HERE = Path(__file__).resolve().parent

# GPT-2 small's shape (GPT2Config keywords)
SMALL = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)


# ---------------------------------------------------------------------------------------
# options

def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def int_list(text: str) -> list[int]:
    """"128,1024" -> [128, 1024]."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None


def parse_model(text: str) -> dict:
    """n_layer:n_embd:n_head:vocab_size -> GPT2Config keywords (n_positions stays 1024)."""
    try:
        n_layer, n_embd, n_head, vocab = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected n_layer:n_embd:n_head:vocab_size, got {text!r}") from None
    return dict(SMALL, n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab)


def add_threads(ap: argparse.ArgumentParser, default: int) -> None:
    ap.add_argument("--threads", type=positive_int, default=default,
                    help=f"threads for tblock and every library it is compared with (default {default})")


def add_json(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--json", metavar="FILE", help="also write the results here")


def add_transformers_run(ap: argparse.ArgumentParser, budget_s: float) -> None:
    """The options of a run against transformers (bench_gpt2.py, bench_decode.py)."""
    add_threads(ap, 2)
    ap.add_argument("--budget", type=float, default=budget_s, help="seconds of interleaved rounds per point")
    ap.add_argument("--min-reps", type=positive_int, default=7, help="timed samples per library per point at least")
    ap.add_argument("--model", type=parse_model, default=SMALL, metavar="L:D:H:V",
                    help="another shape, n_layer:n_embd:n_head:vocab_size (default GPT-2 small: 12:768:12:50257)")
    add_json(ap)


# ---------------------------------------------------------------------------------------
# the run's record: the machine at its start, the load at its end

def machine_record(threads: dict | None = None) -> dict:
    """What every run records first: CPU, tblock's vector path, the thread counts in force,
    library versions, the commit, the date and the load average at the start."""
    return {"cpu": perf.cpu_info(), "isa": perf.vector_path(), "threads": threads,
            "usable_cores": perf.usable_cores(), "date": time.strftime("%Y-%m-%d"),
            "versions": {"python": platform.python_version(), **perf.versions()},
            "git_commit": perf.git_commit(), "loadavg_start": list(os.getloadavg())}


def machine_line(record: dict) -> str:
    """The run's first printed line: the CPU, the usable cores, tblock's path, the load."""
    c, p = record["cpu"], record["isa"]
    return (f"CPU {c.get('model')} (family {c.get('family')}, model {c.get('model_id')}), "
            f"{record['usable_cores']} usable cores; tblock path {p['name']} (LLVM cpu {p['cpu']}"
            f"{', forced' if p['forced'] else ''}); load average {record['loadavg_start'][0]:.2f}")


def finish(record: dict, json_path: str | None) -> None:
    """The run's last line (the load, which says how far to trust it) and its JSON."""
    import numba
    record["loadavg_end"] = list(os.getloadavg())
    if isinstance(record.get("threads"), dict):
        try:
            record["threads"]["numba_threading_layer"] = numba.threading_layer()   # known once the pool has run
        except ValueError:
            record["threads"]["numba_threading_layer"] = "not started: every call ran serially"
    print(f"\nload average at start {record['loadavg_start'][0]:.2f}, at end {record['loadavg_end'][0]:.2f} "
          f"(above the thread count: other work shared the cores)")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(record, f, indent=1, default=str)
        print(f"wrote {json_path}")


# ---------------------------------------------------------------------------------------
# child processes: bench/<name>.py run by path in a fresh interpreter

def run_child(name: str, *args, env: dict | None = None, timeout: float | None = None) -> subprocess.CompletedProcess:
    """bench/<name>.py with ``args``, its output captured."""
    return subprocess.run([sys.executable, str(HERE / f"{name}.py"), *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)


def child_failure(p: subprocess.CompletedProcess) -> str:
    """'' for a child process that exited with 0, else why it did not: the signal that
    killed it, or its last line of stderr."""
    if p.returncode == 0:
        return ""
    if p.returncode < 0:
        try:
            return f"killed by {signal.Signals(-p.returncode).name} in a child process"
        except ValueError:
            return f"killed by signal {-p.returncode} in a child process"
    return (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]


def last_json(p: subprocess.CompletedProcess) -> dict:
    """The JSON object a child printed on its last line."""
    return json.loads(p.stdout.strip().splitlines()[-1])



# ---------------------------------------------------------------------------------------
# tblock.GPT2 against transformers

def rel_err(a, b) -> float:
    """max |a - b| / max |b|."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def build_gpt2(shape: dict, seed: int):
    """(transformers' model, tblock's GPT2 loaded from its save_pretrained, seconds to load)."""
    import tempfile

    import torch
    import transformers

    import tblock
    torch.manual_seed(seed)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**shape, bos_token_id=0, eos_token_id=0)).eval()
    with tempfile.TemporaryDirectory() as root:
        hf.save_pretrained(root)
        t = time.perf_counter()
        ours = tblock.GPT2.from_pretrained(root)
        load_s = time.perf_counter() - t
    return hf, ours, load_s


def transformers_record(threads: dict, model: dict, load_s: float) -> dict:
    """machine_record with transformers' version, the model and its load time, printed as
    the run's header."""
    import torch
    import transformers
    record = machine_record(threads)
    record["versions"]["transformers"] = transformers.__version__
    record.update(model=model, load_s=load_s)
    print(machine_line(record) + f"; {threads['requested']} threads (numba {threads['numba']}, "
          f"torch {threads['torch']})")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, tblock commit {record['git_commit']}")
    return record
