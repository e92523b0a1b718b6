"""The block families ``tblock report`` sweeps, and the one place its BlockConfig is built.

    lesson   the lesson's block: LayerNorm, the two-matrix GELU FFN, positions in the input,
             as many K/V heads as query heads (the default; the report as it always was)
    llama    the block of the small models run today (Llama, SmolLM2, Qwen2.5 less its Q/K/V
             biases, Mistral): RMSNorm with gamma, the gated FFN with silu (SwiGLU), rotary
             positions on Q and K, grouped-query attention; no biases

report.json's "config" holds what builds the swept block (``config_dict``); ``block_config``
turns it back into a BlockConfig for the sweep, the FLOP model and the roofline alike, so
they can never disagree about which block was measured.
"""

from __future__ import annotations

from ..config import BlockConfig

FAMILIES = ("lesson", "llama")
# the options a family sets beyond d_model, n_heads, d_ff, n_kv_heads and causal
FAMILY_FIELDS = {
    "lesson": {},
    "llama": dict(norm_type="rmsnorm", ln_affine=True, ffn="gated", activation="silu", positions="rotary"),
}
DESCRIPTIONS = {
    "lesson": "the lesson's block (LayerNorm, two-matrix FFN, no rotary, n_kv_heads = n_heads)",
    "llama": "a Llama-family block (RMSNorm with gamma, SwiGLU, rotary positions, grouped-query attention)",
}


def default_kv_heads(n_heads: int) -> int:
    """K/V heads when --n-kv-heads is not given: n_heads over its smallest divisor >= 3.
    That is SmolLM2's 3 query heads per K/V head where 3 divides n_heads (9 -> 3, 6 -> 2),
    Llama 3's 4 for 32 heads (-> 8), Qwen2.5-0.5B's 7 for 14 heads (-> 2); 1, 2, 4 and a
    prime n_heads get multi-query attention, one K/V head."""
    group = next((g for g in range(3, n_heads + 1) if n_heads % g == 0), n_heads)
    return n_heads // group


def default_d_ff(family: str, d_model: int) -> int:
    """The lesson's 4 d_model; for llama 8/3 d_model rounded up to a multiple of 64 (the
    SwiGLU width with the two-matrix FFN's parameters, as Llama and SmolLM2 choose it:
    576 -> 1536). Its FLOP-model crossover, 1.5 d_ff, is then about 4 d_model again."""
    if family == "llama":
        return -(-8 * d_model // (3 * 64)) * 64
    return 4 * d_model


def config_dict(family: str, d_model: int, n_heads: int, d_ff: int | None, n_kv_heads: int | None,
                causal: bool, dtype: str) -> dict:
    """report.json's "config": what ``block_config`` needs, and the resolved fields a
    reader wants to see (d_k, d_kv, the norm, the FFN, the positions)."""
    cfg = block_config({"family": family, "d_model": d_model, "n_heads": n_heads, "d_ff": d_ff,
                        "n_kv_heads": n_kv_heads, "causal": causal})
    return {"family": family, "d_model": cfg.d_model, "n_heads": cfg.n_heads, "n_kv_heads": cfg.kv_heads,
            "d_k": cfg.d_k, "d_kv": cfg.d_kv, "d_ff": cfg.d_ff, "causal": cfg.causal, "norm": cfg.norm,
            "norm_type": cfg.norm_type, "ln_affine": cfg.ln_affine, "ffn": cfg.ffn, "activation": cfg.activation,
            "positions": cfg.positions, "rope_theta": cfg.rope_theta, "attn_bias": cfg.attn_bias,
            "ffn_bias": cfg.ffn_bias, "dtype": str(dtype), "batch": 1}


def block_config(cfg_d: dict) -> BlockConfig:
    """The swept block from report.json's "config" (or ``config_dict``'s arguments).

    Reports written before the families have no "family" (the lesson's) and no
    "n_kv_heads"; the lesson's block keeps n_kv_heads None and d_ff as stored (4 d_model
    when absent), so it is the very config the report always built."""
    family = cfg_d.get("family", "lesson")
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    kv = cfg_d.get("n_kv_heads") if family != "lesson" else None
    d_ff = cfg_d.get("d_ff")
    if d_ff is None and family != "lesson":
        d_ff = default_d_ff(family, cfg_d["d_model"])
    if kv is None and family != "lesson":
        kv = default_kv_heads(cfg_d["n_heads"])
    return BlockConfig(d_model=cfg_d["d_model"], n_heads=cfg_d["n_heads"], d_ff=d_ff, causal=cfg_d["causal"],
                       n_kv_heads=kv, **FAMILY_FIELDS[family])
