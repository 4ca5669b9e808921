"""kernels.py's overlap section: a bf16 GEMV and a decode SDPA alone and together on two streams
(CUDA graphs), and two GEMVs together.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from harness import GB, log, one_line, pct
from torch.nn.attention import SDPBackend, sdpa_kernel

from sections.bench import Bench, Config, SLEEP_CYCLES, SectionStats

# ============================================================================ section: overlap

def overlap_section(b: Bench, st: SectionStats):
    """GEMV and decode attention alone and concurrently on two streams (CUDA graphs)."""
    if not b.cuda:
        msg = "skipped: overlap needs CUDA streams and graphs"
        b.csv.row(config_id="overlap:skipped", section="overlap", kclass="overlap", error=msg)
        b.record_error(st, "overlap:skipped", msg)
        return
    quick = b.mode == "quick"
    N, K = b.axis("overlap", "gemv_NK")
    B, L = b.axis("overlap", "sdpa_BL")
    Ws = [torch.randn(N, K, device=b.dev, dtype=torch.bfloat16) for _ in range(4)]
    x = torch.randn(1, K, device=b.dev, dtype=torch.bfloat16)
    q = torch.randn(B, 32, 1, 128, device=b.dev, dtype=torch.bfloat16)
    kc = torch.randn(B, 8, L, 128, device=b.dev, dtype=torch.bfloat16)
    vc = torch.randn(B, 8, L, 128, device=b.dev, dtype=torch.bfloat16)
    gemv_bytes = N * K * 2 + 2 * K + 2 * N
    sdpa_bytes = 2 * kc.numel() * 2 + 2 * q.numel() * 2
    work = {
        "gemv_a": (lambda i: F.linear(x, Ws[i % 2]), gemv_bytes),
        "gemv_b": (lambda i: F.linear(x, Ws[2 + i % 2]), gemv_bytes),
        "sdpa": (lambda i: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True), sdpa_bytes),
    }
    try:
        _capture(work["sdpa"][0], 2)
    except Exception as e:  # noqa: BLE001
        b.notes["overlap_sdpa_default_capture"] = f"failed ({one_line(e)}); using the flash backend"
        work["sdpa"] = (lambda i: _sdpa_flash(q, kc, vc), sdpa_bytes)
    pairs = [("gemv_a", "sdpa"), ("gemv_a", "gemv_b")]
    try:
        kinfo = _overlap_profile(b, work)
        per_call = {k: _overlap_per_call_us(b, fn) for k, (fn, _) in work.items()}
        log("   overlap per-call us:", {k: round(v, 2) for k, v in per_call.items()})
    except Exception as e:  # noqa: BLE001
        b.csv.row(config_id="overlap:setup", section="overlap", kclass="overlap", error=one_line(e))
        b.record_error(st, "overlap:setup", one_line(e))
        return
    for a, c in pairs:
        if time.time() > b.deadline:
            b.truncated = True
            st.skipped_budget += 1
            continue
        _overlap_pair(b, st, work, per_call, kinfo, a, c, quick)


def _sdpa_flash(q, k, v):
    """Decode SDPA restricted to the flash backend (fallback when the default cannot be captured)."""
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def _overlap_profile(b: Bench, work) -> dict:
    """Kernel names of one call of each overlap workload (kernel_names.csv)."""
    cfgs = [Config(f"overlap:{k}", "overlap", {}, lambda: None) for k in work]
    for c, (fn, _) in zip(cfgs, work.values(), strict=True):
        c.fn = fn
        fn(0)
    b.sync()
    kinfo = b.profile(cfgs)
    for c in cfgs:
        for j, k in enumerate(kinfo.get(c.cid, [])):
            b.names.row(config_id=c.cid, section="overlap", kernel_index=j, **k)
    return kinfo


def _capture(fn, reps):
    """A CUDA graph of `reps` invocations of fn (after a warm-up on a side stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(0)
        fn(1)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    return g


def _overlap_per_call_us(b: Bench, fn) -> float:
    """Per-invocation time from a small graph (to size the real graphs)."""
    g = _capture(fn, 4)
    mk, _ = _launch_graphs(b, [(g, torch.cuda.Stream())], 3)
    return statistics.median(mk) / 4


def _launch_graphs(b: Bench, graph_streams, replays):
    """Launches graphs on their streams from one common start; returns makespans (us) and,
    per graph, the time from the start to its end (us), over `replays` repetitions."""
    main = torch.cuda.current_stream()
    makespans, finishes = [], []
    for _ in range(replays):
        torch.cuda._sleep(SLEEP_CYCLES)
        e0 = torch.cuda.Event(enable_timing=True)
        e0.record(main)
        ends = []
        for g, s in graph_streams:
            s.wait_stream(main)
            with torch.cuda.stream(s):
                g.replay()
                e = torch.cuda.Event(enable_timing=True)
                e.record(s)
            ends.append(e)
        for _, s in graph_streams:
            main.wait_stream(s)
        e1 = torch.cuda.Event(enable_timing=True)
        e1.record(main)
        torch.cuda.synchronize()
        makespans.append(e0.elapsed_time(e1) * 1e3)
        finishes.append([e0.elapsed_time(e) * 1e3 for e in ends])
    return makespans, finishes


def _overlap_pair(b: Bench, st, work, per_call, kinfo, a, c, quick):
    """Alone, together (two streams) and sequential (one stream) times of workloads a and c."""
    target_us = 1000.0 if quick else 3000.0
    reps = {k: max(1, round(target_us / per_call[k])) for k in (a, c)}
    cid = f"overlap:{a}+{c}"
    meta = dict(impl=f"{a}+{c}", kclass="overlap", dtype="bf16", reps_a=reps[a], reps_b=reps[c],
                bytes_a=work[a][1], bytes_b=work[c][1],
                bytes_read=work[a][1] * reps[a] + work[c][1] * reps[c],
                note="graph of reps_a invocations of a on stream 1 and reps_b of b on stream 2; "
                     "times are whole-graph makespans in us (not per invocation); "
                     "gemv = F.linear(x[1,4096], W[28672,4096]) rotating 2 weight copies; "
                     "sdpa = q[32,32,1,128] vs K,V[32,8,8192,128] bf16, enable_gqa")
    try:
        ga, gc = _capture(work[a][0], reps[a]), _capture(work[c][0], reps[c])
        sa, sc = torch.cuda.Stream(), torch.cuda.Stream()
        n = b.replays
        alone_a, _ = _launch_graphs(b, [(ga, sa)], n)
        alone_c, _ = _launch_graphs(b, [(gc, sc)], n)
        together, fin = _launch_graphs(b, [(ga, sa), (gc, sc)], n)
        seq, _ = _launch_graphs(b, [(ga, sa), (gc, sa)], n)
        med = statistics.median
        ka, kc_ = kinfo.get(f"overlap:{a}", []), kinfo.get(f"overlap:{c}", [])
        b.csv.row(config_id=cid, section="overlap", replays=n, timing="graph",
                  alone_a_us=med(alone_a), alone_b_us=med(alone_c), together_us=med(together),
                  sequential_us=med(seq), finish_a_us=med(f[0] for f in fin),
                  finish_b_us=med(f[1] for f in fin), median_us=med(together),
                  p10_us=pct(together, 10), p90_us=pct(together, 90),
                  achieved_GBps=meta["bytes_read"] / (med(together) * 1e-6) / GB,
                  kernels=f"{len(ka)}+{len(kc_)}",
                  kernel_main=" | ".join(k["name"][:60] for k in ka[:1] + kc_[:1]), **meta)
        st.rows += 1
        log(f"   {cid}: alone {med(alone_a):.0f} / {med(alone_c):.0f} us, together {med(together):.0f} us, "
            f"sequential {med(seq):.0f} us")
        del ga, gc
    except Exception as e:  # noqa: BLE001
        b.csv.row(config_id=cid, section="overlap", error=one_line(e), **meta)
        b.record_error(st, cid, one_line(e))
        log(f"   !! {cid}: {one_line(e)}")
