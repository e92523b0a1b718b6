"""The demo page by keyboard: a focused control keeps its own keys (arrows, Home/End, Space,
Enter), the page's keys act when no control claims them, the row labels and chips take the
focus, and a live region reads the inspector."""

import pytest
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

AT = 27                                                   # norm (attention) of token 3, two heads


def at_stop(page, server_url, reference):
    page.open(server_url)
    page.blur()
    page.press(Keys.HOME, *[Keys.ARROW_RIGHT] * AT)
    assert (page.event, page.stop) == (AT, "norm")
    return page


def test_with_nothing_focused_the_page_keys_act(page, server_url, reference):
    at_stop(page, server_url, reference)
    page.press(Keys.ARROW_LEFT)
    assert page.event == AT - 1
    page.press(Keys.ARROW_RIGHT, Keys.END)
    assert page.event == 53
    page.press(" ")
    assert page.playing()
    page.press(" ")
    assert not page.playing()


def test_the_slider_keeps_its_arrows_home_and_end(page, server_url, reference):
    at_stop(page, server_url, reference)
    page.focus("#temperature")
    page.press(Keys.ARROW_LEFT)                                  # the temperature moves, the demo stays
    page.wait_run("h2-p1-t0.95")
    assert (page.event, page.stop) == (AT, "norm")
    page.press(Keys.ARROW_RIGHT, Keys.ARROW_RIGHT)
    page.wait_run("h2-p1-t1.05")
    page.press(Keys.HOME)
    page.wait_run("h2-p1-t0.05")
    page.press(Keys.END)
    page.wait_run("h2-p1-t2.00")
    assert (page.event, page.stop) == (AT, "norm") and not page.playing()
    page.press("g")                                              # a key the slider does not claim
    assert page.find("#tour").is_displayed()


def test_the_heads_menu_keeps_its_arrows_and_space(page, server_url, reference):
    at_stop(page, server_url, reference)
    page.focus("#heads")
    page.press(Keys.ARROW_UP)                                    # 2 -> 1: one head, the stop kept
    page.wait_run("h1-p1-t1.00")
    assert (page.event, page.stop) == (reference(heads=1).at("norm", "attention", 3), "norm")
    page.press(" ")
    assert not page.playing() and page.stop == "norm"
    page.press(Keys.ESCAPE)


@pytest.mark.parametrize("key", [" "])
def test_the_position_checkbox_keeps_space(page, server_url, reference, key):
    at_stop(page, server_url, reference)
    page.focus("#positional")
    page.press(key)                                              # toggles the box, plays nothing
    page.wait_run("h2-p0-t1.00")
    assert not page.playing() and (page.event, page.stop) == (AT, "norm")
    page.press(Keys.ARROW_RIGHT)                                 # arrows are not a checkbox's
    assert page.event == AT + 1


@pytest.mark.parametrize("key", [" ", Keys.ENTER])
def test_a_chip_keeps_space_and_enter(page, server_url, reference, key):
    at_stop(page, server_url, reference)
    page.focus('#sentence [data-token-index="2"]')
    page.press(key)                                              # taps the chip, plays nothing
    assert page.tapped() == [2] and not page.playing() and page.event == AT
    assert page.inspector() == reference().inspector(AT, 2)
    page.press(key)
    assert page.tapped() == []


@pytest.mark.parametrize("key", [" ", Keys.ENTER])
def test_a_row_label_takes_the_focus_and_its_keys(page, server_url, reference, key):
    at_stop(page, server_url, reference)
    page.focus('.row-head[data-row="5"]')
    page.press(key)
    assert page.tapped() == [5] and not page.playing() and page.event == AT
    assert page.find('.row-head[data-row="5"]').get_attribute("aria-pressed") == "true"
    assert page.inspector() == reference().inspector(AT, 5)


def test_a_focused_button_keeps_space(page, server_url, reference):
    at_stop(page, server_url, reference)
    page.focus("#next")
    page.press(" ")                                              # clicks "step ▶", does not play
    assert page.event == AT + 1 and not page.playing()
    page.press(Keys.ENTER)
    assert page.event == AT + 2 and not page.playing()


def test_the_view_switch_keeps_its_arrows(page, server_url, reference):
    at_stop(page, server_url, reference)
    page.focus('input[name="view"][value="code"]')
    page.press(Keys.ARROW_RIGHT)                                 # the next view, not the next stop
    assert page.find("body").get_attribute("data-code-view") == "both" and page.event == AT
    page.press(Keys.ARROW_RIGHT)
    assert page.find("body").get_attribute("data-code-view") == "pseudo" and page.event == AT


def test_the_options_keep_space(page, server_url, reference):
    at_stop(page, server_url, reference)
    page.focus("#code-options summary")
    page.press(" ")                                              # opens the options, plays nothing
    assert page.find("#code-options").get_attribute("open") is not None and not page.playing()
    page.focus("#opt-comments")
    page.press(" ")
    assert page.find("body").get_attribute("data-code-options") == "comments" and not page.playing()


def test_row_labels_and_chips_are_reached_by_tab(page, server_url):
    page.open(server_url)
    page.blur()
    reached = []
    for _ in range(60):
        page.press(Keys.TAB)
        reached.append(page.d.execute_script(
            "const e = document.activeElement; return e.className + '|' + (e.dataset.row || e.dataset.tokenIndex || '')"))
    for want in ["row-head|0", "row-head|5", "chip|0", "chip|5"]:
        assert any(r.startswith(want.split("|")[0]) and r.endswith("|" + want.split("|")[1]) for r in reached), want
    vocab = page.d.find_elements("css selector", "#vocab .chip")
    assert all(c.get_attribute("tabindex") == "0" for c in vocab)
    assert vocab[6].get_attribute("aria-label") == "ran: p 0.39"


def test_a_live_region_reads_the_inspector(page, server_url, reference):
    page.open(server_url)
    live = page.find("#announce")
    assert live.get_attribute("aria-live") == "polite"
    said = live.get_attribute("textContent")
    assert said == "token 0 the: predicts ran 0.39, residual norm 2.00, attention entropy 2.12 bits, stage predict"
    page.tap(3)
    want = reference().inspector(53, 3)
    assert live.get_attribute("textContent") == (f"token 3 on: predicts {want['predicts']}, residual norm "
                                                 f"{want['norm']}, attention entropy {want['entropy']}, stage predict")
    page.blur()
    page.press(Keys.HOME)
    assert live.get_attribute("textContent").endswith("stage embed")


def test_the_source_keeps_its_arrows_and_a_vocabulary_chip_claims_none(page, server_url, reference):
    at_stop(page, server_url, reference)
    page.focus("#code")                                          # the scrolling source, reached by Tab
    top = page.d.execute_script("return document.getElementById('code').scrollTop")
    assert top > 0                                               # the stop's line is centred
    page.press(Keys.ARROW_UP, Keys.ARROW_UP, Keys.PAGE_UP)
    assert page.event == AT and not page.playing()
    WebDriverWait(page.d, 5).until(                              # the browser scrolls smoothly
        lambda d: d.execute_script("return document.getElementById('code').scrollTop") < top, "no scroll")
    page.focus('#vocab .chip:nth-child(7)')                      # a chip to read: the page's keys act
    page.press(Keys.ARROW_RIGHT)
    assert page.event == AT + 1
    page.press(" ")
    assert page.playing()
    page.press(" ")
