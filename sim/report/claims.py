"""One figure per claim a study tests (``plots.claims``): claimed setting against baseline.

A claim names the setting it says helps (``claimed``: axis -> value, or a list of values
drawn as separate markers), the baseline it is measured against, the metric (a result
column, or a list of columns summed; p99 per-token latency by default) and the axes whose
combinations form the figure's rows (e.g. model x hardware). Every other axis is held
equal between claimed and baseline: at the values ``at`` names (one panel per entry, at
most ``MAX_AT``), else at the study's detail point where the row has it. A dumbbell per
row joins the baseline (hollow circle) to each claimed marker; for latency the target is
a red line and a claimed marker is green where it meets the target, red where it misses;
``expect_cut_percent`` shades the range the claim promises below the baseline. A row
whose point was left out, does not fit or failed says so in words.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.transforms import blended_transform_factory

from sim.report import labels
from sim.report.figures import (
    LATENCY,
    detail_values,
    eng_axis,
    held,
    key,
    keys,
    matching,
    save,
    settings_text,
    study_axes,
    target_ms,
    varying,
)

MAX_AT = 3
MARKERS = ("D", "s", "^", "v", "P")
METRICS = {LATENCY: "p99 per-token latency (ms)", "per_token_ms_p50": "median per-token latency (ms)",
           "kv_bytes_per_token": "KV bytes read per decode step (bytes)",
           "hbm_bytes_per_token": "bytes read from the backing store per decode step (bytes)"}


@dataclass
class Cell:
    """One setting of one row: its metric (mean over seeds) or why there is none."""

    value: float | None = None
    status: str = "left out"  # "ok", "does not fit", "failed", "left out"
    meets: bool = False


@dataclass
class Row:
    label: dict  # row axis -> value
    baseline: Cell
    claimed: list[Cell]
    points: pd.DataFrame = field(default_factory=pd.DataFrame)  # every point drawn in the row


@dataclass
class ClaimPanel:
    at: dict
    rows: list[Row]


def metric_columns(claim: dict) -> list[str]:
    metric = claim.get("metric") or LATENCY
    return [metric] if isinstance(metric, str) else list(metric)


def metric_label(claim: dict) -> str:
    cols = metric_columns(claim)
    if len(cols) == 1 and cols[0] in METRICS:
        return METRICS[cols[0]]
    if all(c.startswith("ms_") for c in cols):
        return " + ".join(labels.row(c[3:]) for c in cols) + " (ms per decode step)"
    return " + ".join(cols)


def variants(claim: dict) -> list[dict]:
    """Each claimed setting as one dict (the product of the listed values)."""
    claimed = claim["claimed"]
    names = list(claimed)
    lists = [v if isinstance(v, list) else [v] for v in claimed.values()]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*lists)]


def _cell(frame: pd.DataFrame, cols: list[str], target: float | None) -> Cell:
    if frame.empty:
        return Cell()
    ok = frame[frame["status"] == "ok"]
    if ok.empty:
        return Cell(status="failed")
    values = ok[cols].apply(pd.to_numeric, errors="coerce")
    present = values.notna().all(axis=1) & ok[LATENCY].notna() if LATENCY in ok else values.notna().all(axis=1)
    if not present.any():
        return Cell(status="does not fit")
    value = float(values[present].fillna(0).sum(axis=1).mean())
    latency = float(pd.to_numeric(ok[LATENCY][present]).mean()) if LATENCY in ok else float("nan")
    return Cell(value, "ok", target is not None and latency <= target)


def _row_points(frame: pd.DataFrame, settings: dict, free: list[str]) -> pd.DataFrame:
    """Hold every ``free`` axis that still varies in ``frame`` at the detail point's value
    (or the first value the rows have)."""
    fixed = detail_values(settings)
    for axis in free:
        if axis not in frame or frame[axis].nunique() <= 1:
            continue
        present = keys(frame[axis])
        wanted = key(fixed.get(axis))
        frame = frame[present == (wanted if (present == wanted).any() else present.iloc[0])]
    return frame


def claim_panels(grid: pd.DataFrame, settings: dict, claim: dict) -> list[ClaimPanel]:
    """The numbers one claim's figure draws: per panel (``at`` entry), per row, the
    baseline and each claimed setting."""
    frame = matching(grid, claim.get("where") or {})
    axes = study_axes(settings)
    row_axes = list(claim["rows"])
    target = target_ms(grid)
    cols = metric_columns(claim)
    set_axes = set(claim["claimed"]) | set(claim["baseline"])
    combos = [dict(zip(row_axes, c, strict=True)) for c in itertools.product(*(axes[a] for a in row_axes))]
    out = []
    for at in (claim.get("at") or [{}])[:MAX_AT]:
        free = [a for a in varying(settings) if a not in row_axes and a not in set_axes and a not in at]
        sel = matching(frame, at)
        rows = []
        for combo in combos:
            mine = matching(sel, combo)
            if mine.empty:
                continue
            base_rows = _row_points(matching(mine, claim["baseline"]), settings, free)
            cells, drawn = [], [base_rows]
            for variant in variants(claim):
                points = _row_points(matching(mine, variant), settings, free)
                drawn.append(points)
                cells.append(_cell(points, cols, target))
            rows.append(Row(combo, _cell(base_rows, cols, target), cells, pd.concat(drawn)))
        out.append(ClaimPanel(dict(at), rows))
    return out


def claim_plots(grid: pd.DataFrame, settings: dict, folder: Path) -> list[str]:
    """Every claim of the study's ``plots.claims`` as ``plots/claim-<name>.{png,svg}``."""
    written: list[str] = []
    for claim in settings["study"].get("plots", {}).get("claims") or []:
        panels = claim_panels(grid, settings, claim)
        if any(p.rows for p in panels):
            written += claim_figure(panels, claim, settings, grid, folder)
    return written


def claim_figure(panels: list[ClaimPanel], claim: dict, settings: dict, grid: pd.DataFrame,
                 folder: Path) -> list[str]:
    """Dumbbells: per row, the baseline joined to each claimed marker; one panel per ``at``."""
    latency = metric_columns(claim) == [LATENCY]
    target = target_ms(grid) if latency else None
    nrows = max(len(p.rows) for p in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels) + 2.6, 0.36 * nrows + 2.2), squeeze=False,
                             sharey=True)
    for ax, panel in zip(axes[0], panels, strict=True):
        _draw(ax, panel, claim, target)
        heading = settings_text(panel.at)
        if latency:
            meets = sum(any(c.meets for c in r.claimed) for r in panel.rows)
            base_meets = sum(r.baseline.meets for r in panel.rows)
            heading += (", " if heading else "") + (f"claimed meets {target:g} ms in {meets}/{len(panel.rows)} rows"
                                                    f" (baseline {base_meets}/{len(panel.rows)})")
        ax.set_title(heading, fontsize=9)
    first = panels[0].rows
    axes[0][0].set_yticks(range(len(first)), ["  ·  ".join(labels.tick(v) for v in r.label.values())
                                              for r in reversed(first)], fontsize=8)
    axes[0][0].set_ylabel(labels.join_pairs(list(claim["rows"])).replace(" x ", " · "))
    drawn = pd.concat([r.points for p in panels for r in p.rows])
    fixed = held(drawn, [a for a in varying(settings) if a not in claim["rows"] and a not in claim["claimed"]
                         and a not in claim["baseline"] and not any(a in p.at for p in panels)])
    sub = f"claimed: {_setting_words(claim['claimed'])}   vs   baseline: {_setting_words(claim['baseline'])}"
    sub += "; every other axis equal" + (f", at {settings_text(fixed)}" if fixed else "")
    fig.suptitle(f"{claim['title']}\n{sub}", fontsize=10)
    handles, names = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper left", bbox_to_anchor=(1.0, 0.9), fontsize=8)
    fig.tight_layout()
    return save(fig, folder, f"claim-{claim['name']}")


def _setting_words(setting: dict) -> str:
    return ", ".join(f"{a} " + (" or ".join(map(str, v)) if isinstance(v, list) else f"{v}") for a, v in setting.items())


def _offset(k: int, count: int) -> float:
    """Vertical offset of the k-th claimed marker in its row, so equal values stay visible."""
    return 0.0 if count == 1 else 0.34 * (k / (count - 1) - 0.5)


def _annotate_change(ax, base: Cell, cell: Cell, y: float) -> None:
    """The change against the baseline beside a claimed marker, on the side away from the
    line that joins it to the baseline."""
    if base.status != "ok" or not base.value:
        return
    change = 100 * (cell.value / base.value - 1)
    left = cell.value <= base.value
    ax.annotate(f"{change:+.0f}%", (cell.value, y), xytext=(-6 if left else 6, 0), textcoords="offset points",
                fontsize=6, ha="right" if left else "left", va="center", color="0.25")


def _missing_text(row: Row, variant_list: list[dict]) -> str:
    """Why settings of a row have no marker, grouped by reason: "does not fit: baseline, kivi-2"."""
    reasons: dict[str, list[str]] = {}
    if row.baseline.status != "ok":
        reasons.setdefault(row.baseline.status, []).append("baseline")
    differ = [a for a in variant_list[0] if len({str(v[a]) for v in variant_list}) > 1]
    for variant, cell in zip(variant_list, row.claimed, strict=True):
        if cell.status != "ok":
            reasons.setdefault(cell.status, []).append(" ".join(str(variant[a]) for a in differ) or "claimed")
    return "; ".join(f"{why}: {', '.join(names)}" for why, names in reasons.items())


def _place_notes(ax, notes: list[tuple[float, str, list[float]]]) -> None:
    """Each row's "why no marker" note, on the side of the panel its markers leave free."""
    ax.autoscale_view()
    words = blended_transform_factory(ax.transAxes, ax.transData)
    to_axes = ax.transAxes.inverted()
    for y, text, xs in notes:
        edges = sorted([0.0, 1.0] + [to_axes.transform(ax.transData.transform((x, y)))[0] for x in xs])
        gaps = [(b - a, a, b) for a, b in zip(edges, edges[1:], strict=False)]
        _, a, b = max(gaps)
        if a == 0.0:
            ax.text(0.01, y, text, transform=words, fontsize=6.5, color="0.35", ha="left", va="center",
                    style="italic")
        elif b == 1.0:
            ax.text(0.99, y, text, transform=words, fontsize=6.5, color="0.35", ha="right", va="center",
                    style="italic")
        else:
            ax.text((a + b) / 2, y, text, transform=words, fontsize=6.5, color="0.35", ha="center", va="center",
                    style="italic")


def _draw_row(ax, row, y: float, cut, n_variants: int, target: float | None) -> list[float]:
    """One row's baseline point (with the claimed range), its claimed points and their changes;
    returns the values drawn."""
    values = []
    base = row.baseline
    if base.status == "ok":
        values.append(base.value)
        ax.scatter(base.value, y, s=46, facecolors="white", edgecolors="black", zorder=3)
        if cut:
            lo, hi = base.value * (1 - cut[1] / 100), base.value * (1 - cut[0] / 100)
            ax.plot([lo, hi], [y, y], color="tab:green", lw=7, alpha=0.25, solid_capstyle="butt", zorder=1)
    for k, cell in enumerate(row.claimed):
        if cell.status != "ok":
            continue
        values.append(cell.value)
        yk = y + _offset(k, n_variants)
        if base.status == "ok":
            ax.plot([base.value, cell.value], [y, yk], color="0.6", lw=1, zorder=2)
        colour = ("tab:green" if cell.meets else "tab:red") if target is not None else f"C{k}"
        ax.scatter(cell.value, yk, s=40, marker=MARKERS[k % len(MARKERS)], color=colour, zorder=4,
                   edgecolors="black", linewidths=0.4)
        _annotate_change(ax, base, cell, yk)
    return values


def _draw(ax, panel: ClaimPanel, claim: dict, target: float | None) -> None:
    rows = panel.rows
    n = len(rows)
    cut = claim.get("expect_cut_percent")
    variant_list = variants(claim)
    values = []
    notes: list[tuple[float, str, list[float]]] = []
    for i, row in enumerate(rows):
        y = n - 1 - i
        values += _draw_row(ax, row, y, cut, len(variant_list), target)
        missing = _missing_text(row, variant_list)
        if missing:
            notes.append((y, missing, [c.value for c in [row.baseline, *row.claimed] if c.status == "ok"]))
    ax.scatter([], [], s=46, facecolors="white", edgecolors="black",  # legend entries, whatever rows have values
               label=f"baseline ({_setting_words(claim['baseline'])})")
    if cut:
        ax.plot([], [], color="tab:green", lw=7, alpha=0.25, label=f"claimed range: {cut[0]:g}-{cut[1]:g}% below "
                "baseline")
    for k, variant in enumerate(variant_list):
        ax.scatter([], [], marker=MARKERS[k % len(MARKERS)], color="0.5" if target is not None else f"C{k}",
                   edgecolors="black", linewidths=0.4, s=40, label=f"claimed: {_setting_words(variant)}")
    if target is not None:
        ax.axvline(target, color="crimson", ls="--", lw=1.4, label=f"target {target:g} ms")
        ax.scatter([], [], color="tab:green", s=30, label="claimed meets the target")
        ax.scatter([], [], color="tab:red", s=30, label="claimed misses the target")
        values.append(target)
    positive = [v for v in values if v and v > 0]
    if positive and max(positive) / min(positive) > 8:
        ax.set_xscale("log")
        ax.set_xlim(min(positive) / 2.2, max(positive) * 1.6)  # room for the change labels left of the markers
    eng_axis(ax, "x")
    ax.set_ylim(-0.7, n - 0.3)
    _place_notes(ax, notes)
    ax.set_xlabel(metric_label(claim))
    ax.grid(axis="x", alpha=0.3, which="both")
    ax.tick_params(axis="y", length=0)
    for y in range(n):
        ax.axhline(y, color="0.93", lw=0.6, zorder=0)
