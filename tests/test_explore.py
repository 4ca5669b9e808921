"""The explorer without a browser: its numbers are the CLI's, its errors the CLI's lines, it
reads no path, survives any form value and any request, and its HTML exports stand alone.
(tests/test_explore_browser.py drives the page itself in headless Chromium.)"""

from __future__ import annotations

import http.client
import json
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.explore import compute, views
from sim.explore.html import markdown_html, write_study_html
from sim.explore.views import FormError
from tests.conftest import run_cli


def cli_json(*argv: str) -> dict:
    code, out, err = run_cli("run", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def cli_error(*argv: str) -> str:
    code, _out, err = run_cli("run", *argv)
    assert code == 2
    return err.strip()


CASES = [
    ({}, []),
    ({"batch": "16", "context": "32768", "kv": "int8"}, ["--batch", "16", "--context", "32768", "--kv", "int8"]),
    ({"model": "mixtral-8x7b", "dispatch": "host_sync", "steps": "2"},
     ["--model", "mixtral-8x7b", "--dispatch", "host_sync", "--steps", "2"]),
    ({"overrides": "hardware.hbm.channel_bandwidth_GBps=50\nbatch=4", "engine": "analytic", "graph": "eager"},
     ["--set", "hardware.hbm.channel_bandwidth_GBps=50", "--set", "batch=4", "--engine", "analytic", "--no-graph"]),
    ({"model": "llama-3-70b"}, ["--model", "llama-3-70b"]),  # does not fit
]


@pytest.mark.parametrize(("form", "argv"), CASES)
def test_the_page_number_is_the_cli_figure(form, argv):
    view = views.config_view(form)
    cli = cli_json(*argv)
    page = dict(view["summary"])
    for s in (page, cli):
        s.pop("wall_s", None)
        s.pop("schema_version", None)
        s.pop("kind", None)
    assert page == cli  # every figure, not only ms per token
    again = cli_json(*view["argv"])  # the page's own argument list, given to the CLI
    assert again["per_token_ms_p50"] == cli["per_token_ms_p50"] and again["verdict"] == cli["verdict"]


@pytest.mark.parametrize("form, argv", [
    ({"batch": "x"}, ["--batch", "x"]),
    ({"batch": "0"}, ["--batch", "0"]),
    ({"hardware": "nope"}, ["--hardware", "nope"]),
    ({"kv": "nope"}, ["--kv", "nope"]),
    ({"overrides": "foo=1"}, ["--set", "foo=1"]),
    ({"overrides": "hardware.hbm.channel_bandwidth_GBps=-1"}, ["--set", "hardware.hbm.channel_bandwidth_GBps=-1"]),
    ({"context": "200000"}, ["--context", "200000"]),
    ({"dispatch": "teleport"}, ["--dispatch", "teleport"]),
    ({"target_ms": "-3"}, ["--target-ms", "-3"]),
])
def test_bad_input_gets_the_cli_line(form, argv):
    with pytest.raises(FormError) as err:
        views.config_view(form)
    assert str(err.value) == cli_error(*argv)


@pytest.mark.parametrize("form", [
    {"hardware": "/etc/passwd"}, {"hardware": "hardware_profiles/h200-sxm.yaml"}, {"model": "../x"},
    {"kv": "workloads/formats/int8.yaml"}, {"software": "~/stack"}, {"routing": "workloads/routing/x.jsonl"},
    {"model": "pyproject.toml"}, {"overrides": "model=/tmp/model.yaml"}, {"overrides": "hardware=README.md"},
    {"overrides": "trace=workloads/traces/fixed-b8-c4096.jsonl"}, {"overrides": "trace=fixed-b8-c4096"},
])
def test_no_path_is_reachable(form, monkeypatch):
    import sim.config.loader

    def no_read(path, *a, **k):  # nothing outside the bundled folders may be read
        raise AssertionError(f"read {path}")

    monkeypatch.setattr(sim.config.loader, "load_yaml", no_read)
    with pytest.raises(FormError) as err:
        views.config_view(form)
    assert "bundled names only" in str(err.value) or "no trace files" in str(err.value)


def test_a_file_named_like_a_name_is_not_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "h200-sxm").write_text("memory: []\n")  # the CLI would read this file
    with pytest.raises(FormError, match="bundled names only"):
        views.config_view({"hardware": "h200-sxm"})


def test_the_page_bounds_its_work():
    with pytest.raises(FormError, match=f"at most {compute.MAX_STEPS} steps"):
        views.config_view({"steps": "1000"})
    with pytest.raises(FormError, match="unknown field"):
        views.config_view({"out": "/tmp/x"})


VALUES = st.one_of(st.text(max_size=30), st.integers(-10**12, 10**12), st.floats(allow_nan=True), st.none(),
                   st.booleans(), st.lists(st.text(max_size=5), max_size=3), st.dictionaries(st.text(max_size=3),
                                                                                          st.integers(), max_size=2),
                   st.sampled_from(["1", "0", "-1", "1e309", "nan", "inf", "4096", "--help", "-h", "=", "a=b",
                                    "hardware.hbm.x=1", "batch=0", "..", "/", "des", "eager", "graph", "on"]))
FORMS = st.dictionaries(st.sampled_from(sorted(views.FORM_KEYS | views.SERVE_KEYS) + ["zz", "__proto__"]), VALUES,
                        max_size=5)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FORMS)
def test_any_form_value_gives_a_view_or_one_line(form):
    form = {k: v for k, v in form.items() if k not in ("steps", "batch", "context")} | \
        {k: "2" for k in ("steps",) if k in form}  # keep the valid ones quick
    for work in (views.config_view, views.serve_points):
        try:
            work(form)
        except FormError as err:
            line = str(err)
            assert line.startswith("decodesim: ") and "\n" not in line and "Traceback" not in line


TOKENS: dict[int, str] = {}  # port -> the session's token (the page carries it; tests/test_explore_security.py)


@pytest.fixture(scope="module")
def server():
    from sim.explore.server import make_server

    srv = make_server(0)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    TOKENS[srv.server_address[1]] = srv.token
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def request(port: int, method: str, path: str, body: bytes | None = None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body=body, headers={"X-Decodesim-Token": TOKENS.get(port, ""), **(headers or {})})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def test_the_server_answers_and_serves_nothing_else(server):
    assert server and request(server, "GET", "/")[0] == 200
    status, js = request(server, "GET", "/plotly.min.js")
    assert status == 200 and len(js) > 1_000_000
    for path in ("/../../etc/passwd", "/sim/explore/page.html", "/pyproject.toml", "/%2e%2e/README.md",
                 "/api/../../etc/passwd", "//etc/passwd"):
        status, data = request(server, "GET", path)
        assert status == 404 and b"root:" not in data
    status, data = request(server, "POST", "/api/view", json.dumps({"a": {"batch": "x"}}).encode())
    assert status == 400 and json.loads(data) == {"error": cli_error("--batch", "x")}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["/api/view", "/api/curves", "/api/export", "/api/serve", "/api/nope"]),
       st.one_of(st.binary(max_size=40), st.builds(lambda f: json.dumps({"a": f}).encode(), FORMS),
                 st.builds(lambda f: json.dumps({"form": f}).encode(), FORMS),
                 st.sampled_from([b"null", b"[]", b"{}", b'{"a": null}', b'{"a": {}, "b": 3}', b'{"a":{},"seq":"x"}',
                                  b"[" * 5000, b'{"a":{"steps":"1"},"serve":99}',
                                  b'{"a":{"steps":"1"},"axis":[1]}', b'{"a":{"steps":"1"},"axis":"batch"}'])))
def test_the_server_survives_any_request(server, path, body):
    status, data = request(server, "POST", path, body)
    assert status in (200, 400, 404), data[:300]
    if status != 200:
        assert json.loads(data)["error"].startswith("decodesim: ")
    assert request(server, "GET", "/api/options")[0] == 200  # still serving


def test_a_bad_length_is_refused(server):
    status, data = request(server, "POST", "/api/view", b"{}", {"Content-Length": "99999999999"})
    assert status in (400, 413) and b"at most" in data


PAGE_DEFAULTS = {k: ("" if v is None else str(v)) for k, v in views.options()["defaults"].items()
                 if k in views.FORM_KEYS}  # what the page's form sends before anything is changed


@pytest.mark.parametrize("profile", views.options()["hardware"])
def test_every_profile_on_the_page_is_the_cli(profile):
    """The page's untouched form, for each bundled profile, is ``decodesim run --hardware P``:
    the profile's own stack and defaults (a wafer's static-schedule, not the GPU's fused)."""
    assert PAGE_DEFAULTS["software"] == "" and "" in views.options()["software"]
    view = views.config_view({**PAGE_DEFAULTS, "hardware": profile, "engine": "analytic", "steps": "1"})
    cli = cli_json("--hardware", profile, "--engine", "analytic", "--steps", "1")
    page = dict(view["summary"])
    for s in (page, cli):
        for key in ("wall_s", "schema_version", "kind"):
            s.pop(key, None)
    assert page == cli
    assert "--software" not in view["command"]


def test_the_format_menus_offer_only_valid_formats():
    from sim.formats.base import list_formats

    o = views.options()
    assert o["weights"] == [f.name for f in list_formats("weights")] and set(o["weights"]) < set(o["formats"])
    assert o["kv"] == [f.name for f in list_formats("kv")] and set(o["kv"]) < set(o["formats"])
    for name in o["weights"]:
        views.run_argv({"weights": name})
    refused = sorted(set(o["formats"]) - set(o["weights"]))[0]
    with pytest.raises(FormError):
        views.config_view({"weights": refused, "engine": "analytic", "steps": "1"})


def test_every_field_has_help_and_the_tables_download_as_csv():
    import csv
    import io

    from sim.explore.server import Explorer

    o = views.options()
    for field in views.FORM_KEYS | {"requests", "duration_s", "rates"}:
        assert len(o["help"].get(field, "")) > 20, field
    for field in ("dispatch", "placement", "routing"):
        assert "MoE" in o["help"][field]
    forms = [{"engine": "analytic", "steps": "1"}, {"engine": "analytic", "steps": "1", "kv": "int8"},
             {"engine": "analytic", "steps": "1", "hardware": "cerebras-wse3", "label": "wafer"}]
    got = Explorer().view({"setups": forms})
    rows = list(csv.DictReader(io.StringIO(got["csv"]["summary"])))
    assert [r["label"] for r in rows] == ["A", "B", "wafer"]
    for row, form in zip(rows, forms, strict=True):
        cli = cli_json(*views.run_argv(form))
        assert float(row["per_token_ms_p50"]) == cli["per_token_ms_p50"]
        assert row["software"] == cli["software"]
        assert float(row["J_per_token"]) == cli["energy"]["J_per_token"]
    breakdown = list(csv.DictReader(io.StringIO(got["csv"]["breakdown"])))
    assert {r["row"] for r in breakdown} and set(breakdown[0]) == {"row", "A_ms", "B_ms", "wafer_ms"}
    assert "energy" in got["cards"][0] and "J per token" in got["cards"][0]
    assert len(got["plots"]) == 1 + 3  # the breakdown and one roofline per setup
    with pytest.raises(FormError, match="1 to 6 setups"):
        Explorer().view({"setups": [{}] * 7})


def test_serving_rows_are_the_cli_sweep_rows():
    points, command = views.serve_points({"rates": "4", "duration_s": "10", "requests": "synthetic"})
    assert command == "decodesim serve --requests synthetic --duration-s 10 --rates 4"
    row = views.serve_row(points[0])
    code, out, err = run_cli("serve", "--requests", "synthetic", "--duration-s", "10", "--rates", "4", "--json",
                             "--jobs", "1")
    assert code == 0, err
    cli = json.loads(out)["rows"][0]  # the sweep in the --json envelope
    for key in ("tpot_ms_p50", "tpot_ms_p99", "ttft_ms_p99", "requests_done", "throughput_tokens_per_s"):
        assert row[key] == pytest.approx(cli[key], rel=1e-9), key  # the CLI's table JSON keeps 10 decimals
    with pytest.raises(FormError, match="at most 120"):
        views.serve_points({"duration_s": "3600"})
    with pytest.raises(FormError, match="bundled sources only"):
        views.serve_points({"requests": "/etc/passwd"})


def test_run_html_is_self_contained(tmp_path):
    out = tmp_path / "view.html"
    code, _o, err = run_cli("run", "--batch", "4", "--kv", "int8", "--html", str(out))
    assert code == 0, err
    text = out.read_text()
    ms = cli_json("--batch", "4", "--kv", "int8")["per_token_ms_p50"]
    assert f'data-ms="{ms!r}"' in text and f"{ms:.3f} ms" in text
    assert "<script src=" not in text and "Plotly.newPlot" in text and len(text) > 1_000_000
    import html
    import re
    import shlex

    command = html.unescape(re.search(r"same figure from the CLI: <code>([^<]*)</code>", text).group(1))
    assert command == "decodesim run --kv int8 --batch 4"
    assert cli_json(*shlex.split(command)[2:])["per_token_ms_p50"] == ms
    for fig in ("fig-breakdown", "fig-roofline-0", "fig-batch", "fig-context"):
        assert f'id="{fig}"' in text


def test_study_report_html_inlines_its_plots(tmp_path):
    import base64

    png = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "a.png").write_bytes(png)
    (tmp_path / "report.md").write_text(
        "# Study: s\n\nSome **bold** text with `code <x>`.\n\n## Answer\n\n- one\n  - nested\n- two\n\n"
        "| a | b |\n|---|---|\n| 1 | x/y |\n\n![plot](plots/a.png)\n([SVG](plots/a.svg))\n\n```json\n{\"k\": 1}\n```\n"
        "<details><summary>More</summary>\n\n| p | v |\n|---|---|\n| `x` | 2 |\n\n</details>\n")
    path = write_study_html(tmp_path)
    text = path.read_text()
    assert "<h1>Study: s</h1>" in text and "<b>bold</b>" in text and "<code>code &lt;x&gt;</code>" in text
    assert "<ul><li>one</li><ul><li>nested</li></ul><li>two</li></ul>" in text
    assert "<th>a</th>" in text and "<td>x/y</td>" in text and "<td><code>x</code></td>" in text
    assert 'src="data:image/png;base64,' in text and 'href="plots/a.svg"' in text
    assert "<pre><code>{&quot;k&quot;: 1}</code></pre>" in text and "<details>" in text
    assert "<script" not in text  # no plot of its own: no plotly.js to carry
    assert markdown_html("![x](../../etc/passwd)", tmp_path) == '<p><img alt="x" src="../../etc/passwd"></p>'


def test_concurrent_views_are_the_serial_ones():
    """The server computes requests in threads: overlapping runs give the same figures."""
    from concurrent.futures import ThreadPoolExecutor

    forms = [{"batch": "8"}, {"model": "mixtral-8x7b", "steps": "2"}, {"kv": "kivi-2", "context": "16384"},
             {"model": "qwen3-30b-a3b", "steps": "2", "dispatch": "sram_zero_copy"}]
    serial = [views.config_view(f)["summary"]["per_token_ms_p50"] for f in forms]
    with ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(lambda f: views.config_view(f)["summary"]["per_token_ms_p50"], forms * 2))
    assert threaded == serial * 2


def test_one_command_starts_it():
    import os
    import subprocess
    import sys
    import urllib.request

    from tests.conftest import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "sim", "explore", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        assert line.startswith("decodesim explorer on http://127.0.0.1:"), line + proc.stderr.read()
        url = line.split()[3]
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.status == 200 and b"decodesim explorer" in r.read()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_every_curve_point_is_the_cli_figure():
    curves = views.curves_of({"kv": "int8", "steps": "2"})
    at = {p["x"]: p["ms_p99"] for p in curves["batch"]}
    assert at[16] == cli_json("--kv", "int8", "--steps", "2", "--batch", "16")["per_token_ms_p99"]
    at = {p["x"]: p["ms_p99"] for p in curves["context"]}
    assert at[32768] == cli_json("--kv", "int8", "--steps", "2", "--context", "32768")["per_token_ms_p99"]
    assert max(at) <= 131072 - 1  # llama-3-8b's max_context: no point the CLI would refuse


def test_the_server_reuses_a_computed_view_and_keeps_labels_apart():
    from sim.explore.server import Explorer

    e = Explorer()
    first = e.view({"a": {"batch": "2"}})
    again = e.view({"a": {"batch": "2"}})
    assert again == first and len(e.cache) == 1
    named = e.view({"a": {"batch": "2", "label": "mine"}})
    assert named["views"][0]["label"] == "mine" and 'data-label="mine"' in named["cards"][0]
    assert named["views"][0]["summary"]["per_token_ms_p50"] == first["views"][0]["summary"]["per_token_ms_p50"]
    e.CACHE_ENTRIES = 2
    for batch in ("3", "4", "5"):
        e.view({"a": {"batch": batch}})
    assert len(e.cache) == 2


def test_a_search_from_the_page_is_the_cli_search():
    import time

    from sim import api
    from sim.explore.server import Explorer

    form = {"model": "llama-3-8b", "hardware": "h200-sxm", "rate": "4", "duration_s": "5", "max_replays": "1",
            "requests": "synthetic"}
    e = Explorer()
    job = e.searches.start({"search": form})
    deadline = time.monotonic() + 120
    while not e.searches.status(job["id"])["finished"] and time.monotonic() < deadline:
        time.sleep(0.1)
    got = e.searches.status(job["id"])
    assert got["error"] is None and got["front"]
    want = api.search(**views.search_options(form))
    for row in (*got["front"], got["chosen"]):
        for key in ("timing", "wall_s"):
            row.pop(key, None)
    assert got["front"] == [plain_row(r) for r in want["front"]] and got["chosen"] == plain_row(want["chosen"])
    assert got["command"].startswith("decodesim search --model llama-3-8b --hardware h200-sxm")
    assert got["plots"]["fig-search"]["data"] and got["csv"].startswith("index,")
    for bad, match in (({"hardware": "a,b,c,d,e"}, "1 to 4 profiles"), ({"max_replays": "99"}, "at most 8"),
                       ({"duration_s": "600"}, "at most 60"), ({"hardware": "/etc/passwd"}, "bundled names"),
                       ({"requests": "x.csv"}, "bundled sources"), ({"ttft_ms": "x"}, "ttft-ms")):
        with pytest.raises(FormError, match=match):
            views.search_options({**form, **bad})


def plain_row(row: dict) -> dict:
    out = compute.plain(dict(row))
    for key in ("timing", "wall_s"):
        out.pop(key, None)
    return out


def test_a_curve_far_below_the_target_keeps_its_own_scale():
    from sim.explore import figures

    low = [{"label": "wafer", "summary": {"target_ms": 10.0}, "curves": {"batch": [
        {"x": 1, "ms_p99": 0.3, "ms_p50": 0.3, "bound": "kernels", "verdict": "meets-target"},
        {"x": 8, "ms_p99": 0.4, "ms_p50": 0.4, "bound": "kernels", "verdict": "meets-target"}]}}]
    fig = figures.curve(low, "batch")
    assert "shapes" not in fig["layout"] and "above every point" in fig["layout"]["annotations"][0]["text"]
    low[0]["curves"]["batch"][1]["ms_p99"] = 12.0
    fig = figures.curve(low, "batch")
    assert fig["layout"]["shapes"][0]["y0"] == 10.0 and "10 ms target" in fig["layout"]["annotations"][0]["text"]


def test_the_page_roofline_names_the_sustained_vector_ceiling_the_study_draws():
    from sim.explore import figures

    view = views.config_view({"engine": "analytic", "steps": "1", "weights": "int4-g128"})
    roof = view["roofline"]
    hardware = sim_load_profile("h200-sxm")
    assert roof["vector_sustained_Tops"] == pytest.approx(roof["vector_peak_Tops"]
                                                          * hardware.compute.vector_efficiency.value)
    names = [t["name"] for t in figures.roofline(view)["data"]]
    assert any("sustained" in n and f"{roof['vector_sustained_Tops']:,.1f}" in n and "peak" in n for n in names)


def sim_load_profile(name: str):
    import sim

    return sim.load_profile(name)


def test_axis_ticks_of_a_geometric_sweep_are_short():
    from sim.report.labels import axis_tick

    assert [axis_tick(v) for v in (50, 99.78, 199.1, 397.4, 793.1, 1583, 18.75, 12.5, "fp8")] == \
        ["50", "99.8", "199", "397", "793", "1583", "18.75", "12.5", "fp8"]


def test_the_energy_plot_names_its_target_line_and_counts_each_group(tmp_path):
    import matplotlib
    import pandas as pd

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from sim.report import energy_plot

    grid = pd.DataFrame({"status": ["ok"] * 4, "dispatch": ["device", "device", "sram", "sram"],
                         "p99_ms": [5.0, 8.0, 5.0, 8.0], "energy_J_per_token": [1.0, 2.0, 1.0, 2.0],
                         "target_ms": [10.0] * 4})
    grid = grid.rename(columns={"p99_ms": energy_plot.LATENCY})
    seen = {}
    real_save = energy_plot.save

    def keep(fig, folder, name):
        seen["legend"] = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        return real_save(fig, folder, name)

    energy_plot.save = keep
    try:
        energy_plot.energy(grid, {"study": {}, "axes": {"dispatch": ["device", "sram"]}}, tmp_path)
    finally:
        energy_plot.save = real_save
        plt.close("all")
    assert "latency target 10 ms" in seen["legend"] and sum("(2)" in t for t in seen["legend"]) == 2


def test_an_override_keeps_the_profile_stack():
    """``--set batch=2`` on a wafer keeps the wafer's own stack (it used to fall back to fused)."""
    form = {**PAGE_DEFAULTS, "hardware": "cerebras-wse3", "engine": "analytic", "steps": "1", "overrides": "batch=2"}
    page = views.config_view(form)["summary"]
    cli = cli_json("--hardware", "cerebras-wse3", "--engine", "analytic", "--steps", "1", "--set", "batch=2")
    assert page["software"] == cli["software"] == "static-schedule" and page["batch"] == cli["batch"] == 2
    assert page["per_token_ms_p50"] == cli["per_token_ms_p50"]


def test_hbm_channel_ticks_carry_the_whole_memory_bandwidth():
    from sim.report.figures import axis_ticks, axis_title

    settings = {"axes": {"hardware.hbm.channel_bandwidth_GBps": [12.5, 25]},
                "hardware_sources": [["memory.hbm.stacks", 6, "s", False], ["memory.hbm.channels_per_stack", 32, "s",
                                                                               False]]}
    axis = "hardware.hbm.channel_bandwidth_GBps"
    assert axis_ticks(axis, [12.5, 25], settings) == ["12.5\n2.4 TB/s", "25\n4.8 TB/s"]
    assert axis_title(axis, settings).endswith("below: all channels")
    swept = {**settings, "axes": {**settings["axes"], "hardware": ["h200-sxm", "b200"]}}
    assert axis_ticks(axis, [25], swept) == ["25"]  # two profiles: no one total to give
