"""The demo page in Debian's chromium through selenium (make test-browser; plain pytest ignores
this folder). Nothing here downloads a browser: the chromium binary and its driver are named
explicitly, so Selenium Manager is never asked for one.

Expected values come from the demo model run directly in the test (tblock.lesson.demo.TinyLM and
its tracer), never from what the page was sent.
"""

import math
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1440,900")
VOCAB = ["the", "cat", "sat", "on", "mat", "dog", "ran", "away"]
SENTENCE = ["the", "cat", "sat", "on", "the", "mat"]
WAIT_S = 30


@pytest.fixture(scope="session")
def driver():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    if missing:
        pytest.fail(f"{missing} missing: `make test-browser` installs chromium and chromium-driver with apt-get")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    with tempfile.TemporaryDirectory() as profile:
        for flag in FLAGS + (f"--user-data-dir={profile}",):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        try:
            yield d
        finally:
            d.quit()


@pytest.fixture(autouse=True)
def no_console_errors(driver):
    """Every test ends with an empty error console (JavaScript errors, failed loads)."""
    driver.get_log("browser")                                  # reading the log empties it
    yield
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors


@pytest.fixture(scope="session")
def server_url():
    """The real command, as a user starts it: tblock demo --port 0 --no-browser."""
    proc = subprocess.Popen([sys.executable, "-m", "tblock", "demo", "--port", "0", "--no-browser"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        match = re.search(r"serving (http://127\.0\.0\.1:\d+/)", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
        yield match.group(1)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


class Page:
    """The demo page through its automation hooks (data-event, data-stage, data-field, ...)."""

    def __init__(self, driver):
        self.d = driver

    def find(self, css):
        from selenium.webdriver.common.by import By
        return self.d.find_element(By.CSS_SELECTOR, css)

    def open(self, url, key="h2-p1-t1.00"):
        self.d.get(url)
        self.wait_run(key)
        return self

    def wait_run(self, key):
        from selenium.webdriver.support.ui import WebDriverWait

        def shown(d):
            body = self.find("body")
            return body.get_attribute("data-run") == key and body.get_attribute("data-loading") is None
        WebDriverWait(self.d, WAIT_S).until(shown, f"the page never showed run {key}")

    def press(self, *keys):
        from selenium.webdriver.common.action_chains import ActionChains
        ActionChains(self.d).send_keys(*keys).perform()

    @property
    def event(self) -> int:
        return int(self.find("#stage").get_attribute("data-event"))

    @property
    def stop(self) -> str:
        return self.find("#stage").get_attribute("data-stage")

    def field(self, name) -> str:
        return self.find(f'[data-field="{name}"]').text

    def inspector(self) -> dict:
        return {name: self.field(name) for name in ("predicts", "norm", "entropy", "stage")}

    def tap(self, token):
        self.find(f'[data-token-index="{token}"]').click()

    def focus(self, css):
        """Give an element the keyboard focus, as Tab would."""
        self.d.execute_script("arguments[0].focus()", self.find(css))
        assert self.d.execute_script("return document.activeElement === arguments[0]", self.find(css)), css

    def blur(self):
        self.d.execute_script("document.activeElement && document.activeElement.blur()")

    def playing(self) -> bool:
        return self.find("#play").text == "pause"

    def identical(self) -> str:
        return self.find('[data-invariant="identical"]').text

    def tapped(self):
        chips = self.d.find_elements("css selector", "#sentence .chip.tapped")
        return [int(c.get_attribute("data-token-index")) for c in chips]

    def code_line(self) -> str:
        return self.find("#code .line.current").text


@pytest.fixture
def page(driver):
    driver.set_window_size(1440, 900)                          # a test that resizes leaves no trace
    return Page(driver)


# ---- checks run in the page ----------------------------------------------------------------

# every visible text node whose colour reads below 4.5:1 on what lies behind it: the text's colour
# (times its opacity) over the backgrounds of its element and its ancestors, composited
CONTRAST_JS = """
const parse = (c) => { const m = c.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
  const v = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number); return [v[0], v[1], v[2], v.length > 3 ? v[3] : 1]; };
const over = (top, under, alpha) => [0, 1, 2].map((i) => top[i] * alpha + under[i] * (1 - alpha));
const lum = (c) => { const l = c.map((v) => { v /= 255; return v <= 0.04045 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
  return 0.2126 * l[0] + 0.7152 * l[1] + 0.0722 * l[2]; };
function behind(el) {
  const layers = [];
  for (let e = el; e; e = e.parentElement) {
    const c = parse(getComputedStyle(e).backgroundColor);
    if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
  }
  let bg = [255, 255, 255];
  for (let i = layers.length - 1; i >= 0; i--) bg = over(layers[i], bg, layers[i][3]);
  return bg;
}
const failures = [], walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
let checked = 0;
for (let node = walker.nextNode(); node; node = walker.nextNode()) {
  if (!node.textContent.trim()) continue;
  let el = node.parentElement;
  if (el.closest("script")) continue;
  if (el.closest("select")) el = el.closest("select");      // an option's text shows in its select
  if (el.closest("[hidden]") || !el.getClientRects().length || getComputedStyle(el).visibility === "hidden") continue;
  let opacity = 1;
  for (let e = el; e; e = e.parentElement) opacity *= Number(getComputedStyle(e).opacity);
  const fg = parse(getComputedStyle(el).color), bg = behind(el);
  const ink = over(fg, bg, fg[3] * opacity), a = lum(ink), b = lum(bg);
  const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
  checked++;
  if (ratio < 4.5) failures.push([node.textContent.trim().slice(0, 40), Math.round(ratio * 100) / 100,
                                  ink.map(Math.round), bg.map(Math.round)]);
}
return [checked, failures];
"""

# the page's horizontal overflow, and, for every element of the left column, what the browser
# finds at its centre: covered when that is not the element or inside it
OVERLAP_JS = """
const root = document.documentElement, out = { scroll: [root.scrollWidth, root.clientWidth], covered: [], seen: 0 };
const targets = document.querySelectorAll(arguments[0]);
for (const el of targets) {
  el.scrollIntoView({ block: "center", inline: "nearest" });
  const r = el.getBoundingClientRect();
  const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
  out.seen++;
  if (!hit || !(hit === el || el.contains(hit))) out.covered.push([el.className, el.textContent.slice(0, 20),
                                                                 hit ? hit.id || hit.className : null]);
}
window.scrollTo(0, 0);
return out;
"""


# ---- what tblock says, computed here --------------------------------------------------------

def entropy_bits(p):
    return -sum(q * math.log2(q) for q in p if q > 0)


class Reference:
    """The demo model's run for one setting of the toggles: its events and what the inspector
    should read at event k for token j, to the digits the page shows."""

    def __init__(self, heads=2, positional=True, temperature=1.0):
        from tblock.lesson import demo
        self.events = []
        model = demo.TinyLM(VOCAB, dim=4, heads=heads, hidden=8, seed=1, backend="numpy")
        self.result = model.forward(SENTENCE, positional=positional, temperature=temperature,
                                    tracer=lambda kind, p: self.events.append((kind, p)))
        self.kinds = [kind for kind, _ in self.events]

    def stage(self, k):
        kind, p = self.events[k]
        return f"{kind} ({p['stage']})" if kind in ("add", "norm") else kind

    def inspector(self, k, j):
        row, entropies, guess = None, [], None
        for kind, p in self.events[: k + 1]:
            if p["index"] != j:
                continue
            if kind in ("embed", "add", "norm"):
                row = p["sum"] if kind == "embed" else p["after"]
            if kind == "attend":
                entropies.append(entropy_bits(p["weights"]))
            if kind == "predict":
                guess = p
        return {"predicts": f"{guess['top']} {guess['probability']:.2f}" if guess else "—",
                "norm": f"{np.linalg.norm(row):.2f}" if row is not None else "—",
                "entropy": f"{np.mean(entropies):.2f} bits" if entropies else "—",
                "stage": self.stage(k)}

    def at(self, kind, stage=None, token=0, head=None):
        """The index of the event at this stop for this token (and head)."""
        [k] = [k for k, (kd, p) in enumerate(self.events) if kd == kind and p.get("stage") == stage
               and p["index"] == token and p.get("head") == head]
        return k


@pytest.fixture(scope="session")
def reference():
    return Reference


@pytest.fixture(scope="session")
def screenshot_path(tmp_path_factory):
    """Where the screenshot goes: TBLOCK_SCREENSHOT (make test-browser: docs/demo.png) or a temp folder."""
    where = os.environ.get("TBLOCK_SCREENSHOT")
    return Path(where) if where else tmp_path_factory.mktemp("shot") / "demo.png"
