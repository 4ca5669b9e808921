#!/usr/bin/env python3
"""Fit the decodesim h200-sxm profile figures from the measured CSVs.

    python calibration/fit.py [--data calibration/data/h200] [--out calibration/h200_fit.json]

Needs only numpy, pandas and the standard library (no GPU). Reads the microbenchmark CSVs in
--data and writes one JSON document whose every figure carries its source file and fit method.

Held out: decode_steps.csv (the end-to-end decode-step latencies) is copied through for validation
only. No fitted figure reads it; the kernel counts come from the profiler table
(decode_kernels.csv), which counts kernels and times nothing.

If --data has a run2/ folder holding a repeat of the microbenchmarks, the key figures are also
computed from it and reported as a run-to-run spread.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys

import numpy as np
import pandas as pd

HBM_PEAK_GBPS = 4800.0      # H200 SXM datasheet, 4.8 TB/s
BF16_PEAK_TFLOPS = 989.4    # H100/H200 SXM datasheet, dense bf16
L2_BYTES_DEFAULT = 62914560  # as reported by torch on the measured part (60 MiB)
GB = 1e9

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def src(data_dir, name):
    rel = os.path.relpath(os.path.join(data_dir, name), REPO)
    return f"measured: {rel} via calibration/fit.py"


def linfit(bytes_, t_us, weighted=False):
    """Least squares t = t0 + bytes / BW. Returns t0_ns, BW_GBps, rms relative residual.
    weighted=True minimises relative (not absolute) residuals, so small sizes count as much."""
    x = np.asarray(bytes_, dtype=float)
    y = np.asarray(t_us, dtype=float) * 1e-6
    A = np.vstack([np.ones_like(x), x]).T
    w = 1.0 / y if weighted else np.ones_like(y)
    coef, *_ = np.linalg.lstsq(A * w[:, None], y * w, rcond=None)
    t0, inv_bw = coef
    pred = A @ coef
    rel = (pred - y) / y
    return {"t0_ns": float(t0 * 1e9), "bw_GBps": float(1.0 / inv_bw / GB) if inv_bw > 0 else float("inf"),
            "bw_fraction_of_peak": float(1.0 / inv_bw / GB / HBM_PEAK_GBPS) if inv_bw > 0 else None,
            "rms_rel_residual": float(np.sqrt(np.mean(rel ** 2))),
            "max_abs_rel_residual": float(np.max(np.abs(rel))), "n_points": int(len(x)),
            "bytes_range": [int(x.min()), int(x.max())]}


def linfit_robust(bytes_, t_us, max_rel=0.25, min_points=5):
    """Relative-weighted fit that drops, one at a time, the worst point while its relative
    residual exceeds max_rel (a cuBLAS/cuDNN plan outlier, say). Reports the dropped points."""
    x = np.asarray(bytes_, dtype=float)
    y = np.asarray(t_us, dtype=float)
    keep = np.ones(len(x), bool)
    dropped = []
    while keep.sum() > min_points:
        f = linfit(x[keep], y[keep], weighted=True)
        pred_us = (f["t0_ns"] * 1e-3 + x / (f["bw_GBps"] * GB) * 1e6)
        rel = np.where(keep, np.abs(pred_us - y) / y, 0.0)
        i = int(np.argmax(rel))
        if rel[i] <= max_rel:
            break
        keep[i] = False
        dropped.append({"bytes": int(x[i]), "median_us": float(y[i]), "rel_residual": float(rel[i])})
    f = linfit(x[keep], y[keep], weighted=True)
    f["dropped_points"] = dropped
    f["drop_rule"] = f"iteratively drop the worst point while its relative residual > {max_rel}"
    return f, keep


def r(x, nd=4):
    if x is None:
        return None
    if isinstance(x, (float, np.floating)):
        if not np.isfinite(x):
            return None
        return float(round(float(x), nd)) if abs(x) < 1e6 else float(round(float(x), 1))
    return x


def load(data_dir, name):
    p = os.path.join(data_dir, name)
    return pd.read_csv(p) if os.path.exists(p) else None


# ----------------------------------------------------------------------------- pieces

def fit_hbm(d, data_dir, l2_bytes):
    out = {}
    big = d[(d.regime == "hbm") & (d.bytes >= 2 ** 30)]
    med = lambda kind: float(big[big.kind == kind].achieved_GBps.median()) if (big.kind == kind).any() else None  # noqa: E731
    read_t, read_s, copy = med("read_triton"), med("read_torch_sum"), med("copy_d2d")
    best_read = max(v for v in (read_t, read_s) if v is not None)
    out["hbm_stream_efficiency"] = {
        "value": r(best_read / HBM_PEAK_GBPS),
        "read_GBps": r(best_read, 1),
        "read_GBps_by_kernel": {"triton_read": r(read_t, 1), "torch_sum": r(read_s, 1)},
        "peak_GBps": HBM_PEAK_GBPS,
        "method": ("median over sizes 1, 2, 4 GiB of the achieved read bandwidth (bytes read once / "
                   "median kernel time, CUDA events, HBM-cold rotating buffers) of the faster read "
                   "kernel, divided by the 4800 GB/s datasheet peak"),
        "source": src(data_dir, "hbm_bandwidth.csv"),
    }
    out["hbm_copy_efficiency"] = {
        "value": r(copy / HBM_PEAK_GBPS) if copy else None,
        "copy_GBps_read_plus_write": r(copy, 1),
        "method": ("median over 1, 2, 4 GiB of device-to-device copy_ bandwidth counting bytes read + "
                   "bytes written, / 4800 GB/s"),
        "source": src(data_dir, "hbm_bandwidth.csv"),
    }
    fits = {}
    for kind in ("read_triton", "read_torch_sum", "copy_d2d"):
        s = d[(d.kind == kind) & (d.regime == "hbm") & (d.bytes > l2_bytes)]
        if len(s) >= 3:
            x = s.bytes_moved.values
            fits[kind] = {"ols": linfit(x, s.median_us.values),
                          "relative_weighted": linfit(x, s.median_us.values, weighted=True)}
        s_all = d[(d.kind == kind) & (d.regime == "hbm")]
        if len(s_all) >= 3:
            fits.setdefault(kind, {})["relative_weighted_all_cold_sizes"] = linfit(
                s_all.bytes_moved.values, s_all.median_us.values, weighted=True)
    out["hbm_read_kernel_fit"] = {
        "fits": fits,
        "method": ("least squares t(bytes) = t0 + bytes/BW on median per-kernel times (CUDA events, "
                   "queue pre-filled so host launch is excluded) for sizes above the L2 "
                   f"({l2_bytes} B) with rotating HBM-cold buffers; 'ols' minimises absolute error "
                   "(dominated by the largest sizes), 'relative_weighted' relative error; "
                   "'relative_weighted_all_cold_sizes' also uses the cold sizes below the L2 size "
                   "(64 KiB and up), which pins t0 better. bytes = bytes moved (copy: read + write)"),
        "source": src(data_dir, "hbm_bandwidth.csv"),
    }
    curve = []
    for kind in ("read_triton", "read_torch_sum", "copy_d2d"):
        for _, row in d[(d.kind == kind) & (d.regime == "hbm")].iterrows():
            curve.append({"kind": kind, "bytes": int(row.bytes), "median_us": r(row.median_us, 3),
                          "achieved_GBps": r(row.achieved_GBps, 1),
                          "fraction_of_peak": r(row.achieved_GBps / HBM_PEAK_GBPS)})
    out["hbm_size_curve"] = {"rows": curve, "method": "copied from the HBM-cold rows",
                             "source": src(data_dir, "hbm_bandwidth.csv")}
    # L2
    l2 = d[d.kind.str.startswith("l2_multipass") & (d.bytes <= 48 * 2 ** 20)]
    if len(l2):
        mid = l2[(l2.bytes >= 8 * 2 ** 20) & (l2.bytes <= 40 * 2 ** 20)]
        best = l2.loc[l2.achieved_GBps.idxmax()]
        out["l2_bandwidth_GBps"] = {
            "value": r(float(mid.groupby("bytes").achieved_GBps.max().median()), 1),
            "max_GBps": r(float(best.achieved_GBps), 1), "max_at_bytes": int(best.bytes),
            "by_size_GBps": {str(int(b)): r(float(v), 1) for b, v in l2.groupby("bytes").achieved_GBps.max().items()},
            "per_kernel_l2_resident_rows": {
                k: {str(int(b)): r(float(v), 1) for b, v in d[d.kind == k].set_index("bytes").achieved_GBps.items()}
                for k in ("read_triton_l2", "read_torch_sum_l2", "copy_d2d_l2") if (d.kind == k).any()},
            "method": ("Triton kernel reading an L2-resident buffer 32 times in one launch (loads .cg, "
                       "bypassing L1; each pass shifts the block-to-program mapping); value = median over "
                       "buffer sizes 8-40 MiB of the better of 4 or 8 programs/SM. The per-kernel "
                       "*_l2 rows (one pass per launch, same buffer every repetition) include the "
                       "per-kernel fixed cost and are listed for reference"),
            "source": src(data_dir, "hbm_bandwidth.csv"),
        }
    return out


def fit_gather(g, data_dir, stream_read, stream_copy):
    g = g[g.achieved_GBps.notna()]
    rows = []
    for gran, s in g.groupby("granule_bytes"):
        best = s.loc[s.achieved_GBps.idxmax()]
        by = {m: {"moved_GBps": r(float(x.achieved_GBps.iloc[0]), 1),
                  "gathered_GBps": r(float(x.gathered_GBps.iloc[0]), 1)} for m, x in s.groupby("method")}
        rows.append({
            "granule_bytes": int(gran), "best_method": best.method,
            "moved_GBps": r(float(best.achieved_GBps), 1), "gathered_GBps": r(float(best.gathered_GBps), 1),
            "efficiency_vs_stream_copy": r(float(best.achieved_GBps) / stream_copy),
            "efficiency_vs_peak": r(float(best.achieved_GBps) / HBM_PEAK_GBPS),
            "gathered_read_vs_stream_read": r(float(best.gathered_GBps) / stream_read),
            "by_method": by,
        })
    return {"gather_efficiency": {
        "table": rows,
        "stream_copy_GBps": r(stream_copy, 1), "stream_read_GBps": r(stream_read, 1),
        "method": ("random uniform row gathers of 256 MiB per launch from a 4 GiB table (int32 rows of "
                   "the granule size); moved = gathered bytes + contiguous output writes + int64 "
                   "indices; efficiency_vs_stream_copy = moved GB/s / large-copy GB/s (both count a "
                   "read and a write per byte); gathered_read_vs_stream_read = gathered bytes/s / "
                   "large streaming read GB/s; best of torch.index_select and a Triton gather kernel"),
        "source": src(data_dir, "gather_bandwidth.csv")}}


def fit_gemm(gm, data_dir):
    out = {}
    dec = gm[gm.kind == "decode"]
    fits = {}
    for layout in sorted(dec.layout.unique()):
        s = dec[(dec.layout == layout) & (dec.M == 1)]
        fits[layout] = {"ols": linfit(s.weight_bytes.values, s.median_us.values),
                        "relative_weighted": linfit(s.weight_bytes.values, s.median_us.values, weighted=True),
                        "points": [{"K": int(a.K), "N": int(a.N), "weight_bytes": int(a.weight_bytes),
                                    "median_us": r(a.median_us, 3), "achieved_GBps": r(a.achieved_GBps, 1)}
                                   for _, a in s.iterrows()]}
    kn = fits.get("KN", next(iter(fits.values())))
    out["gemv_fit"] = {
        "fits_by_layout": fits,
        "method": ("least squares t = t0 + weight_bytes/BW over the 8 decode weight shapes at M=1 "
                   "(bf16, 33.5 MB to 1.05 GB; rotating weight copies so each call reads HBM-cold "
                   "weights; CUDA events with the queue pre-filled). KN = torch.matmul(x, W[K,N]); "
                   "NK = F.linear(x, W[N,K])"),
        "source": src(data_dir, "gemm.csv"),
    }
    rd_fit = None
    out["hbm_fixed_cost_ns"] = {
        "value": r(kn["ols"]["t0_ns"], 1),
        "effective_bw_GBps": r(kn["ols"]["bw_GBps"], 1),
        "relative_weighted": {"t0_ns": r(kn["relative_weighted"]["t0_ns"], 1),
                              "bw_GBps": r(kn["relative_weighted"]["bw_GBps"], 1)},
        "method": "intercept and slope of the OLS GEMV (M=1, matmul KN) fit above; read-kernel fit in hbm_read_kernel_fit",
        "source": src(data_dir, "gemm.csv"),
    }
    # small-M flatness
    flat = []
    for (layout, K, N), s in dec.groupby(["layout", "K", "N"]):
        s = s.sort_values("M")
        t1 = float(s[s.M == 1].median_us.iloc[0])
        flat_m = 1
        for _, a in s.iterrows():
            if a.median_us <= 1.10 * t1:
                flat_m = int(a.M)
            else:
                break
        first_2x = s[s.median_us >= 2 * t1]
        flat.append({"layout": layout, "K": int(K), "N": int(N), "t_M1_us": r(t1, 2),
                     "flat_within_10pct_until_M": flat_m,
                     "first_M_at_2x_time": int(first_2x.M.iloc[0]) if len(first_2x) else None,
                     "t_by_M_us": {str(int(a.M)): r(a.median_us, 2) for _, a in s.iterrows()},
                     "tflops_at_M512": r(float(s[s.M == s.M.max()].achieved_TFLOPs.iloc[0]), 1)})
    kn_flat = [f["flat_within_10pct_until_M"] for f in flat if f["layout"] == "KN"]
    out["small_m_gemm"] = {
        "summary": {"flat_until_M_min": int(min(kn_flat)), "flat_until_M_median": float(np.median(kn_flat)),
                    "flat_until_M_max": int(max(kn_flat))},
        "table": flat,
        "method": ("per weight shape: the largest M (walking up from 1) whose median time is within 10% "
                   "of the M=1 time; also the first M at which time doubles"),
        "source": src(data_dir, "gemm.csv"),
    }
    sq = gm[gm.kind == "large_square"]
    sus = gm[gm.kind.astype(str).str.startswith("large_square_sustained")]
    if len(sq):
        best = sq.loc[sq.achieved_TFLOPs.idxmax()]
        out["matrix_efficiency"] = {
            "value": r(float(best.achieved_TFLOPs) / BF16_PEAK_TFLOPS),
            "best_TFLOPs": r(float(best.achieved_TFLOPs), 1), "best_at_n": int(best.M),
            "by_n_TFLOPs": {str(int(a.M)): r(a.achieved_TFLOPs, 1) for _, a in sq.iterrows()},
            "peak_TFLOPs": BF16_PEAK_TFLOPS,
            "method": ("bf16 torch.matmul of square random n x n matrices (n = 4096, 8192, 16384), median of "
                       "12-50 timed products after warm-up; best TFLOP/s / 989.4 dense bf16 peak"),
            "source": src(data_dir, "gemm.csv"),
        }
        if len(sus):
            v = sus.achieved_TFLOPs.values
            out["matrix_efficiency"]["sustained"] = {
                "windows": int(len(v)), "first_window_TFLOPs": r(float(v[0]), 1),
                "last_window_TFLOPs": r(float(v[-1]), 1), "median_TFLOPs": r(float(np.median(v)), 1),
                "median_efficiency": r(float(np.median(v)) / BF16_PEAK_TFLOPS),
                "method": "back-to-back 8192^3 products for the requested seconds, median per window of 20"}
    return out


def fit_attention(a, data_dir):
    a = a[a.median_us.notna()]
    out = {}
    per_backend = {}
    for be, s in a.groupby("backend"):
        rob, keep = linfit_robust(s.kv_bytes.values, s.median_us.values)
        rob["dropped_configs"] = [{"B": int(b), "L": int(l)} for b, l, k in zip(s.B, s.L, keep) if not k]
        per_backend[be] = {"fit": linfit(s.kv_bytes.values, s.median_us.values),
                           "fit_relative_weighted": linfit(s.kv_bytes.values, s.median_us.values, weighted=True),
                           "fit_robust": rob}
    table = []
    for _, x in a[a.backend == "default"].sort_values(["B", "L"]).iterrows():
        table.append({"B": int(x.B), "L": int(x.L), "kv_bytes": int(x.kv_bytes), "median_us": r(x.median_us, 2),
                      "achieved_GBps": r(x.achieved_GBps, 1), "fraction_of_peak": r(x.achieved_GBps / HBM_PEAK_GBPS)})
    notes = a[(a.backend == "default") & a.note.astype(str).str.startswith("kernels")].note.tolist()
    failed = sorted({b for b in pd.read_csv(os.path.join(data_dir, "attention.csv")).query(
        "median_us != median_us").backend})
    d = per_backend.get("default", {}).get("fit", {})
    rb = per_backend.get("default", {}).get("fit_robust", {})
    out["attention_kv_read"] = {
        "default_backend_fit": {"t0_ns": r(d.get("t0_ns"), 1), "bw_GBps": r(d.get("bw_GBps"), 1),
                                "bw_fraction_of_peak": r(d.get("bw_fraction_of_peak")),
                                "rms_rel_residual": r(d.get("rms_rel_residual"))},
        "default_backend_fit_robust": {"t0_ns": r(rb.get("t0_ns"), 1), "bw_GBps": r(rb.get("bw_GBps"), 1),
                                       "bw_fraction_of_peak": r(rb.get("bw_fraction_of_peak")),
                                       "rms_rel_residual": r(rb.get("rms_rel_residual")),
                                       "dropped_configs": rb.get("dropped_configs")},
        "fits_by_backend": per_backend,
        "table_default_backend": table,
        "default_backend_kernels": notes,
        "backends_that_failed": failed,
        "method": ("torch SDPA, q [B,32,1,128] vs K,V [B,8,L,128] bf16 with enable_gqa=True, B in {1,8,32}, "
                   "L in {1k,4k,16k,32k}; kv_bytes = 2*B*8*L*128*2; OLS t = t0 + kv_bytes/BW over all 12 "
                   "points per backend ('fit'); 'fit_robust' is relative-weighted and drops plan outliers "
                   "(named in dropped_configs); the default backend's kernels were read with torch.profiler"),
        "source": src(data_dir, "attention.csv"),
    }
    return out


def fit_overheads(o, data_dir):
    def get(name, n=None):
        s = o[o.name == name]
        if n is not None:
            s = s[s.n == n]
        return float(s.median_us.iloc[0]) if len(s) else None

    S = src(data_dir, "overheads.csv")
    out = {
        "eager_launch_overhead_ns": {
            "value": r(get("eager_launch_host_enqueue_per_kernel", 1000) * 1e3, 0),
            "host_enqueue_n100_ns": r(get("eager_launch_host_enqueue_per_kernel", 100) * 1e3, 0),
            "gpu_events_host_fed_ns": r(get("eager_launch_gpu_events_per_kernel", 1000) * 1e3, 0),
            "device_side_kernel_spacing_backlogged_ns": r(get("eager_kernel_gpu_backlogged_per_kernel", 1000) * 1e3, 0),
            "method": ("1000 back-to-back x.add_(1) on a 1-element tensor from Python (PyTorch eager); "
                       "value = host time per launch (median of 40 trials); the GPU, fed by the host, "
                       "runs at the same rate. device_side_kernel_spacing = the same kernels with the "
                       "queue pre-filled (GPU-side cost of one tiny eager kernel, including its own run)"),
            "source": S},
        "graph_kernel_overhead_ns": {
            "value": r(get("graph_replay_gpu_per_kernel", 1000) * 1e3, 0),
            "n100_ns": r(get("graph_replay_gpu_per_kernel", 100) * 1e3, 0),
            "graph_of_1_kernel_ns": r(get("graph_replay_gpu_per_kernel", 1) * 1e3, 0),
            "graph_launch_host_call_ns": r(get("graph_replay_host_call", 1) * 1e3, 0),
            "graph_replay_wall_1_kernel_incl_sync_ns": r(get("graph_replay_wall_incl_sync", 1) * 1e3, 0),
            "method": ("CUDA events around one replay of a captured graph of N tiny kernels (x.add_(1)), "
                       "/ N, N=1000 (queue pre-filled); includes the tiny kernel's own execution, so it "
                       "is an upper bound on the per-node gap"),
            "source": S},
        "sync_round_trip_ns": {
            "value": r(get("synchronize_idle") * 1e3, 0),
            "tiny_kernel_plus_synchronize_ns": r(get("tiny_kernel_plus_synchronize") * 1e3, 0),
            "event_record_synchronize_ns": r(get("event_record_synchronize") * 1e3, 0),
            "method": "host perf_counter around torch.cuda.synchronize() with nothing pending, median of 5000",
            "source": S},
        "d2h_small_copy_ns": {
            "value": r(get("d2h_item_4B") * 1e3, 0),
            "tiny_kernel_plus_item_ns": r(get("tiny_kernel_plus_item") * 1e3, 0),
            "pinned_async_plus_stream_sync_ns": r(get("d2h_4B_pinned_async_plus_stream_sync") * 1e3, 0),
            "method": "host time of .item() on a 4-byte device tensor (cudaMemcpy D2H + sync), median of 5000",
            "source": S},
    }
    return out


def kernels_per_layer(k, data_dir, layers=32):
    if k is None:
        return {}
    k = k[k.is_kernel.astype(str).str.lower() == "true"]
    rows = []
    for (b, L), s in k.groupby(["batch", "context"]):
        lay = s[s.scope == "layer"]
        st = s[s.scope == "step"]
        n_layer = int(lay["count"].sum())
        n_step = int(st["count"].sum())
        rows.append({"batch": int(b), "context": int(L), "kernels_per_layer": n_layer,
                     "kernels_per_step": n_step, "kernels_outside_layers": n_step - layers * n_layer,
                     "distinct_kernels_per_layer": int(len(lay))})
    b1 = [x for x in rows if x["batch"] == 1]
    return {"kernels_per_layer": {
        "value": b1[0]["kernels_per_layer"] if b1 else rows[0]["kernels_per_layer"],
        "graph_value": b1[0]["kernels_per_layer"] if b1 else rows[0]["kernels_per_layer"],
        "by_config": rows,
        "method": ("torch.profiler CUDA activity over one eager decode step and, separately, one layer; "
                   "memcpy/memset entries excluded. The captured graph holds the same kernels (profiling "
                   "a graph replay gave the same per-step count, see decode_steps.csv)"),
        "source": src(data_dir, "decode_kernels.csv")}}


def key_numbers(fig):
    """Flat dict of the headline numbers (used for the run-to-run comparison)."""
    g = lambda *ks: _dig(fig, ks)  # noqa: E731
    return {
        "hbm_read_GBps": g("hbm_stream_efficiency", "read_GBps"),
        "hbm_copy_GBps": g("hbm_copy_efficiency", "copy_GBps_read_plus_write"),
        "l2_GBps": g("l2_bandwidth_GBps", "value"),
        "gemv_t0_ns": g("hbm_fixed_cost_ns", "value"),
        "gemv_bw_GBps": g("hbm_fixed_cost_ns", "effective_bw_GBps"),
        "matrix_TFLOPs": g("matrix_efficiency", "best_TFLOPs"),
        "attn_bw_GBps": g("attention_kv_read", "default_backend_fit", "bw_GBps"),
        "eager_launch_ns": g("eager_launch_overhead_ns", "value"),
        "graph_kernel_ns": g("graph_kernel_overhead_ns", "value"),
        "sync_ns": g("sync_round_trip_ns", "value"),
    }


def _dig(d, ks):
    for k in ks:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def compute(data_dir):
    mj = os.path.join(data_dir, "machine.json")
    machine = json.load(open(mj)) if os.path.exists(mj) else {}
    l2_bytes = int(machine.get("l2_cache_bytes") or L2_BYTES_DEFAULT)
    fig = {}
    hb = load(data_dir, "hbm_bandwidth.csv")
    if hb is not None:
        fig.update(fit_hbm(hb, data_dir, l2_bytes))
    gm = load(data_dir, "gemm.csv")
    if gm is not None:
        fig.update(fit_gemm(gm, data_dir))
    ga = load(data_dir, "gather_bandwidth.csv")
    if ga is not None and hb is not None:
        big = hb[(hb.regime == "hbm") & (hb.bytes >= 2 ** 30)]
        sr = float(big[big.kind.isin(["read_triton", "read_torch_sum"])].groupby("kind").achieved_GBps.median().max())
        sc = float(big[big.kind == "copy_d2d"].achieved_GBps.median())
        fig.update(fit_gather(ga, data_dir, sr, sc))
    at = load(data_dir, "attention.csv")
    if at is not None:
        fig.update(fit_attention(at, data_dir))
    ov = load(data_dir, "overheads.csv")
    if ov is not None:
        fig.update(fit_overheads(ov, data_dir))
    fig.update(kernels_per_layer(load(data_dir, "decode_kernels.csv"), data_dir))
    return fig, machine


REPEATS = (("run2", "run2"), ("eager_repeat_r1", "eager_repeat/r1"), ("eager_repeat_r2", "eager_repeat/r2"),
           ("eager_repeat_r3", "eager_repeat/r3"), ("eager_repeat_pinned_cpu3", "eager_repeat/pin"))


def repeatability(fig, r2):
    """The key figures of run 1 and of the repeat in r2, with their relative differences."""
    fig2, _ = compute(r2)
    k1, k2 = key_numbers(fig), key_numbers(fig2)
    return {
        "method": "the same microbenchmarks run again (calibration/data/h200/run2), same fits",
        "run1": k1, "run2": k2,
        "rel_diff": {k: (r((k2[k] - k1[k]) / k1[k]) if k1.get(k) and k2.get(k) is not None else None) for k in k1},
    }


def add_sustained(fig, r2):
    """Adds the repeat run's sustained-GEMM windows to matrix_efficiency where run 1 has none."""
    me = fig.get("matrix_efficiency")
    g2 = load(r2, "gemm.csv") if os.path.isdir(r2) else None
    if me is None or "sustained" in me or g2 is None:
        return
    sus = g2[g2.kind.astype(str).str.startswith("large_square_sustained")]
    if len(sus):
        v = sus.achieved_TFLOPs.values
        me["sustained"] = {
            "windows": int(len(v)), "first_window_TFLOPs": r(float(v[0]), 1),
            "last_window_TFLOPs": r(float(v[-1]), 1), "median_TFLOPs": r(float(np.median(v)), 1),
            "median_efficiency": r(float(np.median(v)) / BF16_PEAK_TFLOPS),
            "method": ("3 s of back-to-back 8192^3 bf16 products, median per window of 20; SM clock "
                       "fell to about 1485 MHz at the 700 W power limit (see run2/machine_microbench.json)"),
            "source": src(r2, "gemm.csv")}


def step_repeats(steps, data_dir):
    """Per (batch, context, graph): the decode step's median in every repeat of it, and their spread."""
    reps = {"run1": steps}
    for name, sub in REPEATS:
        x = load(os.path.join(data_dir, sub), "decode_steps.csv")
        if x is not None:
            reps[name] = x
    spread = []
    for (b, L, gr), _ in steps.groupby(["batch", "context", "graph"]):
        vals = {n: float(x[(x.batch == b) & (x.context == L) & (x.graph == gr)].median_ms.iloc[0])
                for n, x in reps.items() if len(x[(x.batch == b) & (x.context == L) & (x.graph == gr)])}
        v = np.array(list(vals.values()))
        spread.append({"batch": int(b), "context": int(L), "graph": bool(gr),
                       "median_ms_by_run": {k: r(x, 3) for k, x in vals.items()},
                       "min_ms": r(float(v.min()), 3), "max_ms": r(float(v.max()), 3),
                       "max_over_min": r(float(v.max() / v.min()), 3)})
    return spread


def validation_table(steps, data_dir):
    """The held-out decode-step latencies, copied through, with the spread over their repeats."""
    cols = ["batch", "context", "graph", "median_ms", "p10_ms", "p90_ms", "kernels_per_step"]
    table = {
        "held_out": True,
        "note": "copied through for validation of the simulator; no figure above is fitted to it",
        "rows": [{c: (r(v, 4) if isinstance(v, float) else (v.item() if hasattr(v, "item") else v))
                  for c, v in row.items()} for row in steps[cols].to_dict("records")],
        "source": src(data_dir, "decode_steps.csv"),
    }
    # repeats of the same held-out measurement (spread only; nothing is fitted to them)
    table["repeats"] = {
        "rows": step_repeats(steps, data_dir),
        "note": ("separate processes on fresh or warm machines; graph replays repeat within a few per cent; "
                 "eager steps are host-bound (about 1 ms of host time per layer) and vary by up to 2x "
                 "between processes, also with the process pinned to one CPU"),
        "source": "measured: calibration/data/h200/{decode_steps.csv,run2/,eager_repeat/} via calibration/fit.py"}
    return table


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(HERE, "data", "h200"))
    ap.add_argument("--out", default=os.path.join(HERE, "h200_fit.json"))
    args = ap.parse_args()
    fig, machine = compute(args.data)
    doc = {
        "profile": "h200-sxm",
        "generated_by": "calibration/fit.py",
        "generated_utc": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
        "datasheet_reference": {"hbm_peak_GBps": HBM_PEAK_GBPS, "bf16_dense_peak_TFLOPs": BF16_PEAK_TFLOPS,
                                "units": "GB = 1e9 bytes"},
        "machine": {k: machine.get(k) for k in ("gpu_name", "sm_count", "l2_cache_bytes", "total_memory_bytes",
                                                "driver", "torch", "torch_cuda", "cudnn", "nccl", "triton",
                                                "date_utc", "kernel")},
        "figures": fig,
    }
    r2 = os.path.join(args.data, "run2")
    if os.path.isdir(r2) and os.path.exists(os.path.join(r2, "hbm_bandwidth.csv")):
        doc["repeatability"] = repeatability(fig, r2)
    # sustained-GEMM windows may only exist in the repeat run
    add_sustained(fig, r2)
    steps = load(args.data, "decode_steps.csv")
    if steps is not None:
        doc["decode_step_validation_table"] = validation_table(steps, args.data)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    k = key_numbers(fig)
    print(f"wrote {os.path.relpath(args.out)}")
    for a, b in k.items():
        print(f"  {a:18s} {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
