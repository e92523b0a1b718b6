"""tblock demo in headless chromium: the opening state, keys, inspector, toggles, tour, the ε
edge, export, screenshots. Every test also ends with an empty error console
(conftest.no_console_errors). The code panel, the keyboard and the layout have files of their own."""

import struct
import time

import pytest
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

# the statement each stop runs, as it reads in tblock's source (the code panel's current line)
STATEMENT = {"embed": "E + P", "attend": "attention_core(", "add (attention)": "+ attention(",
             "add (ffn)": "+ ffn(", "norm (attention)": "np.sqrt(var + eps)",
             "norm (ffn)": "np.sqrt(var + eps)", "ffn": "F_post @", "predict": "softmax(logits"}


def test_the_page_opens_on_the_seeds_state(page, server_url, reference):
    """The seed's page: "predicts: ran 0.39, residual norm: 2.00, attention entropy: 2.12 bits,
    stage: predict", the finished run with token 0 inspected."""
    page.open(server_url)
    assert page.inspector() == {"predicts": "ran 0.39", "norm": "2.00", "entropy": "2.12 bits", "stage": "predict"}
    assert page.inspector() == reference().inspector(53, 0)
    assert page.event == 53 and page.tapped() == [0]


def test_keys_step_through_every_event_in_order(page, server_url, reference):
    """→ visits the tracer's events one by one; at each, the inspector (of the token being
    computed) and the code panel's line are tblock's."""
    ref = reference()
    page.open(server_url)
    page.press("r")                                              # the start, nothing tapped
    assert (page.event, page.stop, page.tapped()) == (0, "embed", [])
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
    page.tap(0)                                                  # untap the opening's token 0
    page.tap(4)
    page.blur()
    assert page.tapped() == [4]
    for k in range(0, 54, 5):
        page.press(Keys.HOME, *[Keys.ARROW_RIGHT] * k)
        assert page.inspector() == ref.inspector(k, 4), k
    page.press(Keys.END)
    r = ref.result
    for j in range(6):
        page.tap(j)
        assert page.inspector() == ref.inspector(53, j)
        weights = [c.text.split("\n")[-1] for c in page.d.find_elements("css selector", "#sentence .chip")]
        assert weights == [f"{w:.2f}" for w in r.attention[:, j].mean(axis=0)]       # the sentence strip
        guess = [c.text.split("\n")[-1] for c in page.d.find_elements("css selector", "#vocab .chip")]
        assert guess == [f"{q:.2f}" for q in r.probabilities[j]]                      # the vocabulary strip


def test_the_figures_say_what_they_are(page, server_url):
    page.open(server_url)
    assert "mean of the heads' row entropies" in page.find("#inspector").text
    assert "the heads' mean weight" in page.find("#sentence-label").text
    assert "p of each word" in page.find("#vocab-label").text
    page.press("g", "g", "g", "g", "g", "g")                     # the tour's last stop: the average over rows
    assert "average 2.11 bits of entropy (every head and token" in page.find("#tour-text").text


def test_play_pause_reset_tour_and_fullscreen(page, server_url, reference):
    ref = reference()
    page.open(server_url)
    page.press(" ")                                              # play: from the start, as the run is done
    deadline = time.monotonic() + 15
    while page.event < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    page.press(" ")                                              # pause
    held = page.event
    assert 3 <= held < 53 and not page.playing()
    time.sleep(1.5)
    assert page.event == held
    page.tap(2)
    page.blur()
    page.press("r")                                              # reset: the start, nothing tapped
    assert page.event == 0 and page.tapped() == []
    page.press("g")                                              # the guided tour, step by step
    tour = page.find("#tour")
    assert tour.is_displayed() and tour.get_attribute("data-step") == "0" and page.stop == "embed"
    for step, stop in enumerate(["attend", "add", "norm", "ffn", "predict"], start=1):
        page.press("g")
        assert (tour.get_attribute("data-step"), page.stop) == (str(step), stop)
    assert page.event == 53 and "predicts " + ref.result.top[0] in page.find("#tour-text").text
    assert page.tapped() == [0]
    page.press("g", "g")                                         # past the last step: closed
    assert not tour.is_displayed() and page.tapped() == []       # and nothing left tapped
    page.press("g", "g")
    page.find("#tour-close").click()                             # closed by its button: the same
    assert not tour.is_displayed() and page.tapped() == []
    page.blur()
    page.press("f")                                              # fullscreen on and off (or a refusal on the page)
    page.press("f")
    assert page.event == 6


def test_the_tours_text_follows_every_change(page, server_url, reference):
    page.open(server_url)
    page.press("g", "g", "g", "g", "g", "g")                     # step 6: the finished run
    text = page.find("#tour-text").text
    assert "predicts ran at 39 percent" in text
    set_temperature(page, "0.50")
    page.wait_run("h2-p1-t0.50")
    cold = reference(temperature=0.5).result
    assert f"predicts ran at {100 * cold.probabilities[0].max():.0f} percent" in page.find("#tour-text").text
    Select(page.find("#heads")).select_by_value("1")
    page.wait_run("h1-p1-t0.50")
    one = reference(heads=1, temperature=0.5).result
    text = page.find("#tour-text").text
    assert text.startswith("6/7 · ") and f"predicts {one.top[0]} at {100 * one.probabilities[0].max():.0f}" in text
    assert page.stop == "predict"


def set_temperature(page, text):
    """Move the slider to the grid value ``text`` as a user's drag ends: input, then change."""
    page.d.execute_script(
        "const s = document.getElementById('temperature');"
        "s.value = window.TBLOCK_DEMO.controls.temperatures.findIndex(t => t.text === arguments[0]);"
        "s.dispatchEvent(new Event('input')); s.dispatchEvent(new Event('change'));", text)


def test_toggles_rerun_the_model_through_the_server(page, server_url, reference):
    page.open(server_url)
    Select(page.find("#heads")).select_by_value("1")
    page.wait_run("h1-p1-t1.00")
    one = reference(heads=1)
    assert (page.event, page.stop) == (47, "predict") and len(one.events) == 48     # the stop kept
    page.tap(0)
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
    assert "'the' at [0, 4], after predict: max |Δ| = 0.0e+00, identical guesses" in page.identical()
    set_temperature(page, "0.50")
    page.wait_run("h1-p0-t0.50")
    cold = reference(heads=1, positional=False, temperature=0.5)
    assert page.inspector() == cold.inspector(47, 4)
    assert page.find("#temperature-text").text == "0.50"
    assert float(page.field("predicts").split()[1]) > float(first["predicts"].split()[1])   # sharper


@pytest.mark.parametrize("kind, stage, token, head", [("norm", "attention", 3, None), ("attend", None, 2, 1),
                                                      ("ffn", None, 5, None), ("embed", None, 1, None)])
def test_the_stop_is_kept_across_every_toggle(page, server_url, reference, kind, stage, token, head):
    """heads, position, temperature and the constant row re-run the model; the view stays on the
    same stop and token (an attend of head 1 becomes head 0's when one head is left)."""
    page.open(server_url)
    page.blur()
    page.press(Keys.HOME, *[Keys.ARROW_RIGHT] * reference().at(kind, stage, token, head))
    caption = f"token {token} '"
    changes = [("heads", "1", "h1-p1-t1.00"), ("position", None, "h1-p0-t1.00"), ("temperature", "0.30", "h1-p0-t0.30"),
               ("heads", "2", "h2-p0-t0.30"), ("edge", None, "h2-p0-t1.00-edge"), ("edge", None, "h2-p0-t1.00")]
    for control, value, key in changes:
        if control == "heads":
            Select(page.find("#heads")).select_by_value(value)
        elif control == "position":
            page.find("#positional").click()
        elif control == "temperature":
            set_temperature(page, value)
        else:
            page.find("#constant-row").click()
        page.wait_run(key)
        heads = int(key[1])
        ref = reference(heads=heads, positional=False) if "p0" in key else reference(heads=heads)
        head = None if head is None else min(head, heads - 1)          # one head left: head 0's attend
        want = ref.at(kind, stage, token, head)
        assert (page.event, page.stop) == (want, kind), (control, key)
        assert caption in page.find("#now").text


def test_the_identical_tokens_line_is_true_at_every_stop(page, server_url, reference):
    """With the position code off the two 'the' rows never differ: the line compares them at a
    stop both have passed, so it never says different; with it on it never says identical."""
    page.open(server_url)
    page.find("#positional").click()
    page.wait_run("h2-p0-t1.00")
    page.blur()
    page.press(Keys.HOME)
    for k in range(54):
        line = page.identical().split(": ", 1)[1]
        assert "different" not in line, (k, line)
        assert ("identical rows" in line or "identical guesses" in line) == (k >= 4), (k, line)   # 'the' 4 at event 4
        page.press(Keys.ARROW_RIGHT)
    page.find("#positional").click()
    page.wait_run("h2-p1-t1.00")
    page.blur()
    page.press(Keys.HOME, *[Keys.ARROW_RIGHT] * 4)
    for k in range(4, 54):
        assert "identical" not in page.identical().split(": ", 1)[1], k
        page.press(Keys.ARROW_RIGHT)


def test_the_constant_row_shows_the_epsilon_edge(page, server_url, reference):
    page.open(server_url)
    page.find("#constant-row").click()
    page.wait_run("h2-p0-t1.00-edge")
    assert not page.find("#positional").is_selected() and not page.find("#positional").is_enabled()
    assert not page.find("#temperature").is_enabled() and page.find("#temperature-text").text == "1.00"
    page.tap(0)
    page.tap(1)
    page.blur()
    page.press(Keys.HOME, *[Keys.ARROW_RIGHT] * reference().at("norm", "attention", 1))
    assert page.stop == "norm" and "variance 0; ε keeps" in page.find("#now").text
    assert page.field("norm") == "0.00"
    assert "a constant row (variance 0), which ε keeps finite" in page.find('[data-invariant="unit"]').text
    marked = lambda: [(c.get_attribute("data-row"), c.get_attribute("data-column"))
                      for c in page.d.find_elements("css selector", "#stage .cell.epsilon")]
    assert marked() == [("1", "3")]                              # the stage marks the constant row's norm
    page.press(Keys.END)
    assert marked() == [("1", "3"), ("1", "6")]
    guess = [c.text.split("\n")[-1] for c in page.d.find_elements("css selector", "#vocab .chip")]
    assert guess == ["0.12"] * 8                                                  # uniform, 1/8
    page.find("#constant-row").click()
    page.wait_run("h2-p0-t1.00")
    assert page.find("#positional").is_enabled() and page.find("#temperature").is_enabled()


def test_the_export_works_from_file_urls(page, tmp_path, reference):
    from tblock.lesson.demo_server import export
    index = export(tmp_path / "site")
    page.open(index.resolve().as_uri())
    assert page.find("body").get_attribute("data-mode") == "static"
    ref = reference()
    page.tap(1)
    assert page.inspector() == ref.inspector(53, 1)
    Select(page.find("#heads")).select_by_value("1")
    set_temperature(page, "0.30")
    page.wait_run("h1-p1-t0.30")
    assert page.inspector() == reference(heads=1, temperature=0.3).inspector(47, 1)
    page.find("#constant-row").click()                           # the ε edge's runs travel in runs.js
    page.wait_run("h1-p0-t1.00-edge")


def save(page, path, width, height):
    path.parent.mkdir(parents=True, exist_ok=True)
    assert page.d.save_screenshot(str(path))
    head = path.read_bytes()[:24]
    size = struct.unpack(">II", head[16:24])
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and size[0] >= width * 0.95 and size[1] >= height * 0.9, size


def test_screenshots_at_the_predict_stop(page, server_url, screenshot_path, reference):
    """docs/demo.png (make test-browser): the opening state at 1440 x 900 with the code panel in
    its "both" view; docs/demo-narrow.png: the page at 800 px wide, whole, the panel under the stage."""
    page.open(server_url)
    assert page.inspector() == reference().inspector(53, 0)
    assert len(page.d.find_elements("css selector", "#stage .cell.written")) == 6 * 8
    page.find('input[name="view"][value="both"]').click()
    page.blur()
    save(page, screenshot_path, 1200, 700)
    height = 900
    for _ in range(4):                                           # the panel's height follows the window's
        page.d.set_window_size(800, height)
        height = min(page.d.execute_script("return document.documentElement.scrollHeight"
                                           " + window.outerHeight - window.innerHeight"), 2400)
    save(page, screenshot_path.with_name(screenshot_path.stem + "-narrow.png"), 800, 900)
