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
VOCAB = ["the", "cat", "sat", "on", "mat", "ran"]
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

    def tapped(self):
        chips = self.d.find_elements("css selector", "#sentence .chip.tapped")
        return [int(c.get_attribute("data-token-index")) for c in chips]

    def code_line(self) -> str:
        return self.find("#code .line.current").text


@pytest.fixture
def page(driver):
    return Page(driver)


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
        return {"predicts": f"{guess['top']} {guess['probability']:.3f}" if guess else "—",
                "norm": f"{np.linalg.norm(row):.3f}" if row is not None else "—",
                "entropy": f"{np.mean(entropies):.3f} bits" if entropies else "—",
                "stage": self.stage(k)}


@pytest.fixture(scope="session")
def reference():
    return Reference


@pytest.fixture(scope="session")
def screenshot_path(tmp_path_factory):
    """Where the screenshot goes: TBLOCK_SCREENSHOT (make test-browser: docs/demo.png) or a temp folder."""
    where = os.environ.get("TBLOCK_SCREENSHOT")
    return Path(where) if where else tmp_path_factory.mktemp("shot") / "demo.png"
