"""``tblock generate MODEL --input IN --output OUT``: every prompt of a JSONL file through
the continuous batcher (``model.stream_many``), each record appended to OUT as it may be
written, a progress line on stderr.  The files' rules (lines, records, resuming) are
tblock.jobs'; docs/batch.md is the user's guide."""

from __future__ import annotations

import secrets
import sys
import time
from pathlib import Path

from .jobs import PARAMS, JobOutput, file_sha256, read_requests, record_of

ORDERS = ("input", "done")


def job_settings(args, checkpoint, base_seed: int, tokenizer) -> dict:
    """What makes OUT this job's output: a rerun resumes only when every value is equal."""
    return {"input": str(Path(args.input).resolve()), "input_sha256": file_sha256(args.input),
            "model": str(Path(checkpoint).resolve()), "weights": args.weights, "dot": args.dot,
            "cache": args.cache, "backend": args.backend, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
            "top_k": args.top_k, "top_p": args.top_p, "eos": args.eos, "seed": base_seed,
            "order": args.order, "text": tokenizer is not None}


def base_seed(args) -> int:
    """--seed, else the seed of the job already in OUT (so that a rerun resumes it), else a
    fresh one (printed)."""
    if args.seed is not None:
        return args.seed
    before = None if args.force else JobOutput.previous_settings(args.output)
    seed = None if before is None else before.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0:
        return seed
    return secrets.randbits(32)


class Progress:
    """The progress line on stderr: prompts done of the total and the new tokens per second
    of this run; redrawn in place on a terminal, only the summary elsewhere."""

    def __init__(self, total: int, before: int, stream=None):
        self.stream = sys.stderr if stream is None else stream
        self.tty = self.stream.isatty()
        self.total, self.done, self.tokens = total, before, 0
        self.start = time.perf_counter()

    def rate(self) -> str:
        elapsed = time.perf_counter() - self.start
        return f"{self.tokens / elapsed:.1f}" if elapsed > 0 and self.tokens else "-"

    def add(self, new_tokens: int) -> None:
        self.done += 1
        self.tokens += new_tokens
        if self.tty:
            self.stream.write(f"\r{self.done}/{self.total} prompts, {self.rate()} tokens/s")
            self.stream.flush()

    def finish(self, message: str) -> None:
        self.stream.write(("\r" if self.tty else "") + message + "\n")
        self.stream.flush()


def run_job(args, model, tokenizer, checkpoint) -> int:
    """The job of ``args`` (the generate subcommand's) with the loaded model and tokenizer
    (or None).  Exit status 0 when every good line is in OUT, 130 on Ctrl-C (rerun to go on);
    ValueError for bad settings, a bad line under --on-error fail, a foreign OUT."""
    if Path(args.input).resolve() == Path(args.output).resolve():
        raise ValueError(f"--output {args.output} is the input file: choose another --output")
    seed = base_seed(args)
    defaults = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_k": args.top_k,
                "top_p": args.top_p, "seed": seed, "eos": args.eos}
    skipped = []

    def log(message):
        skipped.append(message)
        print(f"tblock generate: {message}", file=sys.stderr)
    requests = read_requests(args.input, model, tokenizer, defaults, args.on_error, log=log)
    settings = job_settings(args, checkpoint, seed, tokenizer)
    with JobOutput(args.output, settings, force=args.force) as out:
        done = out.done_ids()
        todo = [r for r in requests if r.id not in done]
        before = len(requests) - len(todo)
        print(f"tblock generate: {len(requests)} prompts in {args.input} ({len(skipped)} bad lines skipped), "
              f"{before} already in {args.output}, {len(todo)} to generate; base seed {seed}, "
              f"max_batch {args.max_batch}", file=sys.stderr)
        progress = Progress(len(requests), before)
        try:
            if getattr(args, "ray", None) is not None:      # --ray [ADDRESS]: Ray Data's actors
                from .ray import run_job_args
                run_job_args(args, checkpoint, todo, out, tokenizer, progress.add)
            else:
                _generate(model, todo, out, args, tokenizer, progress)
        except KeyboardInterrupt:
            progress.finish(f"tblock generate: interrupted: {len(out.done_ids() & {r.id for r in requests})} of "
                            f"{len(requests)} prompts in {args.output}; rerun the same command to resume")
            return 130
        elapsed = time.perf_counter() - progress.start
        progress.finish(f"tblock generate: {len(requests)}/{len(requests)} prompts in {args.output} "
                        f"({len(todo)} generated now: {progress.tokens} tokens in {elapsed:.2f} s, "
                        f"{progress.rate()} tokens/s; {before} from before; {len(skipped)} bad lines skipped)")
    return 0


def _generate(model, todo, out: JobOutput, args, tokenizer, progress: Progress) -> None:
    """Every request of ``todo`` through stream_many, each record written to ``out`` as it
    finishes (--order done) or once every earlier one is written (--order input)."""
    if not todo:
        return
    kwargs = {PARAMS[name]: [r.params[name] for r in todo] for name in PARAMS}
    results = model.stream_many([r.ids for r in todo], backend=args.backend, cache_format=args.cache,
                                max_batch=args.max_batch, **kwargs)
    waiting, next_out = {}, 0           # --order input: finished records not yet due
    for index, tokens in results:
        request = todo[index]
        record = record_of(request, tokens, tokenizer)
        progress.add(len(record["new_ids"]))
        if args.order == "done":
            out.write(record)
            continue
        waiting[index] = record
        while next_out in waiting:
            out.write(waiting.pop(next_out))
            next_out += 1
