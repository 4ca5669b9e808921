"""Study plots from saved results (no simulation): PNG and SVG, human axis names with units.

* ``claim-<name>``: one figure per claim the study names (``plots.claims``): the claimed
  setting against the baseline, row by row, with the target line (sim.report.claims);
* ``breakdown``: per-token latency split into its rows (weights, KV, launch/sync, ...) as
  stacked bars, one bar per point along one axis;
* ``feasibility``: p99 per-token latency over two swept axes (one panel per value of the
  facet axes) with the target contour drawn and points that do not fit marked. Panels with
  no point that ran are dropped (and named); beyond ``MAX_PANELS`` panels the map is split
  into one figure per value of the first facet axis (``feasibility-<value>``);
* ``tornado``: how far p99 latency moves for -X% and +X% on each sensitivity knob; knobs
  with no effect are left out and named under the plot;
* ``bandwidth`` and ``roofline``: one decode step of the detail point, from the DES event
  log (sim.report.detail_plots).

Every title and subtitle is derived from the rows actually plotted (sim.report.figures:
``held``): a setting shared by every panel goes in the figure title, a setting that differs
between panels in each panel's title. Inputs are the files the runner writes:
``results.parquet``, ``study.json`` and ``detail/{ops,events}.parquet`` + ``detail/meta.json``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.ticker import FuncFormatter

from sim.report import labels
from sim.report.claims import claim_plots
from sim.report.detail_plots import bandwidth, roofline
from sim.report.energy_plot import energy
from sim.report.figures import (
    LATENCY,
    MAX_PANELS,
    ROW_ORDER,
    axis_ticks,
    axis_title,
    detail_values,
    eng_axis,
    held,
    key,
    keys,
    load,
    ok_rows,
    row_colour,
    row_label,
    save,
    settings_text,
    slug,
    stacked_rows,
    study_axes,
    target_ms,
    varying,
)

__all__ = ["make_plots", "breakdown", "feasibility", "tornado", "bandwidth", "roofline", "sensitivity_swings",
           "load", "LATENCY", "ROW_ORDER", "NO_EFFECT_FRACTION"]

NO_EFFECT_FRACTION = 1e-3  # a knob moving p99 by less than this fraction of the base has no effect


def make_plots(out_dir: str | Path) -> list[str]:
    """(Re)draw every plot the saved results allow; returns the written paths. Plot files
    of an earlier drawing that this one did not write (a map since split, a panel since
    dropped) are removed, so the folder shows only what the results support now."""
    out_dir = Path(out_dir)
    table, settings = load(out_dir)
    folder = out_dir / "plots"
    written: list[str] = []
    grid = table[table["group"] == "grid"]
    for maker in (lambda: claim_plots(grid, settings, folder), lambda: breakdown(grid, settings, folder),
                  lambda: feasibility(grid, settings, folder),
                  lambda: tornado(table[table["group"] == "sensitivity"], settings, folder),
                  lambda: bandwidth(out_dir / "detail", folder), lambda: roofline(out_dir / "detail", folder),
                  lambda: energy(grid, settings, folder)):
        written += maker() or []
    if folder.is_dir():
        for stale in list(folder.glob("*.png")) + list(folder.glob("*.svg")):
            if str(stale) not in written:
                stale.unlink()
    return written


def _mean_over_seeds(frame: pd.DataFrame, keys_: list[str], columns: list[str]) -> pd.DataFrame:
    if not keys_:
        return frame[columns].mean(numeric_only=True).to_frame().T
    return frame.groupby(keys_, sort=False, dropna=False)[columns].mean(numeric_only=True).reset_index()


# -- breakdown ------------------------------------------------------------------------------


def _breakdown_rows(sel: pd.DataFrame, settings: dict) -> pd.DataFrame:
    """The points the breakdown shows: all, or (when many) those at the detail point's
    values of every axis but the one the bars run along."""
    vary = varying(settings)
    along = settings["study"].get("plots", {}).get("breakdown") or (vary[0] if vary else None)
    if not along or len(sel) <= 24:
        return sel
    fixed = detail_values(settings)
    for axis in vary:
        if axis != along and axis in sel:
            sub = sel[keys(sel[axis]) == key(fixed.get(axis))]
            if not sub.empty:
                sel = sub
    return sel


def breakdown(grid: pd.DataFrame, settings: dict, folder: Path) -> list[str]:
    """Stacked bars of the per-step time by breakdown row, one bar per point."""
    ok = ok_rows(grid)
    if ok.empty:
        return []
    sel = _breakdown_rows(ok, settings)
    vary = varying(settings)
    label_axes = [a for a in vary if a in sel and sel[a].astype(str).nunique() > 1]
    rows = stacked_rows([{c[3:]: float(sel[c].fillna(0.0).abs().max()) for c in sel.columns if c.startswith("ms_")}])
    cols = [f"ms_{r}" for r in rows]
    data = _mean_over_seeds(sel.fillna({c: 0.0 for c in cols}), label_axes, cols + [LATENCY]).head(40)
    ticks, tilt = _bar_ticks(data, label_axes, settings)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(data) + 2), 4.8))
    _stack_bars(ax, data, rows, [str(v) for v in sel["kv"].dropna().unique()] if "kv" in sel else [])
    target = target_ms(grid, default=0.0)
    if target:
        ax.axhline(target, color="crimson", lw=1.2, ls="--", label=f"target {target:g} ms")
    ax.set_xticks(range(len(data)), ticks, fontsize=7, rotation=45 if tilt else 0, ha="right" if tilt else "center")
    ax.set_ylabel("time per decode step (ms, mean over steps)")
    ax.set_xlabel(axis_title(label_axes[0], settings) if len(label_axes) == 1 else _axes_label(label_axes))
    note = settings_text(held(sel, [a for a in vary if a not in label_axes]))
    ax.set_title(f"{settings['name']}: time per decode step by part" + (f"\n(at {note})" if note else ""),
                 fontsize=10)
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    eng_axis(ax, "y")
    return save(fig, folder, "breakdown")


def _bar_ticks(data: pd.DataFrame, label_axes: list[str], settings: dict) -> tuple[list[str], bool]:
    """One tick per bar (the value of the one labelled axis, or every labelled setting) and
    whether they must be tilted to fit."""
    if len(label_axes) == 1:
        ticks = axis_ticks(label_axes[0], list(data[label_axes[0]]), settings)
    else:
        sep = "\n" if len(data) <= 8 else ", "
        ticks = [sep.join(labels.setting(a, r[a]) for a in label_axes) or "base" for _, r in data.iterrows()]
    tilt = max((max(len(p) for p in t.split("\n")) for t in ticks), default=0) * len(data) > 70
    return ticks, tilt


def _axes_label(label_axes: list[str]) -> str:
    return labels.label(label_axes[0]) if len(label_axes) == 1 else labels.join_pairs(label_axes) or "point"


def _stack_bars(ax, data: pd.DataFrame, rows: list[str], kv_formats: list[str]) -> None:
    """The breakdown rows stacked bar on bar (rows with no time at any point left out)."""
    bottom = np.zeros(len(data))
    for row in rows:
        values = data[f"ms_{row}"].to_numpy(dtype=float)
        if not values.any():
            continue
        ax.bar(range(len(data)), values, bottom=bottom, label=row_label(row, kv_formats), color=row_colour(row),
               width=0.75)
        bottom += values


# -- feasibility ----------------------------------------------------------------------------


def _numeric(values: list) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


@dataclass
class Panel:
    """One heatmap panel: its rows, the settings they hold, and the cells."""

    facet: dict  # facet axis -> value
    rows: pd.DataFrame
    settings: dict  # every non-plotted axis constant in ``rows`` -> its value
    z: np.ndarray  # mean p99 ms per cell (nan: no value)
    unfit: np.ndarray  # ran, does not fit in memory
    failed: np.ndarray  # every run of the cell failed

    @property
    def has_data(self) -> bool:
        return bool(np.isfinite(self.z).any() or self.unfit.any())


def _heatmap_axes(settings: dict) -> tuple[str, str] | None:
    chosen = settings["study"].get("plots", {}).get("feasibility")
    if chosen:
        return chosen[0], chosen[1]
    vary = varying(settings)
    axes = study_axes(settings)
    numeric = [a for a in vary if _numeric(axes[a])]
    pick = (numeric + [a for a in vary if a not in numeric])[:2]
    return (pick[0], pick[1]) if len(pick) == 2 else None


def _facets(settings: dict, grid: pd.DataFrame, x_axis: str, y_axis: str) -> list[str]:
    facet = settings["study"].get("plots", {}).get("facet")
    if facet:
        facets = [facet] if isinstance(facet, str) else list(facet)
    else:
        facets = [a for a in varying(settings) if a not in (x_axis, y_axis)]
    return [f for f in facets if f in grid]


def _panel_rows(grid: pd.DataFrame, settings: dict, facet: dict, plotted: tuple[str, ...]) -> pd.DataFrame:
    """The rows of one panel: its facet values, every other swept axis at the detail
    point's value where the panel has it (else at the panel's first value of that axis)."""
    sel = grid
    for axis, value in facet.items():
        sel = sel[keys(sel[axis]) == value]
    fixed = detail_values(settings)
    for axis in varying(settings):
        if axis in plotted or axis in facet or axis not in sel or sel[axis].nunique() <= 1:
            continue
        wanted = key(fixed.get(axis))
        present = keys(sel[axis])
        sel = sel[present == (wanted if (present == wanted).any() else present.iloc[0])]
    return sel


def _cells(sel: pd.DataFrame, x_axis: str, y_axis: str, xs: list, ys: list):
    z = np.full((len(ys), len(xs)), np.nan)
    unfit = np.zeros_like(z, dtype=bool)
    failed = np.zeros_like(z, dtype=bool)
    x_keys, y_keys = keys(sel[x_axis]), keys(sel[y_axis])
    latency = pd.to_numeric(sel[LATENCY], errors="coerce") if LATENCY in sel else pd.Series(np.nan, sel.index)
    for i, yv in enumerate(ys):
        for j, xv in enumerate(xs):
            inside = (x_keys == key(xv)) & (y_keys == key(yv))
            cell = sel[inside]
            if cell.empty:
                continue
            good = (cell["status"] == "ok") & latency[inside].notna()
            if good.any():
                z[i, j] = latency[inside][good].mean()
            elif (cell["status"] == "ok").any():
                unfit[i, j] = True
            else:
                failed[i, j] = True
    return z, unfit, failed


def _panels(grid: pd.DataFrame, settings: dict, x_axis: str, y_axis: str, facets: list[str]) -> list[Panel]:
    axes = study_axes(settings)
    combos = grid[facets].map(key).drop_duplicates().values.tolist() if facets else [[]]
    others = [a for a in varying(settings) if a not in (x_axis, y_axis)]
    out = []
    for combo in combos:
        facet = dict(zip(facets, combo, strict=True))
        sel = _panel_rows(grid, settings, facet, (x_axis, y_axis))
        z, unfit, failed = _cells(sel, x_axis, y_axis, axes[x_axis], axes[y_axis])
        out.append(Panel(facet, sel, held(sel, others), z, unfit, failed))
    return out


def _split(panels: list[Panel], facets: list[str]) -> list[tuple[str, list[Panel]]]:
    """(file name, panels) per figure: one figure, or one per value of the first facet."""
    if len(panels) <= MAX_PANELS or not facets:
        return [("feasibility", panels[:MAX_PANELS])]
    groups: dict[str, list[Panel]] = {}
    for panel in panels:
        groups.setdefault(panel.facet[facets[0]], []).append(panel)
    return [(f"feasibility-{slug(value)}", members[:MAX_PANELS]) for value, members in groups.items()]


def feasibility(grid: pd.DataFrame, settings: dict, folder: Path) -> list[str]:
    """Heatmaps of p99 latency over two swept axes, target contour, unfit points hatched."""
    picked = _heatmap_axes(settings)
    if picked is None or grid.empty or picked[0] not in grid or picked[1] not in grid:
        return []
    x_axis, y_axis = picked
    latency = pd.to_numeric(grid[LATENCY], errors="coerce") if LATENCY in grid else pd.Series(np.nan, grid.index)
    good = latency[(grid["status"] == "ok") & latency.notna() & (latency > 0)]
    if good.empty:
        return []
    target = target_ms(grid)
    norm = LogNorm(vmin=max(good.min(), 1e-3), vmax=max(good.max(), target * 1.01, good.min() * 1.01))
    facets = _facets(settings, grid, x_axis, y_axis)
    panels = _panels(grid, settings, x_axis, y_axis, facets)
    dropped = [p for p in panels if not p.has_data]
    panels = [p for p in panels if p.has_data]
    written: list[str] = []
    for name, members in _split(panels, facets):
        written += _feasibility_figure(members, dropped if name == "feasibility" or not facets else
                                       [d for d in dropped if d.facet[facets[0]] == members[0].facet[facets[0]]],
                                       settings, x_axis, y_axis, norm, target, folder, name)
    return written


def _feasibility_figure(panels: list[Panel], dropped: list[Panel], settings: dict, x_axis: str, y_axis: str,
                        norm, target: float, folder: Path, name: str) -> list[str]:
    axes = study_axes(settings)
    xs, ys = axes[x_axis], axes[y_axis]
    shared = {a: v for a, v in panels[0].settings.items()
              if all(a in p.settings and key(p.settings[a]) == key(v) for p in panels)}
    n = len(panels)
    ncols = min(n, 3 if n <= 6 else 4)
    nrows = math.ceil(n / ncols)
    fig, grid_axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols + 1.4, 3.9 * nrows + 0.6), squeeze=False,
                                  layout="constrained")
    image = None
    for k, panel in enumerate(panels):
        ax = grid_axes[k // ncols][k % ncols]
        image = _draw_panel(ax, panel, xs, ys, norm, target)
        ax.set_xticks(range(len(xs)), axis_ticks(x_axis, xs, settings), fontsize=7,
                      rotation=45 if len(xs) > 6 else 0)
        ax.set_yticks(range(len(ys)), axis_ticks(y_axis, ys, settings), fontsize=7)
        ax.set_xlabel(axis_title(x_axis, settings))
        ax.set_ylabel(axis_title(y_axis, settings))
        own = {a: v for a, v in panel.settings.items() if a not in shared}
        ax.set_title(settings_text(own) or settings["name"], fontsize=9)
    for k in range(n, nrows * ncols):
        grid_axes[k // ncols][k % ncols].axis("off")
    if image is not None:
        bar = fig.colorbar(image, ax=grid_axes.ravel().tolist(), shrink=0.85)
        bar.set_label("p99 per-token latency (ms, log scale)")
        bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: labels.eng(v)))
        bar.ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _p: labels.eng(v) if f"{v:.1g}"[0] in "25" else ""))
        bar.ax.axhline(target, color="crimson", lw=2)
    lines = [f"{settings['name']}: p99 per-token latency over {labels.join_pairs([x_axis, y_axis])}",
             (f"(red contour: {target:g} ms target; hatched: does not fit in memory)" if _numeric(xs) and _numeric(ys)
              else f"(white numbers: over the {target:g} ms target, no contour across a categorical axis; "
                   "hatched: does not fit in memory)")]
    if shared:
        lines.append(f"every panel at {settings_text(shared)}")
    if dropped:
        lines.append("no panel for " + "; ".join(settings_text(d.facet) for d in dropped)
                     + " (no point ran: see the report's failed points)")
    fig.suptitle("\n".join(lines), fontsize=10)
    return save(fig, folder, name)


def contour_allowed(xs: list, ys: list, z: np.ndarray, target: float) -> bool:
    """A target contour interpolates between cells, which means something only when both axes
    are numbers (between two KV formats there is nothing to interpolate); it also needs two
    values per axis and latencies on both sides of the target."""
    finite = z[np.isfinite(z)]
    return (_numeric(xs) and _numeric(ys) and min(z.shape) > 1 and len(finite) > 0
            and finite.min() < target < finite.max())


def _draw_panel(ax, panel: Panel, xs: list, ys: list, norm, target: float):
    z, unfit, failed = panel.z, panel.unfit, panel.failed
    image = ax.imshow(z, origin="lower", aspect="auto", cmap="viridis_r", norm=norm, interpolation="nearest")
    for i in range(len(ys)):
        for j in range(len(xs)):
            if unfit[i, j]:
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=True, fc="0.85", ec="0.5", hatch="//"))
                ax.text(j, i, "no fit", ha="center", va="center", fontsize=6, color="0.2")
            elif failed[i, j]:
                ax.text(j, i, "error", ha="center", va="center", fontsize=6, color="red")
            elif not np.isnan(z[i, j]) and len(xs) * len(ys) <= 64:
                ax.text(j, i, labels.eng(z[i, j], 2 if z[i, j] < 10 else 3), ha="center", va="center", fontsize=6,
                        color="white" if z[i, j] > target else "black")
    if contour_allowed(xs, ys, z, target):
        # masked, not filled: no line is drawn across cells without a latency (unfit, failed)
        contour = ax.contour(np.arange(len(xs)), np.arange(len(ys)), np.ma.masked_invalid(z), levels=[target],
                             colors="crimson", linewidths=2)
        if contour.allsegs and any(len(seg) for seg in contour.allsegs[0]):
            ax.clabel(contour, fmt=f"{target:g} ms", fontsize=7)
    ax.set_xticks(range(len(xs)), [labels.axis_tick(v) for v in xs], fontsize=7, rotation=45 if len(xs) > 6 else 0)
    ax.set_yticks(range(len(ys)), [labels.axis_tick(v) for v in ys], fontsize=7)
    return image


# -- tornado --------------------------------------------------------------------------------


def sensitivity_swings(sens: pd.DataFrame) -> tuple[float, list[tuple[str, float, float]]] | None:
    """(base p99 ms, [(knob, p99 at -X%, p99 at +X%), ...]) from the sensitivity runs, or None
    when the base point did not run. Shared by the tornado plot and the report's table."""
    ok = ok_rows(sens)
    base = ok[ok["knob"].isna()] if not ok.empty else ok
    if base.empty:
        return None
    base_ms = float(base[LATENCY].iloc[0])
    bars = []
    for knob, rows in ok[ok["knob"].notna()].groupby("knob"):
        low = rows[rows["delta_percent"] < 0][LATENCY]
        high = rows[rows["delta_percent"] > 0][LATENCY]
        lo = float(low.iloc[0]) if not low.empty else base_ms
        hi = float(high.iloc[0]) if not high.empty else base_ms
        bars.append((knob, lo, hi))
    return base_ms, bars


def no_effect(base_ms: float, lo: float, hi: float) -> bool:
    """Whether a knob moved p99 by less than ``NO_EFFECT_FRACTION`` of the base both ways."""
    return max(abs(lo - base_ms), abs(hi - base_ms)) < NO_EFFECT_FRACTION * abs(base_ms)


def tornado(sens: pd.DataFrame, settings: dict, folder: Path) -> list[str]:
    """Horizontal bars: p99 at -X% and +X% of each knob that moved it; the others named."""
    swings = sensitivity_swings(sens)
    if swings is None or not swings[1]:
        return []
    base_ms, bars = swings
    pct = settings["study"].get("sensitivity", {}).get("percent", 10)
    idle = [b[0] for b in bars if no_effect(base_ms, b[1], b[2])]
    bars = sorted((b for b in bars if b[0] not in idle), key=lambda b: abs(b[2] - b[1]))
    fig, ax = plt.subplots(figsize=(8.0, 0.55 * max(1, len(bars)) + 2.0))
    for i, (_knob, lo, hi) in enumerate(bars):
        ax.barh(i, lo - base_ms, left=base_ms, color="tab:blue", height=0.6, label=f"-{pct:g}%" if i == 0 else None)
        ax.barh(i, hi - base_ms, left=base_ms, color="tab:orange", height=0.6, label=f"+{pct:g}%" if i == 0 else None)
        ax.text(max(lo, hi), i, f"  {lo - base_ms:+.2f} / {hi - base_ms:+.2f} ms", va="center", fontsize=7)
    ax.axvline(base_ms, color="black", lw=1)
    ax.set_yticks(range(len(bars)), [labels.label(b[0]) for b in bars], fontsize=8)
    ax.set_xlabel(f"p99 per-token latency (ms); base {base_ms:.2f} ms")
    base = sens[sens["knob"].isna()]
    where = settings_text(held(base, varying(settings)))
    ax.set_title(f"{settings['name']}: p99 latency with each knob -{pct:g}% and +{pct:g}%"
                 + (f"\n(around {where})" if where else ""), fontsize=10)
    if idle:
        fig.text(0.01, 0.0, f"no effect at ±{pct:g}% (p99 moved less than {100 * NO_EFFECT_FRACTION:g}%), not "
                 "drawn: " + "; ".join(labels.label(k) for k in idle), fontsize=8, color="0.3", va="top")
    if bars:
        ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    lo_all = min([base_ms] + [min(b[1], b[2]) for b in bars])
    hi_all = max([base_ms] + [max(b[1], b[2]) for b in bars])
    span = hi_all - lo_all or max(abs(base_ms) * 0.05, 1e-3)
    ax.set_xlim(lo_all - 0.1 * span, hi_all + 0.45 * span)
    return save(fig, folder, "tornado")
