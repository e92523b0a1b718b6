"""The demo page's code panel in chromium: the bar naming the file, the options (comments, tracer
instrumentation, verbose names), the views (code, both, pseudo), hide and the rail, and the
values the current stop writes beside its line. What it shows is read back from the page and
compared with tblock's source files and the model's trace, not with what the page was sent."""

from pathlib import Path

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys

ROOT = Path(__file__).resolve().parents[2]
FILES = {"embed": "tblock/lesson/demo.py", "attend": "tblock/backends/numpy.py", "predict": "tblock/lesson/demo.py"}


def lines(page):
    """(file, line number, text) of every line the panel shows."""
    return page.d.execute_script("""
        const out = []; let file = null;
        for (const e of document.querySelectorAll('#code .section, #code .line')) {
          if (e.classList.contains('section')) { file = e.textContent.slice(2).split(' · ')[0]; continue; }
          out.push([file, Number(e.querySelector('.number').textContent), e.querySelector('.text').textContent]);
        }
        return out;""")


def option(page, name, on):
    if page.find(f"#opt-{name}").is_selected() != on:
        if page.find("#code-options").get_attribute("open") is None:
            page.find("#code-options summary").click()
        page.find(f"#opt-{name}").click()


def view(page, name):
    page.find(f'input[name="view"][value="{name}"]').click()


def source(file):
    return (ROOT / file).read_text().split("\n")


def test_the_bar_names_the_file_with_its_path_on_hover(page, server_url, reference):
    page.open(server_url)
    page.blur()
    ref = reference()
    for kind in ("embed", "attend", "predict"):
        page.press(Keys.HOME, *[Keys.ARROW_RIGHT] * ref.kinds.index(kind))
        bar = page.find("#code-file")
        assert bar.text == Path(FILES[kind]).name
        ActionChains(page.d).move_to_element(bar).perform()      # the browser's tooltip is the title
        assert bar.get_attribute("title").startswith(FILES[kind] + ", lines ")
        page.blur()


def test_every_line_shown_is_tblocks_own_source(page, server_url):
    """With every option on, the panel is the functions' files line for line; with them off
    (the default), a subset of those lines, comments cut."""
    page.open(server_url)
    bare = lines(page)
    option(page, "comments", True)
    option(page, "tracer", True)
    full = lines(page)
    for file, number, text in full:
        assert source(file)[number - 1].strip() == text.strip(), (file, number)
    assert len(bare) < len(full)
    for file, number, text in bare:
        original = source(file)[number - 1]
        assert original.strip().startswith(text.strip()) and not text.lstrip().startswith(("#", '"""')), (number, text)


def test_comments_and_the_tracer_instrumentation_switch(page, server_url):
    page.open(server_url)
    code = lambda: page.find("#code").get_attribute("textContent")
    assert '"""' not in code() and "# (T, vocab)" not in code() and "emit(" not in code()
    option(page, "comments", True)
    assert '"""Run the tokens through the model' in code() and "# (T, vocab)" in code() and "emit(" not in code()
    option(page, "tracer", True)
    assert 'emit("embed"' in code() and "trace.update(" in code()
    option(page, "comments", False)
    assert 'emit("predict"' in code() and '"""' not in code()
    assert page.find("body").get_attribute("data-code-options") == "tracer"


def test_verbose_names_change_the_display_only(page, server_url, reference):
    page.open(server_url)
    page.blur()
    page.press(Keys.HOME)
    assert "x = E + P" in page.code_line()
    option(page, "verbose", True)
    assert "stream = embeddings + position_codes" in page.code_line()
    assert "x[0] = " not in page.code_line() and "stream[0] = " in page.code_line()   # the written values too
    option(page, "verbose", False)
    assert "x = E + P" in page.code_line()


def test_the_written_values_sit_beside_the_current_line(page, server_url, reference):
    """The stop's line carries what it writes, from the model's own payload."""
    ref = reference()
    page.open(server_url)
    page.blur()
    vec = lambda v: "[" + ", ".join(f"{x:.2f}" for x in v) + "]"
    kind, p = ref.events[53]
    assert page.find("#code .line.current .writes").text == f"top = {p['top']} · p[5, top] = {p['probability']:.2f}"
    k = ref.at("norm", "attention", 2)
    page.press(Keys.HOME, *[Keys.ARROW_RIGHT] * k)
    p = ref.events[k][1]
    assert page.find("#code .line.current .writes").text == \
        f"mu[2] = {p['mean']:.2f} · var[2] = {p['variance']:.2f} · Y[2] = {vec(p['after'])}"
    assert len(page.d.find_elements("css selector", "#code-panel .writes")) == 1


@pytest.mark.parametrize("name", ["code", "both", "pseudo"])
def test_each_view(page, server_url, reference, name):
    ref = reference()
    page.open(server_url)
    view(page, name)
    page.blur()
    narrations = page.d.find_elements("css selector", "#code .narration")
    steps = page.d.find_elements("css selector", "#pseudo .step")
    assert page.find("#code").is_displayed() == (name != "pseudo")
    assert page.find("#pseudo").is_displayed() == (name == "pseudo")
    if name == "code":
        assert narrations == []
    if name == "both":                                           # narration before each stop's line
        assert len(narrations) == 7                              # the norm line serves both norm stops
        before = page.d.execute_script("return document.querySelector('#code .line.current').previousElementSibling")
        assert "predict" in before.text and "scored against every word" in before.text
    if name == "pseudo":
        assert [s.find_element("css selector", ".pseudo-stop").text for s in steps] == [
            "embed", "attend", "add (attention)", "norm (attention)", "ffn", "add (ffn)", "norm (ffn)", "predict"]
    for k in (0, ref.at("attend", None, 1, 1), ref.at("ffn", None, 4), 53):   # the current stop follows
        page.press(Keys.HOME, *[Keys.ARROW_RIGHT] * k)
        if name == "pseudo":
            current = page.find("#pseudo .step.current")
            assert current.find_element("css selector", ".pseudo-stop").text == ref.stage(k)
            assert current.find_element("css selector", ".writes").is_displayed()
        else:
            assert page.find("#code .line.current .writes").is_displayed()


def test_hide_code_leaves_a_rail_that_brings_it_back(page, server_url):
    page.open(server_url)
    page.find("#code-hide").click()
    assert not page.find("#code-panel").is_displayed() and page.find("#code-rail").is_displayed()
    assert page.d.execute_script("return document.activeElement.id") == "code-rail"
    page.press(Keys.ENTER)                                       # the rail is a button: Enter works
    assert page.find("#code-panel").is_displayed() and not page.find("#code-rail").is_displayed()
    assert page.find("#code .line.current")
