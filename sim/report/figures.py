"""What every study plot shares: saving (PNG + SVG, atomic), reading the saved results,
picking rows, and the settings a set of rows holds constant (for titles derived from data).

A title never states a setting the plotted rows do not have: ``held(frame, axes)`` reads the
values off the rows themselves, so a panel of llama-3-70b points with fp8 weights says
"weights=fp8" even when the study's detail point has bf16.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from sim.io import write_with  # noqa: E402
from sim.report import labels  # noqa: E402
from sim.units import GB_PER_TB  # noqa: E402

# every breakdown row sim.results assigns time to, in the order bars stack them
ROW_ORDER = ["weights", "expert_weights", "staged_weights", "kv", "outliers", "activations", "temp", "combine",
             "compute", "expert_compute", "router", "dequant", "dispatch", "links", "host_link", "latency",
             "kernel_startup", "launch_sync", "contention"]
# one colour per breakdown row in every figure (tab20 entries, a new row appended so the others keep
# theirs; a row not listed is grey)
_TAB20 = plt.get_cmap("tab20").colors
ROW_COLOURS = {row: _TAB20[i] for i, row in enumerate(
    ["weights", "expert_weights", "kv", "outliers", "activations", "temp", "combine", "compute", "expert_compute",
     "router", "dequant", "dispatch", "links", "host_link", "latency", "kernel_startup", "launch_sync",
     "contention", "staged_weights"])}
FULL_PRECISION_KV = frozenset({"fp16", "bf16", "fp32"})


def row_colour(row: str):
    """The fixed colour of breakdown row ``row`` (the same in every figure)."""
    return ROW_COLOURS.get(row, (0.6, 0.6, 0.6))


def stacked_rows(breakdowns) -> list[str]:
    """Every row with time in any of ``breakdowns`` (dicts row -> ms), in ROW_ORDER, unknown rows
    last: bars drawn from these sum to the table's per-token time."""
    present = {row for b in breakdowns for row, ms in b.items() if ms and ms > 0}
    return [r for r in ROW_ORDER if r in present] + sorted(present - set(ROW_ORDER))


def row_label(row: str, kv_formats=()) -> str:
    """The legend text of ``row``; ``dequant`` says when quantized-KV reads are counted in it
    (an op's body goes to the longest of its loads and its compute: for quantized-KV attention
    that is usually the dequantization, which then holds the KV reads it overlaps)."""
    text = labels.row(row)
    if row == "dequant" and set(kv_formats) - FULL_PRECISION_KV:
        text += "\n(quantized-KV attention: incl.\nthe KV reads it overlaps)"
    return text
LATENCY = "per_token_ms_p99"
MAX_PANELS = 8  # small multiples beyond this are split into one figure per value of the first facet


def save(fig, folder: Path, name: str) -> list[str]:
    """Write ``fig`` as ``folder/name.png`` and ``.svg`` (atomically); returns both paths."""
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
    """The saved results table and study settings of a study folder."""
    table = pd.read_parquet(out_dir / "results.parquet")
    settings = json.loads((out_dir / "study.json").read_text())
    return table, settings


def ok_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows that ran and have a latency (points that fit)."""
    if frame.empty or "status" not in frame:
        return frame.iloc[0:0]
    ok = frame[frame["status"] == "ok"]
    if LATENCY in ok:
        ok = ok[ok[LATENCY].notna()]
    return ok


def study_axes(settings: dict) -> dict[str, list]:
    return settings.get("axes", {})


def varying(settings: dict) -> list[str]:
    """The swept axes that take more than one value."""
    return [a for a, vals in study_axes(settings).items() if len(vals) > 1]


def detail_values(settings: dict) -> dict:
    """The point the detail run used: plots.detail, else each axis's middle value."""
    chosen = dict(settings["study"].get("plots", {}).get("detail") or {})
    for axis, vals in study_axes(settings).items():
        chosen.setdefault(axis, vals[(len(vals) - 1) // 2])
    return chosen


def key(value) -> str:
    """One spelling per value, so 25 (from the study) and 25.0 (from the table) match."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return f"{float(value):.12g}"
    return str(value)


def keys(column: pd.Series) -> pd.Series:
    return column.map(key)


def matching(frame: pd.DataFrame, where: dict) -> pd.DataFrame:
    """Rows whose axis values match ``where`` (axis -> value or list of values)."""
    sel = frame
    for axis, wanted in where.items():
        if axis not in sel:
            return sel.iloc[0:0]
        options = wanted if isinstance(wanted, list) else [wanted]
        sel = sel[keys(sel[axis]).isin([key(w) for w in options])]
    return sel


def held(frame: pd.DataFrame, axes: list[str]) -> dict:
    """The axes of ``axes`` that take exactly one value in ``frame``, with that value."""
    out = {}
    for axis in axes:
        if axis in frame and not frame.empty:
            values = frame[axis].dropna().unique()
            if len(values) == 1:
                out[axis] = values[0]
    return out


def settings_text(values: dict) -> str:
    """``{"kv": "fp16", "batch": 8}`` as "kv=fp16, batch=8" (dotted paths in words)."""
    return ", ".join(labels.setting(a, v) for a, v in values.items())


def target_ms(frame: pd.DataFrame, default: float = 10.0) -> float:
    if "target_ms" in frame and frame["target_ms"].notna().any():
        return float(frame["target_ms"].dropna().iloc[0])
    return default


def eng_axis(axis, which: str = "y") -> None:
    """Engineering tick labels (12.6k, not 1.26e+04) on one axis of ``axis``, major and minor."""
    target = axis.yaxis if which == "y" else axis.xaxis
    formatter = FuncFormatter(lambda v, _pos: labels.eng(v))
    target.set_major_formatter(formatter)
    target.set_minor_formatter(FuncFormatter(lambda v, _pos: _minor(v)))


def _minor(value: float) -> str:
    """Minor log ticks: label 2x and 5x decades only, so the axis stays readable."""
    if value <= 0:
        return ""
    lead = value / 10 ** np.floor(np.log10(value))
    return labels.eng(value) if round(lead) in (2, 5) and abs(lead - round(lead)) < 1e-6 else ""


def rate_text(GBps: float) -> str:
    """A bandwidth in human units: 4800 -> "4.8 TB/s", 450 -> "450 GB/s"."""
    return f"{GBps / GB_PER_TB:.3g} TB/s" if GBps >= GB_PER_TB else f"{GBps:.3g} GB/s"


HBM_CHANNEL_AXIS = "hardware.hbm.channel_bandwidth_GBps"


def hbm_channels(settings: dict) -> int | None:
    """The study's HBM channel count (stacks x channels per stack of its one hardware
    profile), or None where the hardware is swept or the profile does not say."""
    if "hardware" in study_axes(settings) and len(study_axes(settings)["hardware"]) > 1:
        return None
    given = {path: value for path, value, *_rest in settings.get("hardware_sources", [])}
    stacks, per_stack = given.get("memory.hbm.stacks"), given.get("memory.hbm.channels_per_stack")
    return int(stacks * per_stack) if isinstance(stacks, (int, float)) and isinstance(per_stack, (int, float)) \
        else None


def axis_ticks(axis: str, values: list, settings: dict) -> list[str]:
    """Tick labels of a swept axis: each value (labels.axis_tick), and for the HBM channel
    bandwidth the whole memory's bandwidth under it ("25" over "4.8 TB/s")."""
    channels = hbm_channels(settings) if axis == HBM_CHANNEL_AXIS else None
    return [labels.axis_tick(v) + (f"\n{rate_text(v * channels)}" if channels and isinstance(v, (int, float))
                                   else "") for v in values]


def axis_title(axis: str, settings: dict) -> str:
    """An axis title (labels.label), saying what a second tick line is where there is one."""
    extra = "; below: all channels" if axis == HBM_CHANNEL_AXIS and hbm_channels(settings) else ""
    return labels.label(axis) + extra


def slug(value) -> str:
    """A facet value as part of a file name."""
    text = "".join(c if c.isalnum() or c in "-_." else "-" for c in labels.tick(value))
    return text.strip("-") or "value"
