"""``tblock report``'s limits and roofline: the byte model, intensity and bound on
hand-computed cases, a tiny report's limits, roofline table and plot, the BLAS's kernel
note, and --compare across the schema change (tests/data/report_schema1.json was written
by the report before the roofline)."""

import json
from pathlib import Path

import pytest

import tblock
from tblock import cli, report
from tblock.backends import components
from tblock.perf import machine
from tblock.report import limits, roofline

DATA = Path(__file__).parent / "data"
OLD = DATA / "report_schema1.json"
TINY = ["report", "--d-model", "16", "--n-heads", "2", "--T-list", "4,16,64", "--repeats", "1",
        "--target-time", "0", "--ceiling-sizes", "32,64", "--peers", "none"]
CFG = tblock.BlockConfig(d_model=16, n_heads=2)          # d_ff 64, causal, no biases, no LN affines


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("roofline") / "tiny"
    assert cli.main(TINY + ["--out", str(folder)]) == 0
    return folder


# ---------------------------------------------------------------------------------------
# the byte model, intensity and bound, by hand

# elements at T=4, d=16, 2 heads, d_ff=64: X and the output 4*16 = 64 each; W_Q,K,V,O 4*16*16;
# W_ff1, W_ff2 2*16*64; the causal scores 2 heads * (4*5/2) read, 2 * 4*4 written
HAND_BYTES_T4 = {"layernorm": (64 + 64) * 4,
                 "softmax": (2 * 10 + 2 * 16) * 4,
                 "attention_core": (3 * 64 + 64) * 4,
                 "attention": (64 + 1024 + 64) * 4,
                 "ffn": (64 + 2048 + 64) * 4,
                 "block": (64 + 1024 + 2048 + 64) * 4}


@pytest.mark.parametrize("component", components.COMPONENTS)
def test_component_bytes_by_hand(component):
    assert roofline.component_bytes(CFG, 4, component, 4) == HAND_BYTES_T4[component]


def test_bytes_of_the_full_square_and_in_float64():
    full = tblock.BlockConfig(d_model=16, n_heads=2, causal=False)
    assert roofline.component_bytes(full, 4, "softmax", 4) == (2 * 16 + 2 * 16) * 4
    assert roofline.component_bytes(CFG, 4, "block", 8) == 2 * HAND_BYTES_T4["block"]
    # biases and LayerNorm affines are weights too: +4d attention, +d_ff+d FFN, +2d a LayerNorm
    gpt = tblock.BlockConfig(d_model=16, n_heads=2, attn_bias=True, ffn_bias=True, ln_affine=True)
    assert roofline.component_bytes(gpt, 4, "block", 4) == (64 + 1024 + 64 + 2048 + 64 + 16 + 4 * 16 + 64) * 4


def test_decode_step_flops_and_bytes_by_hand():
    # context 64: four projections and the FFN 2*(4*16*16 + 2*16*64) = 6144, the two
    # LayerNorms 2*5*16 = 160, tanh-GELU 9*64 = 576, the residuals 2*16 = 32; per key a
    # score and an AV (2*16 each) and 6 softmax FLOPs per head: 64 * (64 + 12)
    assert roofline.decode_flops(CFG, 64) == 6144 + 160 + 576 + 32 + 64 * 76
    # its row in and out, the weights, the keys and values of 64 tokens
    assert roofline.decode_bytes(CFG, 64, 4) == (2 * 16 + 3072 + 2 * 64 * 16) * 4
    assert roofline.decode_flops(CFG, 1) == tblock.flops(CFG, 1).total()


LEVELS = [{"name": "L1", "capacity_bytes": 1000, "read_GBs": 100.0},
          {"name": "L2", "capacity_bytes": 10_000, "read_GBs": 40.0},
          {"name": "L3", "capacity_bytes": 100_000, "read_GBs": 50.0},     # timed at a busy moment
          {"name": "DRAM", "capacity_bytes": None, "read_GBs": 10.0}]


def test_memory_level_is_the_smallest_that_holds_the_bytes():
    assert roofline.memory_level(1000, LEVELS) == ("L1", 100.0)
    assert roofline.memory_level(1001, LEVELS) == ("L2", 50.0)     # never below a larger level's
    assert roofline.memory_level(100_000, LEVELS) == ("L3", 50.0)
    assert roofline.memory_level(10**9, LEVELS) == ("DRAM", 10.0)


def test_bound_and_percent_of_roof_by_hand():
    assert roofline.bound(200.0, 0.5, 10.0) == 5.0          # memory: 0.5 FLOP/B x 10 GB/s
    assert roofline.bound(200.0, 100.0, 10.0) == 200.0      # compute: the peak
    # 5000 FLOPs on 2000 bytes held in L2 (credited L3's 50 GB/s): 2.5 x 50 = 125 < 200
    p = roofline.place(5000, 2000, 200.0, LEVELS, gflops=100.0)
    assert p["intensity"] == 2.5 and p["level"] == "L2" and p["bandwidth_GBs"] == 50.0
    assert p["bound_gflops"] == 125.0 and p["bound_by"] == "memory" and p["pct_roof"] == 80.0
    # 10^6 FLOPs on 800 bytes in L1: 1250 x 100 GB/s is far above the 200 GFLOP/s peak
    p = roofline.place(10**6, 800, 200.0, LEVELS, gflops=50.0)
    assert p["bound_gflops"] == 200.0 and p["bound_by"] == "compute" and p["pct_roof"] == 25.0
    assert "pct_roof" not in roofline.place(10**6, 800, 200.0, LEVELS)


def test_add_roofline_lists_what_is_above_its_roof():
    lim = {"peak": {"float32": {"gflops": 100.0}, "float64": {"gflops": 50.0}}, "bandwidth": LEVELS}
    T, c = 16, "layernorm"
    fl = components.component_flops(CFG, T)["causal"][c]
    row = {"T": T, "component": c, "status": "ok", "flops": fl}
    data = {"limits": lim, "config": {"d_model": 16, "n_heads": 2, "causal": True, "dtype": "float32"},
            "backends": {"a": {"compute_dtype": "float32", "results": [dict(row)]},
                         "b": {"compute_dtype": "float64", "results": [dict(row)]}}}
    # a LayerNorm of 16 x 16: 1280 FLOPs on 2048 bytes, in L2 (credited 50 GB/s): 0.625 x 50
    bound = 31.25
    assert fl == 1280
    data["backends"]["a"]["results"][0]["gflops"] = bound * 1.04      # inside the 5% noise
    data["backends"]["b"]["results"][0]["gflops"] = bound * 1.10
    roofline.add_roofline(data)
    assert data["backends"]["a"]["results"][0]["pct_roof"] == pytest.approx(104.0)
    assert [(a["backend"], a["pct_roof"]) for a in data["roofline"]["above"]] == [("b", pytest.approx(110.0))]


# ---------------------------------------------------------------------------------------
# the machine's limits

def test_cache_levels_and_capacity():
    assert machine._cpu_count("0-1,4,6-7") == 5
    levels = machine.cache_levels()
    assert [lv["name"] for lv in levels] == sorted(lv["name"] for lv in levels)
    assert all(lv["bytes"] > 0 and lv["shared_by"] >= 1 for lv in levels)
    from tblock.perf import peak
    assert peak.capacity({"bytes": 1 << 20, "shared_by": 1}, 2) == 2 << 20     # one per core
    assert peak.capacity({"bytes": 32 << 20, "shared_by": 8}, 2) == 32 << 20   # one shared
    assert peak.capacity({"bytes": 32 << 20, "shared_by": 8}, 9) == 64 << 20


def test_fma_loop_counts_lanes_of_each_dtype():
    from tblock.kernels import isa
    from tblock.perf import peak
    nacc = peak.fma_registers() * 3 // 4
    for dt, size in (("float32", 4), ("float64", 8)):
        _, per_iter = peak.fma_loop(1, dt)
        assert per_iter == nacc * (isa.PATH.vector_bytes // size) * 2


@pytest.mark.parametrize("env", [None, "Haswell"])
def test_the_blas_kernel_is_named_and_a_forced_core_type_noted(monkeypatch, env):
    if env is None:
        monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    else:
        monkeypatch.setenv("OPENBLAS_CORETYPE", env)
    k = limits.blas_kernel()
    assert k["label"]["numpy"].startswith(k["name"])
    if k["name"] != "OpenBLAS" or env is None:
        assert k["note"] is None
    else:
        assert "OPENBLAS_CORETYPE=Haswell" in k["note"] and k["env"]["OPENBLAS_CORETYPE"] == "Haswell"
        if k["kernel"]:
            assert k["label"]["numpy"].endswith(f"{k['kernel']} kernel")


# ---------------------------------------------------------------------------------------
# a tiny report: the limits, the roofline table and the plot

def test_tiny_report_has_the_limits_and_the_roofline(tiny):
    data = json.loads((tiny / "report.json").read_text())
    lim = data["limits"]
    assert data["schema"] == report.SCHEMA
    for dt in ("float32", "float64"):
        # measured at the start, after each backend and at the end: the best of them
        assert len(lim["peak"][dt]["samples_gflops"]) == len(data["backends"]) + 2
        assert lim["peak"][dt]["gflops"] == max(lim["peak"][dt]["samples_gflops"])
    for lv in lim["bandwidth"]:
        assert lv["read_GBs"] == max(lv["samples_GBs"]) and len(lv["samples_GBs"]) == len(data["backends"]) + 2
    assert lim["peak"]["float32"]["lanes"] == 2 * lim["peak"]["float64"]["lanes"]
    for rec in data["backends"].values():
        peak = lim["peak"][rec["compute_dtype"]]["gflops"]
        for r in rec["results"]:
            assert r["bytes"] == roofline.component_bytes(CFG, r["T"], r["component"], 4)
            assert r["intensity"] == r["flops"] / r["bytes"]
            assert r["bound_gflops"] == min(peak, r["intensity"] * r["bandwidth_GBs"])
            if r["status"] == "ok":
                assert r["pct_roof"] == pytest.approx(100 * r["gflops"] / r["bound_gflops"])
                assert "pct_ceiling" not in r
    above = {(a["backend"], a["component"], a["T"]) for a in data["roofline"]["above"]}
    assert above == {(b, r["component"], r["T"]) for b, rec in data["backends"].items() for r in rec["results"]
                     if r["status"] == "ok" and r["pct_roof"] > 100 + roofline.NOISE_PCT}
    d = data["decode"]
    if "numba" in data["backends"]:
        assert d["status"] == "ok" and d["context"] == 64 and d["flops"] == roofline.decode_flops(CFG, 64)
        assert d["bytes"] == roofline.decode_bytes(CFG, 64, 4) and d["pct_roof"] > 0
    md = (tiny / "report.md").read_text()
    assert "## Machine limits" in md and "float32 FMA peak" in md and "float64 FMA peak" in md
    assert "DRAM read bandwidth" in md and "float32 BLAS GEMM (reference)" in md
    assert "## Roofline" in md and roofline.BYTE_MODEL in md
    assert "| component | T | FLOPs | bytes (least) | FLOP/byte | held in |" in md
    assert "% of roof" in md and "% of ceiling" not in md
    assert "softmax (standalone)" in md and "takes longer than the whole block" in md
    if "numba" in data["backends"]:
        assert "| decode step (numba) | context 64 |" in md
    assert "![roofline.png](roofline.png)" in md
    raw = (tiny / "roofline.png").read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------
# --compare across the schema change

def test_the_old_schema_test_data_is_an_old_report():
    old = json.loads(OLD.read_text())
    assert old["schema"] == "tblock-report/1" and "ceilings" in old and "limits" not in old


@pytest.mark.parametrize("order", ["old-new", "new-old", "old-old"])
def test_compare_reads_old_and_new_reports(tiny, capsys, order):
    new = tiny / "report.json"
    a, b = {"old-new": (OLD, new), "new-old": (new, OLD), "old-old": (OLD, OLD)}[order]
    rc = cli.main(["report", "--compare", str(a), str(b)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    old = json.loads(OLD.read_text())
    # the BLAS GEMM rows carry the old report's "ceilings"
    gemm = [line.split() for line in out.splitlines() if line.startswith("float32 BLAS GEMM")]
    assert len(gemm) == 1 and float(gemm[0][3 if order != "new-old" else 4]) == pytest.approx(
        old["ceilings"]["float32"]["gflops"], abs=0.06)
    # the FMA peak: only the new report has one
    peak = next(line.split() for line in out.splitlines() if line.startswith("float32 FMA peak"))
    assert [c == "-" for c in peak[3:]] == {"old-new": [True, False, True], "new-old": [False, True, True],
                                            "old-old": [True, True, True]}[order]
    rows = [line.split() for line in out.splitlines() if line.startswith("numpy ") and len(line.split()) == 6]
    if order == "old-old":
        assert rows and all(float(r[-1]) == 1.0 for r in rows)
    else:
        assert rows     # numpy at T=4 and T=16 in both


def test_compare_refuses_an_unknown_schema(tmp_path, capsys):
    bad = tmp_path / "future.json"
    bad.write_text(json.dumps({**json.loads(OLD.read_text()), "schema": "tblock-report/99"}))
    rc = cli.main(["report", "--compare", str(OLD), str(bad)])
    out, err = capsys.readouterr()
    assert rc == 2 and "not a tblock report" in err and "tblock-report/2" in err



def test_the_decode_step_is_na_without_a_causal_numba_block():
    opts = report.ReportOptions(d_model=16, n_heads=2, T_list=[4], backends=["numpy"])
    ok_block = {"numba": {"results": [{"T": 4, "component": "block", "status": "ok"}]}}
    d = report.time_decode(report.ReportOptions(d_model=16, n_heads=2, T_list=[4], causal=False), ok_block)
    assert d["status"] == "n/a" and "causal" in d["reason"]
    d = report.time_decode(opts, {"numpy": {"results": [{"T": 4, "component": "block", "status": "ok"}]}})
    assert d["status"] == "n/a" and "numba" in d["reason"]
    # the roofline leaves an n/a step alone
    lim = {"peak": {"float32": {"gflops": 100.0}}, "bandwidth": LEVELS}
    data = {"limits": lim, "config": {"d_model": 16, "n_heads": 2, "causal": True, "dtype": "float32"},
            "backends": {}, "decode": d}
    roofline.add_roofline(data)
    assert "pct_roof" not in d and data["roofline"]["above"] == []
