"""The explorer driven in a real headless browser (Debian's chromium + chromium-driver, through
Selenium) on 127.0.0.1: load the page and see the CLI's figure; three setups side by side (a
GPU, a wafer with its own stack, a MoE model), each the CLI's figure; a bad value's CLI
error line; the summary as CSV; the view's link reopened in a second browser; a short serving
replay of every setup; the export reopened with the network off and the server stopped;
and every request the pages made (Chrome's performance log) went to 127.0.0.1 only.
Screenshots of the page (docs/explore.png, explore-serving.png, explore-search.png) are
refreshed with DECODESIM_SCREENSHOTS=1.

Skips, saying why, only where no browser can be had (.ci/run installs the Debian packages).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import threading
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
DOCS = Path(__file__).resolve().parent.parent / "docs"
SHOTS = Path(os.environ.get("TMPDIR", "/tmp"))


def cli_ms(*argv: str) -> float:
    code, out, err = run_cli("run", *argv, "--json")
    assert code == 0, err
    return json.loads(out)["per_token_ms_p50"]


@pytest.fixture(scope="module")
def downloads(tmp_path_factory):
    return tmp_path_factory.mktemp("downloads")


def chrome(downloads):
    options = webdriver.ChromeOptions()
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
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
    return driver


@pytest.fixture(scope="module")
def browser(downloads):
    driver = chrome(downloads)
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


def requests_made(driver) -> list[str]:
    """Every URL the browser asked for since the last call (Chrome's performance log)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def local_only(urls: list[str], port: int) -> list[str]:
    """The URLs that leave this machine's explorer (none may)."""
    return [u for u in urls if not (u.startswith(f"http://127.0.0.1:{port}/") or u.startswith("blob:http://127.0.0.1")
                                    or u.startswith("data:") or u.startswith("file://"))]


def ready(driver) -> bool:
    return (driver.find_element(By.ID, "status").get_attribute("data-state") == "ready"
            and driver.find_element(By.ID, "curves-status").get_attribute("data-state") == "ready")


SETUPS = [  # a GPU, a wafer (its own stack: static-schedule), a MoE model on the GPU
    ("A", {"steps": "2"}, ["--steps", "2"]),
    ("B", {"hardware": "cerebras-wse3"}, ["--hardware", "cerebras-wse3", "--steps", "2"]),
    ("C", {"hardware": "h200-sxm", "model": "qwen3-30b-a3b", "dispatch": "host_sync"},
     ["--model", "qwen3-30b-a3b", "--dispatch", "host_sync", "--steps", "2"]),
]


def screenshot(driver, name: str) -> None:
    """The page from its top, as a new user first sees it: into docs/NAME when
    DECODESIM_SCREENSHOTS=1 (``DECODESIM_SCREENSHOTS=1 python -m pytest tests/test_explore_browser.py``
    refreshes the committed ones), else beside the downloads (a test run leaves docs/ alone)."""
    driver.execute_script("window.scrollTo(0, 0); document.querySelector('aside').scrollTop = 0;")
    folder = DOCS if os.environ.get("DECODESIM_SCREENSHOTS") == "1" else SHOTS
    assert driver.save_screenshot(str(folder / name))


def test_the_page_in_a_browser(browser, server, downloads):
    d = browser
    port = server.server_address[1]
    d.get(f"http://127.0.0.1:{port}/")
    wait(d, lambda d: d.find_element(By.ID, "status").get_attribute("data-state") == "ready", "the first view")
    assert shown_ms(d) == cli_ms()  # the default question, as the CLI answers it
    assert "memory-bound" in d.find_element(By.CSS_SELECTOR, '.card[data-label="A"]').text
    wait(d, ready, "the curves")
    for fig in ("fig-breakdown", "fig-roofline-0", "fig-batch", "fig-context"):
        assert d.find_elements(By.CSS_SELECTOR, f"#{fig} .main-svg"), f"{fig} not drawn"
    assert "10 ms target" in d.find_element(By.ID, "fig-batch").text
    assert not d.find_elements(By.CSS_SELECTOR, ".modebar-btn[data-title*='Cloud'], .modebar-btn[data-title*='hare'], "
                                                ".modebar-btn--logo")  # nothing that sends a chart away
    options = json.loads(d.execute_script("return JSON.stringify(OPTIONS)"))
    menu = [o.get_attribute("value") for o in Select(d.find_element(By.ID, "A-kv")).options]
    assert menu == options["kv"] and len(menu) < len(options["formats"])  # KV formats only
    for label in d.find_elements(By.CSS_SELECTOR, "#form-A label"):
        assert len(label.get_attribute("title")) > 20, label.text  # help on every field

    # a bad value: the CLI's own one-line error, the last good view dimmed; then recovery
    set_field(d, "A-batch", "x")
    code, _out, err = run_cli("run", "--batch", "x")
    wait(d, lambda d: d.find_element(By.ID, "error").text == err.strip(), "the CLI's error line")
    assert "stale" in d.find_element(By.ID, "results").get_attribute("class")
    set_field(d, "A-batch", "1")

    # three setups: B starts as a copy of A, C as a copy of B
    for label, fields, argv in SETUPS:
        if label != "A":
            d.find_element(By.ID, "add-setup").click()
            previous = chr(ord(label) - 1)
            assert d.find_element(By.ID, f"{label}-steps").get_attribute("value") == \
                d.find_element(By.ID, f"{previous}-steps").get_attribute("value")
        for name, value in fields.items():
            set_field(d, f"{label}-{name}", value)
        assert "stale" in d.find_element(By.ID, "results").get_attribute("class")  # old figures dimmed at once
    want = {label: cli_ms(*argv) for label, _f, argv in SETUPS}
    wait(d, lambda d: ready(d) and all(d.find_elements(By.CSS_SELECTOR, f'.card[data-label="{k}"] .ms')
                                       and shown_ms(d, k) == v for k, v in want.items()), "three setups")
    assert "stale" not in d.find_element(By.ID, "results").get_attribute("class")
    assert "stack static-schedule" in d.find_element(By.CSS_SELECTOR, '.card[data-label="B"]').text
    assert d.find_elements(By.CSS_SELECTOR, "#fig-roofline-2 .main-svg")
    screenshot(d, "explore.png")

    # the summary table as CSV
    d.find_element(By.ID, "csv-summary").click()
    target = downloads / "decodesim-summary.csv"
    wait(d, lambda d: target.is_file() and not list(downloads.glob("*.crdownload")), "the CSV")
    rows = list(csv.DictReader(target.open()))
    assert {r["label"]: float(r["per_token_ms_p50"]) for r in rows} == want

    # the view's link, reopened in another browser
    d.find_element(By.ID, "copy-link").click()
    link = d.find_element(By.ID, "link").get_attribute("value")
    assert link.startswith(f"http://127.0.0.1:{port}/#view=")
    other = chrome(downloads)
    try:
        other.get(link)
        wait(other, lambda o: ready(o) and len(o.find_elements(By.CSS_SELECTOR, ".card .ms")) == 3, "the linked view")
        assert {k: shown_ms(other, k) for k in want} == want
        assert other.find_element(By.ID, "C-model").get_attribute("value") == "qwen3-30b-a3b"
        leaks = local_only(requests_made(other), port)
    finally:
        other.quit()
    assert leaks == []

    # serving: a short replay of every setup, requested and achieved rates side by side
    d.find_element(By.ID, "tab-serve").click()
    set_field(d, "serve-rates", "4")
    set_field(d, "serve-duration", "5")
    d.find_element(By.ID, "serve-run").click()
    wait(d, lambda d: d.find_element(By.ID, "serve-status").get_attribute("data-state") == "ready", "the replays")
    assert d.find_element(By.ID, "serve-status").text.startswith("3 of 3 replays")
    table = d.find_element(By.ID, "serve-table").text
    assert "requested (req/s)" in table and "achieved (req/s)" in table
    assert len(d.find_elements(By.CSS_SELECTOR, "#serve-table tr")) == 4
    assert "10 ms target" in d.find_element(By.ID, "fig-tpot").text
    screenshot(d, "explore-serving.png")

    # search from the page: the front, then a deployment of it as a fourth setup, the CLI's figure
    d.find_element(By.ID, "tab-search").click()
    for name, value in (("hardware", "h200-sxm"), ("rate", "4"), ("duration_s", "10"), ("max_replays", "2")):
        set_field(d, f"search-{name}", value)
    d.find_element(By.ID, "search-run").click()
    wait(d, lambda d: d.find_element(By.ID, "search-status").get_attribute("data-state") in ("ready", "error"),
         "the search")
    assert d.find_element(By.ID, "search-error").text == ""
    assert d.find_elements(By.CSS_SELECTOR, "#fig-search .main-svg")
    screenshot(d, "explore-search.png")
    d.find_element(By.CSS_SELECTOR, "#search-front .add-from-search").click()
    fields = {name: d.find_element(By.ID, f"D-{name}").get_attribute("value")
              for name in ("hardware", "model", "weights", "kv", "software", "tp", "pp", "chips", "batch")}
    want["D"] = cli_ms(*[w for k, v in fields.items() for w in (f"--{k}", v)])
    wait(d, lambda d: ready(d) and d.find_elements(By.CSS_SELECTOR, '.card[data-label^="h200-sxm"] .ms'),
         "the deployment as a setup")
    label = d.find_element(By.ID, "D-label").get_attribute("value")
    assert shown_ms(d, label) == want.pop("D")
    d.find_element(By.ID, "remove-D").click()
    wait(d, lambda d: ready(d) and len(d.find_elements(By.CSS_SELECTOR, ".card .ms")) == 3, "three setups again")

    # export, then reopen the file offline with the server stopped
    d.find_element(By.ID, "export").click()
    wait(d, lambda d: d.find_element(By.ID, "status").get_attribute("data-state") == "exported", "the export")
    target = downloads / "decodesim-view.html"
    wait(d, lambda d: target.is_file() and not list(downloads.glob("*.crdownload")), "the downloaded file")
    assert local_only(requests_made(d), port) == []  # everything the page asked for, 127.0.0.1 only
    text = target.read_text()
    assert '"showSendToCloud": false' in text and '"displaylogo": false' in text
    server.shutdown()
    d.execute_cdp_cmd("Network.enable", {})
    d.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": True, "latency": 0, "downloadThroughput": -1,
                                                           "uploadThroughput": -1})
    d.get(target.as_uri())
    wait(d, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1", "the offline file")
    assert {k: shown_ms(d, k) for k in want} == want
    drawn = d.execute_script("return document.querySelectorAll('.js-plotly-plot .main-svg').length")
    assert drawn >= 8  # breakdown, three rooflines, two curves, TPOT and TTFT
    assert "TPOT" in d.page_source and "decodesim run" in d.page_source
    assert local_only(requests_made(d), port) == []
    d.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": False, "latency": 0, "downloadThroughput": -1,
                                                           "uploadThroughput": -1})
