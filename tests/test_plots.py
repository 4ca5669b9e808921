"""Study plots and report: every plot type is rendered from a small study and its titles,
labels and ticks are checked against the data it plots (a title never names a setting the
plotted rows do not have); redrawn from saved results by ``decodesim plot DIR`` without
simulating."""

from __future__ import annotations

import json
import re
import struct
import textwrap

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from sim.report import claims, detail_plots, labels, plots
from sim.report.figures import load
from tests.conftest import run_cli
from tests.test_trace_export import check_trace

STUDY = """
name: plots
base: {steps: 1}
sweep:
  grid:
    batch: [1, 16, 64]
    context: [1024, 16384, 65536]
    kv: [fp16, kivi-2]
  zip:
    model: [llama-3-8b, llama-3.2-1b]
    weights: [bf16, fp8]
sensitivity: {percent: 20, knobs: [hardware.hbm.channel_bandwidth_GBps, batch, hardware.system.links.bandwidth_GBps]}
plots:
  claims:
    - {name: kv, title: "kivi-2 against fp16", claimed: {kv: kivi-2}, baseline: {kv: fp16}, rows: [model],
       at: [{batch: 16, context: 16384}, {batch: 64, context: 65536}]}
  feasibility: [batch, context]
  facet: [model, kv]
  detail: {batch: 16, context: 16384, kv: kivi-2, model: llama-3-8b}
"""
NAMES = ["claim-kv", "breakdown", "feasibility", "tornado", "bandwidth", "roofline"]


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plots")
    path = folder / "plots.yaml"
    path.write_text(textwrap.dedent(STUDY))
    code, out, err = run_cli("study", str(path), "--out", str(folder / "out"), "--jobs", "1", "--no-progress")
    assert code == 0, err
    return folder / "out"


@pytest.fixture(scope="module")
def grid(study_dir):
    table, _ = load(study_dir)
    return table[table["group"] == "grid"]


def texts(fig) -> dict:
    """Every piece of text a figure shows, by where it is."""
    out = {"suptitle": fig._suptitle.get_text() if fig._suptitle else "", "figure": [t.get_text() for t in fig.texts],
           "axes": []}
    for ax in fig.axes:
        legend = ax.get_legend()
        out["axes"].append({
            "title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
            "xticks": [t.get_text() for t in ax.get_xticklabels()], "yticks": [t.get_text() for t in ax.get_yticklabels()],
            "legend": [t.get_text() for t in legend.get_texts()] if legend else [],
            "texts": [t.get_text() for t in ax.texts], "images": len(ax.images)})
    out["legends"] = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    return out


def all_text(info: dict) -> str:
    parts = [info["suptitle"], *info["figure"], *info["legends"]]
    for ax in info["axes"]:
        parts += [ax["title"], ax["xlabel"], ax["ylabel"], *ax["xticks"], *ax["yticks"], *ax["legend"], *ax["texts"]]
    return "\n".join(parts)


def capture(mp) -> dict[str, dict]:
    """Patch the plot modules' ``save`` so figures are kept as their texts, not written."""
    figures: dict[str, dict] = {}

    def keep(fig, folder, name):
        fig.canvas.draw()  # tick labels are set at draw time
        figures[name] = texts(fig)
        plt.close(fig)
        return [str(folder / f"{name}.png")]

    for module in (plots, claims, detail_plots):
        mp.setattr(module, "save", keep)
    return figures


@pytest.fixture
def captured(monkeypatch):
    """Figures by file name, instead of writing them."""
    return capture(monkeypatch)


@pytest.fixture(scope="module")
def drawn(study_dir, tmp_path_factory):
    """Every plot of the study, drawn once into texts (the study folder is left alone)."""
    table, settings = load(study_dir)
    grid = table[table["group"] == "grid"]
    folder = tmp_path_factory.mktemp("drawn")
    with pytest.MonkeyPatch.context() as mp:
        figures = capture(mp)
        plots.breakdown(grid, settings, folder)
        plots.feasibility(grid, settings, folder)
        plots.tornado(table[table["group"] == "sensitivity"], settings, folder)
        claims.claim_plots(grid, settings, folder)
        detail_plots.bandwidth(study_dir / "detail", folder)
        detail_plots.roofline(study_dir / "detail", folder)
    return figures


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


def test_feasibility_titles_name_exactly_the_weight_formats_in_each_panel(drawn, grid):
    info = drawn["feasibility"]
    panels = [ax for ax in info["axes"] if ax["images"]]
    assert len(panels) == 4  # model x kv
    assert "weights=" not in info["suptitle"]  # the panels differ: never one global label
    for ax in panels:
        model = re.search(r"model=([\w.-]+)", ax["title"]).group(1)
        kv = re.search(r"kv=([\w.-]+)", ax["title"]).group(1)
        rows = grid[(grid["model"] == model) & (grid["kv"] == kv)]
        assert set(re.findall(r"weights=([\w.-]+)", ax["title"])) == set(rows["weights"]), ax["title"]
        assert ax["xlabel"] == "batch (sequences)" and ax["ylabel"] == "context (tokens)"
        assert ax["xticks"] == ["1", "16", "64"] and ax["yticks"] == ["1024", "16384", "65536"]
    shown = set(re.findall(r"weights=([\w.-]+)", all_text(info)))
    assert shown == set(grid["weights"])


def test_feasibility_drops_panels_without_data_and_names_them(study_dir, captured, tmp_path):
    table, settings = load(study_dir)
    grid = table[table["group"] == "grid"].copy()
    dead = (grid["model"] == "llama-3.2-1b") & (grid["kv"] == "kivi-2")
    grid.loc[dead, "status"] = "error"
    grid.loc[dead, plots.LATENCY] = float("nan")
    plots.feasibility(grid, settings, tmp_path)
    info = captured["feasibility"]
    titles = [ax["title"] for ax in info["axes"] if ax["images"]]
    assert len(titles) == 3 and not any("llama-3.2-1b" in t and "kivi-2" in t for t in titles)
    assert "no panel for model=llama-3.2-1b, kv=kivi-2" in info["suptitle"]


def test_feasibility_beyond_the_panel_cap_is_one_figure_per_facet_value(study_dir, monkeypatch, captured, tmp_path):
    monkeypatch.setattr(plots, "MAX_PANELS", 2)
    copy = tmp_path / "copy"
    for name in ("results.parquet", "study.json"):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_bytes((study_dir / name).read_bytes())
    (copy / "plots").mkdir()
    (copy / "plots" / "feasibility.png").write_bytes(b"stale")
    written = {p.split("/")[-1] for p in plots.make_plots(copy)}
    assert {"feasibility-llama-3-8b.png", "feasibility-llama-3.2-1b.png"} <= written
    assert not (copy / "plots" / "feasibility.png").exists()  # the stale single map is gone


def test_labels_are_human_words_with_units_and_engineering_ticks(drawn):
    for name, info in drawn.items():
        text = all_text(info)
        assert "hardware." not in text, name  # no raw dotted path
        assert not re.search(r"\de[+-]\d", text), (name, re.findall(r"\S*\de[+-]\d\S*", text))
    tornado = drawn["tornado"]["axes"][0]
    assert "HBM bandwidth per channel (GB/s)" in tornado["yticks"] and "batch (sequences)" in tornado["yticks"]
    assert drawn["breakdown"]["axes"][0]["ylabel"].startswith("time per decode step (ms")


def test_tornado_names_the_knobs_with_no_effect(drawn, study_dir):
    from sim.report.plots import no_effect, sensitivity_swings

    table, _ = load(study_dir)
    base, bars = sensitivity_swings(table[table["group"] == "sensitivity"])
    idle = {knob for knob, lo, hi in bars if no_effect(base, lo, hi)}
    assert idle == {"hardware.system.links.bandwidth_GBps"}  # one chip: no link traffic
    info = drawn["tornado"]
    assert labels.label("hardware.system.links.bandwidth_GBps") not in info["axes"][0]["yticks"]
    note = " ".join(info["figure"])
    assert "no effect" in note and labels.label("hardware.system.links.bandwidth_GBps") in note
    assert "kv=kivi-2" in info["axes"][0]["title"]  # the point the knobs move around, from the data


def test_roofline_has_every_memory_level_roof_and_the_vector_ceiling(drawn, study_dir):
    meta = json.loads((study_dir / "detail" / "meta.json").read_text())
    legend = drawn["roofline"]["axes"][0]["legend"]
    for level in meta["levels"]:
        assert any(entry.startswith(f"{labels.resource(level)} roof") for entry in legend), (level, legend)
    assert any(entry.startswith("vector-unit ceiling (dequantization") for entry in legend)
    assert any(entry.startswith("bytes at") for entry in legend)


def test_bandwidth_draws_only_resources_that_were_used(drawn, study_dir):
    events = pd.read_parquet(study_dir / "detail" / "events.parquet")
    meta = json.loads((study_dir / "detail" / "meta.json").read_text())
    info = drawn["bandwidth"]
    shown = [ax["ylabel"].split("\n")[0] for ax in info["axes"]]
    assert shown and all(s in {labels.resource(r) for r in meta["peaks_GBps"]} for s in shown)
    moving = set(events[events["bytes"] > 0]["resource"]) & set(meta["peaks_GBps"])
    for resource in moving:
        name = labels.resource(resource)
        assert name in shown or name in info["suptitle"], resource  # drawn, or named as unused


def test_claim_figure_rows_and_counts_come_from_the_data(drawn, grid):
    info = drawn["claim-kv"]
    first = info["axes"][0]
    assert list(reversed(first["yticks"])) == list(dict.fromkeys(grid["model"]))
    for ax, (batch, context) in zip(info["axes"], [(16, 16384), (64, 65536)], strict=True):
        assert f"batch={batch}, context={context}" in ax["title"]
        at = grid[(grid["batch"] == batch) & (grid["context"] == context)]
        claimed = at[(at["kv"] == "kivi-2") & at["meets_target"].fillna(False).astype(bool)]
        baseline = at[(at["kv"] == "fp16") & at["meets_target"].fillna(False).astype(bool)]
        assert f"claimed meets 10 ms in {claimed['model'].nunique()}/2 rows (baseline {baseline['model'].nunique()}/2)" \
            in ax["title"]
        assert ax["xlabel"] == "p99 per-token latency (ms)"
    assert "claimed: kv kivi-2" in info["suptitle"] and "baseline: kv fp16" in info["suptitle"]


def test_moe_report_panel_titles_come_from_the_run_summaries(monkeypatch, tmp_path):
    from sim.report import moe_report

    seen = []
    monkeypatch.setattr(plt, "close", lambda fig=None: seen.append(texts(fig)))

    def summary(setup, dispatch):
        chips = 576 if "groq" in setup else 8
        return {"model": setup.split(",")[0].lower(), "weights": setup.split(",")[0].split()[-1],
                "hardware": "groq-lpu" if "groq" in setup else "h200-sxm", "chips": chips, "tp": 8, "pp": chips // 8,
                "moe": {"expert_parallel": 1, "placement": "static"}, "target_ms": 10.0, "batch": 8,
                "context": 4096, "kv": "fp16", "breakdown_ms": {"weights": 1.0, "launch_sync": 0.0}}

    results = [{"setup": s, "batch": moe_report.PLOT_BATCH, "dispatch": d, "summary": summary(s, d)}
               for s in moe_report.PLOT_SETUPS for d in moe_report.DISPATCHES]
    moe_report.plot_breakdown(results, tmp_path / "moe.png")
    info = seen[-1]
    for ax, setup in zip(info["axes"], moe_report.PLOT_SETUPS, strict=False):
        s = summary(setup, "device")
        assert ax["title"].startswith(f"{s['model']}, weights {s['weights']}\n{s['hardware']} x{s['chips']}")
    assert "batch 8, context 4096, KV fp16" in info["suptitle"]
    assert "launch + sync" not in all_text(info)  # zero in every run: not in the legend


def test_engineering_numbers():
    assert labels.eng(12580) == "12.6k" and labels.eng(1.258e4) == "12.6k"
    assert labels.eng(999960) == "1M" and labels.eng(0.00042) == "420µ" and labels.eng(0.5) == "0.5"
    assert labels.tick(32768) == "32768" and labels.tick(12589.254) == "12.59k" and labels.tick(18.75) == "18.75"
    assert labels.label("hardware.hbm.channel_bandwidth_GBps") == "HBM bandwidth per channel (GB/s)"
    assert labels.label("hardware.sram.capacity_MB") == "SRAM capacity (MB)"
    assert labels.label("hardware.memory.l2.latency_ns") == "L2 latency (ns)"


def test_feasibility_marks_points_that_do_not_fit(study_dir, grid):
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


def test_report_has_claims_verdicts_plots_and_relative_settings(study_dir):
    text = (study_dir / "report.md").read_text()
    assert "## Claims, one figure each" in text and "(plots/claim-kv.png)" in text
    assert "## Verdicts" in text and "meets-target" in text and "does-not-fit" in text
    for name in NAMES:
        assert f"(plots/{name}.png)" in text
    assert "## Resolved settings" in text and "channel_bandwidth_GBps" in text
    assert "### Where the target holds, along `batch`" in text
    assert "- Hardware file (base): `hardware_profiles/h200-sxm.yaml`" in text
    assert str(study_dir.parent.parent) not in text  # no absolute path of this machine
    assert (study_dir / "detail" / "trace.json").is_file()


def test_study_trace_out_writes_a_chrome_trace(study_dir, tmp_path):
    code, out, err = run_cli("study", str(study_dir.parent / "plots.yaml"), "--out", str(study_dir), "--no-progress",
                             "--no-report", "--trace-out", str(tmp_path / "step.json"))
    assert code == 0, err
    assert "0 simulated" in out  # cached: the trace comes from the saved detail run
    events = check_trace(json.loads((tmp_path / "step.json").read_text()))
    tracks = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"hbm (memory level)", "compute (tile group 1)"} <= tracks


def test_plot_of_a_folder_without_results_is_a_config_error(tmp_path):
    code, out, err = run_cli("plot", str(tmp_path))
    assert code == 2 and "results.parquet" in err and err.count("\n") == 1


def test_report_paths_never_show_this_machine():
    from sim.paths import display_path, relative_text

    assert display_path("/elsewhere/checkout/workloads/models/llama-3-8b.yaml") == "workloads/models/llama-3-8b.yaml"
    assert display_path("/tmp/q/study.yaml", "/tmp/q/out") == "../study.yaml"
    assert display_path("workloads/x.yaml") == "workloads/x.yaml"
    message = "ConfigError: /home/u/decodesim/workloads/formats/int2-asym-outlier.yaml: group_size: must divide"
    assert relative_text(message) == "ConfigError: workloads/formats/int2-asym-outlier.yaml: group_size: must divide"
