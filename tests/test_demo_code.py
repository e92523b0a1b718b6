"""The demo page's code panel (tblock.lesson.demo_code): the lines are tblock's own source, and
each option changes only what is displayed: comments off drops comments and docstrings and
nothing else, tracer off drops only the trace's recording, verbose names rename only names.
Each claim is checked on the parsed source (ast), not on the marks the panel computed."""

import ast
import itertools
from pathlib import Path

import numpy as np
import pytest

from tblock.lesson import demo, demo_code

SECTIONS, LINE_OF = demo_code.code_panel()
STATEMENT = {"embed": "E + P", "attend": "attention_core(", "add": "+ attention(", "norm": "np.sqrt(var + eps)",
             "ffn": "F_post @", "predict": "softmax(logits"}


def shown(section, comments=True, tracer=True, verbose=False):
    """The section as the page shows it with these options (the same rule as code.js)."""
    out = []
    for line in section["lines"]:
        if (not comments and line["doc"]) or (not tracer and line["tracer"]):
            continue
        long = verbose and line["verbose"] is not None
        text, cut = (line["verbose"], line["verbose_comment"]) if long else (line["text"], line["comment"])
        out.append(text[:cut].rstrip() if not comments and cut is not None else text)
    return "\n".join(out) + "\n"


def without_docstrings(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str):
            node.body = node.body[1:] or [ast.Pass()]
    return tree


def test_each_stop_is_the_line_computing_it():
    for (kind, stage), (s, j) in LINE_OF.items():
        want = "+ ffn(" if (kind, stage) == ("add", "ffn") else STATEMENT[kind]
        assert want in SECTIONS[s]["lines"][j]["text"], (kind, stage)
        assert not SECTIONS[s]["lines"][j]["doc"] and not SECTIONS[s]["lines"][j]["tracer"]


def test_the_panel_is_the_source_file_itself():
    root = Path(demo_code.__file__).resolve().parents[2]
    for section in SECTIONS:
        assert section["name"] == Path(section["file"]).name
        text = (root / section["file"]).read_text().split("\n")
        first = section["start"] - 1
        assert section["end"] == first + len(section["lines"])
        for j, line in enumerate(section["lines"]):
            assert text[first + j].strip() == line["text"].strip()


@pytest.mark.parametrize("number", range(len(SECTIONS)))
def test_comments_off_changes_no_code(number):
    section = SECTIONS[number]
    full, bare = shown(section), shown(section, comments=False)
    assert "#" not in bare.replace('"#', "").replace("'#", "")                    # no comment is left
    assert ast.dump(without_docstrings(ast.parse(full))) == ast.dump(ast.parse(bare))


def test_tracer_off_drops_only_the_recording():
    for section in SECTIONS:
        full, plain = shown(section), shown(section, comments=False, tracer=False)
        assert "emit" not in plain and "trace.update" not in plain
        assert any(line["tracer"] for line in section["lines"]) == (full != shown(section, tracer=False))


def arguments():
    """Each shown function's arguments, and how to read its result, in CODE's order."""
    model = demo.TinyLM(["the", "cat", "sat", "on", "mat", "dog", "ran", "away"], seed=3, backend="numpy")
    w = {name: a.astype(np.float64) for name, a in model.block_weights[0].arrays().items()}
    H = np.random.default_rng(0).standard_normal((6, 4))
    return [((model, ["the", "cat", "sat", "on", "the", "mat"]), lambda r: r.probabilities),
            ((H, w, model.cfg), lambda r: r[0]), ((H, w, model.cfg, {}), lambda r: r),
            ((H,), lambda r: r), ((H, w, model.cfg, {}), lambda r: r)]


@pytest.mark.parametrize("comments, tracer, verbose", list(itertools.product((False, True), repeat=3)))
def test_every_option_shows_code_that_computes_the_same(comments, tracer, verbose):
    """Run what the panel shows, under each combination of its options, as the function itself."""
    for section, (fn, _), (args, result) in zip(SECTIONS, demo_code.CODE, arguments()):
        defined = {}                                        # the def lands here, not over a global
        exec(compile(shown(section, comments, tracer, verbose), section["file"], "exec"), dict(fn.__globals__),
             defined)
        np.testing.assert_array_equal(result(defined[fn.__name__](*args)), result(fn(*args)))


class Renamer(ast.NodeTransformer):
    """VERBOSE applied to variable and argument names on the parsed tree."""

    def visit_Name(self, node):
        node.id = demo_code.VERBOSE.get(node.id, node.id)
        return node

    def visit_arg(self, node):
        node.arg = demo_code.VERBOSE.get(node.arg, node.arg)
        return node


@pytest.mark.parametrize("number", range(len(SECTIONS)))
def test_verbose_names_rename_names_only(number):
    section = SECTIONS[number]
    renamed = Renamer().visit(ast.parse(shown(section)))
    assert ast.dump(renamed) == ast.dump(ast.parse(shown(section, verbose=True)))
    assert ast.dump(Renamer().visit(ast.parse(shown(section, comments=False)))) == \
        ast.dump(ast.parse(shown(section, comments=False, verbose=True)))


def test_verbose_names_change_the_display_of_every_section():
    for section in SECTIONS:
        assert shown(section, verbose=True) != shown(section)


def test_a_statement_the_source_lacks_is_an_error(monkeypatch):
    code = list(demo_code.CODE)
    code[2] = (code[2][0], {("attend", None): "no such statement"})
    monkeypatch.setattr(demo_code, "CODE", tuple(code))
    with pytest.raises(LookupError, match=r"exactly one line of attention holding 'no such statement'"):
        demo_code.code_panel()


def test_a_stop_on_a_line_the_options_hide_is_an_error(monkeypatch):
    code = list(demo_code.CODE)
    code[2] = (code[2][0], {("attend", None): "trace.update("})
    monkeypatch.setattr(demo_code, "CODE", tuple(code))
    with pytest.raises(LookupError, match="the attend stop's line in attention is a comment or tracer line"):
        demo_code.code_panel()


def test_every_stop_has_its_narration():
    assert set(demo_code.NARRATION) == set(LINE_OF)
    for pseudo, words in demo_code.NARRATION.values():
        assert pseudo and len(words.split()) >= 8
