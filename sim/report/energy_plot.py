"""Study plot ``energy``: joules per token against milliseconds per token, one point per run.

Every grid point that ran with an energy figure (profiles with an ``energy:`` section) is a
dot at (p99 per-token latency, J per token), coloured by the study's facet (or breakdown) axis, else its first swept axis; the latency
target is a vertical, named line. Coinciding groups stay visible: each group but the last is
drawn hollow and larger than the next, and the legend counts each group's points. Lower left
is better on both. Reads the saved results only.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from sim.report import labels
from sim.report.figures import LATENCY, eng_axis, held, ok_rows, save, settings_text, study_axes, target_ms, varying

ENERGY = "energy_J_per_token"
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def energy(grid: pd.DataFrame, settings: dict, folder: Path) -> list[str]:
    """Draw the plot if any point has an energy figure; returns the written paths."""
    rows = ok_rows(grid)
    if rows.empty or ENERGY not in rows or rows[ENERGY].notna().sum() == 0:
        return []
    rows = rows[rows[ENERGY].notna()]
    axes = varying(settings)
    plots = settings.get("study", {}).get("plots") or {}
    colour = next((a for a in (plots.get("facet"), plots.get("breakdown")) if a in axes), axes[0] if axes else None)
    fig, ax = plt.subplots(figsize=(7.0, 4.6))
    groups = list(rows.groupby(rows[colour].astype(str), sort=False)) if colour else [("all", rows)]
    for k, (value, sel) in enumerate(groups):  # earlier groups larger and hollow: coinciding points stay visible
        size = 28 + 34 * (len(groups) - 1 - k)
        ax.scatter(sel[LATENCY], sel[ENERGY], s=size, marker=MARKERS[k % len(MARKERS)], facecolors="none"
                   if k < len(groups) - 1 else f"C{k}", edgecolors=f"C{k}", linewidths=1.3, alpha=0.9,
                   label=(labels.setting(colour, value) + f" ({len(sel)})") if colour else None)
    target = target_ms(rows)
    ax.axvline(target, color="0.3", linestyle="--", linewidth=1, label=f"latency target {target:g} ms")
    ax.set_xlabel("p99 per-token latency (ms)")
    ax.set_ylabel("energy per token (J)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    eng_axis(ax, "x")
    eng_axis(ax, "y")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="best")
    shared = held(rows, list(study_axes(settings)))
    ax.set_title("Energy per token against latency" + (f"\n{settings_text(shared)}" if shared else ""), fontsize=10)
    return save(fig, folder, "energy")
