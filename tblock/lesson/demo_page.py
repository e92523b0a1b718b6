"""The interactive demo as a page: what it draws, computed by tblock.lesson.demo in Python.

``page_run(heads, positional, temperature)`` sends the demo's six tokens through its seeded
TinyLM once, records the tracer's events, and turns them into everything the page shows:

    events   one per tracer event, in order: the stop (embed, attend, add, norm, ffn, predict),
             the token, the slice of the stage it writes, a caption, its line in the code panel
    states   per token, what the inspector and the two strips show from each of its events on:
             predicts, residual norm, attention entropy, attention weights, guess, invariants
    code     tblock's own source of the stops, with every event mapped to the line computing it
    tour     the guided tour: an event to jump to and what to read there

Every number is formatted here, so the page's JavaScript only looks values up and colours
cells; it computes nothing. The block runs on the numpy oracle, the backend whose source the
code panel shows.
"""

from __future__ import annotations

import inspect
import math
import textwrap
from pathlib import Path

import numpy as np

from ..backends import numpy as oracle
from . import demo
from .analysis import row_entropies_bits

VOCAB = ("the", "cat", "sat", "on", "mat", "ran")
SENTENCE = ("the", "cat", "sat", "on", "the", "mat")     # "the" twice: the equivariance test
SEED = 1                                                  # the demo class's default seed
DIM, HIDDEN = 4, 8
HEADS = (1, 2)
BACKEND = "numpy"
DIGITS = 3                                                # the inspector's decimals
DEFAULT = dict(heads=2, positional=True, temperature=1.0)
# the server's slider moves in 0.05 steps; a static export holds one run per 0.1
SERVER_TEMPERATURES = tuple(round(0.05 * k, 2) for k in range(1, 41))
EXPORT_TEMPERATURES = tuple(round(0.1 * k, 1) for k in range(1, 21))

# the stage's columns, one per stop of the block in the order the events visit them
COLUMNS = (("embed", None), ("attend", None), ("add", "attention"), ("norm", "attention"),
           ("ffn", None), ("add", "ffn"), ("norm", "ffn"), ("predict", None))

# the code panel: each function tblock runs, and for each stop it computes, a statement that
# finds the stop's line in the function's source (searched for, so edits move the highlight)
CODE = (
    (demo.TinyLM.forward, {("embed", None): "x = E + P", ("predict", None): "p = softmax(logits"}),
    (oracle.block_forward_one, {("add", "attention"): "layernorm(H_in + attention(",
                                ("add", "ffn"): 'layernorm(tr["H_mid"] + ffn('}),
    (oracle.attention, {("attend", None): "attention_core(Q, K, V, cfg)"}),
    (oracle.layernorm, {("norm", "attention"): "np.sqrt(var + eps)", ("norm", "ffn"): "np.sqrt(var + eps)"}),
    (oracle.ffn, {("ffn", None): "F_out = F_post @"}),
)


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


# ---- the code panel ----------------------------------------------------------------------

def _relative_file(obj) -> str:
    """The source file as a path from the directory holding the tblock package."""
    root = Path(inspect.getsourcefile(demo)).resolve().parents[2]
    return Path(inspect.getsourcefile(obj)).resolve().relative_to(root).as_posix()


def code_panel() -> tuple[list, dict]:
    """The panel's sections (title, file, first line number, lines) and, per stop, the
    (section, line) that computes it; a statement found nowhere, or twice, is an error."""
    sections, lines_of = [], {}
    for number, (fn, statements) in enumerate(CODE):
        source, first = inspect.getsourcelines(fn)
        lines = textwrap.dedent("".join(source)).rstrip("\n").split("\n")
        sections.append(dict(title=fn.__qualname__, file=_relative_file(fn), start=first, lines=lines))
        for stop, statement in statements.items():
            hits = [j for j, line in enumerate(lines) if statement in line]
            if len(hits) != 1:
                raise LookupError(f"the code panel needs exactly one line of {fn.__qualname__} holding "
                                  f"{statement!r} (the {stop[0]} stop), found {len(hits)}")
            lines_of[stop] = (number, hits[0])
    missing = set(COLUMNS) - set(lines_of)
    if missing:
        raise LookupError(f"no line of code for the stops {sorted(missing, key=str)}")
    return sections, lines_of


# ---- one run -----------------------------------------------------------------------------

class _Recorder:
    """The tracer: keeps every (kind, payload) in order."""

    def __init__(self):
        self.events = []

    def emit(self, kind, payload):
        self.events.append((kind, payload))


def run_key(heads: int, positional: bool, temperature: float) -> str:
    """How the page names a run: the toggles, temperature to the slider's two decimals."""
    return f"h{heads}-p{int(positional)}-t{temperature:.2f}"


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
    if kind in ("add", "norm"):
        return 0, p["after"], None
    if kind == "ffn":
        return 0, p["output"], None
    return 0, p["probabilities"], p["top"]


class _TokenState:
    """What is known about one token so far: its row, each head's attention, its guess."""

    def __init__(self):
        self.row = None             # (dim,) its residual-stream row at the latest stop
        self.attention = {}         # head -> (T,) weights from this token
        self.normed = None          # (dim,) the row after its latest norm stop
        self.guess = None           # the predict payload

    def update(self, kind, p):
        if kind == "embed":
            self.row = p["sum"]
        elif kind in ("add", "norm"):
            self.row = p["after"]
        if kind == "norm":
            self.normed = p["after"]
        if kind == "attend":
            self.attention[p["head"]] = p["weights"]
        if kind == "predict":
            self.guess = p

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
            "attention_text": [_fmt(w, 2) for w in weights] if heads else None,
            "probabilities": _colour_values(g["probabilities"]) if g else None,
            "probability_text": [_fmt(q, 2) for q in g["probabilities"]] if g else None,
            "sum": (f"Σp over the {len(vocab)} words = {float(np.sum(g['probabilities'])):.12f}" if g
                    else "Σp: no guess yet"),
            "unit": (f"‖row‖ after its last norm = {float(np.linalg.norm(self.normed)):.6f}, "
                     f"√d = {math.sqrt(len(self.normed)):.6f}" if self.normed is not None
                     else "‖row‖ after norm: not normalised yet"),
        }


def _identical_rows(tokens, states) -> str:
    """Identical tokens: how far apart their rows are at this stop."""
    parts = []
    for word in dict.fromkeys(tokens):
        where = [i for i, t in enumerate(tokens) if t == word]
        if len(where) < 2:
            continue
        rows = [states[i].row for i in where]
        if any(r is None for r in rows):
            parts.append(f"'{word}' at {where}: not all written yet")
            continue
        gap = max(float(np.max(np.abs(r - rows[0]))) for r in rows[1:])
        verdict = "identical rows" if gap < 1e-12 else "different rows"
        parts.append(f"'{word}' at {where}: max |Δ| = {gap:.1e}, {verdict}")
    return "; ".join(parts) if parts else "no word appears twice"


def _tour(events, result, positional) -> list:
    """The guided tour: (event to show, token to inspect, what to read)."""
    first = {}
    for k, (kind, p) in enumerate(events):
        first.setdefault(stop_of(kind, p), k)
    last = len(events) - 1
    end_token = 0
    entropy = float(np.mean(row_entropies_bits(result.attention)))
    top = result.top[end_token]
    p_top = float(result.probabilities[end_token].max())
    e0 = events[first[("embed", None)]][1]
    code = (f"plus its position code PE(0) = {_vector(e0['position'])}" if positional
            else "plus the position code, which is off: a zero vector")
    return [
        dict(event=first[("embed", None)], token=0,
             text=f"Row 0 starts as the embedding of '{e0['token']}' {code}. Rows stay faint until written."),
        dict(event=first[("attend", None)], token=0,
             text="Head 0 looks around the sentence from token 0: the sentence strip shades every token by "
                  f"its weight. log2 {len(SENTENCE)} = {math.log2(len(SENTENCE)):.3f} bits would be uniform."),
        dict(event=first[("add", "attention")], token=0,
             text="The heads' outputs, mixed by W_o, are added onto the row, not written over it."),
        dict(event=first[("norm", "attention")], token=0,
             text=f"Layer norm: mean 0, variance 1, so the row's norm returns to √d = {math.sqrt(DIM):g}."),
        dict(event=first[("ffn", None)], token=0,
             text=f"A relu network of width {HIDDEN} works on each row alone: "
                  "the only stop where tokens do not interact."),
        dict(event=last, token=end_token,
             text=f"Every row is done: token {end_token} predicts {top} at {100 * p_top:.0f} percent, "
                  f"and the attention rows average {_fmt(entropy)} bits of entropy. Every probability row "
                  "sums to 1."),
        dict(event=last, token=end_token,
             text="Now try the toggles: with the position code off, the two 'the' rows and their guesses "
                  "are identical; a low temperature makes the same guess confident."),
    ]


def page_run(heads: int = 2, positional: bool = True, temperature: float = 1.0) -> dict:
    """Everything the page shows for one setting of its toggles (module docstring)."""
    heads, positional, temperature = check_settings(heads, positional, temperature)
    model = demo.TinyLM(VOCAB, dim=DIM, heads=heads, hidden=HIDDEN, seed=SEED, backend=BACKEND)
    rec = _Recorder()
    result = model.forward(list(SENTENCE), positional=positional, temperature=temperature, tracer=rec)
    _, line_of = code_panel()
    tokens = list(SENTENCE)
    rows = [_TokenState() for _ in tokens]
    events, states = [], [[] for _ in tokens]
    for k, (kind, p) in enumerate(rec.events):
        i, stop = p["index"], stop_of(kind, p)
        offset, values, label = _write(kind, p, model.head_dim)
        rows[i].update(kind, p)
        states[i].append(rows[i].view(k, VOCAB))
        events.append(dict(
            kind=kind, stage=p.get("stage"), head=p.get("head"), token=i, column=COLUMNS.index(stop),
            offset=offset, values=_colour_values(values), texts=[_fmt(v) for v in values], label=label,
            caption=_caption(kind, p, tokens[i]), stage_text=_stage_text(kind, p), line=line_of[stop],
            identical=_identical_rows(tokens, rows)))
    # the diverging ramp's end: the largest entry the stream, a head or the ffn writes
    scale = max(abs(v) for e in events if e["kind"] != "predict" for v in e["values"])
    return dict(
        key=run_key(heads, positional, temperature),
        settings=dict(heads=heads, positional=positional, temperature=temperature,
                      temperature_text=f"{temperature:.2f}", seed=SEED, backend=BACKEND),
        tokens=tokens, vocab=list(VOCAB), dim=DIM,
        columns=[dict(kind=kind, stage=stage, width=len(VOCAB) if kind == "predict" else DIM)
                 for kind, stage in COLUMNS],
        scale=scale, events=events, states=states,
        tour=_tour(rec.events, result, positional))


def controls(temperatures=SERVER_TEMPERATURES) -> dict:
    """The toggles the page offers, its starting run and the code panel (the same for every run)."""
    sections, _ = code_panel()
    return dict(heads=list(HEADS), temperatures=[dict(value=t, text=f"{t:.2f}") for t in temperatures],
                default=dict(DEFAULT, temperature_text=f"{DEFAULT['temperature']:.2f}"), code=sections)


def all_runs(temperatures=EXPORT_TEMPERATURES) -> dict:
    """Every toggle combination over the temperature grid, by run_key: a static export's data."""
    runs = {}
    for heads in HEADS:
        for positional in (True, False):
            for t in temperatures:
                run = page_run(heads, positional, t)
                runs[run["key"]] = run
    return runs
