"""The explorer driven in a real headless browser (Debian's chromium + chromium-driver, through
Selenium) on 127.0.0.1: load the page, change a value and see the number become the CLI's
own figure, see a bad value's CLI error line, compare two setups, run a short serving replay,
export the view and reopen the file with the network off and the server stopped.

Skips, saying why, only where no browser can be had (.ci/run installs the Debian packages).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium")
                 if p and Path(p).is_file()), None)
DRIVER = shutil.which("chromedriver") or ("/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").is_file() else None)
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install '.[test]')")
if CHROMIUM is None or DRIVER is None:
    pytest.skip("no chromium + chromedriver on this machine (apt-get install chromium chromium-driver; .ci/run "
                "does so where it can)", allow_module_level=True)

from selenium.common.exceptions import (  # noqa: E402
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

WAIT_S = 60


def cli_ms(*argv: str) -> float:
    code, out, err = run_cli("run", *argv, "--json")
    assert code == 0, err
    return json.loads(out)["per_token_ms_p50"]


@pytest.fixture(scope="module")
def downloads(tmp_path_factory):
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(downloads):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1200"):
        options.add_argument(arg)
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                              "download.prompt_for_download": False})
    try:
        driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    except Exception as err:  # a browser that cannot start here is a missing browser, not a failure of ours
        pytest.skip(f"chromium would not start: {str(err).splitlines()[0]}")
    driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server():
    from sim.explore.server import make_server

    srv = make_server(0)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def wait(driver, check, what: str):
    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.05,
                             ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)).until(check)
    except TimeoutException:
        raise AssertionError(f"waited {WAIT_S} s for {what}; page error: "
                             f"{driver.find_element(By.ID, 'error').text!r}") from None


def shown_ms(driver, label: str = "A") -> float:
    return float(driver.find_element(By.CSS_SELECTOR, f'.card[data-label="{label}"] .ms').get_attribute("data-ms"))


def set_field(driver, field: str, value: str) -> None:
    box = driver.find_element(By.ID, field)
    if box.tag_name == "select":
        Select(box).select_by_value(value)
    else:
        box.clear()
        box.send_keys(value)


def test_the_page_in_a_browser(browser, server, downloads):
    d = browser
    port = server.server_address[1]
    d.get(f"http://127.0.0.1:{port}/")
    wait(d, lambda d: d.find_element(By.ID, "status").get_attribute("data-state") == "ready", "the first view")
    assert shown_ms(d) == cli_ms()  # the default question, as the CLI answers it
    assert "memory-bound" in d.find_element(By.CSS_SELECTOR, '.card[data-label="A"]').text
    wait(d, lambda d: d.find_element(By.ID, "curves-status").get_attribute("data-state") == "ready", "the curves")
    for fig in ("fig-breakdown", "fig-roofline-0", "fig-batch", "fig-context"):
        assert d.find_elements(By.CSS_SELECTOR, f"#{fig} .main-svg"), f"{fig} not drawn"
    assert "10 ms target" in d.find_element(By.ID, "fig-batch").text

    # change a value: the number becomes the CLI's figure for the new arguments
    before = shown_ms(d)
    set_field(d, "A-batch", "16")
    want = cli_ms("--batch", "16")
    wait(d, lambda d: shown_ms(d) != before and d.find_element(By.ID, "status").get_attribute("data-state") == "ready",
         "the number to change")
    assert shown_ms(d) == want and f"{want:.3f} ms" in d.find_element(By.CSS_SELECTOR, ".card .ms").text

    # a bad value: the CLI's own one-line error, and the page recovers
    set_field(d, "A-batch", "x")
    code, _out, err = run_cli("run", "--batch", "x")
    wait(d, lambda d: d.find_element(By.ID, "error").text == err.strip(), "the CLI's error line")
    assert "stale" in d.find_element(By.ID, "results").get_attribute("class")  # the last good view, dimmed
    set_field(d, "A-batch", "16")
    wait(d, lambda d: d.find_element(By.ID, "error").text == "" and shown_ms(d) == want, "recovery")
    assert "stale" not in d.find_element(By.ID, "results").get_attribute("class")

    # two configurations side by side
    d.find_element(By.ID, "compare").click()
    set_field(d, "B-batch", "16")
    set_field(d, "B-kv", "int8")
    want_b = cli_ms("--batch", "16", "--kv", "int8")
    wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, '.card[data-label="B"] .ms') and shown_ms(d, "B") == want_b,
         "configuration B")
    assert shown_ms(d, "A") == want
    wait(d, lambda d: d.find_element(By.ID, "curves-status").get_attribute("data-state") == "ready", "both curves")

    # serving: a short replay per rate, with progress
    d.find_element(By.ID, "tab-serve").click()
    set_field(d, "serve-rates", "2, 6")
    set_field(d, "serve-duration", "10")
    d.find_element(By.ID, "serve-run").click()
    wait(d, lambda d: d.find_element(By.ID, "serve-status").get_attribute("data-state") == "ready", "the replays")
    assert d.find_element(By.ID, "serve-status").text.startswith("2 of 2 rates")
    assert len(d.find_elements(By.CSS_SELECTOR, "#serve-table tr")) == 3
    assert d.find_elements(By.CSS_SELECTOR, "#fig-tpot .main-svg") and "10 ms target" in d.find_element(
        By.ID, "fig-tpot").text
    d.find_element(By.ID, "tab-config").click()

    # export, then reopen the file offline with the server stopped
    d.find_element(By.ID, "export").click()
    wait(d, lambda d: d.find_element(By.ID, "status").get_attribute("data-state") == "exported", "the export")
    target = downloads / "decodesim-view.html"
    wait(d, lambda d: target.is_file() and not list(downloads.glob("*.crdownload")), "the downloaded file")
    server.shutdown()
    d.execute_cdp_cmd("Network.enable", {})
    d.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": True, "latency": 0, "downloadThroughput": -1,
                                                           "uploadThroughput": -1})
    d.get(target.as_uri())
    wait(d, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1", "the offline file")
    assert shown_ms(d, "A") == want and shown_ms(d, "B") == want_b
    drawn = d.execute_script("return document.querySelectorAll('.js-plotly-plot .main-svg').length")
    assert drawn >= 6  # breakdown, two rooflines, two curves, TPOT and TTFT
    assert "TPOT" in d.page_source and "decodesim run" in d.page_source
    d.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": False, "latency": 0, "downloadThroughput": -1,
                                                           "uploadThroughput": -1})
