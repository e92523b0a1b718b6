"""tblock.peers: every installed peer computes the oracle's block; tblock imports none of
them; `tblock report` and bench/compare_peers.py run with or without them.

The peer libraries are optional (the `peers` extra, not installed in CI): each test that
needs one skips, naming it, when it is missing."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import proc

import tblock
from tblock import cli, peers
from tblock.kernels import isa as kernels_isa

ROOT = Path(__file__).resolve().parent.parent


def need(name):
    """Skip unless every library of peer ``name`` imports."""
    for module in peers.NEEDS[name]:
        pytest.importorskip(module, reason=f"{module} is not installed (the optional peers extra)")
    ok, why = peers.peer_status(name)
    if not ok:
        pytest.skip(why)


@pytest.mark.slow
@pytest.mark.parametrize("B", [1, 2])
@pytest.mark.parametrize("name", peers.PEERS)
def test_peer_matches_the_oracle(name, B):
    need(name)
    cfg = tblock.BlockConfig(d_model=16, n_heads=2)
    w = tblock.init_weights(cfg, seed=4, dtype=np.float32)
    H = np.random.default_rng(B).standard_normal((B, 8, 16)).astype(np.float32)
    fn = peers.build(name, w, cfg, threads=1, shape=H.shape)
    out = fn(H)
    assert out.shape == H.shape and out.dtype == np.float32
    assert peers.max_rel_error(out, tblock.forward(H, w, cfg, backend="numpy")) < 1e-5
    np.testing.assert_array_equal(fn(H), out)       # a second call: same answer, nothing consumed


@pytest.mark.slow
@pytest.mark.parametrize("name", ["torch", "ort"])
def test_peer_takes_2d_input_and_other_configs(name):
    # the builders follow the config: Post-LN, LayerNorm affines, FFN and attention biases,
    # erf GELU, no mask
    need(name)
    cfg = tblock.BlockConfig(d_model=16, n_heads=4, norm="post", ln_affine=True, ffn_bias=True,
                             activation="gelu_erf", causal=False, attn_bias=True)
    rng = np.random.default_rng(0)
    w = tblock.init_weights(cfg, seed=1, dtype=np.float32)
    w = tblock.BlockWeights(**{k: (a + 0.1 * rng.standard_normal(a.shape)).astype(np.float32)
                               for k, a in w.arrays().items()})
    H = rng.standard_normal((8, 16)).astype(np.float32)
    out = peers.build(name, w, cfg, threads=1)(H)
    assert out.shape == (8, 16)
    assert peers.max_rel_error(out, tblock.forward(H, w, cfg, backend="numpy")) < 1e-5


@pytest.mark.slow
def test_onnx_graph_uses_the_fused_attention_op():
    need("ort")
    cfg = tblock.BlockConfig(d_model=16, n_heads=2)
    model = peers.onnx_model(tblock.init_weights(cfg, seed=0), cfg)
    ops = {(n.domain, n.op_type): n for n in model.graph.node}
    att = ops[("com.microsoft", "Attention")]
    assert {a.name: a.i for a in att.attribute} == {"num_heads": 2, "unidirectional": 1}
    assert ("com.microsoft", "FastGelu") in ops and ("", "LayerNormalization") in ops


@pytest.mark.parametrize("text, host, isa", [
    ("brgemm_avx512_f32", "avx512", "avx512"), ("brgconv_avx512_1x1_f32", "avx2", "avx512"),
    ("AVX512_CORE_AMX", "avx512", "avx512"), ("jit_avx2_f32", "avx512", "avx2"), ("AVX2", "avx512", "avx2"),
    ("avx2_vnni", "avx512", "avx2"), ("jit_sse41_f32", "avx512", "generic"),
    ("gemm_mlas_f32", "avx512", "avx512"), ("gemm_mlas_f32", "avx2", "avx2"),      # MLAS: CPUID, the host's
    ("ref_f32", "avx512", None), ("unknown_f32", "avx512", None), ("ALL", "avx2", None), ("", "avx2", None)])
def test_isa_of_a_kernel_name_or_a_setting(text, host, isa):
    assert peers.isa_of_token(text, host) == isa


def test_widest_isa():
    assert peers.widest("generic", "avx512", "avx2") == "avx512"
    assert peers.widest("avx2", "generic") == "avx2" and peers.widest("generic") == "generic"
    assert peers.host_isa() == kernels_isa.PATH.runnable[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", peers.PEERS)
def test_peer_reports_the_isa_of_its_kernels(name):
    need(name)
    cfg = tblock.BlockConfig(d_model=16, n_heads=2)
    fn = peers.build(name, tblock.init_weights(cfg, seed=0, dtype=np.float32), cfg, threads=1, shape=(1, 8, 16))
    isa, evidence = fn.isa
    assert isa in kernels_isa.NAMES and evidence
    if name == "ort":
        assert isa == peers.host_isa()          # no variable caps MLAS


@pytest.mark.subprocess
def test_torch_isa_follows_the_capping_variables():
    """Under the three variables a forced avx2 comparison sets, torch reports avx2 (on a
    machine that runs AVX2); with any one of them missing, the host's ISA."""
    need("torch")
    if "avx2" not in kernels_isa.PATH.runnable:
        pytest.skip("this machine runs no AVX2")
    caps = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    base = {k: v for k, v in os.environ.items() if k not in caps}
    for left_out in [None, *caps]:
        env = dict(base, **{k: v for k, v in caps.items() if k != left_out})
        r = subprocess.run(proc("torch_isa"), capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.split()[-1] == ("avx2" if left_out is None else peers.host_isa()), left_out


@pytest.mark.subprocess
def test_tblock_imports_no_peer():
    r = subprocess.run(proc("import_check", "no_peer"), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_status_and_versions_agree():
    versions = peers.peer_versions()
    assert set(versions) == set(peers.DISTRIBUTIONS)
    for name in peers.PEERS:
        ok, why = peers.peer_status(name)
        assert ok == (name in peers.available_peers())
        assert ok or why
        if ok:
            assert versions[peers.DISTRIBUTION[name]]
    with pytest.raises(ValueError, match="peer must be one of"):
        peers.peer_status("tensorflow")


@pytest.mark.slow
def test_report_lists_the_peers(tmp_path, capsys):
    # cheap peers when installed; the report works, and says why, when none is
    ran = [p for p in ("ort", "torch") if peers.peer_status(p)[0]]
    argv = ["report", "--d-model", "16", "--n-heads", "2", "--T-list", "4,16", "--repeats", "1",
            "--target-time", "0", "--ceiling-sizes", "32", "--backends", "numba", "--no-plots",
            "--out", str(tmp_path / "r")]
    assert cli.main(argv + ["--peers", ",".join(ran)] if ran else argv) == 0
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    md = (tmp_path / "r" / "report.md").read_text()
    if not ran:
        assert set(data["peers"]) == set(peers.PEERS)
        assert all(not p["available"] and p["reason"] for p in data["peers"].values())
        assert "peers not run" in out and "## The whole block against its peers" in md
        return
    for name in ran:
        p = data["peers"][name]
        assert p["available"] and p["version"] == peers.peer_versions()[peers.DISTRIBUTION[name]]
        assert [r["T"] for r in p["results"]] == [4, 16]
        assert all(r["status"] == "ok" and r["median_s"] > 0 and r["max_rel_err"] < 1e-3 for r in p["results"])
        assert peers.LABELS[name] in md
    assert "whole block against its peers" in out and "numba / fastest peer" in md


@pytest.mark.slow     # a whole report run
def test_report_without_peers(tmp_path):
    argv = ["report", "--d-model", "16", "--n-heads", "2", "-T", "4", "--repeats", "1", "--target-time", "0",
            "--ceiling-sizes", "32", "--backends", "numpy", "--no-plots", "--peers", "none", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["peers"] == {}
    assert "against its peers" not in (tmp_path / "report.md").read_text()


def test_report_refuses_an_unknown_peer(tmp_path, capsys):
    assert cli.main(["report", "--peers", "tensorflow", "--out", str(tmp_path / "r")]) == 2
    assert "--peers" in capsys.readouterr().err and not (tmp_path / "r").exists()


@pytest.mark.subprocess
def test_compare_peers_script_at_a_tiny_size(tmp_path):
    """bench/compare_peers.py end to end, tiny and quick (each peer first run in a child
    process): its table and its JSON."""
    out = tmp_path / "peers.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "compare_peers.py"), "--quick", "--points", "16:2:8",
                        "--no-memory", "--isolate", "--threads", "2", "--json", str(out)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads(out.read_text())
    installed = peers.available_peers()
    assert data["peers"] == installed
    header = next(line for line in r.stdout.splitlines() if line.startswith("d_model"))
    for column in ["T", "B", "tblock"] + [peers.LABELS[n] for n in installed] + ["tblock / fastest peer"]:
        assert column in header
    [point] = data["points"]
    assert (point["d"], point["heads"], point["T"], point["B"]) == (16, 2, 8, 1)
    assert set(point["impls"]) == {"tblock", *installed}
    for name, rec in point["impls"].items():
        assert rec["status"] == "ok" and rec["max_rel_err"] < 1e-3 and rec["median_s"] > 0, name
        assert rec["isa"] in kernels_isa.NAMES and rec["isa_evidence"], name
        assert rec["gflops"] == pytest.approx(point["causal_flops"] / rec["median_s"] / 1e9), name
    assert point["impls"]["tblock"]["isa"] == tblock.isa()
    assert ("ratio" in point) == bool(installed) and data["isolate"]
    assert data["isa"]["name"] == tblock.isa() and data["isa"]["vector_bytes"] in (16, 32, 64)
    assert data["cpu"]["model"] and data["versions"]["numba"] and data["threads"]["numba"] >= 1
    assert data["measured_fma_peak_gflops"] > 0 and data["fma_loop"]["lanes"] == data["isa"]["vector_bytes"] // 4


def _bench_common():
    """bench/common.py as a module (bench/ holds scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("bench_common", ROOT / "bench" / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.subprocess
@pytest.mark.parametrize("how, why", [
    ("ok", ""), ("segv", "killed by SIGSEGV in a child process"),
    ("raise", "RuntimeError: the peer broke"), ("exit3", "exit status 3")])
def test_a_peer_that_fails_in_a_child_process_is_named(how, why):
    """compare_peers --isolate runs each peer once in a child first: a crash there (a
    segmentation fault) is reported with its signal instead of ending the run (bench/common.py)."""
    p = subprocess.run(proc("crash", how), capture_output=True, text=True)
    assert _bench_common().child_failure(p) == why


@pytest.mark.slow
@pytest.mark.parametrize("kw", [{}, dict(norm="post", causal=False, activation="relu", ffn_bias=True, ln_affine=True,
                                         attn_bias=True)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backend_torch_is_the_oracles_block_with_its_trace(kw, dtype):
    """The "torch" backend (tblock.backends.torch): forward and its trace by name, when torch
    is installed; a BackendUnavailable naming torch when it is not."""
    cfg = tblock.BlockConfig(d_model=16, n_heads=2, **kw)
    rng = np.random.default_rng(4)
    w = tblock.BlockWeights(**{k: (a + 0.1 * rng.standard_normal(a.shape)).astype(dtype)      # nonzero biases
                               for k, a in tblock.init_weights(cfg, seed=4, dtype=dtype).arrays().items()})
    H = np.random.default_rng(1).standard_normal((2, 8, 16)).astype(dtype)
    if not peers.peer_status("torch")[0]:
        with pytest.raises(tblock.BackendUnavailable, match="torch"):
            tblock.forward(H, w, cfg, backend="torch")
        return
    out, tr = tblock.forward(H, w, cfg, backend="torch", trace=True)
    ref, tr_ref = tblock.forward(H, w, cfg, backend="numpy", trace=True)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert out.dtype == dtype and peers.max_rel_error(out, ref) < tol
    for name in tblock.api.TRACE_NAMES:
        assert peers.max_rel_error(getattr(tr, name), getattr(tr_ref, name)) < tol, name
    assert "torch" not in tblock.available_backends()      # an outside reference, taken by name only
