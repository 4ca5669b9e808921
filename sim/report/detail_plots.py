"""Plots of one decode step of a study's detail point, from its DES event log and op table.

* ``bandwidth``: each resource's utilisation (fraction of its peak) over the step. Only
  resources that carried bytes and reached ``MIN_PEAK_FRACTION`` of their peak get a panel;
  the others are named in the title (never an empty panel).
* ``roofline``: a hierarchical roofline. Each op is placed once per memory level it moved
  bytes at (marker = level): arithmetic intensity = its work / its bytes at that level,
  height = its achieved work rate. Every level has its own bandwidth roof (HBM, L2, SMEM or
  SRAM levels from the study's hardware, ``meta.json``'s ``levels`` and ``peaks_GBps``),
  under the matrix-unit peak and the vector-unit ceiling that bounds dequantization and
  other element-wise work. Work is matrix FLOPs plus vector operations (the cost model's
  units), so the axis says "operations".
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from sim.report import labels
from sim.report.figures import eng_axis, rate_text, save, settings_text
from sim.units import GFLOP_PER_TFLOP, NS_PER_MS, NS_PER_US

MIN_PEAK_FRACTION = 0.01  # a resource never above 1% of its peak gets no panel, only a mention
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
           "tab:cyan", "gold")  # no grey: grey is "other ops"


def _detail(detail: Path) -> dict | None:
    meta_path = detail / "meta.json"
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text())
    if meta.get("error") or not (detail / "events.parquet").is_file():
        return None
    return meta


def _where(meta: dict) -> str:
    return settings_text(dict(meta.get("assignments", []))) or "base point"


# -- bandwidth over time --------------------------------------------------------------------


def utilisation(rows: pd.DataFrame, edges: np.ndarray, peak_GBps: float) -> np.ndarray:
    """Fraction of ``peak_GBps`` used in each time bin (``edges`` in ns) by the spans in ``rows``."""
    width = edges[1] - edges[0]
    util = np.zeros(len(edges) - 1)
    for a, b, n in zip(rows["t_start_ns"].to_numpy(), rows["t_end_ns"].to_numpy(), rows["bytes"].to_numpy(),
                       strict=True):
        if b <= a:
            continue
        rate = n / (b - a)  # bytes per ns == GB/s
        i0, i1 = int(a // width), min(len(util) - 1, int(b // width))
        for i in range(i0, i1 + 1):
            overlap = min(b, edges[i + 1]) - max(a, edges[i])
            if overlap > 0:
                util[i] += rate * overlap
    return util / (width * peak_GBps)


def bandwidth(detail: Path, folder: Path, bins: int = 400) -> list[str]:
    """One panel per resource that carried bytes: utilisation over the step."""
    meta = _detail(detail)
    if meta is None:
        return []
    events = pd.read_parquet(detail / "events.parquet")
    peaks = meta["peaks_GBps"]
    moving = events[(events["bytes"] > 0) & events["resource"].isin(list(peaks))]
    if moving.empty:
        return []
    t_end = float(events["t_end_ns"].max())
    edges = np.linspace(0.0, t_end, bins + 1)
    order = list(dict.fromkeys(r for r in [meta["store"], *meta["levels"], "noc", "link", "pcie", *peaks]
                               if r in set(moving["resource"])))
    shown, quiet = [], []
    for resource in order:
        util = utilisation(moving[moving["resource"] == resource], edges, peaks[resource])
        (shown if util.max() >= MIN_PEAK_FRACTION else quiet).append((resource, util))
    if not shown:
        return []
    scale, unit = (NS_PER_US, "µs") if t_end < 2 * NS_PER_MS else (NS_PER_MS, "ms")
    fig, axes = plt.subplots(len(shown), 1, figsize=(10, 1.7 * len(shown) + 1.2), sharex=True, squeeze=False)
    for ax, (resource, util) in zip(axes[:, 0], shown, strict=True):
        rows = moving[moving["resource"] == resource]
        ax.fill_between(edges[:-1] / scale, 100 * util, step="post", alpha=0.6)
        ax.step(edges[:-1] / scale, 100 * util, where="post", lw=0.6)
        mean = float(rows["bytes"].sum()) / (t_end * peaks[resource])
        ax.set_ylabel(f"{labels.resource(resource)}\n% of {rate_text(peaks[resource])}", fontsize=7)
        ax.set_ylim(0, max(105, 105 * util.max()))
        ax.axhline(100, color="0.4", lw=0.6, ls=":")
        ax.text(0.995, 0.9, f"step mean {100 * mean:.1f}%, peak {100 * util.max():.1f}%", transform=ax.transAxes,
                ha="right", va="top", fontsize=7, bbox={"fc": "white", "ec": "0.7", "alpha": 0.85, "pad": 2})
        ax.grid(alpha=0.25)
    axes[-1, 0].set_xlabel(f"time within the decode step ({unit})")
    lines = ["bandwidth use over one decode step (DES event log)", _where(meta)]
    if quiet:
        lines.append(f"not drawn (never above {100 * MIN_PEAK_FRACTION:g}% of peak): "
                     + ", ".join(f"{labels.resource(r)} (peak {100 * u.max():.2f}%)" for r, u in quiet))
    fig.suptitle("\n".join(lines), fontsize=9)
    return save(fig, folder, "bandwidth")


# -- roofline -------------------------------------------------------------------------------


def level_bytes(ops: pd.DataFrame, level: str) -> pd.Series:
    """Bytes each op moved at memory level ``level`` (columns ``<dir>_<what>_<level>_bytes``)."""
    cols = [c for c in ops.columns if c.endswith(f"_{level}_bytes")]
    return ops[cols].fillna(0).sum(axis=1) if cols else pd.Series(0.0, ops.index)


OLD_OP_NAMES = {"start_ns": "t_start_ns", "end_ns": "t_end_ns"}  # the op table's names before issue 22


def roofline(detail: Path, folder: Path) -> list[str]:
    """Every op placed per memory level under that level's roof, the matrix peak and the
    vector-unit (dequantization) ceiling."""
    meta = _detail(detail)
    if meta is None:
        return []
    ops = pd.read_parquet(detail / "ops.parquet").rename(columns=OLD_OP_NAMES)  # tables written before the rename
    work = ops["flops"].fillna(0) + ops.get("vector_ops", 0)
    dur = (ops["t_end_ns"] - ops["t_start_ns"]).clip(lower=1e-9)
    rate = work / dur / GFLOP_PER_TFLOP  # T operations per second
    levels = [lv for lv in meta["levels"] if lv in meta["peaks_GBps"]]
    points = {}
    for level in levels:
        nbytes = level_bytes(ops, level)
        mask = (nbytes > 0) & (work > 0)
        if mask.any():
            points[level] = pd.DataFrame({"name": ops["name"][mask], "intensity": (work / nbytes)[mask],
                                          "rate": rate[mask]})
    if not points:
        return []
    fig, ax = plt.subplots(figsize=(9, 5.6))
    everything = pd.concat(points.values())
    _roofs(ax, meta, levels, everything)
    names = everything["name"].value_counts().index.tolist()[:len(COLOURS)]
    colour = {n: COLOURS[i] for i, n in enumerate(names)}
    for m, frame in enumerate(points.values()):
        for op_name, rows in frame.groupby("name"):
            ax.scatter(rows["intensity"], rows["rate"], s=16, marker=MARKERS[m % len(MARKERS)],
                       color=colour.get(op_name, "0.55"), alpha=0.75, edgecolors="none")
    for op_name in names:
        ax.scatter([], [], color=colour[op_name], s=16, label=op_name)
    if len(everything["name"].unique()) > len(names):
        ax.scatter([], [], color="0.55", s=16, label="other ops")
    for m, level in enumerate(points):
        ax.scatter([], [], marker=MARKERS[m % len(MARKERS)], color="0.3", s=20,
                   label=f"bytes at {labels.resource(level)}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    eng_axis(ax, "x")
    eng_axis(ax, "y")
    ax.set_xlabel("arithmetic intensity (operations per byte moved at that memory level)")
    ax.set_ylabel("achieved work rate (T operations/s: matrix FLOPs + vector ops)")
    placed = set().union(*(set(frame.index) for frame in points.values()))
    ax.set_title(f"roofline of one decode step\n{_where(meta)}\n{len(placed)} of {len(ops)} ops placed, once per "
                 "memory level they move bytes at (marker); ops with no bytes or no work are not placed", fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(alpha=0.3, which="both")
    return save(fig, folder, "roofline")


def _roofs(ax, meta: dict, levels: list[str], points: pd.DataFrame) -> None:
    """Each level's bandwidth roof under the matrix peak, and the vector-unit ceiling."""
    peak_t = meta["matrix_peak_TFLOPs"]
    lowest_bw = min(meta["peaks_GBps"][lv] for lv in levels)
    x = np.logspace(math.log10(max(points["intensity"].min() / 3, 1e-3)),
                    math.log10(max(points["intensity"].max() * 3, peak_t * GFLOP_PER_TFLOP / lowest_bw * 3)), 200)
    styles = ("-", "--", "-.", ":")
    for i, level in enumerate(levels):
        bw = meta["peaks_GBps"][level]
        ax.plot(x, np.minimum(peak_t, x * bw / GFLOP_PER_TFLOP), color="black", lw=1.3, ls=styles[i % len(styles)],
                label=f"{labels.resource(level)} roof {rate_text(bw)}")
    ax.axhline(peak_t, color="black", lw=0.8, alpha=0.5)
    ax.text(x[0], peak_t * 1.08, f"matrix peak {labels.eng(peak_t)} TFLOP/s ({meta['matmul_dtype']})", fontsize=7)
    vector = meta.get("vector_peak_Tops")
    if vector:
        sustained = vector * meta.get("vector_efficiency", 1.0)
        ax.axhline(sustained, color="tab:purple", lw=1.2,
                   label=f"vector-unit ceiling (dequantization, element-wise) {labels.eng(sustained)} T ops/s")
    else:
        ax.text(x[0], peak_t * 0.5, "no vector-unit ceiling in this detail run (re-run the study to add it)",
                fontsize=7, color="tab:purple")
