"""Command line: ``tblock report``, ``tblock lesson``, ``tblock demo``, ``tblock generate`` and ``tblock --version``
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
                         description="Worked example through every backend, the machine's limits (FMA peak, "
                                     "bandwidths; the BLAS's GEMM as a reference), then every component timed "
                                     "over a sweep of T and placed under its roofline: where attention "
                                     "overtakes the FFN.")
    from .report import add_arguments
    add_arguments(rep)
    les = sub.add_parser("lesson", help="Lesson 13's walk-through on its worked example beside the lesson's "
                                        "numbers; writes the lesson's figures as PNG")
    les.add_argument("--out", default="lesson13-figures", metavar="DIR",
                     help="folder for the figures (default ./lesson13-figures)")
    les.add_argument("--backend", default="numpy", help="backend to run the block on (default numpy)")
    les.add_argument("--force", action="store_true", help="replace files of the figures' names in --out that "
                                                          "tblock did not write (nothing else is touched)")
    dem = sub.add_parser("demo", help="the interactive demo as a page, served from 127.0.0.1 "
                                      "(or --export a copy that opens from file://)",
                         description="Six tokens through one Post-LN block, stop by stop; every number "
                                     "on the page is computed by tblock. Ctrl-C stops the server.")
    dem.add_argument("--port", type=int, default=8013, help="port on 127.0.0.1 (default 8013; 0 picks a free one)")
    dem.add_argument("--no-browser", action="store_true", help="print the URL without opening a browser")
    dem.add_argument("--export", metavar="DIR", help="write a static copy, every toggle precomputed, into DIR")
    dem.add_argument("--force", action="store_true", help="with --export: replace files of the page's names "
                                                          "in DIR that tblock did not write (nothing else is touched)")
    gen = sub.add_parser("generate", help="continue a prompt with a GPT-2 or Llama-family model (tblock.load)",
                         description="Load a checkpoint directory (config.json + safetensors: GPT-2, Llama, "
                                     "Qwen2, Mistral) or a GGUF file, continue the prompt, print the ids (and "
                                     "the text, with a tokenizer.json beside it); a progress line with "
                                     "tokens/s goes to stderr.")
    gen.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint directory or a .gguf file")
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--ids", type=int, nargs="+", metavar="ID", help="the prompt as token ids")
    prompt.add_argument("--prompt", metavar="TEXT", help="the prompt as text: needs tokenizer.json in CHECKPOINT "
                                                         "(or beside the GGUF file) "
                                                         "and the tokenizers package (pip install 'tblock-cpu[text]')")
    prompt.add_argument("--input", metavar="FILE",
                        help="a batch job: one prompt per line of this JSONL file, {\"id\": ID, \"ids\": [...]} "
                             "or {\"id\": ID, \"prompt\": TEXT}, each line optionally with max_new_tokens, "
                             "temperature, top_k, top_p, seed, eos (null or absent: the command line's; a sampled "
                             "line without a seed draws with one derived from --seed, the base seed, and its id); "
                             "needs --output (docs/batch.md)")
    gen.add_argument("-n", "--max-new-tokens", type=int, default=50, help="new tokens at most (default 50)")
    gen.add_argument("--temperature", type=float, default=1.0, help="0 is greedy (default 1.0)")
    gen.add_argument("--top-k", type=int, help="sample among the k most likely tokens only")
    gen.add_argument("--top-p", type=float, help="sample among the most likely tokens holding this probability")
    gen.add_argument("--seed", type=int, help="seed of the draws (default: a fresh one, printed to repeat the run)")
    gen.add_argument("--eos", type=int, metavar="ID", help="stop when this token comes (GPT-2's <|endoftext|> "
                                                           "is 50256; default: never stop early)")
    gen.add_argument("--backend", default=None, help="backend of the blocks (default numba)")
    from .formats import FORMATS
    gen.add_argument("--weights", default=None, choices=FORMATS,
                     help="how the blocks' matrices are stored: quantized on loading (default: fp32, or a "
                          "GGUF file's own format; the embedding and head follow, int8 under int4 blocks)")
    gen.add_argument("--dot", default="fp32", choices=("fp32", "int8", "bf16"),
                     help="how products with stored weights are computed: fp32 (default); int8 for int8/int4 "
                          "weights, each input row rounded to int8 blocks as llama.cpp does; bf16 for bf16 "
                          "weights, inputs rounded to bf16 (faster, less exact)")
    from .kvcache import KV_FORMATS
    gen.add_argument("--cache", default="fp32", choices=KV_FORMATS,
                     help="how the KV caches store keys and values: fp32 (default), bf16 or int8 "
                          "(one float32 scale per head and token), read by every step")
    job = gen.add_argument_group("batch job (--input)")
    job.add_argument("--output", metavar="FILE",
                     help="with --input: the JSONL records, one line per prompt: {\"id\", \"ids\" (prompt and "
                          "new), \"new_ids\", \"stop\" (\"eos\" or \"length\"), \"text\" (the new tokens, with a "
                          "tokenizer)}; FILE.job holds the job's settings. Rerunning the same command resumes "
                          "an interrupted job")
    job.add_argument("--on-error", choices=("skip", "fail"), default="skip",
                     help="a bad input line (reported with its number): skip it (default) or stop before "
                          "generating anything (exit 2)")
    job.add_argument("--order", choices=("input", "done"), default="input",
                     help="records in input order (default) or as each prompt finishes")
    job.add_argument("--max-batch", type=int, default=16, metavar="N",
                     help="prompts decoded together at most (default 16)")
    job.add_argument("--force", action="store_true",
                     help="replace --output even when it is not this job's output")
    job.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                     help="generate on Ray Data actors (pip install 'tblock-cpu[ray]'), one per node by default: "
                          "on the cluster at ADDRESS (auto, HOST:PORT), else RAY_ADDRESS's or a local Ray; "
                          "CHECKPOINT must be at the same path on every node; the output is the local job's "
                          "(docs/ray.md)")
    return parser


def run_generate(args) -> int:
    """``tblock generate``: the ids (and text) on stdout, the progress line on stderr."""
    import secrets
    import time
    from pathlib import Path

    from .models.auto import load

    if args.input is not None:
        return _run_job(args)
    if args.output is not None or args.ray is not None:
        raise ValueError(f"{'--output' if args.output is not None else '--ray'} is for a batch job: give --input FILE "
                         f"too (or leave it out)")
    path = Path(args.checkpoint)
    root = path.parent if path.is_file() else path      # a GGUF file's tokenizer.json lies beside it
    tokenizer = None
    if args.prompt is not None or (root / "tokenizer.json").is_file():
        tokenizer = _tokenizer(root, needed=args.prompt is not None)
    model = load(path, dot=args.dot, **({} if args.weights is None else {"weights": args.weights}))
    ids = args.ids if args.prompt is None else tokenizer.encode(args.prompt).ids
    if not ids:
        raise ValueError(f"the prompt {args.prompt!r} encodes to no tokens")
    seed = args.seed
    if seed is None and args.temperature != 0:
        seed = secrets.randbits(32)             # printed, so the run can be repeated
    steps = model.stream(ids, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                         top_p=args.top_p, seed=seed, eos_token_id=args.eos, backend=args.backend,
                         cache_format=args.cache)
    tty = sys.stderr.isatty()
    new, start, first = [], time.perf_counter(), 0.0
    for tok in steps:
        new.append(tok)
        elapsed = time.perf_counter() - start
        if len(new) == 1:
            first = elapsed                     # the prefill and the first token
        elif tty:                               # redrawn in place on a terminal
            rate = (len(new) - 1) / (elapsed - first)
            sys.stderr.write(f"\r{len(new)}/{args.max_new_tokens} tokens, {rate:.1f} tokens/s")
            sys.stderr.flush()
    total = time.perf_counter() - start
    # tokens/s of the one-token steps, after the first token
    rate = f"{(len(new) - 1) / (total - first):.1f}" if len(new) > 1 else "-"
    draws = "greedy" if args.temperature == 0 else f"seed {seed}"
    sys.stderr.write(f"{chr(13) if tty else ''}{len(new)} tokens in {total:.2f} s: the prefill of {len(ids)} and "
                     f"the first token {first * 1e3:.1f} ms, then {rate} tokens/s "
                     f"({draws}, backend {args.backend or 'numba'}, weights {model.weight_format}, dot {args.dot}, "
                     f"cache {args.cache})\n")
    out = list(ids) + new
    print(" ".join(str(i) for i in out))
    if tokenizer is not None:
        print(tokenizer.decode(out))
    return 0


def _run_job(args) -> int:
    """``tblock generate CHECKPOINT --input IN --output OUT``: tblock.batch_job with the model."""
    from pathlib import Path

    from .batch_job import run_job
    from .config import check_int
    from .models.auto import load

    if args.output is None:
        raise ValueError("--input needs --output FILE (the records' file)")
    check_int("--max-batch", args.max_batch, 1)
    path = Path(args.checkpoint)
    root = path.parent if path.is_file() else path      # a GGUF file's tokenizer.json lies beside it
    # a "prompt" line without a tokenizer is a bad line, reported as such
    tokenizer = _tokenizer(root, needed=False) if (root / "tokenizer.json").is_file() else None
    model = load(path, dot=args.dot, **({} if args.weights is None else {"weights": args.weights}))
    return run_job(args, model, tokenizer, path)


def _tokenizer(root, needed: bool):
    """CHECKPOINT_DIR/tokenizer.json through the tokenizers package; None when it is not
    needed (ids given) and cannot be had; a clear error when it is needed."""
    path = root / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"--prompt needs {path} (a Hugging Face tokenizers file); give --ids instead")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        if not needed:
            return None
        raise ValueError("--prompt needs the tokenizers package: pip install 'tblock-cpu[text]' "
                         "(or pip install tokenizers)") from None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:          # the tokenizers package raises plain Exception for a bad file
        raise ValueError(f"{path}: not a tokenizers file the tokenizers package can read: "
                         f"{' '.join(str(e).split())}") from None


def _run(args, argv) -> int:
    if args.command == "report":
        from . import report
        return report.main(args, "tblock " + " ".join(sys.argv[1:] if argv is None else argv))
    if args.command == "lesson":
        from .lesson import run_lesson
        return run_lesson(out_dir=args.out, backend=args.backend, force=args.force)
    if args.command == "demo":
        from .lesson.demo_server import main as demo_main
        return demo_main(args)
    if args.command == "generate":
        return run_generate(args)
    return 1


def main(argv=None) -> int:
    """Every command's errors (bad input, a file that cannot be read or written, memory)
    are one line on stderr and exit status 2, never a traceback."""
    args = build_parser().parse_args(argv)
    try:
        return _run(args, argv)
    except (ValueError, TypeError, OSError, MemoryError) as e:
        what = " ".join(str(e).split()) or type(e).__name__
        if isinstance(e, MemoryError):
            what = f"out of memory ({what}): choose smaller sizes"
        print(f"tblock {args.command}: error: {what}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:              # Ctrl-C before or between a command's own handlers
        print(f"tblock {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
