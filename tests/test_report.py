"""``tblock report``: FLOPs equal tblock.flops, the folder and its JSON round-trip, the
plots are real PNGs, --compare reads two reports, and bad options write nothing (the
limits and the roofline: tests/test_roofline.py)."""

import dataclasses
import json
import math
import os
import struct

import pytest

import tblock
from tblock import cli, report
from tblock.backends import components

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# a tiny sweep: every available backend, three T, minimal repeats, small ceiling GEMMs
TINY = ["report", "--d-model", "16", "--n-heads", "2", "--T-list", "4,16,64", "--repeats", "1",
        "--target-time", "0", "--ceiling-sizes", "32,64"]


def run_cli(argv, capsys):
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    """One tiny report for the whole module (it is the slow part)."""
    folder = tmp_path_factory.mktemp("reports") / "tiny"
    rc = cli.main(TINY + ["--out", str(folder)])
    assert rc == 0
    return folder


def expected_component_flops(cfg, T):
    """The components' FLOPs written out from tblock.flops, independently of tblock.backends.components."""
    fc = tblock.flops(cfg, T)
    out = {}
    for kind, c in (("full", fc.full), ("causal", fc.causal)):
        out[kind] = {
            "layernorm": c["layernorm"] / 2,
            "softmax": c["softmax"],
            "attention_core": c["scores"] + c["softmax"] + c["av"],
            "attention": c["qkv"] + c["scores"] + c["softmax"] + c["av"] + c["out_proj"],
            "ffn": c["ffn_up"] + c["activation"] + c["ffn_down"],
            "block": fc.total(causal=(kind == "causal")),
        }
    return out


# ---------------------------------------------------------------------------------------
# FLOPs

@pytest.mark.parametrize("d_model,n_heads,T", [(8, 2, 4), (16, 2, 64), (384, 6, 3072), (768, 12, 96)])
def test_component_flops_equal_tblock_flops(d_model, n_heads, T):
    cfg = tblock.BlockConfig(d_model=d_model, n_heads=n_heads)
    assert components.component_flops(cfg, T) == expected_component_flops(cfg, T)


def test_report_flops_equal_tblock_flops(tiny_report):
    data = json.loads((tiny_report / "report.json").read_text())
    cfg = tblock.BlockConfig(d_model=16, n_heads=2, causal=data["config"]["causal"])
    for T in (4, 16, 64):
        want = expected_component_flops(cfg, T)
        assert data["flops"][str(T)] == want
        for rec in data["backends"].values():
            for row in (r for r in rec["results"] if r["T"] == T):
                assert row["flops_full"] == want["full"][row["component"]]
                assert row["flops_causal"] == want["causal"][row["component"]]
                if row["status"] == "ok":
                    assert row["gflops"] == pytest.approx(row["flops_causal"] / row["median_s"] / 1e9)
    fm = data["flop_model"]
    assert fm["crossover_T_full"] == tblock.crossover_T(cfg, False) == 4 * 16
    assert fm["crossover_T_causal"] == tblock.crossover_T(cfg, True) == 8 * 16 - 1


def test_sublayer_crossover_brackets_the_flop_balance():
    cfg = tblock.BlockConfig(d_model=384, n_heads=6)
    for causal in (False, True):
        T = components.sublayer_crossover_T(cfg, causal)
        kind = "causal" if causal else "full"
        lo, hi = math.floor(T), math.ceil(T)
        below = components.component_flops(cfg, lo)[kind]
        above = components.component_flops(cfg, hi)[kind]
        assert below["attention"] <= below["ffn"] and above["attention"] >= above["ffn"]
    # about 2 d_model full and 4 d_model causal: half the core's crossover
    assert 1.8 * 384 < components.sublayer_crossover_T(cfg, False) < 2.1 * 384
    assert 3.6 * 384 < components.sublayer_crossover_T(cfg, True) < 4.1 * 384


# ---------------------------------------------------------------------------------------
# the sweep's T grid and the crossover interpolation

def test_default_sweep_spans_d_over_8_to_8_d_and_hits_the_model_crossovers():
    Ts = report.default_T_list(384, "quick")
    assert Ts[0] == 48 and Ts[-1] == 3072
    assert 4 * 384 // 2 in Ts and 4 * 384 in Ts and 8 * 384 in Ts
    full = report.default_T_list(384, "full")
    assert full[-1] == 16 * 384 and len(full) > len(Ts)
    assert report.default_T_list(384, "quick", 100, 100) == [100]


def rows(times):
    return [{"T": T, "component": c, "status": "ok", "median_s": t, "gflops": 1.0}
            for c, series in times.items() for T, t in series.items()]


def test_measured_crossover_is_exact_for_power_laws():
    # attention ~ T^2, FFN ~ 100 T: equal at T = 100, which the sweep does not hit
    Ts = (25, 50, 200, 400)
    x = report.measured_crossover(rows({"attention": {T: T * T for T in Ts},
                                        "ffn": {T: 100.0 * T for T in Ts}}), "attention", "ffn")
    assert x["T"] == pytest.approx(100.0)


def test_measured_crossover_takes_the_last_upward_crossing_and_says_it_was_noisy():
    Ts = (10, 20, 40, 80, 160)
    attn = {10: 2.0, 20: 0.5, 40: 1.0, 80: 4.0, 160: 16.0}      # a spurious spike at T=10
    x = report.measured_crossover(rows({"attention": attn, "ffn": {T: 2.0 for T in Ts}}), "attention", "ffn")
    assert 40 < x["T"] < 80
    assert "2 times" in x["status"]      # down after T=10, up before T=80


def test_measured_crossover_outside_the_sweep():
    Ts = (10, 20)
    below = report.measured_crossover(rows({"attention": {10: 2.0, 20: 3.0}, "ffn": {T: 1.0 for T in Ts}}),
                                      "attention", "ffn")
    assert below["T"] is None and below["status"].startswith("below the sweep")
    above = report.measured_crossover(rows({"attention": {10: 0.25, 20: 0.5}, "ffn": {T: 1.0 for T in Ts}}),
                                      "attention", "ffn")
    assert above["T"] is None and above["status"].startswith("above the sweep")
    assert above["extrapolated_T"] == pytest.approx(40.0)


def test_measured_crossover_does_not_extrapolate_a_flat_slope():
    """Two nearly equal ratios (noise) made the last slope reach 1 at T ~ 10^(10^6): an
    OverflowError; now the status says only that it is above the sweep."""
    Ts = (512, 1024)
    flat = report.measured_crossover(rows({"attention": {512: 0.5, 1024: 0.5 * (1 + 1e-12)},
                                           "ffn": {T: 1.0 for T in Ts}}), "attention", "ffn")
    assert flat["T"] is None and "extrapolated_T" not in flat
    assert flat["status"] == "above the sweep: attention still faster at T=1024"


# ---------------------------------------------------------------------------------------
# the folder: files, JSON round-trip, PNGs

def test_tiny_report_writes_the_folder(tiny_report):
    names = sorted(p.name for p in tiny_report.iterdir())
    assert names == sorted(["report.md", "report.json", *report.PLOTS])
    # nothing left behind beside it: the temporary folder was renamed into place
    assert [p.name for p in tiny_report.parent.iterdir()] == ["tiny"]


def test_report_json_round_trips(tiny_report):
    text = (tiny_report / "report.json").read_text()
    data = json.loads(text)
    assert data["schema"] == report.SCHEMA
    assert json.dumps(data, indent=1) + "\n" == text
    # report.md is a pure function of the JSON: a saved report renders the same page
    assert report.render_markdown(data) == (tiny_report / "report.md").read_text()


def test_report_json_is_self_describing(tiny_report):
    data = json.loads((tiny_report / "report.json").read_text())
    m = data["machine"]
    for key in ("cpu", "cores", "python", "versions", "blas", "date"):
        assert m[key], key
    assert m["versions"]["numpy"] and m["versions"]["numba"]
    assert data["threads"]["requested"] >= 1
    lim = data["limits"]
    assert lim["isa"]["name"] == tblock.isa()
    assert set(lim["peak"]) == set(lim["blas_gemm"]) == {"float32", "float64"}
    assert all(p["gflops"] > 0 for p in lim["peak"].values())
    assert all(g["gflops"] > 0 for g in lim["blas_gemm"].values())
    assert lim["bandwidth"][-1]["name"] == "DRAM" and all(lv["read_GBs"] > 0 for lv in lim["bandwidth"])
    assert data["params"] == {"config": tblock.param_count(tblock.BlockConfig(d_model=16, n_heads=2)),
                              "toy": 808, "toy_ln_affine": 840}
    # every backend that runs here was swept, the numpy oracle always among them
    assert set(data["backends"]) == set(components.available_backends())
    numpy_rows = {(r["T"], r["component"]): r for r in data["backends"]["numpy"]["results"]}
    assert len(numpy_rows) == 3 * len(components.COMPONENTS)
    assert all(r["status"] == "ok" and r["median_s"] > 0 for r in numpy_rows.values())
    # the worked example went through every tblock backend and matches the lesson
    for b, rows_ in data["worked_example"].items():
        assert rows_[-1][0] == "max |H_out - lesson|" and rows_[-1][2] < 1e-6, b


def test_report_md_has_the_sections(tiny_report):
    md = (tiny_report / "report.md").read_text()
    for heading in ("## Machine limits", "## Roofline", "## Crossover", "## FLOPs per component", "## Backend `numpy`",
                    "## Lesson 13 worked example", "## Plots"):
        assert heading in md
    assert "4·d_model" in md and "8·d_model" in md
    for png in report.PLOTS:
        assert f"]({png})" in md


@pytest.mark.parametrize("name", report.PLOTS)
def test_plots_are_valid_pngs(tiny_report, name):
    raw = (tiny_report / name).read_bytes()
    assert raw[:8] == PNG_SIGNATURE
    assert raw[12:16] == b"IHDR"
    width, height = struct.unpack(">II", raw[16:24])
    assert width > 200 and height > 200
    image = pytest.importorskip("matplotlib.image").imread(tiny_report / name)
    assert image.shape[:2] == (height, width)


# ---------------------------------------------------------------------------------------
# --compare

def test_compare_two_reports(tiny_report, tmp_path, capsys):
    a = tiny_report / "report.json"
    data = json.loads(a.read_text())
    # B: the same report with every numpy time doubled
    for row in data["backends"]["numpy"]["results"]:
        if row["status"] == "ok":
            row["median_s"] *= 2
    b = tmp_path / "b.json"
    b.write_text(json.dumps(data))
    rc, out, err = run_cli(["report", "--compare", str(a), str(b)], capsys)
    assert rc == 0, err
    lines = [line.split() for line in out.splitlines() if line.startswith("numpy ") and len(line.split()) == 6]
    assert len(lines) >= 3 * len(components.COMPONENTS)
    assert all(float(line[-1]) == pytest.approx(2.0, abs=0.006) for line in lines)
    assert str(a) in out and str(b) in out


def test_compare_refuses_what_is_not_a_report(tiny_report, tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    rc, out, err = run_cli(["report", "--compare", str(tiny_report / "report.json"), str(bad)], capsys)
    assert rc == 2 and "--compare" in err and "not a tblock report" in err
    rc, out, err = run_cli(["report", "--compare", str(tmp_path / "missing.json"), str(bad)], capsys)
    assert rc == 2 and "cannot read" in err


# ---------------------------------------------------------------------------------------
# bad options: exit 2, the option named, nothing written

BAD = [
    (["--T-min", "100", "--T-max", "10"], "--T-min"),
    (["--T-list", ","], "--T-list"),
    (["--T-list", "0,4"], "--T-list"),
    (["--backends", "numpy,fortran"], "--backends"),
    (["--backends", ""], "--backends"),
    (["--d-model", "30", "--n-heads", "4"], "--n-heads"),
    (["--d-model", "100"], "--n-heads"),
    (["--d-model", "0"], "--d-model"),
    (["--dtype", "float16"], "--dtype"),
    (["--threads", "0"], "--threads"),
    (["--point-budget", "0"], "--point-budget"),
    (["--target-time", "inf"], "--target-time"),
    (["--target-time", "nan"], "--target-time"),
    (["--target-time", "-1"], "--target-time"),
    (["--ceiling-sizes", "a,b"], "--ceiling-sizes"),
]


@pytest.mark.parametrize("args,option", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_options_exit_2_and_write_nothing(args, option, tmp_path, capsys):
    out_dir = tmp_path / "out"
    rc, out, err = run_cli(["report", "--out", str(out_dir)] + args, capsys)
    assert rc == 2
    assert option in err and "error" in err
    assert list(tmp_path.iterdir()) == []


def test_unwritable_out_is_refused(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    rc, out, err = run_cli(["report", "--out", str(a_file / "sub")] + TINY[1:], capsys)
    assert rc == 2 and "--out" in err
    rc, out, err = run_cli(["report", "--out", str(a_file)] + TINY[1:], capsys)
    assert rc == 2 and "--out" in err and "not a folder" in err
    assert [p.name for p in tmp_path.iterdir()] == ["file"] and a_file.read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_parent_is_refused(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        rc, out, err = run_cli(["report", "--out", str(ro / "rep")] + TINY[1:], capsys)
    finally:
        ro.chmod(0o755)
    assert rc == 2 and "--out" in err and "not writable" in err
    assert list(ro.iterdir()) == []


def test_a_folder_that_is_not_a_report_is_never_replaced(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    rc, out, err = run_cli(["report", "--out", str(mine)] + TINY[1:], capsys)
    assert rc == 2 and "--out" in err and "refusing" in err
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"]


def test_a_failed_write_leaves_the_old_report_and_no_temporary_folder(tiny_report, tmp_path, monkeypatch):
    data = json.loads((tiny_report / "report.json").read_text())
    data["options"]["plots"] = False        # the plots are tested above; they take seconds
    out = tmp_path / "rep"
    report.write_report_folder(json.loads(json.dumps(data)), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(_):
        raise RuntimeError("disk full")
    monkeypatch.setattr(report, "render_markdown", broken)
    with pytest.raises(RuntimeError):
        report.write_report_folder(json.loads(json.dumps(data)), out)
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_an_old_report_is_replaced_whole(tiny_report, tmp_path):
    data = json.loads((tiny_report / "report.json").read_text())
    out = tmp_path / "rep"
    report.write_report_folder(json.loads(json.dumps(data)), out)     # with its plots
    data["options"]["plots"] = False
    report.check_out_folder(str(out))       # an old report may be replaced
    report.write_report_folder(data, out)
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]


def _user_folder(tmp_path, tiny_report):
    """A folder of the user's that also holds a tblock report.json (issue #13's reproduction)."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.json").write_bytes((tiny_report / "report.json").read_bytes())
    (mine / "notes.txt").write_text("precious")
    (mine / "src").mkdir()
    (mine / "src" / "main.py").write_text("print(1)")
    return mine


def _tree(folder):
    return sorted((str(p.relative_to(folder)), p.read_bytes() if p.is_file() else None) for p in folder.rglob("*"))


def test_a_report_json_among_the_users_files_is_not_a_licence_to_delete(tiny_report, tmp_path, capsys):
    mine = _user_folder(tmp_path, tiny_report)
    before = _tree(mine)
    rc, out, err = run_cli(["report", "--out", str(mine)] + TINY[1:], capsys)
    assert rc == 2 and "--out" in err and "refusing" in err and "notes.txt, src" in err
    assert _tree(mine) == before


@pytest.mark.parametrize("content", ["{}", "[1, 2]", "not json", '{"schema": "someone-else/1"}'])
def test_a_report_json_without_tblocks_schema_is_not_a_report(tmp_path, content):
    out = tmp_path / "rep"
    out.mkdir()
    (out / "report.json").write_text(content)
    with pytest.raises(report.ReportError, match="refusing"):
        report.check_out_folder(str(out))


def test_files_that_come_in_during_the_run_are_kept(tiny_report, tmp_path):
    data = json.loads((tiny_report / "report.json").read_text())
    data["options"]["plots"] = False
    out = tmp_path / "rep"
    report.write_report_folder(json.loads(json.dumps(data)), out)
    report.check_out_folder(str(out))
    (out / "notes.txt").write_text("written while the report ran")
    with pytest.raises(report.ReportError, match="notes.txt"):
        report.write_report_folder(data, out)
    assert (out / "notes.txt").read_text() == "written while the report ran"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_the_folder_mode_follows_the_umask(tiny_report, tmp_path, mask):
    data = json.loads((tiny_report / "report.json").read_text())
    data["options"]["plots"] = False
    old = os.umask(mask)
    try:
        report.write_report_folder(data, tmp_path / "rep")
    finally:
        os.umask(old)
    assert (tmp_path / "rep").stat().st_mode & 0o777 == 0o777 & ~mask
    assert (tmp_path / "rep" / "report.md").stat().st_mode & 0o777 == 0o666 & ~mask


def test_nothing_too_big_for_memory_is_allocated_or_run(tmp_path, monkeypatch):
    """report -T 30000 drew the (n_heads, T, T) softmax input before its memory check, and
    checked the peers with the float64 oracle at any T: both now wait for the check (here
    with a 1 MiB limit at T=256, where the scores are 1 MiB in float64)."""
    args = cli.build_parser().parse_args(["report", "--d-model", "16", "--n-heads", "2", "-T", "256",
                                          "--backends", "numba,numpy", "--repeats", "1", "--target-time", "0",
                                          "--out", str(tmp_path / "r")])
    opts = dataclasses.replace(report.resolve_options(args), mem_limit_bytes=1 << 20, peers=["torch"])
    drawn, real_inputs = [], components.make_inputs
    monkeypatch.setattr(components, "make_inputs", lambda *a, **k: drawn.append(k["components"]) or real_inputs(*a, **k))
    data = report.run_sweep(opts, report.prepare_all(opts))
    assert drawn and all("softmax" not in names for names in drawn)
    rows = {(b, r["component"]): r for b, rec in data["backends"].items() for r in rec["results"]}
    assert rows["numba", "softmax"]["status"] == "skipped" and "GiB" in rows["numba", "softmax"]["reason"]
    assert rows["numpy", "block"]["status"] == "skipped" and rows["numba", "block"]["status"] == "ok"

    monkeypatch.setattr(report.peers, "peer_status", lambda name: (True, ""))
    monkeypatch.setattr(report.peers, "build", lambda *a, **k: lambda X: X)
    monkeypatch.setattr(report.api, "forward", lambda *a, **k: pytest.fail("the oracle ran at T=256"))
    [row] = report.run_peers(opts)["torch"]["results"]
    assert row["status"] == "skipped" and "oracle" in row["reason"]


def test_without_matplotlib_the_report_says_so_and_skips_the_plots(tiny_report, tmp_path, monkeypatch):
    import sys
    data = json.loads((tiny_report / "report.json").read_text())
    # a None entry in sys.modules makes the import raise ImportError, as if not installed
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    out = tmp_path / "rep"
    report.write_report_folder(data, out)
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]
    assert "matplotlib is not installed" in (out / "report.md").read_text()
    assert json.loads((out / "report.json").read_text())["plots"]["files"] == []


@pytest.mark.slow     # a whole report run
def test_a_failing_component_is_reported_not_fatal(monkeypatch, tmp_path, capsys):
    real = components.prepare

    def prepare(backend, cfg, weights, dtype):
        cs = real(backend, cfg, weights, dtype)
        if backend == "numpy":
            def broken(X):
                raise FloatingPointError("simulated kernel failure")
            cs.fns["ffn"] = broken
        return cs
    monkeypatch.setattr(components, "prepare", prepare)
    rc, out, err = run_cli(["report", "--d-model", "16", "--n-heads", "2", "--T-list", "4", "--backends", "numpy",
                            "--repeats", "1", "--target-time", "0", "--ceiling-sizes", "32", "--no-plots",
                            "--out", str(tmp_path / "r")], capsys)
    assert rc == 0
    assert "error: numpy ffn at T=4: FloatingPointError: simulated kernel failure" in out
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    rows = {r["component"]: r for r in data["backends"]["numpy"]["results"]}
    assert rows["ffn"]["status"] == "error" and rows["block"]["status"] == "ok"
    assert "error (FloatingPointError" in (tmp_path / "r" / "report.md").read_text()


@pytest.mark.parametrize("start,end,own,warned", [(0.2, 1.8, 2, False), (0.7, 1.0, 2, True), (0.2, 2.6, 2, True),
                                                  (0.2, 0.6, 0, True), (0.2, 1.4, 1, False)])
def test_the_load_warning_does_not_count_the_reports_own_threads(start, end, own, warned):
    m = {"loadavg_start": [start, 0, 0], "loadavg_end": [end, 0, 0], "usable_cores": 2}
    busy = report.load_warning(m, own)
    assert (busy is not None) == warned
    if warned:
        assert f"{start:.2f} at the start and {end:.2f} at the end" in busy
