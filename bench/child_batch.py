"""One contender of bench_batch.py in a fresh process, so that torch's threads and Numba's
never share one:

    python child_batch.py JOB CHECKPOINT WORKLOAD.npz TOKENS.npz WEIGHTS THREADS BATCH REPS

JOB is one of
    many           tblock: model.generate_many(prompts, new, temperature=0, max_batch=BATCH)
    loop           tblock: model.generate(p, new, temperature=0) for each prompt in turn
    transformers   GPT2LMHeadModel.generate on batches of BATCH prompts in input order, left
                   padded (attention_mask, pad_token_id), greedy, float32 (WEIGHTS ignored)

The workload (bench_batch.py writes it): ``ids``, every prompt's tokens one after another,
``lengths`` and ``new`` (new tokens per prompt).  Untimed first: the model's load and a
warm-up on every prompt with 2 new tokens each (compiles and loads every kernel the prompts'
lengths pick, first touches).  Then REPS times: the whole workload (wall), and the prompts alone with one new
token each (``prefill``: every prompt through the model, up to its first token).  The
first timed run's new tokens go to TOKENS.npz as ``tokens`` (n_prompts, new), -1 where a
prompt made fewer; the last line printed is a JSON object of the times.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def read_workload(path):
    """(prompts: list of int64 arrays, new tokens per prompt)."""
    w = np.load(path)
    cuts = np.cumsum(w["lengths"])[:-1]
    return np.split(w["ids"].astype(np.int64), cuts), int(w["new"])


def new_tokens(outputs, prompts, new) -> np.ndarray:
    """(n_prompts, new) int64: each output's tokens after its prompt, -1 past its end."""
    out = np.full((len(prompts), new), -1, np.int64)
    for i, (o, p) in enumerate(zip(outputs, prompts)):
        made = np.asarray(o)[len(p):][:new]
        out[i, :len(made)] = made
    return out


def timed(run, prompts, new, reps):
    """(wall seconds per rep, prefill seconds per rep, the first rep's outputs)."""
    walls, prefills, first = [], [], None
    for _ in range(reps):
        t = time.perf_counter()
        outputs = run(prompts, new)
        walls.append(time.perf_counter() - t)
        first = outputs if first is None else first
        t = time.perf_counter()
        run(prompts, 1)
        prefills.append(time.perf_counter() - t)
    return walls, prefills, first


def tblock_runner(job, ckpt, weights, threads, batch):
    import tblock
    from tblock import perf
    counts, _ = perf.pin_threads(threads, with_torch=False)
    t = time.perf_counter()
    fmt, _, dot = weights.partition("/")             # "int8/int8": the format, then the dot
    model = tblock.load(ckpt, weights=fmt, dot=dot or "fp32")
    load_s = time.perf_counter() - t
    if job == "many":
        if not hasattr(model, "generate_many"):
            sys.exit(f"{type(model).__name__} has no generate_many in this tree (tblock/models/batching.py)")

        def run(prompts, new):
            return model.generate_many(prompts, new, temperature=0, max_batch=batch)
    else:
        def run(prompts, new):
            return [model.generate(p, new, temperature=0) for p in prompts]
    info = {"threads": counts, "load_s": load_s, "holds": f"blocks {model.weight_format}, head {model.head_format}",
            "isa": tblock.isa()}
    return run, info


def transformers_runner(ckpt, threads, batch):
    from tblock import peers, perf
    peers.import_early(["torch"])
    counts, _ = perf.pin_threads(threads, with_torch=True)
    import torch
    import transformers
    t = time.perf_counter()
    hf = transformers.GPT2LMHeadModel.from_pretrained(ckpt).float().eval()
    load_s = time.perf_counter() - t
    pad = hf.config.eos_token_id            # GPT-2 pads with its end of text
    hf.generation_config.eos_token_id = None        # no early stop: every prompt makes its count
    hf.generation_config.pad_token_id = pad

    def one_batch(group, new):
        width = max(len(p) for p in group)
        ids = np.full((len(group), width), pad, np.int64)
        mask = np.zeros((len(group), width), np.int64)
        for r, p in enumerate(group):           # left padding: every prompt ends at the last column
            ids[r, width - len(p):], mask[r, width - len(p):] = p, 1
        with torch.inference_mode():
            out = hf.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), do_sample=False,
                              max_new_tokens=new, min_new_tokens=new, pad_token_id=pad)
        return [np.concatenate([p, row[width:]]) for p, row in zip(group, out.numpy())]

    def run(prompts, new):
        return [o for i in range(0, len(prompts), batch) for o in one_batch(prompts[i:i + batch], new)]
    info = {"threads": counts, "load_s": load_s, "holds": "float32 parameters",
            "transformers": transformers.__version__, "torch": torch.__version__,
            "attn_implementation": getattr(hf.config, "_attn_implementation", None)}
    return run, info


def main(argv):
    job, ckpt, workload, tokens_path, weights = argv[:5]
    threads, batch, reps = (int(x) for x in argv[5:8])
    prompts, new = read_workload(workload)
    if job in ("many", "loop"):
        run, info = tblock_runner(job, ckpt, weights, threads, batch)
    elif job == "transformers":
        run, info = transformers_runner(ckpt, threads, batch)
    else:
        sys.exit(f"JOB must be many, loop or transformers, got {job!r}")
    t = time.perf_counter()
    run(prompts, 2)
    info["warmup_s"] = time.perf_counter() - t
    walls, prefills, outputs = timed(run, prompts, new, reps)
    np.savez(tokens_path, tokens=new_tokens(outputs, prompts, new))
    print(json.dumps({"wall_s": walls, "prefill_s": prefills, **info}, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
