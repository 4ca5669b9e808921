"""Fit the kernel-level cost model to the H200 kernel-class microbenchmarks.

Inputs (committed, measured by calibration/kernels.py, kv_attention.py, moe_host.py and
host_ops.py on one H200): ``data/h200/kernels/k/kernels.csv``,
``data/h200/kv/kv/kv_attention.csv``, ``data/h200/moe/m/host_dispatch.csv`` (host time per
kernel launch by op), ``data/h200/host_ops/host_ops.csv`` (host time of framework calls that
launch no kernel: nn.Module calls, views, transposes, slices). Whole decode steps are never
read here (they are the frozen validation set in validation/).

Model (sim/costs.py): a kernel of class c takes ``startup_c + max(bytes / BW, compute)``
where BW is the class's rate from HBM (``bandwidth_GBps``), or, for classes that put one
CTA on a row (``parallel: rows``), at most rows x the class's per-CTA rate; compute is the
matrix unit at ``matrix_efficiency`` of its peak for matrix kernels. Dequantizing attention
adds ``values x ps_per_value(format)`` beside the loads (the stack's implementations).

Method: each class is fitted by weighted least squares on relative error (t = a + b x bytes
for the linear classes, a small grid search for the per-CTA rate), with one third of the
configurations held out by a fixed hash of their config id; the report gives the fit and
held-out errors separately. ``--write`` puts the figures, each with its source, into
hardware_profiles/h200-sxm.yaml (the block after ``# >>> kernels``) and into the software
stacks' fitted blocks (``# >>> fitted`` .. ``# <<< fitted``).

Run: ``python calibration/fit_kernels.py [--write]`` (numpy + pandas; no GPU).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KERNELS = HERE / "data/h200/kernels/k/kernels.csv"
KERNELS21 = HERE / "data/h200/i21/k/kernels.csv"  # issue 21: castred, kv_append, fp8_static, grouped_mm
BCAST = HERE / "data/h200/i21/bcast/b/kernels.csv"  # issue 21: broadcast, sliced and strided element-wise
KV = HERE / "data/h200/kv/kv/kv_attention.csv"
KV21 = HERE / "data/h200/i21/kv/kv_attention.csv"  # issue 21: 32k and 128k context, batch 1-64
SDPA_HEADS = HERE / "data/h200/i21/sdpa_heads"  # issue 21: cuDNN SDPA at head_dim 64, 128 (40 heads), 256
HOST = HERE / "data/h200/moe/m/host_dispatch.csv"
HOST_OPS = HERE / "data/h200/host_ops/host_ops.csv"
OUT = HERE / "kernel_fit.json"
PROFILE = ROOT / "hardware_profiles/h200-sxm.yaml"
STACKS = ROOT / "workloads/software"
PEAK_BF16_TFLOPS = 989.4  # NVIDIA H200 datasheet, dense bf16 (sources.md N10)

# kernel classes: which single-kernel microbenchmarks measure each (kernels.csv impl names; the
# elementwise section of kernels.csv, and the castred section of the issue-21 run)
CLASSES = {
    "elementwise": ["add", "mul", "silu"],
    # the casts PyTorch vectorizes: fp32 -> bf16 and anything -> fp8 (the others: impls below)
    "cast": ["cast_fp32_bf16", "cast_fp32_float8_e4m3fn", "cast_bf16_float8_e4m3fn"],
    "copy": ["copy_", "cat2"],
    # single-pass row reductions over rows of >= 1024 values (sum, amax, mean, argmax) and whole
    # tensors; narrower rows (64) are bound by rows, not bytes, and lie outside this model (reported)
    "reduction": ["reduce_sum", "reduce_amax", "reduce_mean_fp32", "reduce_full_sum", "reduce_full_amax"],
    "index": ["index_select", "F.embedding", "index_copy_", "index_add_"],
}
ROWS_PARALLEL = {"reduction", "index"}
MIN_ROW_WIDTH = {"reduction": 1024}
# kernel implementations a stack can name (``impls``): PyTorch's element-by-element kernels,
# its grouped GEMM; each an efficiency against its class's rate, from these microbenchmarks
IMPLS = {
    "widen_cast": ("cast", ["cast_bf16_fp32", "cast_fp16_fp32", "cast_bf16_fp32_slice"]),
    "byte_cast": ("cast", ["cast_bf16_int8", "cast_int8_bf16", "cast_float8_e4m3fn_bf16", "cast_int8_bf16_sliced",
                           "cast_uint8_bf16_sliced"]),
    "broadcast": ("elementwise", ["mul_rowscale", "mul_groupscale", "add_groupzero"]),
    # PyTorch's strided (non-vectorized) element-wise kernel: bit ops on strided codes; RoPE on q, k views
    "strided": ("elementwise", ["and15_sliced", "shr4_sliced"]),
    "byte_stack": ("copy", ["stack2_uint8"]),
    "argmax": ("reduction", ["argmax", "reduce_argmax"]),  # index of the max: a slower reduction kernel
}
IMPL_MIN_BYTES = 16 * 2**20  # efficiencies from the sizes where the rate, not the start-up, shows


def held_out(config_id: str) -> bool:
    """A fixed third of the configurations, by hash (never by shape)."""
    return int(hashlib.sha256(config_id.encode()).hexdigest(), 16) % 3 == 0


def errors(pred, meas) -> dict:
    e = (np.asarray(pred) - np.asarray(meas)) / np.asarray(meas)
    if len(e) == 0:
        return {"n": 0}
    return {"n": int(len(e)), "median_abs_pct": round(float(np.median(np.abs(e))) * 100, 2),
            "worst_abs_pct": round(float(np.max(np.abs(e))) * 100, 2)}


def linfit(x, t):
    """t = a + b x, weighted least squares on relative error."""
    w = 1.0 / t
    A = np.vstack([np.ones_like(x), x]).T * w[:, None]
    (a, b), *_ = np.linalg.lstsq(A, t * w, rcond=None)
    return float(a), float(b)


def fit_linear_class(df: pd.DataFrame) -> dict:
    """Start-up from the small sizes (data in L2, as a decode step's activations are), the
    HBM rate from the slope over the HBM-cold sizes."""
    fit = df[~df.config_id.map(held_out)]
    hold = df[df.config_id.map(held_out)]
    size = fit.bytes_read + fit.bytes_written
    small = fit[size <= 256 * 1024]
    cold = fit[fit.hbm_cold == True]  # noqa: E712
    _, b = linfit((cold.bytes_read + cold.bytes_written).to_numpy(float), cold.median_us.to_numpy(float) * 1e3)
    bw = 1.0 / b if b > 0 else math.inf
    a = float(np.median(small.median_us * 1e3 - (small.bytes_read + small.bytes_written) / bw))
    pred = lambda d: (a + (d.bytes_read + d.bytes_written).to_numpy(float) / bw) / 1e3  # noqa: E731
    return {"startup_ns": round(a, 1), "bandwidth_GBps": round(bw, 1), "fit": errors(pred(fit), fit.median_us),
            "held_out": errors(pred(hold), hold.median_us), "impls": sorted(df.impl.unique())}


def fit_rows_class(df: pd.DataFrame, bw_cap: float) -> dict:
    """t = a + bytes / min(bw, rows x cta): grid search over cta, least squares for a, 1/bw."""
    fit = df[~df.config_id.map(held_out)]
    hold = df[df.config_id.map(held_out)]
    best = None
    for cta in np.geomspace(2, 200, 60):
        x = (fit.bytes_read + fit.bytes_written).to_numpy(float)
        rate = np.minimum(bw_cap, fit.rows.to_numpy(float) * cta)
        t = fit.median_us.to_numpy(float) * 1e3
        a = float(np.median(t - x / rate))
        a = max(a, 0.0)
        pred = a + x / rate
        err = float(np.median(np.abs(pred - t) / t))
        if best is None or err < best[0]:
            best = (err, cta, a)
    _, cta, a = best

    def pred(d):
        x = (d.bytes_read + d.bytes_written).to_numpy(float)
        return (a + x / np.minimum(bw_cap, d.rows.to_numpy(float) * cta)) / 1e3

    return {"startup_ns": round(a, 1), "bandwidth_GBps": round(bw_cap, 1), "cta_bandwidth_GBps": round(float(cta), 2),
            "parallel": "rows", "fit": errors(pred(fit), fit.median_us), "held_out": errors(pred(hold), hold.median_us),
            "impls": sorted(df.impl.unique())}


def fit_rows_joint(df: pd.DataFrame, bw_cap: float) -> dict:
    """t = a + bytes / min(bw, rows x cta), a, cta and bw (<= bw_cap) by a grid search that
    minimises the mean relative error of the fit third (the start-up and the per-row rate
    together: reductions of few rows are neither start-up nor bandwidth bound)."""
    fit = df[~df.config_id.map(held_out)]
    hold = df[df.config_id.map(held_out)]
    x = (fit.bytes_read + fit.bytes_written).to_numpy(float)
    t = fit.median_us.to_numpy(float) * 1e3
    r = fit.rows.to_numpy(float)
    best = None
    for bw in np.linspace(1500.0, bw_cap, 30):
        for cta in np.geomspace(2, 400, 80):
            rate = np.minimum(bw, r * cta)
            for a in np.arange(500.0, 6000.0, 100.0):
                err = float(np.mean(np.abs(a + x / rate - t) / t))
                if best is None or err < best[0]:
                    best = (err, a, cta, bw)
    _, a, cta, bw = best

    def pred(d):
        return (a + (d.bytes_read + d.bytes_written).to_numpy(float) / np.minimum(bw, d.rows.to_numpy(float) * cta)) / 1e3

    return {"startup_ns": round(float(a), 1), "bandwidth_GBps": round(float(bw), 1), "cta_bandwidth_GBps": round(float(cta), 2),
            "parallel": "rows", "fit": errors(pred(fit), fit.median_us), "held_out": errors(pred(hold), hold.median_us),
            "impls": sorted(df.impl.unique())}


def fit_matrix(g: pd.DataFrame) -> dict:
    """bf16 F.linear: t = a + max(bytes / bw, flops / (peak x eff)); a and bw from M <= 16
    (memory-bound), eff from M >= 128 (the rows where compute shows)."""
    fit = g[~g.config_id.map(held_out)]
    hold = g[g.config_id.map(held_out)]
    small = fit[fit.M <= 16]
    a, b = linfit(small.bytes_read.to_numpy(float), small.median_us.to_numpy(float) * 1e3)
    bw = 1.0 / b
    big = fit[fit.M >= 128]
    best = None
    for eff in np.linspace(0.3, 0.95, 66):
        pred = a + np.maximum(big.bytes_read / bw, big.flops / (PEAK_BF16_TFLOPS * 1e3 * eff))
        err = float(np.median(np.abs(pred - big.median_us * 1e3) / (big.median_us * 1e3)))
        if best is None or err < best[0]:
            best = (err, eff)
    eff = best[1]

    def pred(d):
        return (a + np.maximum(d.bytes_read / bw, d.flops / (PEAK_BF16_TFLOPS * 1e3 * eff))) / 1e3

    return {"startup_ns": round(a, 1), "bandwidth_GBps": round(bw, 1), "matrix_efficiency": round(float(eff), 3),
            "fit": errors(pred(fit), fit.median_us), "held_out": errors(pred(hold), hold.median_us),
            "rows": int(len(g))}


def fit_grid_cta(k: pd.DataFrame) -> float:
    """One program's streaming rate (GB/s): the grid section's few-program rows at >= 64 MiB."""
    g = k[(k.section == "grid") & (k.n_programs <= 16) & (k.size_bytes >= 64 * 2**20)]
    return float(np.median(g.achieved_GBps / g.n_programs))


# -- attention --------------------------------------------------------------------------------

FORMATS = {  # kv_attention.py format -> (bits, group, outlier fraction, K per channel, codebook)
    "int8": (8.0, 128, 0.0, False, False),
    "int4-g32": (4.0, 32, 0.0, False, False),
    "int4-g64": (4.0, 64, 0.0, False, False),
    "int4-g128": (4.0, 128, 0.0, False, False),
    "int2-kivi": (2.0, 32, 0.0, True, False),
    "int2-asym-outlier": (2.0, 128, 0.05, False, False),
}
HELD_OUT_FORMAT = "int4-g64"


def nonneg_lstsq(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (active set: drop the most negative, refit)."""
    active = list(range(A.shape[1]))
    while True:
        coef = np.zeros(A.shape[1])
        sol, *_ = np.linalg.lstsq(A[:, active], y, rcond=None)
        coef[active] = sol
        if (sol >= 0).all() or not active:
            return coef
        active.pop(int(np.argmin(sol)))


def attention_values(df: pd.DataFrame) -> np.ndarray:
    return (df.B * df.Hkv * df.L * df.D * 2).to_numpy(float)


def fit_attention(kv: pd.DataFrame) -> dict:
    """The attention class (bf16 cuDNN SDPA: start-up and KV rate) and each Triton
    implementation's efficiency and per-value dequantization cost by format layout."""
    kv = kv[kv.phase == "sweep"].dropna(subset=["median_us"]).copy()
    kv["held"] = kv.config_id.map(held_out)
    ref = kv[kv.impl == "sdpa_cudnn"]
    fit = ref[~ref.held]
    a, b = linfit(fit.kv_bytes.to_numpy(float), fit.median_us.to_numpy(float) * 1e3)
    cls = {"startup_ns": round(a, 1), "bandwidth_GBps": round(1 / b, 1)}
    pred = lambda d: (a + d.kv_bytes / (1 / b)) / 1e3  # noqa: E731
    cls["fit"] = errors(pred(fit), fit.median_us)
    cls["held_out"] = errors(pred(ref[ref.held]), ref[ref.held].median_us)
    impls = {}
    for family in ("triton_group", "triton_elem"):
        rows = kv[kv.impl.str.startswith(family)]
        bf = kv[kv.impl == "triton_bf16"]
        eff = float(np.median((a + bf.kv_bytes * b) / (bf.median_us * 1e3)))  # the Triton kernel vs cuDNN
        eff = min(eff, 1.0)
        # dequantization time per value where the kernel is slower than its bytes allow
        rows = rows.assign(bits=rows.fmt.map(lambda f: FORMATS[f][0]), group=rows.fmt.map(lambda f: FORMATS[f][1]),
                           outl=rows.fmt.map(lambda f: FORMATS[f][2]), chan=rows.fmt.map(lambda f: FORMATS[f][3]),
                           values=attention_values(rows))
        rows["ps"] = (rows.median_us * 1e3 - a) / rows["values"] * 1e3
        big = rows[(rows.B * rows.L >= 1 << 18)]  # shapes where dequantization, not start-up, dominates
        train = big[(~big.held) & (big.fmt != HELD_OUT_FORMAT)]
        X = np.vstack([np.ones(len(train)), 8 / train.bits - 1, 1 / train.group, train.outl,
                       train.chan.astype(float)]).T
        coef = nonneg_lstsq(X / train.ps.to_numpy(float)[:, None], np.ones(len(train)))  # relative error
        names = ["value_ps", "unpack_ps", "group_ps", "outlier_ps", "channel_ps"]

        def predict(d, coef=coef, eff=eff):
            ps = (coef[0] + coef[1] * (8 / d.bits - 1) + coef[2] / d.group + coef[3] * d.outl
                  + coef[4] * d.chan.astype(float))
            deq = d["values"] * ps / 1e3
            mem = d.kv_bytes * b / eff
            return (a + np.maximum(mem, deq)) / 1e3

        fit_rows = rows[(~rows.held) & (rows.fmt != HELD_OUT_FORMAT)]
        hold_rows = rows[rows.held & (rows.fmt != HELD_OUT_FORMAT)]
        fmt_rows = rows[rows.fmt == HELD_OUT_FORMAT]
        impls[family] = {"efficiency": round(eff, 3), **{n: round(float(c), 2) for n, c in zip(names, coef, strict=True)},
                         "fit": errors(predict(fit_rows), fit_rows.median_us),
                         "held_out_shapes": errors(predict(hold_rows), hold_rows.median_us),
                         f"held_out_format_{HELD_OUT_FORMAT}": errors(predict(fmt_rows), fmt_rows.median_us)}
    return {"class": cls, "impls": impls}


# -- host dispatch ----------------------------------------------------------------------------

DISPATCH = {  # kernel class -> host_dispatch.csv op whose busy-device host time it takes
    "matrix": "linear", "attention": "sdpa", "elementwise": "add_", "reduction": "softmax", "cast": "add_",
    "copy": "cat", "index": "index_select",
}


def fit_dispatch(h: pd.DataFrame) -> dict:
    busy = h[h.device_busy == True]  # noqa: E712
    out = {}
    for kclass, op in DISPATCH.items():
        rows = busy[busy.op == op]
        out[kclass] = round(float(rows.host_us_per_call_median.median()) * 1e3, 0)
    item = h[(h.op == "d2h") & h.variant.str.contains("item")]
    sort = h[(h.op == "host_group") & h.variant.str.contains("sort stable cpu n=128")]
    out["item_ns"] = round(float(item.host_us_per_call_median.median()) * 1e3, 0)
    out["grouping_ns"] = round(float(sort.host_us_per_call_median.median()) * 1e3, 0)
    return out


HOST_CALLS = {  # framework call a stack names -> host_ops.csv op (host time of a call that launches no kernel)
    "module_call": "module_call", "view": "view", "view_transpose": "transpose", "reshape": "reshape",
    "unsqueeze": "unsqueeze", "slice": "slice", "shape": "shape", "contiguous": "contiguous",
}


def fit_host_calls(h: pd.DataFrame) -> dict:
    """Host ns per kernel-less framework call (nn.Module __call__, view, transpose, ...), the
    median of host_ops.py's repeats with the device busy."""
    busy = h[h.device_busy == True]  # noqa: E712
    return {name: round(float(busy[busy.op == op].us_per_call_median.median()) * 1e3, 1)
            for name, op in HOST_CALLS.items()}


# -- the whole fit ----------------------------------------------------------------------------


def fit_impl(rows: pd.DataFrame, cls: dict) -> dict:
    """An implementation's efficiency against its class: the median over the large sizes (fit
    third) of the class's rate over the one measured, t = startup + bytes / (bw x eff)."""
    fit = rows[~rows.config_id.map(held_out)]
    hold = rows[rows.config_id.map(held_out)]
    a = cls["startup_ns"]

    def rate(d):  # the class's rate for these rows (a rows-parallel class: at most rows x per-CTA rate)
        if cls.get("parallel") == "rows":
            return np.minimum(cls["bandwidth_GBps"], d.rows.to_numpy(float) * cls["cta_bandwidth_GBps"])
        return cls["bandwidth_GBps"]

    def eff_of(d):
        moved = (d.bytes_read + d.bytes_written).to_numpy(float)
        return moved / rate(d) / np.maximum(d.median_us.to_numpy(float) * 1e3 - a, 1.0)

    big = fit[(fit.bytes_read + fit.bytes_written) >= IMPL_MIN_BYTES]
    eff = float(min(1.0, np.median(eff_of(big if len(big) >= 3 else fit))))
    # its own start-up where it has small sizes (<= 64 KiB, in L2 as decode activations are); an
    # implementation measured only above that gets start-up and rate from one line through its sizes
    small = fit[(fit.bytes_read + fit.bytes_written) <= 64 * 1024]
    if len(small) < 2 and cls.get("parallel") != "rows" and len(fit) >= 4:
        a, slope = linfit((fit.bytes_read + fit.bytes_written).to_numpy(float), fit.median_us.to_numpy(float) * 1e3)
        eff = float(min(1.0, 1.0 / (slope * cls["bandwidth_GBps"])))
    elif len(small) >= 2:
        moved = (small.bytes_read + small.bytes_written).to_numpy(float)
        a = float(np.median(small.median_us.to_numpy(float) * 1e3 - moved / (rate(small) * eff)))
    pred = lambda d: (a + (d.bytes_read + d.bytes_written).to_numpy(float) / (rate(d) * eff)) / 1e3  # noqa: E731
    return {"efficiency": round(eff, 3), "startup_ns": round(a, 1), "fit": errors(pred(fit), fit.median_us),
            "held_out": errors(pred(hold), hold.median_us), "impls": sorted(rows.impl.unique())}


def fit_grouped_mm(g: pd.DataFrame, matrix: dict) -> dict:
    """torch._grouped_mm against the matrix class: the rate its (touched) expert weights are
    read at, from the memory-bound calls (padded rows <= 1024), compute at the class's
    efficiency; t = startup + max(bytes / (bw x eff), flops / (peak x matrix_efficiency))."""
    fit = g[~g.config_id.map(held_out)]
    hold = g[g.config_id.map(held_out)]
    a, bw, meff = matrix["startup_ns"], matrix["bandwidth_GBps"], matrix["matrix_efficiency"]
    mem = fit[fit.M_padded <= 1024]
    eff = float(min(1.0, np.median(mem.bytes_read / bw / np.maximum(mem.median_us * 1e3 - a, 1.0))))

    def pred(d):
        return (a + np.maximum(d.bytes_read / (bw * eff), d.flops / (PEAK_BF16_TFLOPS * 1e3 * meff))) / 1e3

    return {"efficiency": round(eff, 3), "fit": errors(pred(fit), fit.median_us),
            "held_out": errors(pred(hold), hold.median_us), "impls": sorted(g.impl.unique())}  # the class's start-up


def fit_sdpa_head_dim(d: int, cls: dict) -> dict:
    """cuDNN SDPA's rate at head_dim ``d`` against the attention class (fitted at 128): the
    median over the fit third of the class's KV rate over the measured one."""
    rows = pd.read_csv(SDPA_HEADS / f"h16_8_{d}" / "kv_attention.csv")
    rows = rows[(rows.phase == "sweep") & rows.median_us.notna()]
    fit = rows[~rows.config_id.map(held_out)]
    hold = rows[rows.config_id.map(held_out)]
    a, bw = cls["startup_ns"], cls["bandwidth_GBps"]
    big = fit[fit.kv_bytes >= IMPL_MIN_BYTES]
    eff = float(min(1.0, np.median(big.kv_bytes / bw / np.maximum(big.median_us * 1e3 - a, 1.0))))
    pred = lambda x: (a + x.kv_bytes / (bw * eff)) / 1e3  # noqa: E731
    return {"efficiency": round(eff, 3), "fit": errors(pred(fit), fit.median_us),
            "held_out": errors(pred(hold), hold.median_us), "impls": [f"sdpa_cudnn D={d}"]}


def outside_rows(n: pd.DataFrame, cls: dict) -> dict:
    """The class's errors on the rows its model leaves out (narrow rows), reported, not fitted."""
    rows = n[(n.kclass == "reduction") & (n.row_width < MIN_ROW_WIDTH["reduction"])]
    x = (rows.bytes_read + rows.bytes_written).to_numpy(float)
    rate = np.minimum(cls["bandwidth_GBps"], rows.rows.to_numpy(float) * cls["cta_bandwidth_GBps"])
    return {"rows": "reductions over rows of 64 values (bound by rows, not bytes)",
            **errors((cls["startup_ns"] + x / rate) / 1e3, rows.median_us)}


def compute() -> dict:
    k = pd.read_csv(KERNELS)
    k = k[k.error.isna()]
    n = pd.concat([pd.read_csv(KERNELS21), pd.read_csv(BCAST)], ignore_index=True)
    n = n[n.error.isna()]
    e = pd.concat([k[k.section == "elementwise"], n[n.section.isin(["castred", "bcast"])]], ignore_index=True)
    cta = fit_grid_cta(k)
    classes = {}
    for cls, impls in CLASSES.items():
        rows = e[e.impl.isin(impls)]
        if cls in MIN_ROW_WIDTH:
            rows = rows[rows.row_width.isna() | (rows.row_width >= MIN_ROW_WIDTH[cls])]
        if cls not in ROWS_PARALLEL:
            classes[cls] = fit_linear_class(rows)
        elif cls == "reduction":
            classes[cls] = fit_rows_joint(rows, bw_cap=4400.0)
        else:
            classes[cls] = fit_rows_class(rows, bw_cap=4400.0)
    gemm = k[(k.section == "gemm") & (k.impl == "F.linear")]
    classes["matrix"] = fit_matrix(gemm)
    kv = fit_attention(pd.concat([pd.read_csv(KV), pd.read_csv(KV21)], ignore_index=True))
    classes["attention"] = kv["class"]
    impls = {name: fit_impl(e[e.impl.isin(names)], classes[cls]) | {"class": cls}
             for name, (cls, names) in IMPLS.items()}
    impls["grouped_mm"] = fit_grouped_mm(n[n.section == "grouped_mm"], classes["matrix"]) | {"class": "matrix"}
    impls["sdpa_d256"] = fit_sdpa_head_dim(256, classes["attention"]) | {"class": "attention"}
    return {"source": "measured: calibration/data/h200 (kernels.py, kv_attention.py, moe_host.py) via "
                      "calibration/fit_kernels.py",
            "grid_cta_bandwidth_GBps": round(cta, 2), "classes": classes, "attention_impls": kv["impls"],
            "impls": impls, "outside": {"reduction": outside_rows(n, classes["reduction"])},
            "dispatch_ns": fit_dispatch(pd.read_csv(HOST)), "host_calls_ns": fit_host_calls(pd.read_csv(HOST_OPS))}


# -- writing the figures ----------------------------------------------------------------------

SOURCE = "measured: calibration/data/h200/{csv} via calibration/fit_kernels.py"


def sustained_GBps() -> float:
    """The h200-sxm store's sustained stream rate (pin peak x stream efficiency x (1 - refresh))."""
    import yaml

    hbm = yaml.safe_load(PROFILE.read_text().split("# >>> kernels")[0])["memory"][0]
    peak = hbm["stacks"]["value"] * hbm["channels_per_stack"]["value"] * hbm["channel_bandwidth_GBps"]["value"]
    return peak * hbm["stream_efficiency"]["value"] * (1 - hbm["refresh_overhead"]["value"])


def profile_block(fit: dict) -> str:
    lines = ["# >>> kernels (written by calibration/fit_kernels.py --write; do not edit by hand)",
             "kernels:",
             f"  cta_bandwidth_GBps: {{value: {fit['grid_cta_bandwidth_GBps']}, source: \"" +
             SOURCE.format(csv="kernels/k/kernels.csv (grid: one program's streaming rate)") + "\"}",
             "  provenance: {kind: measured, device: \"NVIDIA H200\", data: calibration/data/h200}",
             "  classes:"]
    for name, c in fit["classes"].items():
        csv = "kv/kv/kv_attention.csv (sdpa_cudnn bf16)" if name == "attention" else \
            f"kernels/k/kernels.csv ({', '.join(c.get('impls', ['F.linear']))})"
        src = SOURCE.format(csv=csv)
        lines.append(f"    {name}:")
        lines.append(f"      startup_ns: {{value: {c['startup_ns']}, source: \"{src}\"}}")
        frac = round(c["bandwidth_GBps"] / sustained_GBps(), 3)
        lines.append(f"      stream_fraction: {{value: {frac}, source: \"{src} ({c['bandwidth_GBps']} GB/s over the "
                     f"profile's sustained {sustained_GBps():.0f} GB/s)\"}}")
        if c.get("parallel") == "rows":
            lines.append("      parallel: rows")
            lines.append(f"      cta_bandwidth_GBps: {{value: {c['cta_bandwidth_GBps']}, source: \"{src}\"}}")
    return "\n".join(lines) + "\n"


def write_profile(fit: dict) -> None:
    text = PROFILE.read_text()
    marker = "# >>> kernels"
    head = text.split(marker)[0].rstrip("\n") + "\n"
    energy = text[text.index("# >>> energy"):] if "# >>> energy" in text else ""  # calibration/energy/fit.py's block
    PROFILE.write_text(head + profile_block(fit) + energy)


def write_stacks(fit: dict) -> list[str]:
    """Replace each stack's ``# >>> fitted <name>`` .. ``# <<< fitted`` block."""
    written = []
    for path in sorted(STACKS.glob("*.yaml")):
        text = path.read_text()
        if "# >>> fitted" not in text:
            continue

        def block(match, fit=fit):
            what = match.group(1).strip()
            indent = match.group(2)
            return f"# >>> fitted {what}\n" + render(what, fit, indent) + f"{indent}# <<< fitted"

        new = re.sub(r"# >>> fitted ([^\n]*)\n.*?([ \t]*)# <<< fitted", block, text, flags=re.S)
        path.write_text(new)
        written.append(path.name)
    return written


def render(what: str, fit: dict, indent: str) -> str:
    out = []
    if what == "dispatch":
        src = SOURCE.format(csv="moe/m/host_dispatch.csv (busy device, host time per call)")
        for kclass, ns in fit["dispatch_ns"].items():
            if kclass.endswith("_ns"):
                continue
            out.append(f"{indent}{kclass}: {{value: {ns}, source: \"{src}\"}}")
    elif what == "moe_host":
        src = SOURCE.format(csv="moe/m/host_dispatch.csv (torch.sort of 128 routing ids on the host)")
        out.append(f"{indent}grouping_ns: {{value: {fit['dispatch_ns']['grouping_ns']}, source: \"{src}\"}}")
    elif what == "host calls":
        src = SOURCE.format(csv="host_ops/host_ops.csv (busy device, host time per call; no kernel launched)")
        for name, ns in fit["host_calls_ns"].items():
            out.append(f"{indent}{name}: {{value: {ns}, source: \"{src}\"}}")
    elif what == "impls":
        for name, c in fit["impls"].items():
            csv = {"grouped_mm": "i21/k/kernels.csv (grouped_mm)",
                   "sdpa_d256": "i21/sdpa_heads/h16_8_256/kv_attention.csv (sdpa_cudnn, head_dim 256)"}.get(
                name, f"i21 castred/bcast kernels.csv ({', '.join(c['impls'])})")
            src = SOURCE.format(csv=csv)
            startup = f"startup_ns: {{value: {c['startup_ns']}, source: \"{src}\"}}, " if "startup_ns" in c else ""
            out.append(f"{indent}{name}: {{efficiency: {{value: {c['efficiency']}, source: \"{src}\"}}, {startup}"
                       f"source: \"{c['class']} class\"}}")
    elif what.startswith("attention "):
        family = what.split()[1]
        c = fit["attention_impls"][family]
        src = SOURCE.format(csv=f"kv/kv/kv_attention.csv ({family}_*)")
        for key in ("efficiency", "value_ps", "unpack_ps", "group_ps", "outlier_ps", "channel_ps"):
            out.append(f"{indent}{key}: {{value: {c[key]}, source: \"{src}\"}}")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write the figures into the profile and the stacks")
    args = parser.parse_args(argv)
    fit = compute()
    OUT.write_text(json.dumps(fit, indent=1) + "\n")
    for name, c in fit["classes"].items():
        print(f"{name:<12} startup {c['startup_ns']:8.1f} ns  bw {c['bandwidth_GBps']:8.1f} GB/s  "
              f"fit {c['fit']}  held out {c['held_out']}")
    for name, c in fit["attention_impls"].items():
        print(f"{name:<13} {json.dumps(c)}")
    for name, c in fit["impls"].items():
        print(f"impl {name:<14} eff {c['efficiency']:.3f} ({c['class']})  fit {c['fit']}  held out {c['held_out']}")
    print("outside", fit["outside"])
    print("dispatch", fit["dispatch_ns"])
    print("host calls", fit["host_calls_ns"])
    if args.write:
        write_profile(fit)
        print("wrote", PROFILE.relative_to(ROOT), "and", ", ".join(write_stacks(fit)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
