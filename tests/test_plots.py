"""Study plots and report: written as PNG and SVG with labelled axes, redrawn from saved
results by ``decodesim plot DIR`` without simulating."""

from __future__ import annotations

import struct
import textwrap

import pytest

from tests.conftest import run_cli

STUDY = """
name: plots
base: {model: llama-3-8b, steps: 1}
sweep:
  grid:
    batch: [1, 16, 64]
    context: [1024, 16384, 65536]
    kv: [fp16, kivi-2]
sensitivity: {percent: 20, knobs: [hardware.hbm.channel_bandwidth_GBps, batch]}
plots: {feasibility: [batch, context], facet: kv, detail: {batch: 16, context: 16384, kv: kivi-2}}
"""
NAMES = ["breakdown", "feasibility", "tornado", "bandwidth", "roofline"]


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plots")
    path = folder / "plots.yaml"
    path.write_text(textwrap.dedent(STUDY))
    code, out, err = run_cli("study", str(path), "--out", str(folder / "out"), "--jobs", "1", "--no-progress")
    assert code == 0, err
    return folder / "out"


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_every_plot_is_written_as_png_and_svg(study_dir):
    for name in NAMES:
        width, height = png_size(study_dir / "plots" / f"{name}.png")
        assert width > 300 and height > 200
        svg = (study_dir / "plots" / f"{name}.svg").read_text()
        assert svg.lstrip().startswith("<?xml") and "</svg>" in svg


@pytest.mark.parametrize("name, words", [
    ("breakdown", ["time per decode step (ms"]),
    ("feasibility", ["batch (sequences)", "context (tokens)", "p99 per-token latency (ms", "10 ms"]),
    ("tornado", ["p99 per-token latency (ms)", "hardware.hbm.channel_bandwidth_GBps"]),
    ("bandwidth", ["time within the decode step", "GB/s"]),
    ("roofline", ["arithmetic intensity (FLOP per byte", "TFLOP/s"]),
])
def test_axes_are_labelled_with_units(study_dir, name, words):
    import re

    svg = (study_dir / "plots" / f"{name}.svg").read_text()
    # matplotlib writes text as glyph paths, with the string in a comment
    comments = " ".join(re.findall(r"<!-- (.*?) -->", svg))
    for word in words:
        assert word in comments, (name, word)


def test_feasibility_marks_points_that_do_not_fit(study_dir):
    from sim.study import results

    table = results(study_dir)
    grid = table[table["group"] == "grid"]
    unfit = grid[grid["verdict"] == "does-not-fit"]
    assert not unfit.empty  # batch 64 x context 65536 fp16 needs ~550 GB
    svg = (study_dir / "plots" / "feasibility.svg").read_text()
    assert "no fit" in svg


def test_plot_redraws_from_saved_results_without_simulating(study_dir, monkeypatch):
    import sim.run

    def boom(*a, **k):
        raise AssertionError("plot must not simulate")

    monkeypatch.setattr(sim.run, "simulate", boom)
    for name in NAMES:
        (study_dir / "plots" / f"{name}.png").unlink()
    (study_dir / "report.md").unlink()
    code, out, err = run_cli("plot", str(study_dir))
    assert code == 0, err
    for name in NAMES:
        assert (study_dir / "plots" / f"{name}.png").is_file()
    assert (study_dir / "report.md").is_file()


def test_report_has_verdicts_plots_and_settings(study_dir):
    text = (study_dir / "report.md").read_text()
    assert "## Verdicts" in text and "meets-target" in text and "does-not-fit" in text
    for name in NAMES:
        assert f"(plots/{name}.png)" in text
    assert "## Resolved settings" in text and "channel_bandwidth_GBps" in text
    assert "### Where the target holds, along `batch`" in text
    assert (study_dir / "detail" / "trace.json").is_file()


def test_study_trace_out_writes_a_chrome_trace(study_dir, tmp_path):
    import json

    code, out, err = run_cli("study", str(study_dir.parent / "plots.yaml"), "--out", str(study_dir), "--no-progress",
                             "--no-report", "--trace-out", str(tmp_path / "step.json"))
    assert code == 0, err
    assert "0 simulated" in out  # cached: the trace comes from the saved detail run
    events = json.loads((tmp_path / "step.json").read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert {"hbm", "compute"} <= tracks
    assert all(e["dur"] >= 0 for e in events if e["ph"] == "X")


def test_plot_of_a_folder_without_results_is_a_config_error(tmp_path):
    code, out, err = run_cli("plot", str(tmp_path))
    assert code == 2 and "results.parquet" in err and err.count("\n") == 1
