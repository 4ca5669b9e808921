"""Plots of serving replays (matplotlib, Agg backend; PNG).

* ``latency_vs_rate(table, path)``: for a sweep, p50 and p99 time per output token and p99
  time to first token against the request rate, one panel column per (hardware, model,
  weights), one colour per KV format, the target as a horizontal line;
* ``over_time(steps, path)``: for one replay, batch size, KV occupancy and queue length
  over simulated time (per-bin mean as a line, per-bin maximum as a shaded band).

Latencies are in ms in every panel of a figure (one unit per quantity; TTFT's log axis spans
seconds without a change of unit); elapsed time is in s, min or h, whichever keeps the
numbers readable.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from sim.io import write_with  # noqa: E402
from sim.units import MS_PER_S, S_PER_H, S_PER_MIN  # noqa: E402

OVER_TIME_BINS = 400


def time_unit_ms(values_ms) -> tuple[str, float]:
    """("ms", 1) or ("s", 1000): the unit that keeps ``values_ms`` readable, and the divisor."""
    finite = np.asarray([v for v in values_ms if v is not None and np.isfinite(v)], dtype=float)
    return ("s", MS_PER_S) if len(finite) and np.nanmax(finite) >= 10_000 else ("ms", 1.0)


def elapsed_unit_s(span_s: float) -> tuple[str, float]:
    """Unit for an elapsed-time axis spanning ``span_s`` seconds, and the divisor."""
    if span_s >= 3 * S_PER_H:
        return "h", S_PER_H
    if span_s >= 10 * S_PER_MIN:
        return "min", S_PER_MIN
    return "s", 1.0


def latency_vs_rate(table: pd.DataFrame, path: str | Path, target_ms: float | None = None) -> Path:
    """Latency against request rate for every (hardware, model, weights) of a sweep."""
    ok = table[table.get("status", "ok") == "ok"] if "status" in table else table
    groups = list(ok.groupby(["hardware", "model", "weights"], sort=False)) or [(("", "", ""), ok)]
    fig, axes = plt.subplots(2, len(groups), figsize=(5.2 * len(groups), 7.5), squeeze=False)
    formats = list(dict.fromkeys(ok["kv"])) if len(ok) else []
    colours = {fmt: plt.cm.viridis(i / max(1, len(formats) - 1)) for i, fmt in enumerate(formats)}
    for column, ((hardware, model, weights), group) in enumerate(groups):
        top, bottom = axes[0][column], axes[1][column]
        tpot_unit = ttft_unit = "ms"  # one time unit in the whole figure (TTFT on a log axis spans seconds fine)
        tpot_div = ttft_div = 1.0
        for fmt, rows in group.groupby("kv", sort=False):
            rows = rows.sort_values("rate_per_s")
            colour = colours[fmt]
            top.plot(rows["rate_per_s"], rows["tpot_ms_p99"] / tpot_div, "o-", color=colour, label=f"{fmt} p99")
            top.plot(rows["rate_per_s"], rows["tpot_ms_p50"] / tpot_div, "o--", color=colour, alpha=0.6,
                     label=f"{fmt} p50")
            bottom.plot(rows["rate_per_s"], rows["ttft_ms_p99"] / ttft_div, "o-", color=colour, label=f"{fmt} p99")
        if target_ms is not None:
            top.axhline(target_ms / tpot_div, color="crimson", lw=1, ls=":", label=f"target {target_ms:g} ms")
        top.set_title(f"{model} ({weights} weights) on {hardware}", fontsize=10)
        top.set_ylabel(f"time per output token ({tpot_unit})")
        bottom.set_ylabel(f"p99 time to first token ({ttft_unit})")
        bottom.set_yscale("log")
        bottom.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
        for ax in (top, bottom):
            ax.set_xlabel("request rate (requests/s)")
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
            ax.grid(alpha=0.3, which="both")
        top.legend(fontsize=7, ncol=2)
    fig.suptitle("Serving latency against request rate (open-loop replay)", fontsize=11)
    fig.tight_layout()
    return _save(fig, path)


def over_time(steps: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """Batch size, KV occupancy and queue length over the simulated time of one replay."""
    span = float(steps["t_start_s"].max()) if len(steps) else 0.0
    unit, div = elapsed_unit_s(span)
    bins = np.linspace(0.0, max(span, 1e-9), OVER_TIME_BINS + 1)
    which = np.clip(np.digitize(steps["t_start_s"], bins) - 1, 0, OVER_TIME_BINS - 1)
    weights = steps["step_ms"].to_numpy()
    centres = (bins[:-1] + bins[1:]) / 2 / div
    panels = [("batch", "sequences per step", 1.0), ("kv_occupancy", "KV pool occupancy (%)", 100.0),
              ("waiting", "waiting requests", 1.0)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 7.5), sharex=True)
    for ax, (column, label, scale) in zip(axes, panels, strict=True):
        values = steps[column].to_numpy(dtype=float) * scale
        mean = _binned(which, values * weights, OVER_TIME_BINS) / np.maximum(_binned(which, weights, OVER_TIME_BINS),
                                                                             1e-12)
        peak = _binned_max(which, values, OVER_TIME_BINS)
        idle = _binned(which, weights, OVER_TIME_BINS) <= 0  # no step began in the bin: a gap, not a zero
        mean[idle] = np.nan
        peak[idle] = np.nan
        ax.fill_between(centres, 0, peak, alpha=0.25, step="mid", label="max per bin")
        ax.plot(centres, mean, lw=1, label="time-weighted mean per bin")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[-1].set_xlabel(f"simulated time ({unit})")
    fig.suptitle(title or "Batch, KV occupancy and queue over time", fontsize=11)
    fig.tight_layout()
    return _save(fig, path)


def _binned(which: np.ndarray, values: np.ndarray, bins: int) -> np.ndarray:
    return np.bincount(which, weights=values, minlength=bins)[:bins]


def _binned_max(which: np.ndarray, values: np.ndarray, bins: int) -> np.ndarray:
    out = np.zeros(bins)
    np.maximum.at(out, which, values)
    return out


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    write_with(path, lambda tmp: fig.savefig(tmp, dpi=110, format=path.suffix[1:] or "png"))
    plt.close(fig)
    return path


__all__ = ["latency_vs_rate", "over_time", "time_unit_ms", "elapsed_unit_s"]
