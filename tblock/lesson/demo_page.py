"""The interactive demo as a page: what it draws, computed by tblock.lesson.demo in Python.

``page_run(heads, positional, temperature)`` sends the demo's six tokens through its seeded
TinyLM once, records the tracer's events, and turns them into everything the page shows:

    events   one per tracer event, in order: the stop (embed, attend, add, norm, ffn, predict),
             the token, the slice of the stage it writes, a caption, its line in the code panel
    states   per token, what the inspector and the two strips show from each of its events on:
             predicts, residual norm, attention entropy, attention weights, guess, invariants
    code     tblock's own source of the stops (demo_code.code_panel), with every event mapped to
             the line computing it and the values it writes
    tour     the guided tour: an event to jump to and what to read there

Every number is formatted here, so the page's JavaScript only looks values up and colours
cells; it computes nothing. The block runs on the numpy oracle, the backend whose source the
code panel shows.

The seed leaves the vocabulary open beyond the sentence's words. Eight words with "ran" the
seventh is the one reading that reproduces the seed's page (predicts ran 0.39, residual norm
2.00, attention entropy 2.12 bits at the predict stop, token 0 inspected); docs/demo.md says
what was searched. Which two words fill the other open places is not in the seed.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from . import demo
from .analysis import row_entropies_bits
from .demo_code import NARRATION, code_panel

VOCAB = ("the", "cat", "sat", "on", "mat", "dog", "ran", "away")
SENTENCE = ("the", "cat", "sat", "on", "the", "mat")     # "the" twice: the equivariance test
SEED = 1                                                  # the demo class's default seed
DIM, HIDDEN = 4, 8
HEADS = (1, 2)
BACKEND = "numpy"
DIGITS = 2                                                # the seed's page shows two decimals
DEFAULT = dict(heads=2, positional=True, temperature=1.0)
START = dict(event="last", token=0)                       # the seed's page opens on the finished run
# the ε edge: "cat" fed as a constant row (its embedding one value, W_o = 0, position off)
EDGE_WORD, EDGE_VALUE = "cat", 0.5
# the server's slider moves in 0.05 steps; a static export holds one run per 0.1
SERVER_TEMPERATURES = tuple(round(0.05 * k, 2) for k in range(1, 41))
EXPORT_TEMPERATURES = tuple(round(0.1 * k, 1) for k in range(1, 21))

# the stage's columns, one per stop of the block in the order the events visit them
COLUMNS = (("embed", None), ("attend", None), ("add", "attention"), ("norm", "attention"),
           ("ffn", None), ("add", "ffn"), ("norm", "ffn"), ("predict", None))


def stop_of(kind: str, payload: dict) -> tuple:
    """The stage column of an event: add and norm run twice, and their payload's stage says which."""
    return (kind, payload.get("stage"))


def _fmt(x, digits=DIGITS) -> str:
    return f"{float(x):.{digits}f}"


def _vector(v, digits=DIGITS) -> str:
    return "[" + ", ".join(_fmt(x, digits) for x in v) + "]"


def _colour_values(v) -> list:
    """Values only the colour ramp reads: six decimals are more than a pixel resolves."""
    return [round(float(x), 6) for x in v]


# ---- one run -----------------------------------------------------------------------------

class _Recorder:
    """The tracer: keeps every (kind, payload) in order."""

    def __init__(self):
        self.events = []

    def emit(self, kind, payload):
        self.events.append((kind, payload))


def run_key(heads: int, positional: bool, temperature: float, constant_row: bool = False) -> str:
    """How the page names a run: the toggles, temperature to the slider's two decimals."""
    return f"h{heads}-p{int(positional)}-t{temperature:.2f}" + ("-edge" if constant_row else "")


def check_settings(heads, positional, temperature) -> tuple[int, bool, float]:
    if isinstance(heads, bool) or heads not in HEADS:
        raise ValueError(f"heads must be one of {HEADS}, got {heads!r}")
    if not isinstance(positional, bool):
        raise TypeError(f"positional must be a bool, got {type(positional).__name__} {positional!r}")
    return int(heads), positional, demo.check_temperature(temperature)


def _caption(kind, p, word) -> str:
    """The token and stop being computed, in words."""
    i = p["index"]
    where = f"token {i} '{word}'"
    if kind == "embed":
        return f"embed · {where}: E[{word}] + PE({i})"
    if kind == "attend":
        return f"attend · head {p['head']} looks around the sentence from {where}"
    if kind == "add":
        return f"add · {where}: the {p['stage']} output added onto the row"
    if kind == "norm" and p["variance"] == 0:
        return (f"norm · {where}: a constant row, variance 0; ε keeps (x − mean) / √(0 + ε) = 0 "
                "finite where 0 / 0 would be NaN")
    if kind == "norm":
        return f"norm · {where}: the row after {p['stage']} recentred and rescaled"
    if kind == "ffn":
        return f"ffn · {where}: relu network on this row alone"
    return f"predict · {where}: a distribution over the vocabulary"


def _stage_text(kind, p) -> str:
    return f"{kind} ({p['stage']})" if kind in ("add", "norm") else kind


def _write(kind, p, head_dim) -> tuple:
    """(column offset, values, label) an event writes into its cell of the stage."""
    if kind == "embed":
        return 0, p["sum"], None
    if kind == "attend":
        return p["head"] * head_dim, p["output"], None      # a head fills its own slice of the row
    if kind == "norm" and p["variance"] == 0:
        return 0, p["after"], "ε"                           # a constant row: ε is what kept it finite
    if kind in ("add", "norm"):
        return 0, p["after"], None
    if kind == "ffn":
        return 0, p["output"], None
    return 0, p["probabilities"], p["top"]


def _writes(kind, p) -> list:
    """What the stop's line of code writes, [name, verbose name, value], shown beside that line."""
    i = p["index"]
    if kind == "embed":
        return [[f"x[{i}]", f"stream[{i}]", _vector(p["sum"])]]
    if kind == "attend":
        h = p["head"]
        return [[f"A[{h}, {i}]", f"attention_weights[{h}, {i}]", _vector(p["weights"])],
                [f"out_concat[{i}, head {h}]", f"head_outputs[{i}, head {h}]", _vector(p["output"])]]
    if kind == "add":
        delta = "A_out" if p["stage"] == "attention" else "F_out"
        verbose = "attention_out" if p["stage"] == "attention" else "ffn_out"
        return [[f"row + {delta}[{i}]", f"row + {verbose}[{i}]", _vector(p["after"])]]
    if kind == "norm":
        return [[f"mu[{i}]", f"mean[{i}]", _fmt(p["mean"])], [f"var[{i}]", f"variance[{i}]", _fmt(p["variance"])],
                [f"Y[{i}]", f"normalised[{i}]", _vector(p["after"])]]
    if kind == "ffn":
        return [[f"F_post[{i}]", f"hidden[{i}]", _vector(p["hidden"])],
                [f"F_out[{i}]", f"ffn_out[{i}]", _vector(p["output"])]]
    return [["top", "top", p["top"]], [f"p[{i}, top]", f"probabilities[{i}, top]", _fmt(p["probability"])]]


class _TokenState:
    """What is known about one token so far: its stage cells, each head's attention, its guess."""

    def __init__(self):
        self.cells = {}             # column -> (width,) values written so far, NaN where not yet
        self.row = None             # (dim,) its residual-stream row at the latest stop
        self.attention = {}         # head -> (T,) weights from this token
        self.normed = None          # (dim,) the row after its latest norm stop
        self.variance = None        # the variance that norm removed
        self.guess = None           # the predict payload

    def update(self, kind, p, column, offset, values):
        width = len(VOCAB) if kind == "predict" else DIM
        cell = self.cells.setdefault(column, np.full(width, np.nan))
        cell[offset:offset + len(values)] = values
        if kind == "embed":
            self.row = p["sum"]
        elif kind in ("add", "norm"):
            self.row = p["after"]
        if kind == "norm":
            self.normed, self.variance = p["after"], p["variance"]
        if kind == "attend":
            self.attention[p["head"]] = p["weights"]
        if kind == "predict":
            self.guess = p

    def _unit(self) -> str:
        if self.normed is None:
            return "‖row‖ after norm: not normalised yet"
        norm = float(np.linalg.norm(self.normed))
        if self.variance == 0:
            return (f"‖row‖ after its last norm = {norm:.6f}: a constant row (variance 0), "
                    "which ε keeps finite instead of 0 / 0")
        return f"‖row‖ after its last norm = {norm:.6f}, √d = {math.sqrt(len(self.normed)):.6f}"

    def view(self, event_index, vocab) -> dict:
        """The inspector fields and strips as the page shows them from this event on."""
        heads = sorted(self.attention)
        weights = np.mean([self.attention[h] for h in heads], axis=0) if heads else None    # (T,)
        entropy = np.mean(row_entropies_bits(np.array([self.attention[h] for h in heads]))) if heads else None
        g = self.guess
        return {
            "from": event_index,
            "predicts": f"{g['top']} {_fmt(g['probability'])}" if g else "—",
            "norm": _fmt(np.linalg.norm(self.row)) if self.row is not None else "—",
            "entropy": f"{_fmt(entropy)} bits" if heads else "—",
            "heads_seen": len(heads),
            "attention": _colour_values(weights) if heads else None,
            "attention_text": [_fmt(w) for w in weights] if heads else None,
            "probabilities": _colour_values(g["probabilities"]) if g else None,
            "probability_text": [_fmt(q) for q in g["probabilities"]] if g else None,
            "sum": (f"Σp over the {len(vocab)} words = {float(np.sum(g['probabilities'])):.12f}" if g
                    else "Σp: no guess yet"),
            "unit": self._unit(),
        }


def _column_name(column) -> str:
    kind, stage = COLUMNS[column]
    return f"{kind} ({stage})" if stage else kind


def _identical_rows(tokens, states) -> str:
    """Identical tokens: how far apart their cells are at the latest stop all of them have passed."""
    parts = []
    for word in dict.fromkeys(tokens):
        where = [i for i, t in enumerate(tokens) if t == word]
        if len(where) < 2:
            continue
        passed = [c for c in range(len(COLUMNS))
                  if all(c in states[i].cells and not np.isnan(states[i].cells[c]).any() for i in where)]
        if not passed:
            parts.append(f"'{word}' at {where}: not all written yet")
            continue
        c = max(passed)
        cells = [states[i].cells[c] for i in where]
        gap = max(float(np.max(np.abs(v - cells[0]))) for v in cells[1:])
        what = "guesses" if COLUMNS[c][0] == "predict" else "rows"
        verdict = f"identical {what}" if gap < 1e-12 else f"different {what}"
        parts.append(f"'{word}' at {where}, after {_column_name(c)}: max |Δ| = {gap:.1e}, {verdict}")
    return "; ".join(parts) if parts else "no word appears twice"


def _tour(events, result, positional, constant_row) -> list:
    """The guided tour: (event to show, token to inspect, what to read)."""
    first = {}
    for k, (kind, p) in enumerate(events):
        first.setdefault((stop_of(kind, p), p["index"]), k)
    last = len(events) - 1
    end_token = START["token"]
    entropy = float(np.mean(row_entropies_bits(result.attention)))
    top = result.top[end_token]
    p_top = float(result.probabilities[end_token].max())
    e0 = events[first[(("embed", None), 0)]][1]
    code = (f"plus its position code PE(0) = {_vector(e0['position'])}" if positional
            else "plus the position code, which is off: a zero vector")
    norm = dict(event=first[(("norm", "attention"), 0)], token=0,
                text=f"Layer norm: mean 0, variance 1, so the row's norm returns to √d = {math.sqrt(DIM):g}.")
    if constant_row:
        j = SENTENCE.index(EDGE_WORD)
        row = events[first[(("embed", None), j)]][1]["sum"]
        norm = dict(event=first[(("norm", "attention"), j)], token=j,
                    text=f"The ε edge: '{EDGE_WORD}' enters as the constant row {_vector(row)} "
                         "(position off, W_o = 0), so the norm meets variance 0: (x − mean) / √(0 + ε) = 0 "
                         f"stays finite where 0 / 0 would be NaN, and its guess ends uniform, 1/{len(VOCAB)} "
                         "a word.")
    return [
        dict(event=first[(("embed", None), 0)], token=0,
             text=f"Row 0 starts as the embedding of '{e0['token']}' {code}. Rows stay faint until written."),
        dict(event=first[(("attend", None), 0)], token=0,
             text="Head 0 looks around the sentence from token 0: the sentence strip shades every token by "
                  f"its weight. log2 {len(SENTENCE)} = {math.log2(len(SENTENCE)):.2f} bits would be uniform."),
        dict(event=first[(("add", "attention"), 0)], token=0,
             text="The heads' outputs, mixed by W_o, are added onto the row, not written over it."),
        norm,
        dict(event=first[(("ffn", None), 0)], token=0,
             text=f"A relu network of width {HIDDEN} works on each row alone: "
                  "the only stop where tokens do not interact."),
        dict(event=last, token=end_token,
             text=f"Every row is done: the inspected token predicts {top} at {100 * p_top:.0f} percent, "
                  f"and the attention rows average {_fmt(entropy)} bits of entropy (every head and token; "
                  "the inspector's figure is this token's mean over its heads). Every probability row sums to 1."),
        dict(event=last, token=end_token,
             text="Now try the toggles: with the position code off, the two 'the' rows and their guesses "
                  "are identical; a low temperature makes the same guess confident; 'constant row (ε)' "
                  f"feeds '{EDGE_WORD}' as a constant row, the norm's epsilon edge."),
    ]


def _edge_weights(weights: demo.DemoWeights) -> demo.DemoWeights:
    """The ε edge's model: EDGE_WORD's embedding one constant value and W_o = 0, so its row
    reaches the first norm constant."""
    embeddings = weights.embeddings.copy()
    embeddings[VOCAB.index(EDGE_WORD)] = EDGE_VALUE
    blocks = tuple(dataclasses.replace(b, wo=np.zeros_like(b.wo)) for b in weights.blocks)
    return demo.DemoWeights(embeddings=embeddings, blocks=blocks, wout=weights.wout)


def page_run(heads: int = 2, positional: bool = True, temperature: float = 1.0,
             constant_row: bool = False) -> dict:
    """Everything the page shows for one setting of its toggles (module docstring)."""
    heads, positional, temperature = check_settings(heads, positional, temperature)
    if not isinstance(constant_row, bool):
        raise TypeError(f"constant_row must be a bool, got {type(constant_row).__name__} {constant_row!r}")
    if constant_row and positional:
        raise ValueError("constant_row needs positional=False: the position code would make the row vary")
    model = demo.TinyLM(VOCAB, dim=DIM, heads=heads, hidden=HIDDEN, seed=SEED, backend=BACKEND)
    if constant_row:
        model = demo.TinyLM(VOCAB, dim=DIM, heads=heads, hidden=HIDDEN, backend=BACKEND,
                            weights=_edge_weights(model.weights))
    rec = _Recorder()
    result = model.forward(list(SENTENCE), positional=positional, temperature=temperature, tracer=rec)
    _, line_of = code_panel()
    tokens = list(SENTENCE)
    rows = [_TokenState() for _ in tokens]
    events, states = [], [[] for _ in tokens]
    for k, (kind, p) in enumerate(rec.events):
        i, stop = p["index"], stop_of(kind, p)
        offset, values, label = _write(kind, p, model.head_dim)
        rows[i].update(kind, p, COLUMNS.index(stop), offset, values)
        states[i].append(rows[i].view(k, VOCAB))
        events.append(dict(
            kind=kind, stage=p.get("stage"), head=p.get("head"), token=i, column=COLUMNS.index(stop),
            offset=offset, values=_colour_values(values), texts=[_fmt(v) for v in values], label=label,
            caption=_caption(kind, p, tokens[i]), stage_text=_stage_text(kind, p), line=line_of[stop],
            writes=_writes(kind, p), identical=_identical_rows(tokens, rows)))
    # the diverging ramp's end: the largest entry the stream, a head or the ffn writes
    scale = max(abs(v) for e in events if e["kind"] != "predict" for v in e["values"])
    return dict(
        key=run_key(heads, positional, temperature, constant_row),
        settings=dict(heads=heads, positional=positional, temperature=temperature,
                      temperature_text=f"{temperature:.2f}", seed=SEED, backend=BACKEND,
                      constant_row=constant_row),
        tokens=tokens, vocab=list(VOCAB), dim=DIM,
        columns=[dict(kind=kind, stage=stage, width=len(VOCAB) if kind == "predict" else DIM)
                 for kind, stage in COLUMNS],
        scale=scale, events=events, states=states,
        tour=_tour(rec.events, result, positional, constant_row))


def controls(temperatures=SERVER_TEMPERATURES) -> dict:
    """The toggles the page offers, where it starts, the code panel with its narration (the same
    for every run) and the ε edge's runs (one per head count, position off, temperature 1)."""
    sections, line_of = code_panel()
    stops = [dict(kind=kind, stage=stage, line=line_of[(kind, stage)], pseudo=NARRATION[(kind, stage)][0],
                  narration=NARRATION[(kind, stage)][1]) for kind, stage in COLUMNS]
    edge = {str(h): page_run(h, False, 1.0, constant_row=True) for h in HEADS}
    return dict(heads=list(HEADS), temperatures=[dict(value=t, text=f"{t:.2f}") for t in temperatures],
                default=dict(DEFAULT, temperature_text=f"{DEFAULT['temperature']:.2f}"), start=START,
                code=sections, stops=stops, edge=edge, edge_word=EDGE_WORD)


def all_runs(temperatures=EXPORT_TEMPERATURES) -> dict:
    """Every toggle combination over the temperature grid, by run_key: a static export's data."""
    runs = {}
    for heads in HEADS:
        for positional in (True, False):
            for t in temperatures:
                run = page_run(heads, positional, t)
                runs[run["key"]] = run
    return runs
