"""tblock demo in headless chromium: keys, inspector, toggles, code panel, export, screenshot.
Every test also ends with an empty error console (conftest.no_console_errors)."""

import struct
import time

import pytest
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

pytestmark = pytest.mark.browser

# the statement each stop runs, as it reads in tblock's source (the code panel's current line)
STATEMENT = {"embed": "E + P", "attend": "attention_core(", "add (attention)": "+ attention(",
             "add (ffn)": "+ ffn(", "norm (attention)": "np.sqrt(var + eps)",
             "norm (ffn)": "np.sqrt(var + eps)", "ffn": "F_post @", "predict": "softmax(logits"}


def test_keys_step_through_every_event_in_order(page, server_url, reference):
    """→ visits the tracer's events one by one; at each, the inspector (of the token being
    computed) and the code panel's line are tblock's."""
    ref = reference()
    page.open(server_url)
    page.press(Keys.HOME)
    assert (page.event, page.stop) == (0, "embed")
    for k in range(len(ref.events)):
        if k:
            page.press(Keys.ARROW_RIGHT)
        assert (page.event, page.stop) == (k, ref.kinds[k])
        assert page.inspector() == ref.inspector(k, ref.events[k][1]["index"]), k
        assert STATEMENT[ref.stage(k)] in page.code_line(), (k, page.code_line())
    assert page.event == len(ref.events) - 1 == 53
    page.press(Keys.ARROW_RIGHT)                                 # the last event stays the last
    assert page.event == 53
    page.press(Keys.ARROW_LEFT, Keys.ARROW_LEFT, Keys.ARROW_LEFT)
    assert (page.event, page.stop) == (50, ref.kinds[50])
    page.press(Keys.HOME)
    assert page.event == 0
    page.press(Keys.END)
    assert (page.event, page.stop) == (53, "predict")


def test_a_tapped_token_is_inspected_at_every_stop(page, server_url, reference):
    ref = reference()
    page.open(server_url)
    page.tap(4)
    assert page.tapped() == [4]
    for k in range(0, 54, 5):
        page.press(Keys.HOME, *[Keys.ARROW_RIGHT] * k)
        assert page.inspector() == ref.inspector(k, 4), k
    page.press(Keys.END)
    for j in range(6):
        page.tap(j)
        assert page.inspector() == ref.inspector(53, j)
        r = ref.result
        weights = [c.text.split("\n")[-1] for c in page.d.find_elements("css selector", "#sentence .chip")]
        assert weights == [f"{w:.2f}" for w in r.attention[:, j].mean(axis=0)]       # the sentence strip
        guess = [c.text.split("\n")[-1] for c in page.d.find_elements("css selector", "#vocab .chip")]
        assert guess == [f"{q:.2f}" for q in r.probabilities[j]]                      # the vocabulary strip


def test_play_pause_reset_tour_and_fullscreen(page, server_url, reference):
    ref = reference()
    page.open(server_url)
    page.press(" ")                                              # play
    deadline = time.monotonic() + 15
    while page.event < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    page.press(" ")                                              # pause
    held = page.event
    assert held >= 3
    time.sleep(1.5)
    assert page.event == held
    page.tap(2)
    page.press("r")                                              # reset: the start, nothing tapped
    assert page.event == 0 and page.tapped() == []
    page.press("g")                                              # the guided tour, step by step
    tour = page.find("#tour")
    assert tour.is_displayed() and tour.get_attribute("data-step") == "0" and page.stop == "embed"
    for step, stop in enumerate(["attend", "add", "norm", "ffn", "predict"], start=1):
        page.press("g")
        assert (tour.get_attribute("data-step"), page.stop) == (str(step), stop)
    assert page.event == 53 and "predicts " + ref.result.top[0] in page.find("#tour-text").text
    page.press("g", "g")                                         # past the last step: closed
    assert not tour.is_displayed()
    page.press("f")                                              # fullscreen on and off (or a refusal on the page)
    page.press("f")
    assert page.event == 53


def test_toggles_rerun_the_model_through_the_server(page, server_url, reference):
    page.open(server_url)
    Select(page.find("#heads")).select_by_value("1")
    page.wait_run("h1-p1-t1.00")
    one = reference(heads=1)
    page.press(Keys.END)
    assert (page.event, page.stop) == (47, "predict") and len(one.events) == 48
    for j in range(6):
        page.tap(j)
        assert page.inspector() == one.inspector(47, j)
    page.find("#positional").click()
    page.wait_run("h1-p0-t1.00")
    off = reference(heads=1, positional=False)
    page.tap(0)
    first = page.inspector()
    page.tap(4)
    assert page.inspector() == first == off.inspector(47, 4)     # identical tokens, identical rows
    assert "'the' at [0, 4]: max |Δ| = 0.0e+00, identical rows" in page.find('[data-invariant="identical"]').text
    set_temperature(page, "0.50")
    page.wait_run("h1-p0-t0.50")
    cold = reference(heads=1, positional=False, temperature=0.5)
    assert page.inspector() == cold.inspector(47, 4)
    assert page.find("#temperature-text").text == "0.50"
    assert float(page.field("predicts").split()[1]) > float(first["predicts"].split()[1])   # sharper


def set_temperature(page, text):
    """Move the slider to the grid value ``text`` as a user's drag ends: input, then change."""
    page.d.execute_script(
        "const s = document.getElementById('temperature');"
        "s.value = window.TBLOCK_DEMO.controls.temperatures.findIndex(t => t.text === arguments[0]);"
        "s.dispatchEvent(new Event('input')); s.dispatchEvent(new Event('change'));", text)


def test_invariants_are_on_the_page(page, server_url):
    page.open(server_url)
    page.press(Keys.END)
    for j in range(6):
        page.tap(j)
        total = float(page.find('[data-invariant="sum"]').text.rsplit("= ", 1)[1])
        assert abs(total - 1) < 1e-11
        norm = float(page.find('[data-invariant="unit"]').text.split("= ")[1].split(",")[0])
        assert abs(norm - 2) < 1e-4                              # sqrt(d) after the norm
    assert "different rows" in page.find('[data-invariant="identical"]').text


def test_the_export_works_from_file_urls(page, tmp_path, reference):
    from tblock.lesson.demo_server import export
    index = export(tmp_path / "site")
    page.open(index.resolve().as_uri())
    assert page.find("body").get_attribute("data-mode") == "static"
    ref = reference()
    page.press(Keys.END)
    page.tap(1)
    assert page.inspector() == ref.inspector(53, 1)
    Select(page.find("#heads")).select_by_value("1")
    set_temperature(page, "0.30")
    page.wait_run("h1-p1-t0.30")
    page.press(Keys.END)
    assert page.inspector() == reference(heads=1, temperature=0.3).inspector(47, 1)


def test_screenshot_at_the_predict_stop(page, server_url, screenshot_path, reference):
    """docs/demo.png (make test-browser): the last stop, token 0 tapped, every row written."""
    page.open(server_url)
    page.press(Keys.END)
    page.tap(0)
    assert page.inspector() == reference().inspector(53, 0)
    written = page.d.find_elements("css selector", "#stage .cell.written")
    assert len(written) == 6 * 8
    screenshot_path.parent.mkdir(parents=True, exist_ok=True)
    assert page.d.save_screenshot(str(screenshot_path))
    head = screenshot_path.read_bytes()[:24]
    width, height = struct.unpack(">II", head[16:24])
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and width >= 1200 and height >= 700
