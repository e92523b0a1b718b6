"""``tblock report --family llama``: the Llama-family block (RMSNorm with gamma, SwiGLU, rotary,
grouped-query attention) swept like the lesson's; the FLOP model's crossover at 1.5 d_ff
(3 d_ff - 1 causal), the peers skipped with the reason, the family's options checked, and the
one BlockConfig every part of the report builds from report.json's "config"."""

import dataclasses
import json

import pytest
from conftest import cli_run, one_line_error

import tblock
from tblock import cli, report
from tblock.report import family, options, roofline

# d_k = 8 (even, for rotary); default n_kv_heads 6 // 3 = 2; default d_ff 8/3 * 48 -> 128
LLAMA = ["--family", "llama", "--d-model", "48", "--n-heads", "6", "--T-list", "8,32", "--backends", "numpy",
         "--repeats", "1", "--target-time", "0", "--ceiling-sizes", "32"]
# the same block written out by hand, not through tblock.report.family
CFG = tblock.BlockConfig(d_model=48, n_heads=6, n_kv_heads=2, d_ff=128, norm_type="rmsnorm", ln_affine=True,
                         ffn="gated", activation="silu", positions="rotary")


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    """One quick llama report for the module: (folder, its terminal output)."""
    folder = tmp_path_factory.mktemp("llama") / "rep"
    lines = []
    opts = report.resolve_options(cli.build_parser().parse_args(["report"] + LLAMA + ["--out", str(folder)]))
    assert report.run_report(opts, "tblock report " + " ".join(LLAMA), out=lines.append) == 0
    return folder, "\n".join(lines)


@pytest.fixture(scope="module")
def llama_data(llama_run):
    return json.loads((llama_run[0] / "report.json").read_text())


def test_the_config_names_the_family_and_its_block(llama_data):
    c = llama_data["config"]
    assert {k: c[k] for k in ("family", "d_model", "n_heads", "n_kv_heads", "d_k", "d_kv", "d_ff", "causal",
                              "norm_type", "ln_affine", "ffn", "activation", "positions", "attn_bias")} == dict(
        family="llama", d_model=48, n_heads=6, n_kv_heads=2, d_k=8, d_kv=16, d_ff=128, causal=True,
        norm_type="rmsnorm", ln_affine=True, ffn="gated", activation="silu", positions="rotary", attn_bias=False)
    assert llama_data["options"]["family"] == "llama"
    assert family.block_config(c) == CFG


def test_the_flop_model_crossover_is_the_gated_ffns(llama_data):
    fm = llama_data["flop_model"]
    # three d_model x d_ff matmuls: 4 T^2 d = 6 T d d_ff at T = 1.5 d_ff; causal 2 d T(T+1) -> 3 d_ff - 1
    assert fm["crossover_T_full"] == 1.5 * 128 == tblock.crossover_T(CFG, False)
    assert fm["crossover_T_causal"] == 3 * 128 - 1 == tblock.crossover_T(CFG, True)
    assert fm["ffn_matrices"] == 3
    # the sublayer crossover brackets where attention's FLOPs (grouped K/V) reach the FFN's
    for kind in ("full", "causal"):
        T = fm[f"sublayer_crossover_T_{kind}"]
        below, above = (tblock.flops(CFG, t) for t in (int(T), int(T) + 1))
        part = lambda fc: (fc.causal if kind == "causal" else fc.full)       # noqa: E731
        attn = lambda c: c["qkv"] + c["scores"] + c["softmax"] + c["av"] + c["out_proj"]      # noqa: E731
        ffn = lambda c: c["ffn_up"] + c["activation"] + c["ffn_down"]        # noqa: E731
        assert attn(part(below)) <= ffn(part(below)) and attn(part(above)) >= ffn(part(above))


def test_the_flops_params_and_timings_are_the_llama_blocks(llama_data):
    for T in (8, 32):
        fc = tblock.flops(CFG, T).causal
        f = llama_data["flops"][str(T)]["causal"]
        assert f["ffn"] == fc["ffn_up"] + fc["activation"] + fc["ffn_down"]
        assert f["block"] == sum(fc.values())
    # W_Q, W_O 48x48; W_K, W_V 48x16; three 48x128 FFN matrices; b_ff1, b_gate, b_ff2 in the lesson's
    # count; two RMSNorm gammas
    assert llama_data["params"]["config"] == 2 * 48 * 48 + 2 * 48 * 16 + 3 * 48 * 128 + 2 * 128 + 48 + 2 * 48
    rows = llama_data["backends"]["numpy"]["results"]
    assert len(rows) == 2 * len(report.COMPONENTS) and all(r["status"] == "ok" for r in rows)


def test_the_peers_are_skipped_with_the_reason(llama_run, llama_data):
    folder, out = llama_run
    ps = llama_data["peers"]
    assert set(ps) == set(report.peers.PEERS)
    for p in ps.values():
        assert p["available"] is False and p["results"] == []
        assert "lesson's block only" in p["reason"]
    md = (folder / "report.md").read_text()
    assert "not run (the whole-block peers are built for the lesson's block only" in md
    assert "peers not run: " in out and "lesson's block only" in out


def test_the_report_names_the_family_and_the_gated_crossover(llama_run):
    folder, out = llama_run
    md = (folder / "report.md").read_text()
    assert "**Block** (`--family llama`)" in md and "n_kv_heads=2" in md and "SwiGLU" in md
    assert "against the FFN's three matmuls" in md
    assert "T = 192 = 1.5·d_ff ≈ 4·d_model for the full square" in md
    assert "T = 383 = 3·d_ff − 1 ≈ 7.98·d_model causal" in md
    assert "The Llama-family block." in md
    assert "llama block (RMSNorm, SwiGLU d_ff=128, rotary, 2 K/V heads)" in out
    assert "FLOP model core=FFN 192 full (1.5*d_ff ~4*d_model), 383 causal (3*d_ff - 1 ~7.98*d_model)" in out
    # report.md stays a pure function of the JSON
    data = json.loads((folder / "report.json").read_text())
    assert report.render_markdown(data) == md


def test_the_plots_are_written(llama_run):
    pytest.importorskip("matplotlib")
    folder, _ = llama_run
    for name in report.PLOTS:
        assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_warns_when_the_families_differ(llama_data, tmp_path, capsys):
    lesson = json.loads(json.dumps(llama_data))
    lesson["config"] = {k: lesson["config"][k] for k in ("d_model", "n_heads", "d_k", "d_ff", "causal", "dtype")}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(lesson))          # a report from before the families: the lesson's block
    b.write_text(json.dumps(llama_data))
    rc, out, err = cli_run(capsys, "report", "--compare", a, b)
    assert rc == 0, err
    assert "family (lesson vs llama)" in out and "n_kv_heads (6 vs 2)" in out
    assert "llama block (d_ff=128, 2 K/V heads)" in out


# ---------------------------------------------------------------------------------------
# the options

BAD = [
    (["--n-kv-heads", "4"], "--n-kv-heads must divide n_heads=6, got 4"),
    (["--n-kv-heads", "0"], "--n-kv-heads must be >= 1"),
    (["--d-ff", "0"], "--d-ff must be >= 1"),
    (["--family", "bogus"], "--family must be one of lesson, llama, got 'bogus'"),
]


@pytest.mark.parametrize("args,needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_family_options_exit_2_with_one_line(args, needle, tmp_path, capsys):
    base = [a for a in LLAMA if a not in ("--family", "llama")] if "--family" in args else LLAMA
    rc, out, err = cli_run(capsys, "report", *base, *args, "--out", tmp_path / "r")
    one_line_error(rc, err, "report", needle)
    assert out == "" and list(tmp_path.iterdir()) == []


def test_kv_heads_are_refused_for_the_lessons_block_and_odd_heads_for_rotary(tmp_path, capsys):
    lesson = ["--d-model", "48", "--n-heads", "6", "-T", "8", "--backends", "numpy", "--out", tmp_path / "r"]
    rc, out, err = cli_run(capsys, "report", *lesson, "--n-kv-heads", "2")
    one_line_error(rc, err, "report", "--n-kv-heads applies to --family llama only")
    # d_k = 36 / 12 = 3: rotary turns pairs of columns
    rc, out, err = cli_run(capsys, "report", "--family", "llama", "--d-model", "36", "--n-heads", "12", "-T", "8",
                           "--backends", "numpy", "--out", tmp_path / "r")
    one_line_error(rc, err, "report", "--n-heads", "d_k=3")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("n_heads,kv", [(1, 1), (2, 1), (3, 1), (4, 1), (6, 2), (7, 1), (8, 2), (9, 3), (12, 4),
                                        (14, 2), (32, 8)])
def test_default_kv_heads(n_heads, kv):
    # n_heads over its smallest divisor >= 3: SmolLM2-135M 9 -> 3, Qwen2.5-0.5B 14 -> 2, Llama 3 32 -> 8
    assert family.default_kv_heads(n_heads) == kv
    assert n_heads % kv == 0


@pytest.mark.parametrize("fam,d_model,d_ff", [("llama", 576, 1536), ("llama", 384, 1024), ("llama", 48, 128),
                                             ("llama", 896, 2432), ("lesson", 384, 1536)])
def test_default_d_ff(fam, d_model, d_ff):
    # llama: 8/3 d_model rounded up to a multiple of 64 (SmolLM2-135M: 576 -> 1536)
    assert family.default_d_ff(fam, d_model) == d_ff


def test_options_carry_the_family_and_build_the_config_once():
    args = cli.build_parser().parse_args(["report"] + LLAMA + ["--n-kv-heads", "3", "--d-ff", "200"])
    opts = options.resolve_options(args)
    assert (opts.family, opts.n_kv_heads, opts.d_ff) == ("llama", 3, 200)
    assert opts.block() == dataclasses.replace(CFG, n_kv_heads=3, d_ff=200)
    assert family.block_config(opts.config()) == opts.block()


def test_a_report_config_from_before_the_families_is_the_lessons_block():
    old = {"d_model": 16, "n_heads": 2, "d_k": 8, "d_ff": 64, "causal": False, "dtype": "float32"}
    assert family.block_config(old) == tblock.BlockConfig(d_model=16, n_heads=2, causal=False)
    assert family.block_config({"d_model": 16, "n_heads": 2, "causal": True}).lesson_block
    with pytest.raises(ValueError, match="family"):
        family.block_config({**old, "family": "gpt5"})


def test_the_memory_check_counts_the_gated_ffn_and_the_kv_heads(monkeypatch):
    """The bound is the weights (once, plus once per backend) and one call's activations: a
    gated FFN's third matrix and hidden layer count, grouped K/V heads count d_kv."""
    d, f, kv, T, n_backends = 64, 256, 16, 1000, 1
    weights = 2 * d * d + 2 * d * kv + 3 * d * f
    activations = T * (4 * d + 2 * kv + 2 * f)
    need = 4 * (weights * (1 + n_backends) + activations)
    cfg = tblock.BlockConfig(d_model=d, n_heads=4, n_kv_heads=1, d_ff=f, norm_type="rmsnorm", ffn="gated",
                             activation="silu", positions="rotary")
    monkeypatch.setattr(options, "physical_memory", lambda: need)
    options._check_memory(cfg, T, n_backends, "float32", (8,))
    monkeypatch.setattr(options, "physical_memory", lambda: need - 1)
    with pytest.raises(options.ReportError, match="needs at least"):
        options._check_memory(cfg, T, n_backends, "float32", (8,))


# ---------------------------------------------------------------------------------------
# the roofline's bytes for the llama block, by hand

def test_bytes_of_the_llama_block_by_hand():
    d, kv, f, T = 48, 16, 128, 4
    # Q (T, d) and K, V (T, d_kv) in, (T, d) out
    assert roofline.component_bytes(CFG, T, "attention_core", 4) == (T * d + 2 * T * kv + T * d) * 4
    # W_Q, W_O d x d; W_K, W_V d x d_kv; no biases
    assert roofline.component_bytes(CFG, T, "attention", 4) == (T * d + 2 * d * d + 2 * d * kv + T * d) * 4
    # three d x d_ff matrices
    assert roofline.component_bytes(CFG, T, "ffn", 4) == (T * d + 3 * d * f + T * d) * 4
    # one RMSNorm's gamma, no beta
    assert roofline.component_bytes(CFG, T, "layernorm", 4) == (T * d + d + T * d) * 4
    block_weights = 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d
    assert roofline.component_bytes(CFG, T, "block", 8) == (T * d + block_weights + T * d) * 8
    # a decode step reads the K and V of its context: d_kv wide each
    assert roofline.decode_bytes(CFG, 100, 4) == (2 * d + block_weights + 2 * 100 * kv) * 4
