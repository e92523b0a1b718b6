"""One side of an A/B run (bench/ab.py): imports whichever tblock is first on the path.

Reads commands on stdin, one JSON object a line, and answers one line each:

    {"cmd": "outputs", "path": P}       every case's outputs saved to the .npz file P
    {"cmd": "time", "case": C, "n": N}  seconds for N calls of timing case C
    {"cmd": "quit"}

Only public API that the base commit has too is used, so both sides run this same file.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import tblock


STORED = (("bf16", "bf16"), ("int8", "int8"), ("int4", "int8"), ("int8", "fp32"))    # (format, dot)


def _configs():
    """(name, cfg, B, T) over the block's options, with edge shapes: T = 1, one head, B > 1."""
    C = tblock.BlockConfig
    yield "toy", C(d_model=8, n_heads=2), 1, 4
    yield "one-head-T1", C(d_model=16, n_heads=1, d_ff=40), 1, 1
    yield "post-relu", C(d_model=24, n_heads=3, norm="post", activation="relu", causal=False), 2, 7
    yield "biases", C(d_model=32, n_heads=4, d_ff=100, ffn_bias=True, ln_affine=True, attn_bias=True), 3, 17
    yield "gelu-erf", C(d_model=48, n_heads=4, activation="gelu_erf"), 2, 33
    yield "mid", C(d_model=64, n_heads=4, d_ff=192, ffn_bias=True), 2, 65
    yield "large", C(d_model=384, n_heads=6, ffn_bias=True, ln_affine=True, attn_bias=True), 1, 64
    yield "long", C(d_model=96, n_heads=2, causal=True), 1, 300


def _stored_configs():
    """More (name, cfg, B, T) for the stored formats: the gated, grouped, rotary block split
    by columns, and more rows than the threads' share of split tasks (FFN by row tiles)."""
    C = tblock.BlockConfig
    yield "llama", C(d_model=128, n_heads=4, n_kv_heads=2, norm_type="rmsnorm", ffn="gated", activation="silu",
                     positions="rotary", d_ff=224, ln_affine=True), 1, 70
    yield "many-rows", C(d_model=384, n_heads=6, ffn_bias=True, ln_affine=True, attn_bias=True), 2, 300
    yield "post-many", C(d_model=64, n_heads=4, norm="post", ffn_bias=True, ln_affine=True), 3, 200


def _weights(cfg, seed, dtype):
    """Random weights with every present bias and affine perturbed (not the identity)."""
    w = tblock.init_weights(cfg, seed=seed, dtype=dtype)
    rng = np.random.default_rng(seed + 1000)
    a = {k: (v + 0.1 * rng.standard_normal(v.shape)).astype(dtype) if v.ndim == 1 else v
         for k, v in w.arrays().items()}
    return tblock.BlockWeights(**a)


def outputs() -> dict[str, np.ndarray]:
    """name -> array for every case: forwards on every backend, traces, cached chunks, a
    stack with caches, and a GPT-2's logits, prepared decode steps and greedy tokens."""
    out = {}
    ex = tblock.load_worked_example()
    for backend in ("numba", "numpy", "c"):
        out[f"worked/{backend}"] = tblock.forward(ex.H_in, ex.weights, ex.cfg, backend=backend)
    for dtype in (np.float32, np.float64):
        dn = np.dtype(dtype).name
        for i, (name, cfg, B, T) in enumerate(_configs()):
            w = _weights(cfg, i, dtype)
            H = np.random.default_rng(i).standard_normal((B, T, cfg.d_model)).astype(dtype)
            for backend in ("numba", "numpy", "c"):
                out[f"{name}/{dn}/{backend}"] = tblock.forward(H, w, cfg, backend=backend)
            out[f"{name}/{dn}/2d"] = tblock.forward(H[0], w, cfg)
            out[f"{name}/{dn}/strided"] = tblock.forward(H[:, ::-1], w, cfg)
            _, tr = tblock.forward(H, w, cfg, trace=True)
            for key in ("H_norm1", "A", "H_mid", "F_post", "H_out"):
                out[f"{name}/{dn}/trace/{key}"] = np.asarray(getattr(tr, key, None) if not isinstance(tr, dict)
                                                             else tr[key])
            if cfg.causal:
                for backend in ("numba", "numpy"):
                    cache = tblock.KVCache(cfg, T + 2, B, dtype)
                    parts, at = [], 0
                    for n in (T // 2, 1, T - T // 2 - 1):
                        if n > 0:
                            parts.append(tblock.forward(H[:, at:at + n], w, cfg, backend=backend, cache=cache))
                            at += n
                    out[f"{name}/{dn}/cached/{backend}"] = np.concatenate(parts, axis=1)
        cfg = tblock.BlockConfig(d_model=64, n_heads=4, ffn_bias=True, ln_affine=True, attn_bias=True)
        stack = tblock.Stack(cfg, [_weights(cfg, 50 + l, dtype) for l in range(3)])
        H = np.random.default_rng(7).standard_normal((2, 9, 64)).astype(dtype)
        caches = stack.make_cache(12, 2, dtype)
        out[f"stack/{dn}/prompt"] = stack(H[:, :8], cache=caches)
        out[f"stack/{dn}/step"] = stack(H[:, 8:], cache=caches)
        out[f"stack/{dn}/plain"] = stack(H)
        model = tblock.GPT2.from_config(vocab_size=97, n_positions=40, n_embd=48, n_layer=3, n_head=4, seed=3,
                                        dtype=dtype)
        ids = np.arange(11) % 97
        out[f"gpt2/{dn}/logits"] = model(ids)
        for backend in ("numba", "numpy"):
            cache = model.make_cache(30)
            steps = [model.next_logits(ids, cache, backend=backend)]
            for t in range(5):              # the checked step, then prepared ones
                steps.append(model.next_logits(np.array([t + 1]), cache, backend=backend).copy())
            out[f"gpt2/{dn}/steps/{backend}"] = np.stack(steps)
        out[f"gpt2/{dn}/greedy"] = model.generate(ids[None], 12, temperature=0)
        out[f"gpt2/{dn}/sampled"] = model.generate(ids[None], 12, temperature=0.8, top_k=20, seed=5)
    for fmt, dot in STORED:
        for i, (name, cfg, B, T) in enumerate(list(_configs()) + list(_stored_configs())):
            if cfg.d_model % 32 == 0 and cfg.d_ff % 32 == 0:    # 8- and 4-bit blocks: 32 inputs
                w = tblock.quantize(_weights(cfg, i, np.float32), fmt, dot=dot)
                H = np.random.default_rng(i).standard_normal((B, T, cfg.d_model)).astype(np.float32)
                out[f"{name}/{fmt}-{dot}/numba"] = tblock.forward(H, w, cfg)
                out[f"{name}/{fmt}-{dot}/T1"] = tblock.forward(H[:, :1], w, cfg)
    return out


def _timing_cases():
    """name -> a function of no arguments: one call of the case."""
    cases = {}
    for name, d, h, T, fmt, dot in (("toy", 8, 2, 4, None, None), ("384x64", 384, 6, 64, None, None),
                                    ("768x1024", 768, 12, 1024, None, None),
                                    ("bf16-768x128", 768, 12, 128, "bf16", "bf16"),
                                    ("int8-768x128", 768, 12, 128, "int8", "int8")):
        cfg = tblock.BlockConfig(d_model=d, n_heads=h)
        w = tblock.init_weights(cfg, seed=0)
        if fmt is not None:
            w = tblock.quantize(w, fmt, dot=dot)
        H = np.random.default_rng(0).standard_normal((T, d)).astype(np.float32)
        tblock.forward(H, w, cfg)
        cases[name] = (lambda H=H, w=w, cfg=cfg: tblock.forward(H, w, cfg))
    model = tblock.GPT2.from_config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                                    seed=0)
    cache = model.make_cache(1024)
    ids = np.arange(128) % 50257
    model.next_logits(ids, cache)
    logits = np.empty((1, 50257), np.float32)
    tok = np.zeros((1, 1), np.int64)

    def step():
        if cache[0].length >= 1000:         # back to the prompt: the same context range each round
            for c in cache:
                c.length = 128
        model.next_logits(tok, cache, out=logits)
    step()
    cases["decode"] = step
    cases["llama-int8-decode"] = _llama_step()
    return cases


def _llama_step():
    """A decode step of SmolLM2-135M's shape (30 blocks of d 576, 9 heads over 3 K/V heads,
    gated d_ff 1536, tied head), random weights as int8 dot int8: short stages, many of them."""
    from tblock.models.llama import hf_tensor_shapes
    cfg = tblock.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                             num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    rng = np.random.default_rng(0)
    t = {k: (np.ones(s) if len(s) == 1 else 0.02 * rng.standard_normal(s)).astype(np.float32)
         for k, s in hf_tensor_shapes(cfg).items()}
    model = tblock.Llama.from_tensors(cfg, t, weights="int8", dot="int8")
    del t
    cache = model.make_cache(256)
    model.next_logits(np.arange(128), cache)
    logits = np.empty((1, cfg.vocab_size), np.float32)
    tok = np.zeros((1, 1), np.int64)

    def step():
        if cache[0].length >= 192:          # contexts 128-191, as a short generation's
            for c in cache:
                c.length = 128
        model.next_logits(tok, cache, out=logits)
    step()
    return step


def main() -> None:
    cases = None
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "outputs":
            np.savez(msg["path"], **outputs())
            reply = {"ok": True}
        elif msg["cmd"] == "time":
            cases = cases or _timing_cases()
            fn = cases[msg["case"]]
            t0 = time.perf_counter()
            for _ in range(msg["n"]):
                fn()
            reply = {"seconds": time.perf_counter() - t0}
        else:
            break
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
