#!/usr/bin/env python3
"""One engine's decode and prefill timing in a fresh process (bench_engines.py's child):
CTranslate2 or OpenVINO, each with its own thread pool and runtime libraries, apart from
tblock's Numba pool and torch.

    python bench/child_engine.py ctranslate2 MODEL_DIR int8_float32 --threads 2 ...
    python bench/child_engine.py openvino MODEL_DIR bf16 --threads 2 ...

The config is CTranslate2's compute type, or OpenVINO's INFERENCE_PRECISION_HINT ("f32",
"bf16", or "default": the CPU plugin's own choice, recorded).  The prompt is --context random
token ids (the same generator and seed as bench_engines.py's), then --gen greedy steps, timed
from the first generated token's end to the last's: seconds per step, one sample per run
(and the first greedy token, which bench_engines.py sets beside tblock's).
Prefill: --prefill tokens into an empty cache up to the first token's logits.  One untimed
run of each first.  Prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def prompt_ids(n: int, vocab: int, seed: int) -> np.ndarray:
    """n random token ids below the last id (the end of text), as bench_engines.py draws them."""
    return np.random.default_rng(seed).integers(0, vocab - 1, n)


# ---------------------------------------------------------------------------------------
# CTranslate2: Generator.generate_tokens yields each step's token as it is made

def ctranslate2_runs(args) -> dict:
    import ctranslate2
    gen = ctranslate2.Generator(args.model, device="cpu", compute_type=args.config,
                                intra_threads=args.threads, inter_threads=1)
    vocab = json.loads((Path(args.model) / "vocabulary.json").read_text())
    words = lambda ids: [vocab[i] for i in ids]     # noqa: E731  ids -> the tokens it takes
    prompt = words(prompt_ids(args.context, len(vocab), args.seed))
    long = words(prompt_ids(args.prefill, len(vocab), args.seed + 1))
    # end_token=[]: no stop on the end-of-text id, so every run makes --gen + 1 tokens
    kw = dict(sampling_topk=1, end_token=[])

    first = []

    def decode() -> float:
        marks = []
        for step in gen.generate_tokens(prompt, max_length=args.gen + 1, **kw):
            marks.append(time.perf_counter())
            if len(marks) == 1:
                first.append(step.token_id)
        if len(marks) != args.gen + 1:
            raise RuntimeError(f"CTranslate2 made {len(marks)} tokens, asked for {args.gen + 1}")
        return (marks[-1] - marks[0]) / args.gen

    def prefill() -> float:
        t = time.perf_counter()
        gen.generate_batch([long], max_length=1, include_prompt_in_result=False, **kw)
        return time.perf_counter() - t

    out = runs(decode, prefill, args.reps)
    return {"version": ctranslate2.__version__, "first_token": first[0], **out}


# ---------------------------------------------------------------------------------------
# OpenVINO: the stateful model optimum-intel exports (its KV cache held in the request)

def openvino_runs(args) -> dict:
    import openvino as ov
    core = ov.Core()
    xml = Path(args.model) / "openvino_model.xml"
    config = {"INFERENCE_NUM_THREADS": args.threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
    if args.config != "default":
        config["INFERENCE_PRECISION_HINT"] = args.config
    model = core.read_model(xml)
    sliced = last_row_head(model)
    compiled = core.compile_model(model, "CPU", config)
    req = compiled.create_infer_request()
    names = {p.get_any_name() for p in compiled.inputs}
    vocab = compiled.outputs[0].get_partial_shape()[-1].get_length()

    def feed(ids: np.ndarray, past: int) -> np.ndarray:
        """The logits of ids (T,) after ``past`` tokens in the request's state: (vocab,) of the last."""
        T = len(ids)
        inputs = {"input_ids": ids[None].astype(np.int64),
                  "attention_mask": np.ones((1, past + T), np.int64)}
        if "position_ids" in names:
            inputs["position_ids"] = np.arange(past, past + T, dtype=np.int64)[None]
        if "beam_idx" in names:
            inputs["beam_idx"] = np.zeros(1, np.int32)
        req.infer(inputs)
        return req.get_output_tensor(0).data[0, -1]

    prompt = prompt_ids(args.context, vocab, args.seed)
    long = prompt_ids(args.prefill, vocab, args.seed + 1)
    logits_rows, first = [], []

    def decode() -> float:
        req.reset_state()
        tok = int(np.argmax(feed(prompt, 0)))
        first.append(tok)
        t = time.perf_counter()
        for i in range(args.gen):
            tok = int(np.argmax(feed(np.array([tok]), args.context + i)))
        return (time.perf_counter() - t) / args.gen

    def prefill() -> float:
        req.reset_state()
        t = time.perf_counter()
        feed(long, 0)
        dt = time.perf_counter() - t
        logits_rows.append(req.get_output_tensor(0).shape[1])
        return dt

    out = runs(decode, prefill, args.reps)
    hint = compiled.get_property("INFERENCE_PRECISION_HINT")
    precision = hint.to_string() if hasattr(hint, "to_string") else str(hint)      # an ov.Type: "f32", "bf16"
    # rows of logits the prefill computed: 1 where the export slices the last token before the head
    return {"version": ov.get_version(), "inference_precision": precision, "head_sliced": sliced, "first_token": first[0],
            "prefill_logits_rows": int(logits_rows[-1]), **out}


def last_row_head(model) -> bool:
    """The vocabulary head on the last row only, as openvino.genai's LLM pipeline compiles an
    export (optimum-intel's computes logits for every row): a Slice of the hidden states in
    front of the head's MatMul.  False where no MatMul is found near the logits."""
    import openvino.opset13 as ops
    node = model.get_results()[0].input_value(0).get_node()
    for _ in range(4):                      # past a Convert or two to the head's MatMul
        if node.get_type_name() == "MatMul":
            rows = ops.slice(node.input_value(0), np.array([-1]), np.array([np.iinfo(np.int64).max]),
                             np.array([1]), np.array([1]))         # [:, -1:, :] of (B, T, d)
            node.input(0).replace_source_output(rows.output(0))
            model.validate_nodes_and_infer_types()
            return True
        node = node.input_value(0).get_node()
    return False


def runs(decode, prefill, reps: int) -> dict:
    """One untimed run of each, then ``reps`` timed ones, interleaved."""
    decode(), prefill()
    d, p = [], []
    for _ in range(reps):
        d.append(decode())
        p.append(prefill())
    return {"decode_s": d, "prefill_s": p}


ENGINES = {"ctranslate2": ctranslate2_runs, "openvino": openvino_runs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine", choices=sorted(ENGINES))
    ap.add_argument("model", help="the converted model's folder")
    ap.add_argument("config", help="CTranslate2's compute type, or OpenVINO's precision hint (f32, bf16, default)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(json.dumps(ENGINES[args.engine](args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
