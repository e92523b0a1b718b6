"""The demo page's layout and colours in chromium: from 768 to 1920 px wide nothing of the stage,
the strips or the inspector lies under the code panel (elementFromPoint at each one's centre),
the page never scrolls sideways, row labels stay on one line, and every text node reads at
4.5:1 or more on what lies behind it (WCAG AA), in every state the page can show."""

import pytest
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

from conftest import CONTRAST_JS, OVERLAP_JS

SIZES = [(768, 900), (800, 900), (1024, 768), (1280, 800), (1440, 900), (1920, 1080)]
# every cell of the stage (the predict column's among them), its labels, the strips, the inspector
LEFT = ("#stage .cell, #stage .row-head, #stage .column-head, #sentence .chip, #vocab .chip, "
        "#inspector dt, #inspector dd, #invariants li")
COUNT = 6 * 8 + 6 + 8 + 6 + 8 + 4 + 4 + 3


def resize(page, width, height):
    from selenium.webdriver.support.ui import WebDriverWait
    page.d.set_window_size(width, height)
    WebDriverWait(page.d, 10).until(lambda d: d.execute_script("return window.innerWidth") == width,
                                    f"the window never became {width} px wide")


@pytest.mark.parametrize("width, height", SIZES)
@pytest.mark.parametrize("code_view", ["code", "both", "pseudo", "hidden"])
def test_nothing_lies_under_the_code_panel(page, server_url, width, height, code_view):
    resize(page, width, height)
    page.open(server_url)
    if code_view == "hidden":
        page.find("#code-hide").click()
    else:
        page.find(f'input[name="view"][value="{code_view}"]').click()
    for state in ("end", "start", "constant row"):
        if state == "constant row":                              # its two ε marks widen two columns
            page.find("#constant-row").click()
            page.wait_run("h2-p0-t1.00-edge")
            page.blur()
            page.press(Keys.END)
        found = page.d.execute_script(OVERLAP_JS, LEFT)
        assert found["seen"] == COUNT and found["covered"] == [], (state, found)
        predict = page.d.execute_script(OVERLAP_JS, '#stage .cell[data-column="7"]')
        assert predict["seen"] == 6 and predict["covered"] == [], (state, predict)
        assert found["scroll"][0] <= found["scroll"][1], ("sideways scroll", found["scroll"])
        heights = page.d.execute_script(
            "return [...document.querySelectorAll('.row-head')].map((e) => e.getClientRects().length)")
        assert heights == [1] * 6                                # no row label wraps
        page.blur()
        page.press(Keys.HOME)


def test_the_code_panel_sits_beside_the_stage_when_there_is_room(page, server_url):
    """1440 px: the code to the right of the stage; 1024 px: under it; neither overlaps."""
    rect = lambda css: page.d.execute_script(
        "const r = document.querySelector(arguments[0]).getBoundingClientRect(); "
        "return [r.left, r.top, r.right, r.bottom]", css)
    page.open(server_url)
    stage, code = rect("#stage"), rect("#code-panel")
    assert code[0] >= stage[2] and code[1] < stage[3]
    resize(page, 1024, 768)
    page.open(server_url)
    stage, panels, code = rect("#stage"), rect(".panels"), rect("#code-panel")
    assert code[1] >= panels[3] >= stage[3]


def contrast(page, state):
    checked, failures = page.d.execute_script(CONTRAST_JS)
    assert checked > 50 and failures == [], (state, failures)


def test_every_text_reads_at_four_and_a_half_to_one(page, server_url, reference):
    """The opening, each token tapped, the sharpest and flattest guesses, the ε edge, the tour,
    every code view with every option, the rail, and a narrow screen."""
    page.open(server_url)
    contrast(page, "opening")
    for j in range(6):
        page.tap(j)
        contrast(page, f"token {j} tapped")
    for text, key in (("0.05", "h2-p1-t0.05"), ("2.00", "h2-p1-t2.00")):
        page.d.execute_script(
            "const s = document.getElementById('temperature');"
            "s.value = window.TBLOCK_DEMO.controls.temperatures.findIndex(t => t.text === arguments[0]);"
            "s.dispatchEvent(new Event('change'));", text)
        page.wait_run(key)
        for j in range(6):
            page.tap(j)
            contrast(page, f"temperature {text}, token {j}")
    Select(page.find("#heads")).select_by_value("1")
    page.find("#constant-row").click()
    page.wait_run("h1-p0-t1.00-edge")
    contrast(page, "constant row")
    page.blur()
    page.press("g", "g", "g", "g")
    contrast(page, "tour")
    page.find("#code-options summary").click()
    for name in ("comments", "tracer", "verbose"):
        page.find(f"#opt-{name}").click()
    for view in ("code", "both", "pseudo"):
        page.find(f'input[name="view"][value="{view}"]').click()
        contrast(page, f"view {view}")
    page.find("#code-hide").click()
    contrast(page, "rail")
    resize(page, 800, 900)
    page.open(server_url)
    contrast(page, "800 px")
    page.blur()
    page.press(Keys.HOME)
    contrast(page, "800 px, first stop")
