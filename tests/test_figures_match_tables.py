"""Issue 22: figures drawn from the same rows as their tables. Stacked bars sum to the
table's ms per token (kernel start-up included), a breakdown row has one colour in every
figure, the target contour is drawn only over numeric axes, a serving figure uses one time
unit, and a quantized-KV breakdown says its KV reads sit under dequantization."""

from __future__ import annotations

from collections import defaultdict

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")
from matplotlib.patches import Rectangle  # noqa: E402

from sim.report import figures, plots  # noqa: E402
from sim.report.figures import ROW_COLOURS, row_colour, row_label, stacked_rows  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

FRONTIER = ROOT / "reports" / "kv-format-frontier"


def _capture(monkeypatch, module, name="save"):
    figs = []

    def keep(fig, *args, **kwargs):
        figs.append(fig)
        return []

    monkeypatch.setattr(module, name, keep)
    return figs


def _bar_totals(fig) -> dict[float, float]:
    totals: dict[float, float] = defaultdict(float)
    for ax in fig.axes:
        for patch in ax.patches:
            if isinstance(patch, Rectangle) and patch.get_width() < 1.5 and patch.get_height() > 0:
                totals[round(patch.get_x() + patch.get_width() / 2, 6)] += patch.get_height()
    return dict(totals)


def _legend_colours(fig) -> dict[str, tuple]:
    out = {}
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        for text, handle in zip(legend.get_texts(), legend.legend_handles, strict=False):
            if hasattr(handle, "get_facecolor"):
                out[text.get_text().split("\n")[0]] = tuple(np.round(handle.get_facecolor()[:3], 6))
    return out


@pytest.mark.skipif(not (FRONTIER / "results.parquet").is_file(), reason="bundled study report absent")
def test_study_breakdown_bars_sum_to_the_table_ms_per_token(monkeypatch):
    grid, settings = figures.load(FRONTIER)
    assert "ms_kernel_startup" in grid and grid["ms_kernel_startup"].max() > 0
    figs = _capture(monkeypatch, plots)
    plots.breakdown(grid, settings, FRONTIER / "unused")
    totals = sorted(_bar_totals(figs[0]).values())
    sel = plots._breakdown_rows(plots.ok_rows(grid), settings)  # the points the figure draws
    axes = [a for a in plots.varying(settings) if a in sel and sel[a].astype(str).nunique() > 1]
    means = sorted(plots._mean_over_seeds(sel, axes, ["per_token_ms_mean"])["per_token_ms_mean"].head(40))
    assert len(totals) == len(means) > 1
    assert totals == pytest.approx(means, rel=1e-9)  # each bar: its point's mean step time, start-up included
    colours = _legend_colours(figs[0])
    for row in ("kv", "weights", "kernel_startup"):
        assert colours[row_label(row).split("\n")[0]] == tuple(np.round(row_colour(row)[:3], 6))


def test_moe_bars_include_kernel_startup_and_sum_to_ms_per_token():
    from sim.config.spec import RunSpec
    from sim.report import moe_report
    from sim.run import simulate

    summary = simulate(RunSpec(model="mixtral-8x7b", steps=1, context=1024, engine="analytic")).summary
    assert summary["breakdown_ms"].get("kernel_startup", 0) > 0
    setup = "s"
    by = {(setup, d): summary for d in moe_report.DISPATCHES}
    rows, stacks = moe_report.bar_stacks(by, [setup])
    assert "kernel_startup" in rows
    for key in by:
        assert sum(stacks[key].values()) == pytest.approx(summary["per_token_ms_mean"], rel=1e-9)


def test_one_colour_per_row_and_every_row_stacked():
    assert len(set(ROW_COLOURS.values())) == len(ROW_COLOURS)
    assert set(figures.ROW_ORDER) <= set(ROW_COLOURS)
    from sim.results import BOUND_OF

    assert set(BOUND_OF) <= set(figures.ROW_ORDER)  # every row sim.results assigns time to is drawn
    assert stacked_rows([{"kv": 1.0, "zzz_new": 0.5, "weights": 0.0}, {"kernel_startup": 2.0}]) == [
        "kv", "kernel_startup", "zzz_new"]


def test_dequant_label_says_when_quantized_kv_reads_are_in_it():
    assert "KV reads" in row_label("dequant", ["fp16", "kivi-2"])
    assert "KV reads" not in row_label("dequant", ["fp16"])


def test_contour_only_over_numeric_axes():
    z = np.array([[5.0, 12.0], [8.0, 20.0]])
    assert plots.contour_allowed([1, 2], [10, 20], z, 10.0)
    assert not plots.contour_allowed(["fp16", "int8"], [10, 20], z, 10.0)
    assert not plots.contour_allowed([1, 2], ["a", "b"], z, 10.0)
    assert not plots.contour_allowed([1, 2], [10, 20], np.full((2, 2), np.nan), 10.0)


def test_latency_vs_rate_uses_one_time_unit(monkeypatch, tmp_path):
    from sim.serve import plots as serve_plots

    figs = _capture(monkeypatch, serve_plots, "_save")
    rows = [{"hardware": "h", "model": m, "weights": "bf16", "kv": "fp16", "status": "ok", "rate_per_s": r,
             "tpot_ms_p99": 6.0 * r, "tpot_ms_p50": 5.0 * r, "ttft_ms_p99": 30_000.0 * r}
            for m in ("a", "b") for r in (1, 2)]
    serve_plots.latency_vs_rate(pd.DataFrame(rows), tmp_path / "x.png", target_ms=10)
    units = {ax.get_ylabel().rsplit("(", 1)[-1] for ax in figs[0].axes if ax.get_ylabel()}
    assert units == {"ms)"}, units
