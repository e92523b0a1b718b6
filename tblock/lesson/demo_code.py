"""The demo page's code panel: tblock's own source of the stops the page walks through.

``code_panel()`` reads each function tblock runs for the demo (inspect.getsourcelines) and
hands the page, per line, the exact text plus what the panel's options need to change the
display without changing the file:

    comment   where a trailing ``#`` comment starts (comments off drops it), or None
    doc       the line is only a comment or part of a docstring (comments off hides it)
    tracer    the line records the trace that draws the page (tracer off hides it)
    verbose   the line with terse names spelled out (display only), or None when unchanged

and, per stop, the line computing it and the narration the views "both" and "pseudo" show.
"""

from __future__ import annotations

import ast
import inspect
import io
import textwrap
import tokenize
from pathlib import Path

from ..backends import numpy as oracle
from . import demo

# each function tblock runs, and for each stop it computes, a statement that finds the stop's
# line in the function's source (searched for, so edits move the highlight)
CODE = (
    (demo.TinyLM.forward, {("embed", None): "x = E + P", ("predict", None): "p = softmax(logits"}),
    (oracle.block_forward_one, {("add", "attention"): "ln1(H_in + attention(",
                                ("add", "ffn"): 'ln2(tr["H_mid"] + ffn('}),
    (oracle.attention, {("attend", None): "attention_core(Q, K, V, cfg)"}),
    (oracle.layernorm, {("norm", "attention"): "np.sqrt(var + eps)", ("norm", "ffn"): "np.sqrt(var + eps)"}),
    (oracle.ffn, {("ffn", None): "F_out = F_post @"}),
)

# verbose names for the terse identifiers (display only; attributes and keyword names keep theirs)
VERBOSE = {
    "E": "embeddings", "P": "position_codes", "x": "stream", "x_in": "stream_in", "p": "probabilities",
    "ids": "token_ids", "t": "token_id", "i": "index", "l": "block", "w": "weights", "tr": "trace",
    "cfg": "config", "H_in": "stream_in", "ln1": "norm1", "ln2": "norm2", "X": "rows",
    "Q": "queries", "K": "keys", "V": "values", "A": "attention_weights", "out_concat": "head_outputs",
    "A_out": "attention_out", "mu": "mean", "var": "variance", "Y": "normalised",
    "F_pre": "hidden_pre", "F_post": "hidden", "F_out": "ffn_out",
}

# per stop: pseudocode and a plain-English narration (the views "both" and "pseudo")
NARRATION = {
    ("embed", None): ("row[i] ← E[token i] + PE(i)",
                      "Each token's row starts as its word's embedding plus the code of its position "
                      "(a zero vector when position is off)."),
    ("attend", None): ("a[h, i, j] ← softmax over j of q[i] · k[j] / √d_head;  out[h, i] ← Σ_j a[h, i, j] v[j]",
                       "Every head compares this token's query with every token's key, turns the scores "
                       "into weights that sum to 1, and mixes the values with them."),
    ("add", "attention"): ("row[i] ← row[i] + W_o · [out[0, i], out[1, i], …]",
                           "The heads' outputs, side by side and mixed by W_o, are added onto the row: "
                           "the sub-layer nudges it instead of replacing it."),
    ("norm", "attention"): ("row[i] ← (row[i] − mean) / √(variance + ε)",
                            "Layer norm recentres the row to mean 0 and rescales it to variance 1, so its "
                            "length returns to √d; ε keeps a constant row finite."),
    ("ffn", None): ("f[i] ← W_2 · relu(W_1 · row[i])",
                    "A small relu network works on this row alone: the only stop where tokens do not "
                    "interact."),
    ("add", "ffn"): ("row[i] ← row[i] + f[i]",
                     "The feed-forward result is added onto the row, the second residual connection."),
    ("norm", "ffn"): ("row[i] ← (row[i] − mean) / √(variance + ε)",
                      "The same layer norm again: the row leaves the block at mean 0, variance 1."),
    ("predict", None): ("p[i] ← softmax(W_out · row[i] / temperature)",
                        "The row is scored against every word and the scores become a distribution; "
                        "temperature below 1 sharpens it, above 1 flattens it."),
}


def relative_file(obj) -> str:
    """The source file as a path from the directory holding the tblock package."""
    root = Path(inspect.getsourcefile(demo)).resolve().parents[2]
    return Path(inspect.getsourcefile(obj)).resolve().relative_to(root).as_posix()


def _tracer_lines(tree) -> set:
    """0-based lines that only record the trace: ``emit = ...``, ``if emit:`` blocks, ``trace.update(...)``."""
    lines = set()
    for node in ast.walk(tree):
        records = (
            (isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "emit")
            or (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "emit"
                                                     for t in node.targets))
            or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "update"
                and isinstance(node.value.func.value, ast.Name) and node.value.func.value.id == "trace"))
        if records:
            lines.update(range(node.lineno - 1, node.end_lineno))
    return lines


def _doc_lines(tree) -> set:
    """0-based lines of docstrings (a function's first statement when it is a string)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines.update(range(first.lineno - 1, first.end_lineno))
    return lines


def _renamed_and_comments(source: str) -> tuple[dict, dict]:
    """Per 0-based line: the (col, old, new) renames of VERBOSE names, and where a comment starts."""
    renames, comments = {}, {}
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    depth = 0
    for k, tok in enumerate(tokens):
        line, col = tok.start[0] - 1, tok.start[1]
        if tok.type == tokenize.OP:
            depth += tok.string in "([{"
            depth -= tok.string in ")]}"
        if tok.type == tokenize.COMMENT:
            comments[line] = col
        if tok.type != tokenize.NAME or tok.string not in VERBOSE:
            continue
        before, after = tokens[k - 1] if k else None, tokens[k + 1] if k + 1 < len(tokens) else None
        attribute = before is not None and before.string == "."
        keyword = depth > 0 and after is not None and after.string == "="
        if not (attribute or keyword):
            renames.setdefault(line, []).append((col, tok.string, VERBOSE[tok.string]))
    return renames, comments


def _verbose(text: str, renames: list, comment):
    """(the line with its renames applied, where its comment now starts)."""
    out, shift = text, 0
    for col, old, new in sorted(renames, reverse=True):
        out = out[:col] + new + out[col + len(old):]
    if comment is not None:
        shift = sum(len(new) - len(old) for col, old, new in renames if col < comment)
    return out, (None if comment is None else comment + shift)


def _annotate(lines: list) -> list:
    """Every line of one function with its comment, doc, tracer and verbose marks (module docstring)."""
    source = "\n".join(lines) + "\n"
    tree = ast.parse(source)
    tracer, doc = _tracer_lines(tree), _doc_lines(tree)
    renames, comments = _renamed_and_comments(source)
    out = []
    for j, text in enumerate(lines):
        comment = comments.get(j)
        only_comment = comment is not None and not text[:comment].strip()
        verbose, verbose_comment = _verbose(text, renames.get(j, []), comment)
        out.append(dict(text=text, comment=None if only_comment else comment, doc=only_comment or j in doc,
                        tracer=j in tracer, verbose=verbose if j in renames else None,
                        verbose_comment=None if only_comment else verbose_comment))
    return out


def code_panel() -> tuple[list, dict]:
    """The panel's sections and, per stop, the (section, line) that computes it; a statement
    found nowhere, or twice, or on a line the options can hide, is an error."""
    sections, lines_of = [], {}
    for number, (fn, statements) in enumerate(CODE):
        source, first = inspect.getsourcelines(fn)
        lines = textwrap.dedent("".join(source)).rstrip("\n").split("\n")
        annotated = _annotate(lines)
        path = relative_file(fn)
        sections.append(dict(title=fn.__qualname__, file=path, name=Path(path).name, start=first,
                             end=first + len(lines) - 1, lines=annotated))
        for stop, statement in statements.items():
            hits = [j for j, line in enumerate(lines) if statement in line]
            if len(hits) != 1:
                raise LookupError(f"the code panel needs exactly one line of {fn.__qualname__} holding "
                                  f"{statement!r} (the {stop[0]} stop), found {len(hits)}")
            if annotated[hits[0]]["doc"] or annotated[hits[0]]["tracer"]:
                raise LookupError(f"the {stop[0]} stop's line in {fn.__qualname__} is a comment or tracer "
                                  "line, which the panel's options can hide")
            lines_of[stop] = (number, hits[0])
    missing = set(NARRATION) - set(lines_of)
    if missing:
        raise LookupError(f"no line of code for the stops {sorted(missing, key=str)}")
    return sections, lines_of
