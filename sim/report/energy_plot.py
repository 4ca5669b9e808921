"""Study plot ``energy``: joules per token against milliseconds per token, one point per run.

Every grid point that ran with an energy figure (profiles with an ``energy:`` section) is a
dot at (p99 per-token latency, J per token), coloured by the study's facet (or breakdown) axis, else its first swept axis; the latency
target is a vertical line. Lower left is better on both. Reads the saved results only.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from sim.report import labels
from sim.report.figures import LATENCY, eng_axis, held, ok_rows, save, settings_text, study_axes, target_ms, varying

ENERGY = "energy_J_per_token"


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
    groups = rows.groupby(rows[colour].astype(str), sort=False) if colour else [("all", rows)]
    for value, sel in groups:
        ax.scatter(sel[LATENCY], sel[ENERGY], s=28, alpha=0.85,
                   label=labels.setting(colour, value) if colour else None)
    ax.axvline(target_ms(rows), color="0.3", linestyle="--", linewidth=1)
    ax.set_xlabel("p99 per-token latency (ms)")
    ax.set_ylabel("energy per token (J)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    eng_axis(ax, "x")
    eng_axis(ax, "y")
    ax.grid(True, which="both", alpha=0.25)
    if colour:
        ax.legend(fontsize=8, loc="best")
    shared = held(rows, list(study_axes(settings)))
    ax.set_title("Energy per token against latency" + (f"\n{settings_text(shared)}" if shared else ""), fontsize=10)
    return save(fig, folder, "energy")
