#!/usr/bin/env python3
"""Train the tiny byte-level GPT-2 that tests/data/tiny_gpt2 holds (issue #32's accuracy model).

    python bench/train_tiny_gpt2.py                       # writes tests/data/tiny_gpt2 (minutes)
    python bench/train_tiny_gpt2.py --out /tmp/tiny --steps 50

The model: transformers' GPT2LMHeadModel with vocab_size 256 (a token is a byte: no
tokenizer), n_positions 256, n_embd 128, n_layer 4, n_head 4 (d_ff 512), no dropout.
The text: the Python standard library's own source, the top-level ``Lib/*.py`` files of the
running interpreter named in TRAIN_FILES, concatenated in sorted order (each followed by a
blank line).  HELDOUT_FILES are never trained on; their text is written beside the model as
heldout.txt, because another interpreter's standard library differs: the tests read that
file, never the interpreter's.  A file of TRAIN_FILES this interpreter lacks is skipped and
named; the corpus's size and SHA-256 are printed so that a run can be compared.

Training: torch on the CPU with --threads threads, torch.manual_seed(--seed) and
deterministic algorithms; AdamW (lr 2e-3, betas (0.9, 0.95), weight decay 0.1 on the
matrices), linear warm-up over the first 5% of the steps then cosine decay to 10%; each step
a batch of --batch windows of 257 bytes at offsets drawn from a numpy default_rng(--seed),
gradient norm clipped to 1.  The held-out loss is the mean cross-entropy (nats per byte) of
non-overlapping 256-byte windows, each position predicting the next byte from its window's
earlier bytes only (tblock.models.accuracy's protocol).  The model is saved with
save_pretrained(safe_serialization=True): config.json and model.safetensors (float32).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

HELDOUT_FILES = ("fractions.py", "graphlib.py", "textwrap.py")
# every top-level module of CPython 3.11's Lib/ but the held-out ones and the
# machine-generated _sysconfigdata_*.py
TRAIN_FILES = (
    "__future__.py", "__hello__.py", "_aix_support.py", "_bootsubprocess.py", "_collections_abc.py",
    "_compat_pickle.py", "_compression.py", "_markupbase.py", "_osx_support.py", "_py_abc.py",
    "_pydecimal.py", "_pyio.py", "_sitebuiltins.py", "_strptime.py", "_threading_local.py",
    "_weakrefset.py", "abc.py", "aifc.py", "antigravity.py", "argparse.py", "ast.py", "asynchat.py",
    "asyncore.py", "base64.py", "bdb.py", "bisect.py", "bz2.py", "cProfile.py", "calendar.py", "cgi.py",
    "cgitb.py", "chunk.py", "cmd.py", "code.py", "codecs.py", "codeop.py", "colorsys.py", "compileall.py",
    "configparser.py", "contextlib.py", "contextvars.py", "copy.py", "copyreg.py", "crypt.py", "csv.py",
    "dataclasses.py", "datetime.py", "decimal.py", "difflib.py", "dis.py", "doctest.py", "enum.py",
    "filecmp.py", "fileinput.py", "fnmatch.py", "ftplib.py", "functools.py", "genericpath.py",
    "getopt.py", "getpass.py", "gettext.py", "glob.py", "gzip.py", "hashlib.py", "heapq.py", "hmac.py",
    "imaplib.py", "imghdr.py", "imp.py", "inspect.py", "io.py", "ipaddress.py", "keyword.py",
    "linecache.py", "locale.py", "lzma.py", "mailbox.py", "mailcap.py", "mimetypes.py", "modulefinder.py",
    "netrc.py", "nntplib.py", "ntpath.py", "nturl2path.py", "numbers.py", "opcode.py", "operator.py",
    "optparse.py", "os.py", "pathlib.py", "pdb.py", "pickle.py", "pickletools.py", "pipes.py",
    "pkgutil.py", "platform.py", "plistlib.py", "poplib.py", "posixpath.py", "pprint.py", "profile.py",
    "pstats.py", "pty.py", "py_compile.py", "pyclbr.py", "pydoc.py", "queue.py", "quopri.py", "random.py",
    "reprlib.py", "rlcompleter.py", "runpy.py", "sched.py", "secrets.py", "selectors.py", "shelve.py",
    "shlex.py", "shutil.py", "signal.py", "site.py", "smtpd.py", "smtplib.py", "sndhdr.py", "socket.py",
    "socketserver.py", "sre_compile.py", "sre_constants.py", "sre_parse.py", "ssl.py", "stat.py",
    "statistics.py", "string.py", "stringprep.py", "struct.py", "subprocess.py", "sunau.py",
    "symtable.py", "sysconfig.py", "tabnanny.py", "tarfile.py", "telnetlib.py", "tempfile.py", "this.py",
    "threading.py", "timeit.py", "token.py", "tokenize.py", "trace.py", "traceback.py", "tracemalloc.py",
    "tty.py", "turtle.py", "types.py", "typing.py", "uu.py", "uuid.py", "warnings.py", "wave.py",
    "weakref.py", "webbrowser.py", "xdrlib.py", "zipapp.py", "zipfile.py", "zipimport.py",
)
CONFIG = dict(vocab_size=256, n_positions=256, n_embd=128, n_layer=4, n_head=4, activation_function="gelu_new",
              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
CONTEXT = CONFIG["n_positions"]


def corpus(lib: Path, names) -> tuple[bytes, list[str]]:
    """The named files' bytes, sorted by name, each followed by a blank line; and the
    names this interpreter lacks."""
    parts, missing = [], []
    for name in sorted(names):
        path = lib / name
        if path.is_file():
            parts.append(path.read_bytes().rstrip(b"\n") + b"\n\n")
        else:
            missing.append(name)
    return b"".join(parts), missing


def heldout_loss(model, data: np.ndarray) -> float:
    """Mean next-byte cross-entropy over non-overlapping CONTEXT-byte windows (nats)."""
    import torch
    n = (len(data) - 1) // CONTEXT
    x = torch.from_numpy(data[:n * CONTEXT].reshape(n, CONTEXT).astype(np.int64))
    y = torch.from_numpy(data[1:n * CONTEXT + 1].reshape(n, CONTEXT).astype(np.int64))
    model.eval()
    with torch.no_grad():
        logits = model(x).logits.double()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
    model.train()
    return float(loss)


def lr_at(step: int, steps: int, peak: float) -> float:
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, steps - warm)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests" / "data" / "tiny_gpt2")
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    lib = Path(sysconfig.get_paths()["stdlib"])
    train, missing = corpus(lib, TRAIN_FILES)
    heldout, lost = corpus(lib, HELDOUT_FILES)
    if lost:
        sys.exit(f"the held-out files {lost} are not in {lib}")
    print(f"Python {sys.version.split()[0]} from {lib}; train {len(train)} bytes of {len(TRAIN_FILES) - len(missing)} "
          f"files, sha256 {hashlib.sha256(train).hexdigest()[:16]}; held-out {len(heldout)} bytes")
    if missing:
        print(f"skipped (not in this Lib/): {', '.join(missing)}")
    data = np.frombuffer(train, np.uint8)
    held = np.frombuffer(heldout, np.uint8)

    model = GPT2LMHeadModel(GPT2Config(**CONFIG))
    model.train()
    decay = [q for n, q in model.named_parameters() if q.dim() == 2 and "wpe" not in n]
    rest = [q for n, q in model.named_parameters() if not (q.dim() == 2 and "wpe" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    rng = np.random.default_rng(args.seed)
    offsets = np.arange(CONTEXT + 1)
    curve, start, window = [], time.perf_counter(), []
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr)
        at = rng.integers(0, len(data) - CONTEXT - 1, args.batch)
        xy = torch.from_numpy(data[at[:, None] + offsets].astype(np.int64))      # (batch, 257)
        logits = model(xy[:, :-1]).logits                                        # (batch, 256, 256)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), xy[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        window.append(loss.item())
        if (step + 1) % 100 == 0 or step + 1 == args.steps:
            mean = sum(window) / len(window)
            curve.append((step + 1, round(mean, 4)))
            print(f"step {step + 1:5d}  train loss (mean of the last {len(window)}) {mean:.4f}  "
                  f"{time.perf_counter() - start:6.1f} s", flush=True)
            window = []
    wall = time.perf_counter() - start
    final = heldout_loss(model, held)
    print(f"held-out loss {final:.4f} nats/byte (perplexity {math.exp(final):.3f}) after {args.steps} steps, "
          f"{wall:.0f} s of training")

    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    (args.out / "heldout.txt").write_bytes(heldout)
    record = {"python": sys.version.split()[0], "torch": torch.__version__, "steps": args.steps,
              "batch": args.batch, "lr": args.lr, "seed": args.seed, "threads": args.threads,
              "train_bytes": len(train), "train_sha256": hashlib.sha256(train).hexdigest(),
              "skipped": missing, "heldout_files": list(HELDOUT_FILES), "heldout_bytes": len(heldout),
              "train_loss_curve": curve, "heldout_loss": round(final, 5), "train_seconds": round(wall)}
    (args.out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
