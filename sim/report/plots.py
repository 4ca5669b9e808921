"""Study plots from saved results (no simulation): PNG and SVG, labelled axes with units.

* ``breakdown``: per-token latency split into its rows (weights, KV, launch/sync, ...) as
  stacked bars, one bar per point along one axis;
* ``bandwidth``: HBM, SRAM and link utilisation (fraction of each resource's peak) over
  time within one decode step of the detail point, from the DES event log;
* ``roofline``: every op of that step placed by arithmetic intensity (FLOP per byte from
  the backing store) and achieved FLOP/s, under the compute and bandwidth roofs;
* ``feasibility``: p99 per-token latency over two swept axes (one panel per value of the
  facet axes) with the target contour drawn and points that do not fit marked;
* ``tornado``: how far p99 latency moves for -X% and +X% on each sensitivity knob.

Inputs are the files the runner writes: ``results.parquet``, ``study.json`` and
``detail/{ops,events}.parquet`` + ``detail/meta.json``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402

from sim.io import write_with  # noqa: E402

ROW_ORDER = ["weights", "expert_weights", "kv", "outliers", "activations", "combine", "compute", "expert_compute",
             "router", "dequant", "dispatch", "links", "host_link", "latency", "launch_sync", "contention"]
LATENCY = "per_token_ms_p99"


def _save(fig, folder: Path, name: str) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for ext in ("png", "svg"):
        target = folder / f"{name}.{ext}"
        write_with(target, lambda tmp, ext=ext: fig.savefig(tmp, dpi=130 if ext == "png" else None,
                                                            bbox_inches="tight", format=ext,
                                                            metadata={"Date": None} if ext == "svg" else None))
        out.append(str(target))
    plt.close(fig)
    return out


def load(out_dir: Path) -> tuple[pd.DataFrame, dict]:
    table = pd.read_parquet(out_dir / "results.parquet")
    settings = json.loads((out_dir / "study.json").read_text())
    return table, settings


def make_plots(out_dir: str | Path) -> list[str]:
    """(Re)draw every plot the saved results allow; returns the written paths."""
    out_dir = Path(out_dir)
    table, settings = load(out_dir)
    folder = out_dir / "plots"
    written: list[str] = []
    grid = table[table["group"] == "grid"]
    for maker in (lambda: breakdown(grid, settings, folder), lambda: feasibility(grid, settings, folder),
                  lambda: tornado(table[table["group"] == "sensitivity"], settings, folder),
                  lambda: bandwidth(out_dir / "detail", folder), lambda: roofline(out_dir / "detail", folder)):
        written += maker() or []
    return written


# -- helpers ---------------------------------------------------------------------------------


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty or "status" not in frame:
        return frame.iloc[0:0]
    ok = frame[frame["status"] == "ok"]
    if LATENCY in ok:
        ok = ok[ok[LATENCY].notna()]
    return ok


def _axes(settings: dict) -> dict[str, list]:
    return settings.get("axes", {})


def _varying(settings: dict) -> list[str]:
    return [a for a, vals in _axes(settings).items() if len(vals) > 1]


def _detail_values(settings: dict) -> dict:
    # the point the detail run used: plots.detail, else each axis's middle value
    chosen = dict(settings["study"].get("plots", {}).get("detail") or {})
    for axis, vals in _axes(settings).items():
        chosen.setdefault(axis, vals[(len(vals) - 1) // 2])
    return chosen


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _key(value) -> str:
    """One spelling per value, so 25 (from the study) and 25.0 (from the table) match."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return f"{float(value):.12g}"
    return str(value)


def _keys(column: pd.Series) -> pd.Series:
    return column.map(_key)


def _short(axis: str) -> str:
    return axis.split(".")[-1]


def _mean_over_seeds(frame: pd.DataFrame, keys: list[str], columns: list[str]) -> pd.DataFrame:
    if not keys:
        return frame[columns].mean(numeric_only=True).to_frame().T
    return frame.groupby(keys, sort=False, dropna=False)[columns].mean(numeric_only=True).reset_index()


# -- breakdown ------------------------------------------------------------------------------


def breakdown(grid: pd.DataFrame, settings: dict, folder: Path) -> list[str]:
    ok = _ok(grid)
    if ok.empty:
        return []
    varying = _varying(settings)
    along = settings["study"].get("plots", {}).get("breakdown") or (varying[0] if varying else None)
    fixed = _detail_values(settings)
    sel = ok
    if along and len(ok) > 24:  # keep the other axes at the detail point's values
        for axis in varying:
            if axis != along and axis in sel:
                sub = sel[_keys(sel[axis]) == _key(fixed.get(axis))]
                if not sub.empty:
                    sel = sub
    label_axes = [a for a in varying if a in sel and sel[a].astype(str).nunique() > 1]
    rows = [c for c in ROW_ORDER if f"ms_{c}" in sel] + sorted(
        c[3:] for c in sel.columns if c.startswith("ms_") and c[3:] not in ROW_ORDER)
    cols = [f"ms_{r}" for r in rows]
    data = _mean_over_seeds(sel.fillna({c: 0.0 for c in cols}), label_axes, cols + [LATENCY])
    data = data.head(40)
    sep = "\n" if len(data) <= 8 else ", "
    if len(label_axes) == 1:
        labels = [_fmt(r[label_axes[0]]) for _, r in data.iterrows()]
    else:
        labels = [sep.join(f"{_short(a)}={_fmt(r[a])}" for a in label_axes) or "base" for _, r in data.iterrows()]
    tilt = max((max(len(p) for p in lab.split("\n")) for lab in labels), default=0) * len(data) > 70
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(data) + 2), 4.8))
    bottom = np.zeros(len(data))
    cmap = plt.get_cmap("tab20")
    for i, (row, col) in enumerate(zip(rows, cols, strict=False)):
        values = data[col].to_numpy(dtype=float)
        if not values.any():
            continue
        ax.bar(range(len(data)), values, bottom=bottom, label=row, color=cmap(i % 20), width=0.75)
        bottom += values
    target = float(grid["target_ms"].dropna().iloc[0]) if "target_ms" in grid and grid["target_ms"].notna().any() else None
    if target:
        ax.axhline(target, color="crimson", lw=1.2, ls="--", label=f"target {target:g} ms")
    ax.set_xticks(range(len(data)), labels, fontsize=7, rotation=45 if tilt else 0, ha="right" if tilt else "center")
    ax.set_ylabel("time per decode step (ms, mean over steps)")
    ax.set_xlabel(_axis_label(label_axes[0]) if len(label_axes) == 1 else ", ".join(_short(a) for a in label_axes)
                  or "point")
    held = [a for a in varying if a not in label_axes and a in sel and _keys(sel[a]).nunique() == 1]
    note = ", ".join(f"{_short(a)}={_fmt(sel[a].iloc[0])}" for a in held)
    ax.set_title(f"{settings['name']}: per-token latency breakdown" + (f"\n(at {note})" if note else ""),
                 fontsize=10)
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, folder, "breakdown")


# -- feasibility ----------------------------------------------------------------------------


def _numeric(values: list) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def feasibility(grid: pd.DataFrame, settings: dict, folder: Path) -> list[str]:
    axes = _axes(settings)
    varying = _varying(settings)
    chosen = settings["study"].get("plots", {}).get("feasibility")
    if chosen:
        x_axis, y_axis = chosen
    else:
        numeric = [a for a in varying if _numeric(axes[a])]
        pick = (numeric + [a for a in varying if a not in numeric])[:2]
        if len(pick) < 2:
            return []
        x_axis, y_axis = pick
    if grid.empty or x_axis not in grid or y_axis not in grid:
        return []
    facet = settings["study"].get("plots", {}).get("facet")
    facets = ([facet] if isinstance(facet, str) else list(facet)) if facet else [
        a for a in varying if a not in (x_axis, y_axis)]
    facets = [f for f in facets if f in grid]
    if facets:
        combos = grid[facets].map(_key).drop_duplicates().values.tolist()
    else:
        combos = [[]]
    combos = combos[:16]
    fixed = _detail_values(settings)
    others = [a for a in varying if a not in (x_axis, y_axis, *facets)]
    xs, ys = axes[x_axis], axes[y_axis]
    target = float(grid["target_ms"].dropna().iloc[0]) if grid["target_ms"].notna().any() else 10.0
    latency = pd.to_numeric(grid[LATENCY], errors="coerce") if LATENCY in grid else pd.Series(np.nan, grid.index)
    ok_vals = latency[(grid["status"] == "ok") & latency.notna() & (latency > 0)]
    if ok_vals.empty:
        return []
    norm = LogNorm(vmin=max(ok_vals.min(), 1e-3), vmax=max(ok_vals.max(), target * 1.01, ok_vals.min() * 1.01))
    n = len(combos)
    ncols = min(n, 3 if n <= 9 else 4)
    nrows = math.ceil(n / ncols)
    fig, panels = plt.subplots(nrows, ncols, figsize=(4.6 * ncols + 1.2, 3.9 * nrows), squeeze=False,
                               layout="constrained")
    image = None
    for k, combo in enumerate(combos):
        ax = panels[k // ncols][k % ncols]
        sel = grid
        for f, v in zip(facets, combo, strict=False):
            sel = sel[_keys(sel[f]) == v]
        for a in others:
            sub = sel[_keys(sel[a]) == _key(fixed.get(a))]
            sel = sub if not sub.empty else sel
        z = np.full((len(ys), len(xs)), np.nan)
        unfit = np.zeros_like(z, dtype=bool)
        failed = np.zeros_like(z, dtype=bool)
        for i, yv in enumerate(ys):
            for j, xv in enumerate(xs):
                cell = sel[(_keys(sel[x_axis]) == _key(xv)) & (_keys(sel[y_axis]) == _key(yv))]
                if cell.empty:
                    continue
                good = cell[(cell["status"] == "ok") & pd.to_numeric(cell[LATENCY], errors="coerce").notna()]
                if not good.empty:
                    z[i, j] = pd.to_numeric(good[LATENCY]).mean()
                elif (cell["status"] == "ok").any():
                    unfit[i, j] = True
                else:
                    failed[i, j] = True
        image = ax.imshow(z, origin="lower", aspect="auto", cmap="viridis_r", norm=norm, interpolation="nearest")
        for i in range(len(ys)):
            for j in range(len(xs)):
                if unfit[i, j]:
                    ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=True, fc="0.85", ec="0.5", hatch="//"))
                    ax.text(j, i, "no fit", ha="center", va="center", fontsize=6, color="0.2")
                elif failed[i, j]:
                    ax.text(j, i, "error", ha="center", va="center", fontsize=6, color="red")
                elif not np.isnan(z[i, j]) and len(xs) * len(ys) <= 64:
                    ax.text(j, i, f"{z[i, j]:.1f}", ha="center", va="center", fontsize=6,
                            color="white" if z[i, j] > target else "black")
        finite = np.where(np.isnan(z), np.nanmax(z) * 10 if np.isfinite(z).any() else 1.0, z)
        if np.isfinite(z).any() and finite.min() < target < finite.max() and min(z.shape) > 1:
            contour = ax.contour(np.arange(len(xs)), np.arange(len(ys)), finite, levels=[target], colors="crimson",
                                 linewidths=2)
            ax.clabel(contour, fmt=f"{target:g} ms", fontsize=7)
        ax.set_xticks(range(len(xs)), [_fmt(v) for v in xs], fontsize=7, rotation=45 if len(xs) > 6 else 0)
        ax.set_yticks(range(len(ys)), [_fmt(v) for v in ys], fontsize=7)
        ax.set_xlabel(_axis_label(x_axis))
        ax.set_ylabel(_axis_label(y_axis))
        title = ", ".join(f"{_short(f)}={v}" for f, v in zip(facets, combo, strict=False))
        ax.set_title(title or settings["name"], fontsize=9)
    for k in range(n, nrows * ncols):
        panels[k // ncols][k % ncols].axis("off")
    if image is not None:
        bar = fig.colorbar(image, ax=panels.ravel().tolist(), shrink=0.85)
        bar.set_label("p99 per-token latency (ms, log scale)")
    held = ", ".join(f"{_short(a)}={_fmt(fixed.get(a))}" for a in others)
    fig.suptitle(f"{settings['name']}: feasibility (red contour: {target:g} ms target; hatched: does not fit)"
                 + (f"\nother axes held at {held} (where swept)" if held else ""), fontsize=10)
    return _save(fig, folder, "feasibility")


UNITS = {"batch": "sequences", "context": "tokens", "steps": "steps", "tp": "chips", "pp": "stages"}


def _axis_label(axis: str) -> str:
    leaf = axis.split(".")[-1]
    if leaf in UNITS:
        return f"{leaf} ({UNITS[leaf]})"
    for suffix, unit in (("_GBps", "GB/s"), ("_MB", "MB"), ("_GB", "GB"), ("_ns", "ns"), ("_GHz", "GHz"),
                         ("_TFLOPs", "TFLOP/s"), ("_KiB", "KiB")):
        if leaf.endswith(suffix):
            return f"{axis} ({unit})"
    if axis.endswith(".value"):
        return _axis_label(axis[: -len(".value")])
    return axis


# -- tornado --------------------------------------------------------------------------------


def sensitivity_swings(sens: pd.DataFrame) -> tuple[float, list[tuple[str, float, float]]] | None:
    """(base p99 ms, [(knob, p99 at -X%, p99 at +X%), ...]) from the sensitivity runs, or None
    when the base point did not run. Shared by the tornado plot and the report's table."""
    ok = _ok(sens)
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


def tornado(sens: pd.DataFrame, settings: dict, folder: Path) -> list[str]:
    swings = sensitivity_swings(sens)
    if swings is None or not swings[1]:
        return []
    base_ms, bars = swings
    pct = settings["study"].get("sensitivity", {}).get("percent", 10)
    bars.sort(key=lambda b: abs(b[2] - b[1]))
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * len(bars) + 1.6))
    for i, (_knob, lo, hi) in enumerate(bars):
        ax.barh(i, lo - base_ms, left=base_ms, color="tab:blue", height=0.6, label=f"-{pct:g}%" if i == 0 else None)
        ax.barh(i, hi - base_ms, left=base_ms, color="tab:orange", height=0.6, label=f"+{pct:g}%" if i == 0 else None)
        ax.text(max(lo, hi), i, f"  {lo - base_ms:+.2f} / {hi - base_ms:+.2f} ms", va="center", fontsize=7)
    ax.axvline(base_ms, color="black", lw=1)
    ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    ax.set_xlabel(f"p99 per-token latency (ms); base {base_ms:.2f} ms")
    ax.set_title(f"{settings['name']}: sensitivity, each knob -{pct:g}% and +{pct:g}%")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    lo_all = min(min(b[1], b[2]) for b in bars + [("", base_ms, base_ms)])
    hi_all = max(max(b[1], b[2]) for b in bars + [("", base_ms, base_ms)])
    span = hi_all - lo_all or 1.0
    ax.set_xlim(lo_all - 0.1 * span, hi_all + 0.45 * span)
    return _save(fig, folder, "tornado")


# -- bandwidth over time --------------------------------------------------------------------


def _detail(detail: Path):
    meta_path = detail / "meta.json"
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text())
    if meta.get("error") or not (detail / "events.parquet").is_file():
        return None
    return meta


def bandwidth(detail: Path, folder: Path, bins: int = 400) -> list[str]:
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
    width = edges[1] - edges[0]
    order = [r for r in [meta["store"], *meta["levels"], "noc", "link", "pcie"] if r in set(moving["resource"])]
    order = list(dict.fromkeys(order))
    fig, axes = plt.subplots(len(order), 1, figsize=(10, 1.7 * len(order) + 1), sharex=True, squeeze=False)
    for ax, resource in zip(axes[:, 0], order, strict=False):
        rows = moving[moving["resource"] == resource]
        util = np.zeros(bins)
        t0, t1, nbytes = rows["t_start_ns"].to_numpy(), rows["t_end_ns"].to_numpy(), rows["bytes"].to_numpy()
        for a, b, n in zip(t0, t1, nbytes, strict=False):
            if b <= a:
                continue
            rate = n / (b - a)  # bytes per ns == GB/s
            i0, i1 = int(a // width), min(bins - 1, int(b // width))
            for i in range(i0, i1 + 1):
                overlap = min(b, edges[i + 1]) - max(a, edges[i])
                if overlap > 0:
                    util[i] += rate * overlap
        util = util / (width * peaks[resource])
        ax.fill_between(edges[:-1] / 1e3, util, step="post", alpha=0.6)
        ax.step(edges[:-1] / 1e3, util, where="post", lw=0.6)
        mean = float(rows["bytes"].sum()) / (t_end * peaks[resource])
        ax.set_ylabel(f"{resource}\n(fraction of\n{peaks[resource]:g} GB/s)", fontsize=7)
        ax.set_ylim(0, max(1.05, util.max() * 1.05))
        ax.axhline(1.0, color="0.4", lw=0.6, ls=":")
        ax.text(0.995, 0.9, f"step mean {100 * mean:.1f}%, peak {100 * util.max():.1f}%", transform=ax.transAxes, ha="right", va="top", fontsize=7,
                bbox={"fc": "white", "ec": "0.7", "alpha": 0.85, "pad": 2})
        ax.grid(alpha=0.25)
    axes[-1, 0].set_xlabel("time within the decode step (µs)")
    where = ", ".join(f"{_short(p)}={_fmt(v)}" for p, v in meta.get("assignments", []))
    fig.suptitle(f"bandwidth utilisation over one decode step (DES event log; {where or 'base point'})", fontsize=9)
    return _save(fig, folder, "bandwidth")


# -- roofline -------------------------------------------------------------------------------


def roofline(detail: Path, folder: Path) -> list[str]:
    meta = _detail(detail)
    if meta is None:
        return []
    ops = pd.read_parquet(detail / "ops.parquet")
    store = meta["store"]
    byte_cols = [c for c in ops.columns if c.endswith(f"_{store}_bytes")]
    if not byte_cols:
        return []
    nbytes = ops[byte_cols].fillna(0).sum(axis=1)
    work = ops["flops"].fillna(0) + ops.get("vector_ops", 0)
    dur = (ops["end_ns"] - ops["start_ns"]).clip(lower=1e-9)
    placed = ops[(nbytes > 0) & (work > 0)].copy()
    placed["intensity"] = (work / nbytes)[placed.index]
    placed["tflops"] = (work / dur / 1e3)[placed.index]
    if placed.empty:
        return []
    peak_t = meta["matrix_peak_TFLOPs"]
    bw = meta["peaks_GBps"][store]
    fig, ax = plt.subplots(figsize=(7.5, 5))
    x = np.logspace(math.log10(max(placed["intensity"].min() / 3, 1e-3)),
                    math.log10(max(placed["intensity"].max() * 3, peak_t * 1e3 / bw * 3)), 200)
    ax.plot(x, np.minimum(peak_t, x * bw / 1e3), color="black", lw=1.5,
            label=f"roof: {peak_t:.0f} TFLOP/s {meta['matmul_dtype']}, {store} {bw:.0f} GB/s")
    names = placed["name"].value_counts().index.tolist()
    cmap = plt.get_cmap("tab10")
    for i, name in enumerate(names[:10]):
        rows = placed[placed["name"] == name]
        ax.scatter(rows["intensity"], rows["tflops"], s=14, color=cmap(i), label=f"{name} ({len(rows)})", alpha=0.75)
    rest = placed[~placed["name"].isin(names[:10])]
    if not rest.empty:
        ax.scatter(rest["intensity"], rest["tflops"], s=10, color="0.5", label=f"other ops ({len(rest)})", alpha=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"arithmetic intensity (FLOP per byte from {store})")
    ax.set_ylabel("achieved throughput (TFLOP/s)")
    where = ", ".join(f"{_short(p)}={_fmt(v)}" for p, v in meta.get("assignments", []))
    skipped = len(ops) - len(placed)
    ax.set_title(f"roofline, one decode step ({where or 'base point'}); {skipped} ops with no {store} bytes or no "
                 "FLOPs not placed", fontsize=8)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3, which="both")
    return _save(fig, folder, "roofline")
