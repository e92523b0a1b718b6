"""The demo page without a browser (tblock demo): what page_run hands the page against the
demo model's own trace (the seed's opening state, the invariant lines, the ε edge, the tour),
the server, the CLI and the static export. The code panel: test_demo_code.py; the page in a
real browser: tests/browser (make test-browser)."""

import json
import math
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tblock.lesson import demo
from tblock.lesson import demo_page, demo_server

VOCAB = ["the", "cat", "sat", "on", "mat", "dog", "ran", "away"]
SENTENCE = ["the", "cat", "sat", "on", "the", "mat"]
# the demo class's order for 6 tokens and 2 heads (its source: one attend per head and token)
ORDER = ["embed"] * 6 + ["attend"] * 12 + ["add"] * 6 + ["norm"] * 6 + ["ffn"] * 6 + ["add"] * 6 + \
        ["norm"] * 6 + ["predict"] * 6
STOPS = [("embed", None), ("attend", None), ("add", "attention"), ("norm", "attention"), ("ffn", None),
         ("add", "ffn"), ("norm", "ffn"), ("predict", None)]


def entropy_bits(p):
    """Shannon entropy in bits, written out here rather than taken from tblock."""
    return -sum(q * math.log2(q) for q in p if q > 0)


def reference(heads=2, positional=True, temperature=1.0):
    """The demo model run directly: its result and its events."""
    events = []
    model = demo.TinyLM(VOCAB, dim=4, heads=heads, hidden=8, seed=1, backend="numpy")
    r = model.forward(SENTENCE, positional=positional, temperature=temperature,
                      tracer=lambda kind, p: events.append((kind, p)))
    return r, events


def final_state(run, token):
    return run["states"][token][-1]


# ---- the seed's page -----------------------------------------------------------------------

def test_the_default_shows_the_seeds_numbers():
    """The seed's page: "predicts: ran 0.39, residual norm: 2.00, attention entropy: 2.12 bits,
    stage: predict", and its tour: "predicts ran at 39 percent ... average 2.11 bits"."""
    run = demo_page.page_run(**demo_page.DEFAULT)
    start = demo_page.controls()["start"]
    assert start == {"event": "last", "token": 0}
    state = final_state(run, start["token"])
    shown = (state["predicts"], state["norm"], state["entropy"], run["events"][-1]["stage_text"])
    assert shown == ("ran 0.39", "2.00", "2.12 bits", "predict")
    assert "predicts ran at 39 percent, and the attention rows average 2.11 bits" in run["tour"][5]["text"]


# ---- what the page is given ----------------------------------------------------------------

def test_events_are_the_tracers_in_order():
    run = demo_page.page_run()
    assert [e["kind"] for e in run["events"]] == ORDER
    assert [e["stage"] for e in run["events"] if e["kind"] == "add"] == ["attention"] * 6 + ["ffn"] * 6
    _, events = reference()
    assert [(e["token"], e["head"]) for e in run["events"]] == [(p["index"], p.get("head")) for _, p in events]


def test_every_written_number_is_the_payloads():
    run = demo_page.page_run()
    _, events = reference()
    vector = {"embed": "sum", "attend": "output", "add": "after", "norm": "after", "ffn": "output",
              "predict": "probabilities"}
    for e, (kind, p) in zip(run["events"], events):
        assert e["texts"] == [f"{v:.2f}" for v in p[vector[kind]]]
        np.testing.assert_allclose(e["values"], p[vector[kind]], atol=5e-7)     # colour values: 6 decimals
        assert e["offset"] == (2 * p["head"] if kind == "attend" else 0)        # head h fills columns 2h, 2h+1


def written(kind, p):
    """What each stop's line writes, by the names its source uses, from the payload."""
    vec = lambda v: "[" + ", ".join(f"{x:.2f}" for x in v) + "]"
    i = p["index"]
    if kind == "embed":
        return {f"x[{i}]": vec(p["sum"])}
    if kind == "attend":
        return {f"A[{p['head']}, {i}]": vec(p["weights"]), f"out_concat[{i}, head {p['head']}]": vec(p["output"])}
    if kind == "add":
        return {f"row + {'A_out' if p['stage'] == 'attention' else 'F_out'}[{i}]": vec(p["after"])}
    if kind == "norm":
        return {f"mu[{i}]": f"{p['mean']:.2f}", f"var[{i}]": f"{p['variance']:.2f}", f"Y[{i}]": vec(p["after"])}
    if kind == "ffn":
        return {f"F_post[{i}]": vec(p["hidden"]), f"F_out[{i}]": vec(p["output"])}
    return {"top": p["top"], f"p[{i}, top]": f"{p['probability']:.2f}"}


def test_the_values_beside_the_line_are_the_payloads():
    run = demo_page.page_run()
    _, events = reference()
    for e, (kind, p) in zip(run["events"], events):
        assert {name: value for name, _, value in e["writes"]} == written(kind, p), (kind, p["index"])
        assert all(long for _, long, _ in e["writes"])                       # a verbose name for each


def test_the_inspector_at_the_end_is_the_models():
    run = demo_page.page_run()
    r, _ = reference()
    for i in range(6):
        s = final_state(run, i)
        assert s["predicts"] == f"{r.top[i]} {r.probabilities[i].max():.2f}"
        assert s["norm"] == f"{np.linalg.norm(r.stream[i]):.2f}" == "2.00"              # sqrt(d) after the norm
        entropy = np.mean([entropy_bits(r.attention[h, i]) for h in range(2)])
        assert s["entropy"] == f"{entropy:.2f} bits"
        assert s["attention_text"] == [f"{w:.2f}" for w in r.attention[:, i].mean(axis=0)]
        assert s["probability_text"] == [f"{q:.2f}" for q in r.probabilities[i]]
    assert run["events"][-1]["stage_text"] == "predict"


def test_the_inspector_follows_each_tokens_events():
    """Before the end: the row norm is the token's latest row, entropy averages the heads seen so far."""
    run = demo_page.page_run()
    _, events = reference()
    row, seen = {}, {}
    for k, (kind, p) in enumerate(events):
        i = p["index"]
        if kind in ("embed", "add", "norm"):
            row[i] = p["sum"] if kind == "embed" else p["after"]
        if kind == "attend":
            seen.setdefault(i, []).append(entropy_bits(p["weights"]))
        [state] = [s for s in run["states"][i] if s["from"] == k]
        assert state["norm"] == f"{np.linalg.norm(row[i]):.2f}"
        assert state["entropy"] == (f"{np.mean(seen[i]):.2f} bits" if i in seen else "—")
        assert state["predicts"] == (f"{p['top']} {p['probability']:.2f}" if kind == "predict" else "—")


def test_invariants_on_the_page():
    run = demo_page.page_run()
    for i in range(6):
        s = final_state(run, i)
        total = float(re.search(r"= ([0-9.]+)$", s["sum"]).group(1))
        assert abs(total - 1) < 1e-11                                                  # rows sum to 1
        norm = float(re.search(r"= ([0-9.]+),", s["unit"]).group(1))
        assert abs(norm - 2) < 1e-4                                                     # norm sqrt(d)
    assert run["events"][-1]["identical"].endswith("different guesses")                # position on
    off = demo_page.page_run(positional=False)
    assert re.search(r"'the' at \[0, 4\], after predict: max \|Δ\| = 0\.0e\+00, identical guesses",
                     off["events"][-1]["identical"])
    a, b = final_state(off, 0), final_state(off, 4)
    assert {k: a[k] for k in ("predicts", "norm", "entropy")} == {k: b[k] for k in ("predicts", "norm", "entropy")}
    assert run["events"][0]["identical"] == "'the' at [0, 4]: not all written yet"


@pytest.mark.parametrize("heads", [1, 2])
def test_the_identical_tokens_line_compares_a_stop_both_have_passed(heads):
    """At every event: the line names the latest stop both 'the' rows have passed (recomputed
    here from the trace), and with the position code off it never says different."""
    for positional in (False, True):
        run = demo_page.page_run(heads=heads, positional=positional)
        _, events = reference(heads=heads, positional=positional)
        done = {0: {}, 4: {}}                                       # token -> stop -> events seen
        for k, (kind, p) in enumerate(events):
            if p["index"] in done:
                stop = (kind, p.get("stage"))
                done[p["index"]][stop] = done[p["index"]].get(stop, 0) + 1
            need = lambda stop: heads if stop == ("attend", None) else 1
            both = [s for s in STOPS if all(done[t].get(s, 0) == need(s) for t in done)]
            line = run["events"][k]["identical"]
            if not both:
                assert line == "'the' at [0, 4]: not all written yet", k
                continue
            kind, stage = both[-1]
            name = f"{kind} ({stage})" if stage else kind
            assert line.startswith(f"'the' at [0, 4], after {name}: "), (k, line)
            if positional:
                assert line.endswith(("different rows", "different guesses")), (k, line)
            else:
                assert line.endswith(("identical rows", "identical guesses")) and "= 0.0e+00" in line, (k, line)


def test_toggles_run_the_model_with_them():
    one = demo_page.page_run(heads=1, positional=False, temperature=0.5)
    r, events = reference(heads=1, positional=False, temperature=0.5)
    assert len(one["events"]) == len(events) == demo.event_count(6, 1) == 48
    assert one["key"] == "h1-p0-t0.50" and one["settings"]["temperature_text"] == "0.50"
    for i in range(6):
        assert final_state(one, i)["predicts"] == f"{r.top[i]} {r.probabilities[i].max():.2f}"
    assert all(e["offset"] == 0 for e in one["events"])                          # one head fills the row
    warm, cold = demo_page.page_run(temperature=2.0), demo_page.page_run(temperature=0.1)
    p = lambda run: float(final_state(run, 0)["predicts"].split()[1])
    assert p(cold) > p(warm)                                                     # same logits, sharper


def test_the_tour_points_at_its_stops():
    run = demo_page.page_run()
    kinds = [run["events"][step["event"]]["kind"] for step in run["tour"]]
    assert kinds == ["embed", "attend", "add", "norm", "ffn", "predict", "predict"]
    r, _ = reference()
    assert f"predicts {r.top[0]} at {100 * r.probabilities[0].max():.0f} percent" in run["tour"][5]["text"]
    rows = np.mean([entropy_bits(a) for a in r.attention.reshape(-1, 6)])
    assert f"average {rows:.2f} bits of entropy (every head and token" in run["tour"][5]["text"]


# ---- the ε edge ----------------------------------------------------------------------------

@pytest.mark.parametrize("heads", [1, 2])
def test_the_constant_row_shows_what_epsilon_is_for(heads):
    """'cat' fed as a constant row (its embedding 0.5 everywhere, W_o = 0, position off): both of
    its norm stops meet variance 0 and give a zero row, finite; its guess is uniform."""
    run = demo_page.controls()["edge"][str(heads)]
    assert run["key"] == f"h{heads}-p0-t1.00-edge" and run["settings"]["constant_row"] is True
    cat = [e for e in run["events"] if e["token"] == 1]
    assert [e["texts"] for e in cat if e["kind"] == "embed"] == [["0.50"] * 4]
    norms = [e for e in cat if e["kind"] == "norm"]
    assert len(norms) == 2
    for e in norms:
        assert e["values"] == [0.0] * 4 and "variance 0; ε keeps" in e["caption"] and e["label"] == "ε"
        assert dict((n, v) for n, _, v in e["writes"])["var[1]"] == "0.00"
    s = final_state(run, 1)
    assert s["norm"] == "0.00" and "a constant row (variance 0)" in s["unit"]
    assert s["probability_text"] == ["0.12"] * 8                                 # 1/8, uniform
    assert [e["token"] for e in run["events"] if e["label"] == "ε"] == [1, 1]      # no other row is constant
    step = run["tour"][3]
    assert run["events"][step["event"]]["kind"] == "norm" and step["token"] == 1 and "ε" in step["text"]
    # the other tokens still see attention; W_o = 0 keeps it out of their rows
    assert all(np.isfinite(v) for e in run["events"] for v in e["values"])


def test_the_constant_row_needs_the_position_code_off():
    with pytest.raises(ValueError, match="constant_row needs positional=False"):
        demo_page.page_run(2, True, 1.0, constant_row=True)
    with pytest.raises(TypeError, match="constant_row must be a bool, got int 1"):
        demo_page.page_run(2, False, 1.0, constant_row=1)


def test_the_controls_carry_the_narration_of_every_stop():
    c = demo_page.controls()
    assert [(s["kind"], s["stage"]) for s in c["stops"]] == STOPS
    assert all(s["pseudo"] and s["narration"].endswith(".") for s in c["stops"])
    run = demo_page.page_run()
    for e in run["events"]:
        assert c["stops"][e["column"]]["line"] == e["line"]                     # one line per stop


# ---- bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(heads=3), ValueError, r"heads must be one of \(1, 2\), got 3"),
    (dict(heads=True), ValueError, r"heads must be one of \(1, 2\), got True"),
    (dict(positional=1), TypeError, "positional must be a bool, got int 1"),
    (dict(temperature=0), ValueError, "temperature must be a finite number > 0, got 0"),
])
def test_bad_settings(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        demo_page.page_run(**kwargs)


@pytest.mark.parametrize("query, match", [
    ("heads=two", "heads must be one of"),
    ("positional=yes", "positional must be 1 or 0, got 'yes'"),
    ("temperature=hot", "temperature must be a finite number > 0, got 'hot'"),
    ("temperature=-1", "temperature must be a finite number > 0, got -1.0"),
    ("seed=3", r"takes heads, positional and temperature, got \['seed'\]"),
])
def test_bad_queries(query, match):
    with pytest.raises(ValueError, match=match):
        demo_server.parse_run_query(query)


def test_bad_port_and_export_target(tmp_path):
    with pytest.raises(ValueError, match=r"port must be an integer in \[0, 65535\].*got 70000"):
        demo_server.make_server(70000)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="--export needs a folder, got the file"):
        demo_server.export(tmp_path / "file")


# ---- the server ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server():
    srv = demo_server.make_server(0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_port}/"
    srv.shutdown()
    srv.server_close()


def get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.headers["Content-Type"], r.read()


def test_the_server_serves_the_page_and_runs(server):
    status, kind, body = get(server)
    assert status == 200 and kind.startswith("text/html") and b'<script src="demo.js">' in body
    for name in ("demo.js", "code.js", "demo.css"):
        assert get(server + name)[2] == (Path(demo_page.__file__).parents[1] / "web" / name).read_bytes()
    script = get(server + "runs.js")[2].decode()
    data = json.loads(script.removeprefix("window.TBLOCK_DEMO = ").removesuffix(";\n"))
    assert data["mode"] == "server" and data["runs"] is None
    assert [t["text"] for t in data["controls"]["temperatures"]][:3] == ["0.05", "0.10", "0.15"]
    run = json.loads(get(server + "api/run?heads=1&positional=0&temperature=0.50")[2])
    assert run == json.loads(json.dumps(demo_page.page_run(1, False, 0.5)))


def test_the_server_refuses_bad_requests(server):
    with pytest.raises(urllib.error.HTTPError) as e:
        get(server + "api/run?heads=3")
    assert e.value.code == 400 and json.loads(e.value.read())["error"] == "heads must be one of (1, 2), got 3"
    with pytest.raises(urllib.error.HTTPError) as e:
        get(server + "../pyproject.toml")
    assert e.value.code == 404


def test_a_busy_port_is_a_clear_error(server):
    port = int(server.rsplit(":", 1)[1].strip("/"))
    with pytest.raises(ValueError, match=rf"cannot listen on 127.0.0.1:{port} .*--port 0 for a free one"):
        demo_server.serve(port, open_browser=False)


@pytest.mark.subprocess
def test_the_command_prints_its_url_and_stops_on_ctrl_c(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "tblock", "demo", "--port", "0", "--no-browser"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = re.search(r"serving (http://127\.0\.0\.1:\d+/)", line).group(1)
        assert get(url + "api/run")[0] == 200
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "tblock demo: stopped" in out and "Traceback" not in err


# ---- the static export ---------------------------------------------------------------------

@pytest.mark.subprocess
def test_the_export_holds_every_toggle_and_needs_no_network(tmp_path):
    out = subprocess.run([sys.executable, "-m", "tblock", "demo", "--export", str(tmp_path / "site")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    site = tmp_path / "site"
    assert sorted(p.name for p in site.iterdir()) == ["code.js", "demo.css", "demo.js", "index.html", "runs.js"]
    data = json.loads((site / "runs.js").read_text().removeprefix("window.TBLOCK_DEMO = ").removesuffix(";\n"))
    grid = [f"{0.1 * k:.2f}" for k in range(1, 21)]
    assert data["mode"] == "static"
    assert sorted(data["runs"]) == sorted(f"h{h}-p{p}-t{t}" for h in (1, 2) for p in (0, 1) for t in grid)
    assert [t["text"] for t in data["controls"]["temperatures"]] == grid
    assert data["runs"]["h2-p0-t0.30"] == json.loads(json.dumps(demo_page.page_run(2, False, 0.3)))
    for name in ("index.html", "demo.js", "code.js", "demo.css"):   # nothing fetched from elsewhere
        assert not re.search(r"https?:|//cdn|@import", (site / name).read_text()), name
