"""Fit a hardware profile's measured figures to the rows of ``decodesim calibrate``.

Input: the CSV of sim/calibrate/bench.py (one row per configuration, microseconds per call).
Output: figures keyed by the profile's dotted paths, each with its value and a note on how it
was fitted, plus the fit errors per class. No GPU, numpy and pandas only.

The model is the one sim/costs charges: a kernel of class c takes ``startup_c + bytes / BW_c``
(``BW_c = stream_fraction_c x`` the store's sustained stream rate); a class whose grid is one
CTA per row (``parallel: rows``: reductions, gathers) reads at most ``rows x cta_bandwidth``;
a matrix kernel takes ``startup + max(bytes / BW, flops / (peak x matrix_efficiency))``.
Each class is fitted by least squares on relative error (start-up from the small sizes, whose
data sit in the L2 as a decode step's activations do; the rate from the HBM-cold sizes), with a
fixed third of the configurations held out by a hash of their id (never by shape), so the
report gives fit and held-out errors apart. (calibration/fit_kernels.py, which fits the richer
H200 sweeps, uses the same functions.)
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pandas as pd

from sim.units import GFLOP_PER_TFLOP, NS_PER_US, TB, US_PER_S


def held_out(config_id: str) -> bool:
    """A fixed third of the configurations, by hash (never by shape)."""
    return int(hashlib.sha256(config_id.encode()).hexdigest(), 16) % 3 == 0


def errors(pred, meas) -> dict:
    """n, median and worst absolute relative error (percent) of ``pred`` against ``meas``."""
    e = (np.asarray(pred, float) - np.asarray(meas, float)) / np.asarray(meas, float)
    if len(e) == 0:
        return {"n": 0}
    return {"n": int(len(e)), "median_abs_pct": round(float(np.median(np.abs(e))) * 100, 2),
            "worst_abs_pct": round(float(np.max(np.abs(e))) * 100, 2)}


def linfit(x, t):
    """t = a + b x, weighted least squares on relative error."""
    x, t = np.asarray(x, float), np.asarray(t, float)
    w = 1.0 / t
    A = np.vstack([np.ones_like(x), x]).T * w[:, None]
    (a, b), *_ = np.linalg.lstsq(A, t * w, rcond=None)
    return float(a), float(b)


def _moved(d: pd.DataFrame) -> np.ndarray:
    return (d.bytes_read + d.bytes_written).to_numpy(float)


def _split(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    mask = df.config_id.map(held_out)
    return df[~mask], df[mask]


def fit_linear_class(df: pd.DataFrame, small_bytes: int = 256 * 1024) -> dict:
    """Start-up from the small sizes (data in L2), the HBM rate from the slope over the
    HBM-cold sizes; t = startup + bytes / BW."""
    fit, hold = _split(df)
    small = fit[_moved(fit) <= small_bytes]
    cold = fit[fit.hbm_cold.astype(bool)]
    if len(cold) < 2:
        cold = fit[_moved(fit) >= 16 * 2**20]
    _, b = linfit(_moved(cold), cold.median_us.to_numpy(float) * NS_PER_US)
    bw = 1.0 / b if b > 0 else math.inf
    if len(small) == 0:
        small = fit.nsmallest(2, "size_bytes")
    a = float(np.median(small.median_us.to_numpy(float) * NS_PER_US - _moved(small) / bw))

    def pred(d):
        return (a + _moved(d) / bw) / NS_PER_US

    return {"startup_ns": round(a, 1), "bandwidth_GBps": round(bw, 1), "fit": errors(pred(fit), fit.median_us),
            "held_out": errors(pred(hold), hold.median_us), "impls": sorted(df.impl.unique()),
            "residuals": _residuals(pred(df), df)}


def fit_rows_class(df: pd.DataFrame, bw_cap: float) -> dict:
    """t = a + bytes / min(bw_cap, rows x cta): a grid search over cta, a by the median."""
    fit, hold = _split(df)
    x, t, r = _moved(fit), fit.median_us.to_numpy(float) * NS_PER_US, fit.rows.to_numpy(float)
    best = None
    for cta in np.geomspace(2, 400, 80):
        rate = np.minimum(bw_cap, r * cta)
        a = max(float(np.median(t - x / rate)), 0.0)
        err = float(np.median(np.abs(a + x / rate - t) / t))
        if best is None or err < best[0]:
            best = (err, cta, a)
    _, cta, a = best

    def pred(d):
        return (a + _moved(d) / np.minimum(bw_cap, d.rows.to_numpy(float) * cta)) / NS_PER_US

    return {"startup_ns": round(a, 1), "bandwidth_GBps": round(bw_cap, 1), "cta_bandwidth_GBps": round(float(cta), 2),
            "parallel": "rows", "fit": errors(pred(fit), fit.median_us), "held_out": errors(pred(hold), hold.median_us),
            "impls": sorted(df.impl.unique()), "residuals": _residuals(pred(df), df)}


def fit_matrix(g: pd.DataFrame, peak_TFLOPs: float) -> dict:
    """bf16 F.linear: t = a + max(bytes / bw, flops / (peak x eff)); a and bw from M <= 16
    (memory-bound), eff from M >= 128 (where compute shows)."""
    fit, hold = _split(g)
    small = fit[fit.M <= 16]
    a, b = linfit(small.bytes_read.to_numpy(float), small.median_us.to_numpy(float) * NS_PER_US)
    bw = 1.0 / b if b > 0 else math.inf
    big = fit[fit.M >= 128]
    best = (math.inf, 0.7)
    for eff in np.linspace(0.3, 0.95, 66):
        pred = a + np.maximum(big.bytes_read / bw, big.flops / (peak_TFLOPs * GFLOP_PER_TFLOP * eff))
        err = float(np.median(np.abs(pred - big.median_us * NS_PER_US) / (big.median_us * NS_PER_US))) if len(big) else 0.0
        if err < best[0]:
            best = (err, eff)
    eff = float(best[1])

    def pred(d):
        return (a + np.maximum(d.bytes_read / bw, d.flops / (peak_TFLOPs * GFLOP_PER_TFLOP * eff))) / NS_PER_US

    return {"startup_ns": round(a, 1), "bandwidth_GBps": round(bw, 1), "matrix_efficiency": round(eff, 3),
            "fit": errors(pred(fit), fit.median_us), "held_out": errors(pred(hold), hold.median_us),
            "impls": ["F.linear"], "residuals": _residuals(pred(g), g)}


def fit_attention(a: pd.DataFrame) -> dict:
    """Decode SDPA: t = startup + KV bytes / BW over the batch x context grid."""
    fit, hold = _split(a)
    start, b = linfit(fit.size_bytes.to_numpy(float), fit.median_us.to_numpy(float) * NS_PER_US)
    bw = 1.0 / b if b > 0 else math.inf  # no slope: bytes never showed (start-up bound rows)

    def pred(d):
        return (start + d.size_bytes.to_numpy(float) / bw) / NS_PER_US

    return {"startup_ns": round(start, 1), "bandwidth_GBps": round(bw, 1), "fit": errors(pred(fit), fit.median_us),
            "held_out": errors(pred(hold), hold.median_us), "impls": ["sdpa"], "residuals": _residuals(pred(a), a)}


def _residuals(pred, d: pd.DataFrame) -> list[float]:
    """Relative residuals (pred / measured - 1) of every row: the spread the error bands use."""
    return [round(float(x), 4) for x in (np.asarray(pred, float) / d.median_us.to_numpy(float) - 1)]


def host_figures(h: pd.DataFrame) -> dict:
    """Host figures in ns from the host rows (medians)."""
    med = dict(zip(h.impl, h.median_us.astype(float) * NS_PER_US, strict=True))
    return {"launch_overhead_ns": med.get("launch_eager"), "kernel_gap_ns": med.get("graph_per_kernel"),
            "graph_launch_ns": med.get("graph_launch"), "sync_round_trip_ns": med.get("sync_idle"),
            "item_ns": med.get("item_d2h")}


def stream(rows: pd.DataFrame) -> dict:
    """The HBM stream: sustained read rate (median over >= 1 GiB, else the largest sizes) and
    the start-up t0 of t = t0 + bytes / BW over the read kernel's sizes."""
    read = rows[rows.impl == "read_sum"].sort_values("size_bytes")
    big = read[read.size_bytes >= 2**30]
    if big.empty:
        big = read.tail(1)
    sustained = float(np.median(big.size_bytes / (big.median_us * NS_PER_US)))  # bytes/ns = GB/s
    t0, _ = linfit(read.size_bytes.to_numpy(float), read.median_us.to_numpy(float) * NS_PER_US)
    copy = rows[(rows.impl == "copy") & (rows.size_bytes >= 2**30)]
    copy_GBps = float(np.median(2 * copy.size_bytes / (copy.median_us * NS_PER_US))) if len(copy) else None
    return {"sustained_GBps": round(sustained, 4), "t0_ns": round(t0, 1), "copy_GBps": copy_GBps and round(copy_GBps, 1)}


def fit_all(df: pd.DataFrame, peak_GBps: float, refresh: float, peak_TFLOPs: float) -> dict:
    """Every figure of a calibration CSV: the store's stream, L2, host, matrix peak and the
    kernel classes (their rates as fractions of the measured sustained stream)."""
    ok = df[df.error.isna() | (df.error == "")] if "error" in df else df
    ok = ok[ok.median_us.notna()]
    hbm = stream(ok[ok.section == "hbm"])
    sustained = hbm["sustained_GBps"]
    classes = {}
    rows = ok[ok.section == "classes"]
    for kclass, sub in rows.groupby("kclass", sort=False):
        if len(sub) < 3:
            continue
        # a class measured by rows (one CTA per row: reductions, gathers) takes the per-CTA fit
        by_rows = "rows" in sub and sub["rows"].notna().any()
        classes[kclass] = fit_rows_class(sub, bw_cap=sustained) if by_rows else fit_linear_class(sub)
    mat = ok[ok.section == "gemm"]
    if len(mat) >= 3:
        classes["matrix"] = fit_matrix(mat, peak_TFLOPs)
    att = ok[ok.section == "sdpa"]
    if len(att) >= 3:
        classes["attention"] = fit_attention(att)
    for c in classes.values():
        c["stream_fraction"] = round(min(c["bandwidth_GBps"] / sustained, 1.2), 3)
    l2 = ok[ok.section == "l2"]
    l2_GBps = float(((l2.bytes_read + l2.bytes_written) / (l2.median_us * NS_PER_US)).max()) if len(l2) else None
    peak = ok[ok.section == "peak"]
    tflops = float((peak.flops / (peak.median_us / US_PER_S) / TB).max()) if len(peak) else None
    host = host_figures(ok[ok.section == "overheads"])
    return {"hbm": hbm, "stream_efficiency": round(sustained / peak_GBps / (1 - refresh), 4),
            "l2_GBps": l2_GBps and round(l2_GBps, 0), "matmul_TFLOPs": tflops and round(tflops, 1),
            "matrix_efficiency": tflops and round(tflops / peak_TFLOPs, 4), "host": host, "classes": classes,
            "sustained_GBps": sustained}
