#!/usr/bin/env python3
"""Microbenchmarks of one GPU for the decodesim h200-sxm profile.

Writes into --out:
  hbm_bandwidth.csv    streaming read (torch sum, Triton read kernel) and D2D copy, 64 KiB..4 GiB,
                       HBM-cold (rotating buffers) and L2-resident (same buffer) rows, plus a
                       multi-pass Triton L2 read kernel (l2 rows)
  gather_bandwidth.csv random gathers of contiguous granules from a >= 4 GiB table
  gemm.csv             bf16 decode-shape GEMMs (matmul x[M,K]@W[K,N]; also F.linear W[N,K]) and
                       large square GEMMs
  attention.csv        decode SDPA, q [B,32,1,128] vs K,V [B,8,L,128], per backend
  overheads.csv        eager launch, CUDA-graph replay, sync round trip, small D2H copy
  machine_microbench.json

Usage on the device:  python3 calibration/microbench.py --out $OUT
Plumbing check on CPU: python3 calibration/microbench.py --cpu --out /tmp/mb
(--cpu uses tiny sizes and host timers; its numbers mean nothing.)
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from harness import (GB, ClockSampler, CsvOut, Timer, log, machine_facts, nvidia_smi_snapshot,  # noqa: E402
                     reps_for, run_mode, summarize, write_json)
from sweep import axis  # noqa: E402

KiB, MiB, GiB = 1024, 1024 ** 2, 1024 ** 3

try:
    import triton
    from ops.stream import _gather_kernel, _l2_multipass_kernel, _read_kernel
    HAVE_TRITON = True
except Exception:  # noqa: BLE001
    HAVE_TRITON = False

class Ctx:
    def __init__(self, args):
        self.args = args
        self.cpu = args.cpu
        self.cuda = not args.cpu
        self.dev = torch.device("cuda" if self.cuda else "cpu")
        self.timer = Timer(self.cuda, max_reps=args.max_reps)
        self.out = args.out
        self.nsm = torch.cuda.get_device_properties(0).multi_processor_count if self.cuda else 4
        self.l2 = (getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 * MiB)
                   if self.cuda else 4 * MiB)
        self.mode = run_mode(args)
        self.t_start = time.time()
        self.notes = {}
        self.triton_ok = HAVE_TRITON and (self.cuda or os.environ.get("TRITON_INTERPRET") == "1")

    def elapsed(self):
        return time.time() - self.t_start

    def axis(self, section, name):
        """One axis of a section's sweep at this run's mode (calibration/sweeps/microbench.yaml)."""
        return axis("microbench", section, name, self.mode)

    def pool_bytes(self):
        """The HBM section's buffer (also the gather table): 4 GiB, or --cpu-pool-mib."""
        return self.args.cpu_pool_mib * MiB if self.cpu else self.axis("hbm", "pool_bytes")

    def sync(self):
        self.timer.sync()


def _triton_read(ctx, x, partial):
    n = x.numel()
    BLOCK = 4096 if ctx.cuda else 64
    nprog = min(ctx.nsm * 4, triton.cdiv(n, BLOCK))
    _read_kernel[(nprog,)](x, partial, n, triton.cdiv(n, nprog * BLOCK), BLOCK=BLOCK,
                           num_warps=8 if ctx.cuda else 1)


# ----------------------------------------------------------------------------- HBM / L2

def _hbm_sizes(ctx, max_size):
    """The streaming sizes: powers of two from first_size_bytes up to max_size, plus the extra sizes
    within it, sorted and without repeats."""
    sizes = []
    s = ctx.axis("hbm", "first_size_bytes")
    while s <= max_size:
        sizes.append(s)
        s *= 2
    extra = ctx.axis("hbm", "extra_sizes_bytes")
    return sorted(set(sizes + [e for e in extra if e <= max_size]))


def _check_triton_read(ctx, nel_pool, partial):
    """Checks the Triton read kernel's sum on fresh data against torch's; turns the Triton rows off
    (ctx.triton_ok) when it is wrong or fails."""
    try:
        n = min(nel_pool, 3 * 1024 * 1024 + 17)
        x = torch.randn(n, device=ctx.dev)
        _triton_read(ctx, x, partial)
        g = min(ctx.nsm * 4, triton.cdiv(n, 4096 if ctx.cuda else 64))
        got = partial[:g].double().sum().item()
        ref = x.double().sum().item()
        ctx.notes["triton_read_check"] = {"got": got, "ref": ref, "abs_err": abs(got - ref)}
        log("triton read check", got, ref)
        if abs(got - ref) > 1e-2 * math.sqrt(n) + 1e-3 * abs(ref):
            log("!! triton read kernel check failed; disabling Triton rows")
            ctx.triton_ok = False
        del x
    except Exception as e:  # noqa: BLE001
        log("!! triton read kernel failed:", repr(e))
        traceback.print_exc()
        ctx.triton_ok = False


def _rotating_views(src, dst, S, pool_bytes):
    """S-byte views of src and of dst spread over the pool, and a function that returns the next
    slot to use (one running counter for every kind measured at this size)."""
    nel = S // 4
    nslots = max(1, pool_bytes // S)
    # rotation: a running counter walks through up to 4096 slots spread over the whole pool, so
    # the bytes read between two visits of one slot are >= min(pool, 4096*S) >= 4x L2, also
    # across the kinds measured at this size (the counter is not reset between kinds)
    nv = min(nslots, 4096)
    stride = nslots // nv
    views_s = [src[(k * stride) * nel:(k * stride + 1) * nel] for k in range(nv)]
    views_d = [dst[(k * stride) * nel:(k * stride + 1) * nel] for k in range(nv)]
    ctr = [0]

    def nxt():
        ctr[0] += 1
        return ctr[0] % nv
    return views_s, views_d, nxt


def _hbm_row(out, S, fits, kind, us, moved, regime, note=""):
    """Writes one hbm_bandwidth.csv row of S-byte buffers timed at us; returns its GB/s."""
    sm = summarize(us)
    bw = moved / (sm["median_us"] * 1e-6) / GB
    out.row(kind=kind, regime=regime, bytes=S, bytes_moved=moved, achieved_GBps=bw,
            fits_l2=fits, note=note, **sm)
    return bw


def _hbm_l2_resident(ctx, out, v0, d0, partial, S, reps, l2_limit):
    """The l2_resident rows of size S: the same buffer every rep (the copy only where its source and
    destination both fit)."""
    if ctx.triton_ok:
        us = ctx.timer.time(lambda i: _triton_read(ctx, v0, partial), reps, warmup=5)
        _hbm_row(out, S, True, "read_triton_l2", us, S, "l2_resident", "same buffer every rep")
    us = ctx.timer.time(lambda i: v0.sum(), reps, warmup=5)
    _hbm_row(out, S, True, "read_torch_sum_l2", us, S, "l2_resident", "same buffer every rep")
    if 2 * S <= l2_limit:
        us = ctx.timer.time(lambda i: d0.copy_(v0), reps, warmup=5)
        _hbm_row(out, S, True, "copy_d2d_l2", us, 2 * S, "l2_resident", "same src/dst every rep")


def _hbm_size(ctx, out, src, dst, partial, S, pool_bytes, l2_limit):
    """The rows of one size S: reads and copy over rotating slots of the pool, then the L2-resident
    rows where S fits; logs the rotating rows' GB/s."""
    views_s, views_d, nxt = _rotating_views(src, dst, S, pool_bytes)
    est = 3.0 + S / (3.5e12 if ctx.cuda else 5e9) * 1e6
    reps = reps_for(est, budget_us=120_000 if ctx.cuda else 20_000, lo=15, hi=200)
    rot_ok = (S * len(views_s) >= 3 * ctx.l2) or S >= 2 * ctx.l2
    regime = "hbm" if rot_ok else "l2_partly"
    fits = S <= l2_limit
    bw_t = float("nan")
    if ctx.triton_ok:
        us = ctx.timer.time(lambda i: _triton_read(ctx, views_s[nxt()], partial), reps)
        bw_t = _hbm_row(out, S, fits, "read_triton", us, S, regime,
                        "persistent read kernel, 4 programs/SM, BLOCK 4096 fp32")
    us = ctx.timer.time(lambda i: views_s[nxt()].sum(), reps)
    bw_s = _hbm_row(out, S, fits, "read_torch_sum", us, S, regime, "torch.sum fp32")

    def cp(i):
        k = nxt()
        views_d[k].copy_(views_s[k])
    us = ctx.timer.time(cp, reps)
    bw_c = _hbm_row(out, S, fits, "copy_d2d", us, 2 * S, regime, "dst.copy_(src); bytes_moved = read + write")
    if fits:
        _hbm_l2_resident(ctx, out, views_s[0], views_d[0], partial, S, reps, l2_limit)
    log(f"hbm S={S / MiB:9.3f} MiB  triton {bw_t:8.1f}  sum {bw_s:8.1f}  copy {bw_c:8.1f} GB/s ({regime})")


def _hbm_l2_multipass(ctx, out, src, partial, l2_limit):
    """The l2_multipass_triton rows: the multi-pass read kernel over the first S bytes of src, at
    each L2 size and number of programs per SM."""
    passes = 32 if ctx.cuda else 2
    BLOCK = 4096 if ctx.cuda else 64
    for S in ctx.axis("hbm", "l2_sizes_bytes"):
        x = src[: S // 4]
        n = x.numel()
        for per_sm in ctx.axis("hbm", "l2_programs_per_sm"):
            grid = (min(ctx.nsm * per_sm, triton.cdiv(n, BLOCK)),)

            iters = triton.cdiv(n, grid[0] * BLOCK)

            def f(i, x=x, n=n, grid=grid, iters=iters):
                _l2_multipass_kernel[grid](x, partial, n, passes, iters, BLOCK=BLOCK,
                                           num_warps=8 if ctx.cuda else 1)
            us = ctx.timer.time(f, 30 if ctx.cuda else 3, warmup=3)
            bw = _hbm_row(out, S, S <= l2_limit, f"l2_multipass_triton_{per_sm}perSM", us, S * passes,
                          "l2_resident" if S <= l2_limit else "hbm_or_mixed",
                          f"{passes} passes in one kernel, .cg loads (bypass L1)")
            log(f"l2 multipass S={S / MiB:6.1f} MiB {per_sm}/SM: {bw:9.1f} GB/s")


def bench_hbm(ctx):
    pool_bytes = ctx.pool_bytes()
    sizes = _hbm_sizes(ctx, pool_bytes)
    # for CPU the "L2" is notional
    l2_limit = 48 * MiB if not ctx.cpu else 2 * MiB

    nel_pool = pool_bytes // 4
    src = torch.randn(nel_pool, device=ctx.dev, dtype=torch.float32)
    dst = torch.empty_like(src)
    partial = torch.empty(ctx.nsm * 16 + 1, device=ctx.dev, dtype=torch.float32)  # >= any grid used
    ctx.sync()

    out = CsvOut(os.path.join(ctx.out, "hbm_bandwidth.csv"),
                 ["kind", "regime", "bytes", "bytes_moved", "median_us", "p10_us", "p90_us",
                  "achieved_GBps", "n_reps", "fits_l2", "note"])

    # correctness checks of the Triton kernels on fresh data
    if ctx.triton_ok:
        _check_triton_read(ctx, nel_pool, partial)

    for S in sizes:
        _hbm_size(ctx, out, src, dst, partial, S, pool_bytes, l2_limit)

    # explicit L2 bandwidth: multi-pass kernel over an L2-resident buffer
    if ctx.triton_ok:
        _hbm_l2_multipass(ctx, out, src, partial, l2_limit)
    out.close()
    return src, dst


# ----------------------------------------------------------------------------- gather

def bench_gather(ctx, table_f32):
    out = CsvOut(os.path.join(ctx.out, "gather_bandwidth.csv"),
                 ["method", "granule_bytes", "table_bytes", "n_rows_gathered", "bytes_gathered",
                  "bytes_moved", "median_us", "p10_us", "p90_us", "achieved_GBps", "gathered_GBps",
                  "n_reps", "check", "note"])
    table_bytes = table_f32.numel() * 4
    tab_i32 = table_f32.view(torch.int32)
    gathered = 256 * MiB if ctx.cuda else min(1 * MiB, table_bytes // 8)
    for g in ctx.axis("gather", "granule_bytes"):
        G = g // 4
        R = table_bytes // g
        tab = tab_i32.view(R, G)
        n = gathered // g
        idx_sets = [torch.randint(0, R, (n,), device=ctx.dev, dtype=torch.int64) for _ in range(2)]
        outbuf = torch.empty(n, G, device=ctx.dev, dtype=torch.int32)
        moved = 2 * n * g + n * 8  # gathered read + contiguous write + index read
        # check both methods on fresh indices
        chk_idx = torch.randint(0, R, (min(n, 4096),), device=ctx.dev, dtype=torch.int64)
        ref = tab[chk_idx].clone()
        methods = [("torch_index_select",
                    lambda i: torch.index_select(tab, 0, idx_sets[i % 2], out=outbuf),
                    lambda: torch.equal(torch.index_select(tab, 0, chk_idx), ref))]
        if ctx.triton_ok:
            BR = max(1, 4096 // G) if ctx.cuda else max(1, 64 // G)
            nw = 4 if ctx.cuda else 1

            def tg(ix, ob, BR=BR, G=G, nw=nw):
                nn = ix.numel()
                _gather_kernel[(triton.cdiv(nn, BR),)](tab, ix, ob, nn, G=G, BR=BR, num_warps=nw)

            def tchk(tg=tg, G=G):
                ob = torch.full((chk_idx.numel(), G), -7, device=ctx.dev, dtype=torch.int32)
                tg(chk_idx, ob)
                return torch.equal(ob, ref)
            methods.append(("triton_gather", lambda i, tg=tg: tg(idx_sets[i % 2], outbuf), tchk))
        for name, fn, chk in methods:
            try:
                ok = bool(chk())
                est = moved / (2e12 if ctx.cuda else 2e9) * 1e6
                us = ctx.timer.time(fn, reps_for(est, 150_000 if ctx.cuda else 10_000, 10, 60))
                sm = summarize(us)
                t = sm["median_us"] * 1e-6
                out.row(method=name, granule_bytes=g, table_bytes=table_bytes, n_rows_gathered=n,
                        bytes_gathered=n * g, bytes_moved=moved, achieved_GBps=moved / t / GB,
                        gathered_GBps=n * g / t / GB, check=ok,
                        note="uniform random rows; bytes_moved = gathered + written + int64 indices", **sm)
                log(f"gather {name:20s} g={g:5d}: {moved / t / GB:8.1f} GB/s moved, {n * g / t / GB:8.1f} gathered, check={ok}")
            except Exception as e:  # noqa: BLE001
                log(f"!! gather {name} g={g} failed: {e!r}")
                out.row(method=name, granule_bytes=g, note=f"failed: {e!r}"[:300])
        del idx_sets, outbuf, ref, chk_idx
    out.close()


# ----------------------------------------------------------------------------- GEMM

def _check_gemm(ctx, dt):
    """Relative error of one small product against float64 (ctx.notes gemm_rel_err_bf16)."""
    a = torch.randn(64, 256, device=ctx.dev, dtype=dt)
    b = torch.randn(256, 128, device=ctx.dev, dtype=dt)
    ref = a.double() @ b.double()
    rel = ((a @ b).double() - ref).norm() / ref.norm()
    ctx.notes["gemm_rel_err_bf16"] = float(rel)
    log("gemm check rel err", float(rel))


def _decode_gemm_fn(ctx, layout, xs, Ws, M, N_, copies, dt):
    """fn(i) for the timer, rotating through the copies: matmul into a preallocated output (KN,
    W[K,N]) or F.linear (NK, W[N,K])."""
    if layout == "KN":
        ys = [torch.empty(M, N_, device=ctx.dev, dtype=dt) for _ in range(copies)]

        def fn(i):
            j = i % copies
            torch.matmul(xs[j], Ws[j], out=ys[j])
        return fn

    def fn(i):
        j = i % copies
        F.linear(xs[j], Ws[j])
    return fn


def _time_decode_gemm(ctx, out, fn, layout, M, K_, N_, wbytes, copies):
    """Times one decode GEMM and writes its row (logged at a few M, every M on the CPU)."""
    flops = 2 * M * K_ * N_
    est = 4 + max(wbytes / 3.5e12, flops / 6e14) * 1e6 if ctx.cuda else 100
    us = ctx.timer.time(fn, reps_for(est, 60_000 if ctx.cuda else 5_000, 15, 100), warmup=3)
    sm = summarize(us)
    t = sm["median_us"] * 1e-6
    out.row(kind="decode", layout=layout, M=M, K=K_, N=N_, weight_bytes=wbytes, flops=flops,
            achieved_GBps=wbytes / t / GB, achieved_TFLOPs=flops / t / 1e12,
            weight_copies=copies, **sm)
    if M in (1, 64, 512) or not ctx.cuda:
        log(f"gemm {layout} M={M:4d} K={K_:6d} N={N_:6d}: {sm['median_us']:9.2f} us "
            f"{wbytes / t / GB:8.1f} GB/s {flops / t / 1e12:7.1f} TF/s")


def _decode_gemms(ctx, out, K_, N_, ms, dt):
    """The decode rows of one weight shape: both layouts at every M, over enough weight copies that
    they are not L2-resident."""
    wbytes = K_ * N_ * 2
    copies = max(2, math.ceil(256 * MiB / wbytes)) if ctx.cuda else 2
    for layout in ("KN", "NK"):
        shape = (K_, N_) if layout == "KN" else (N_, K_)
        Ws = [torch.randn(*shape, device=ctx.dev, dtype=dt) * 0.02 for _ in range(copies)]
        for M in ms:
            xs = [torch.randn(M, K_, device=ctx.dev, dtype=dt) for _ in range(copies)]
            fn = _decode_gemm_fn(ctx, layout, xs, Ws, M, N_, copies, dt)
            _time_decode_gemm(ctx, out, fn, layout, M, K_, N_, wbytes, copies)
            del fn, xs
        del Ws
    if ctx.cuda:
        torch.cuda.empty_cache()


def _square_rel_err(ctx, A, B, n):
    """Relative error of a 256x256 corner of A @ B against float64 (nan for large n on the device)."""
    if n <= 4096 or not ctx.cuda:
        chk = (A[:256].double() @ B[:, :256].double())
        got = (A @ B)[:256, :256].double()
        return float((got - chk).norm() / chk.norm())
    return float("nan")


def _large_square_gemm(ctx, out, n, dt):
    """Times one n x n x n product and writes its large_square row."""
    A = torch.randn(n, n, device=ctx.dev, dtype=dt)
    B = torch.randn(n, n, device=ctx.dev, dtype=dt)
    C = torch.empty(n, n, device=ctx.dev, dtype=dt)
    rel = _square_rel_err(ctx, A, B, n)
    flops = 2 * n ** 3
    reps = {4096: 50, 8192: 30, 16384: 12}.get(n, 3)
    us = ctx.timer.time(lambda i: torch.matmul(A, B, out=C), reps, warmup=5)
    sm = summarize(us)
    t = sm["median_us"] * 1e-6
    out.row(kind="large_square", layout="KN", M=n, K=n, N=n, weight_bytes=n * n * 2, flops=flops,
            achieved_GBps=n * n * 2 / t / GB, achieved_TFLOPs=flops / t / 1e12, weight_copies=1,
            rel_err=rel, **sm)
    log(f"gemm square n={n}: {sm['median_us']:.1f} us  {flops / t / 1e12:.1f} TF/s  p10 {flops / (sm['p90_us'] * 1e-6) / 1e12:.1f}")


def _large_square_gemms(ctx, out, dt):
    """The large_square rows, with clock samples while they run (ctx.notes clocks_during_large_gemm)."""
    sampler = ClockSampler().start() if ctx.cuda else None
    for n in ctx.axis("gemm", "square"):
        _large_square_gemm(ctx, out, n, dt)
    if sampler:
        ctx.notes["clocks_during_large_gemm"] = sampler.stop()


def _sustained_gemm(ctx, out, dt):
    """The large_square_sustained rows: back-to-back 8192^3 products for --gemm-sustain-s seconds,
    timed in windows, with clock samples (ctx.notes clocks_during_sustained_gemm)."""
    n = 8192
    A = torch.randn(n, n, device=ctx.dev, dtype=dt)
    B = torch.randn(n, n, device=ctx.dev, dtype=dt)
    C = torch.empty(n, n, device=ctx.dev, dtype=dt)
    flops = 2 * n ** 3
    sampler = ClockSampler(0.02).start()
    win = 20
    t_end = time.time() + ctx.args.gemm_sustain_s
    w = 0
    t = float("nan")
    while time.time() < t_end:
        us = ctx.timer.time(lambda i: torch.matmul(A, B, out=C), win, warmup=0, backlog=False)
        sm = summarize(us)
        t = sm["median_us"] * 1e-6
        out.row(kind=f"large_square_sustained_w{w:03d}", layout="KN", M=n, K=n, N=n, weight_bytes=n * n * 2,
                flops=flops, achieved_GBps=n * n * 2 / t / GB, achieved_TFLOPs=flops / t / 1e12,
                weight_copies=1, **sm)
        w += 1
    ctx.notes["clocks_during_sustained_gemm"] = sampler.stop()
    log(f"gemm sustained: {w} windows of {win}; last {flops / t / 1e12:.1f} TF/s; "
        f"clocks {ctx.notes['clocks_during_sustained_gemm']}")


def bench_gemm(ctx):
    out = CsvOut(os.path.join(ctx.out, "gemm.csv"),
                 ["kind", "layout", "M", "K", "N", "median_us", "p10_us", "p90_us", "weight_bytes",
                  "flops", "achieved_GBps", "achieved_TFLOPs", "n_reps", "weight_copies", "rel_err"])
    dt = torch.bfloat16
    scale = 1 if ctx.cuda else ctx.axis("gemm", "cpu_shape_divisor")
    ms = ctx.axis("gemm", "M")
    # correctness check once
    _check_gemm(ctx, dt)
    for (K, N) in ctx.axis("gemm", "KN"):
        _decode_gemms(ctx, out, K // scale, N // scale, ms, dt)
    # large compute-bound GEMMs
    _large_square_gemms(ctx, out, dt)
    # sustained: ~2 s of back-to-back 8192^3 products, timed in windows, with clock samples
    if ctx.cuda and ctx.args.gemm_sustain_s > 0:
        _sustained_gemm(ctx, out, dt)
    out.close()


# ----------------------------------------------------------------------------- attention

def _sdpa_backends(ctx):
    """The backends measured: (row name, the backend list for sdpa_kernel, or None for torch's own choice)."""
    from torch.nn.attention import SDPBackend
    backends = [("default", None), ("flash", [SDPBackend.FLASH_ATTENTION]),
                ("efficient", [SDPBackend.EFFICIENT_ATTENTION]),
                ("cudnn", [SDPBackend.CUDNN_ATTENTION])]
    if not ctx.cuda:
        backends = [("default", None), ("math", [SDPBackend.MATH])]
    return backends


def _sdpa_context(bl):
    """sdpa_kernel(bl), or no restriction for the default choice (bl None)."""
    from torch.nn.attention import sdpa_kernel
    return contextlib.nullcontext() if bl is None else sdpa_kernel(bl)


def _sdpa_flags():
    """Which SDPA backends torch has enabled."""
    return {
        "flash_sdp_enabled": torch.backends.cuda.flash_sdp_enabled(),
        "mem_efficient_sdp_enabled": torch.backends.cuda.mem_efficient_sdp_enabled(),
        "cudnn_sdp_enabled": getattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: None)(),
        "math_sdp_enabled": torch.backends.cuda.math_sdp_enabled(),
    }


def _default_kernels_note(fn, B, L, default_kernels):
    """The CUDA kernels one call of fn launches, profiled (also kept in default_kernels), as a note."""
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(1)
            torch.cuda.synchronize()
        names = sorted({e.name for e in prof.events()
                        if str(getattr(e, "device_type", "")).endswith("CUDA")})
        default_kernels[f"B{B}_L{L}"] = names
        return "kernels: " + " | ".join(n[:80] for n in names)
    except Exception as e:  # noqa: BLE001
        return f"profiler failed: {e!r}"[:200]


def _attention_backend(ctx, out, bname, bl, fn, ref, shape, copies, default_kernels):
    """Times fn under one backend and writes its row, or a failed row."""
    B, L, kvb = shape["B"], shape["L"], shape["kv_bytes"]
    try:
        with _sdpa_context(bl):
            o = fn(0)
        rel = float((o[:1].float() - ref).norm() / ref.norm())
        est = 5 + kvb / 3e12 * 1e6
        reps = reps_for(est, 80_000 if ctx.cuda else 5_000, 15, 100)
        with _sdpa_context(bl):
            us = ctx.timer.time(fn, reps, warmup=3)
        sm = summarize(us)
        t = sm["median_us"] * 1e-6
        note = ""
        if bname == "default" and ctx.cuda and (B, L) in ((1, 4096), (8, 4096), (32, 16384)):
            note = _default_kernels_note(fn, B, L, default_kernels)
        out.row(backend=bname, achieved_GBps=kvb / t / GB, copies=copies, rel_err=rel, note=note,
                **shape, **sm)
        log(f"attn {bname:9s} B={B:3d} L={L:6d}: {sm['median_us']:9.2f} us {kvb / t / GB:8.1f} GB/s rel={rel:.1e}")
    except Exception as e:  # noqa: BLE001
        msg = repr(e).splitlines()[0][:250]
        out.row(backend=bname, note=f"failed: {msg}", **shape)
        log(f"attn {bname} B={B} L={L} failed: {msg}")


def _attention_point(ctx, out, B, L, heads, backends, default_kernels):
    """The rows of one (B, L): every backend over enough copies of q, K, V that they are not
    L2-resident, checked against an fp32 reference."""
    dt = torch.bfloat16
    Hq, Hkv, D = heads
    kvb = 2 * B * Hkv * L * D * 2
    copies = min(64, max(1, math.ceil(384 * MiB / kvb))) if ctx.cuda else 1
    Ks = [torch.randn(B, Hkv, L, D, device=ctx.dev, dtype=dt) for _ in range(copies)]
    Vs = [torch.randn(B, Hkv, L, D, device=ctx.dev, dtype=dt) for _ in range(copies)]
    qs = [torch.randn(B, Hq, 1, D, device=ctx.dev, dtype=dt) for _ in range(copies)]
    # fp32 reference on a slice (first batch element)
    k0 = Ks[0][:1].float().repeat_interleave(Hq // Hkv, dim=1)
    v0 = Vs[0][:1].float().repeat_interleave(Hq // Hkv, dim=1)
    ref = torch.softmax((qs[0][:1].float() @ k0.transpose(-1, -2)) / math.sqrt(D), -1) @ v0
    del k0, v0

    def fn(i):
        j = i % copies
        return F.scaled_dot_product_attention(qs[j], Ks[j], Vs[j], enable_gqa=True)
    shape = dict(B=B, L=L, Hq=Hq, Hkv=Hkv, D=D, kv_bytes=kvb)
    for bname, bl in backends:
        _attention_backend(ctx, out, bname, bl, fn, ref, shape, copies, default_kernels)


def bench_attention(ctx):
    backends = _sdpa_backends(ctx)
    out = CsvOut(os.path.join(ctx.out, "attention.csv"),
                 ["backend", "B", "L", "Hq", "Hkv", "D", "median_us", "p10_us", "p90_us", "kv_bytes",
                  "achieved_GBps", "n_reps", "copies", "rel_err", "note"])
    Hq, Hkv, D = ctx.axis("attention", "heads")
    Bs = ctx.axis("attention", "batches")
    Ls = ctx.axis("attention", "contexts")
    default_kernels = {}
    for B in Bs:
        for L in Ls:
            _attention_point(ctx, out, B, L, (Hq, Hkv, D), backends, default_kernels)
            if ctx.cuda:
                torch.cuda.empty_cache()
    ctx.notes["sdpa_default_kernels"] = default_kernels
    ctx.notes["sdpa_flags"] = _sdpa_flags()
    out.close()


# ----------------------------------------------------------------------------- overheads

def _overhead_row(out, name, n, us, note):
    """Writes one overheads.csv row and logs its percentiles."""
    sm = summarize(us)
    out.row(name=name, n=n, note=note, **sm)
    log(f"overhead {name:34s} n={n:5d}: median {sm['median_us']:8.3f} us  p10 {sm['p10_us']:8.3f}  p90 {sm['p90_us']:8.3f}")


def _host_fed_launches(ctx, x, n):
    """One round of n x.add_(1) launches from an idle device: us per launch to enqueue, us per
    launch up to the final synchronize, and us per launch by CUDA events (None on the CPU)."""
    sync = ctx.sync
    pc = time.perf_counter
    sync()
    if ctx.cuda:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
    t0 = pc()
    for _ in range(n):
        x.add_(1)
    t1 = pc()
    if ctx.cuda:
        e1.record()
    sync()
    t2 = pc()
    gpu = e0.elapsed_time(e1) * 1e3 / n if ctx.cuda else None
    return (t1 - t0) * 1e6 / n, (t2 - t0) * 1e6 / n, gpu


def _backlogged_launches(ctx, x, n):
    """us per launch by CUDA events of n x.add_(1) queued behind a GPU spin."""
    # backlogged: GPU busy while host enqueues, so events see device-side spacing only
    e2, e3 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(2_000_000 * n / 100))
    e2.record()
    for _ in range(n):
        x.add_(1)
    e3.record()
    ctx.sync()
    return e2.elapsed_time(e3) * 1e3 / n


def _eager_launch_overheads(ctx, out, x):
    """The eager launch rows at n = 100 and 1000 launches (the CUDA-event ones on the device only)."""
    outer = 40 if ctx.cuda else 5
    for n in (100, 1000):
        enq, wall, gpu_fed, gpu_back = [], [], [], []
        for _ in range(outer):
            host_us, wall_us, gpu_us = _host_fed_launches(ctx, x, n)
            enq.append(host_us)
            wall.append(wall_us)
            if ctx.cuda:
                gpu_fed.append(gpu_us)
                gpu_back.append(_backlogged_launches(ctx, x, n))
        _overhead_row(out, "eager_launch_host_enqueue_per_kernel", n, enq,
                      "host time per x.add_(1) call (1-element tensor)")
        _overhead_row(out, "eager_launch_wall_per_kernel", n, wall, "host time for n launches + final synchronize, / n")
        if ctx.cuda:
            _overhead_row(out, "eager_launch_gpu_events_per_kernel", n, gpu_fed,
                          "CUDA events around n host-fed launches, / n")
            _overhead_row(out, "eager_kernel_gpu_backlogged_per_kernel", n, gpu_back,
                          "CUDA events, queue pre-filled (GPU behind host): device-side kernel-to-kernel time")


def _add_graph(x, n):
    """A CUDA graph of n x.add_(1) (captured after a side-stream warmup), replayed 5 times."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x.add_(1)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for _ in range(n):
            x.add_(1)
    for _ in range(5):
        g.replay()
    return g


def _backlogged_replays(ctx, g, n, reps):
    """reps replays of g, each behind a GPU spin: us per kernel by CUDA events, and host us of
    the replay call."""
    sync = ctx.sync
    pc = time.perf_counter
    gpu, host = [], []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(200_000)
        e0.record()
        t0 = pc()
        g.replay()
        t1 = pc()
        e1.record()
        sync()
        gpu.append(e0.elapsed_time(e1) * 1e3 / n)
        host.append((t1 - t0) * 1e6)
    return gpu, host


def _idle_replays(ctx, g, reps):
    """Host us of reps replays of g on an idle device, each with its synchronize."""
    sync = ctx.sync
    pc = time.perf_counter
    wall = []
    for _ in range(reps):
        sync()
        t0 = pc()
        g.replay()
        sync()
        wall.append((pc() - t0) * 1e6)
    return wall


def _graph_replay_overheads(ctx, out, x):
    """The graph_replay rows of graphs of 1 to 1000 kernels (device only)."""
    for n in (1, 10, 100, 1000):
        g = _add_graph(x, n)
        ctx.sync()
        reps = 200 if n <= 100 else 60
        gpu, host = _backlogged_replays(ctx, g, n, reps)
        wall = _idle_replays(ctx, g, reps)
        _overhead_row(out, "graph_replay_gpu_per_kernel", n, gpu,
                      "CUDA events around one replay of a graph of n x.add_(1), / n (backlogged)")
        _overhead_row(out, "graph_replay_host_call", n, host, "host time of g.replay() call (whole graph)")
        _overhead_row(out, "graph_replay_wall_incl_sync", n, wall, "host: replay + synchronize, whole graph, idle GPU")
        del g


def _sync_overheads(ctx, out, x, N):
    """The synchronize round-trip rows: N synchronizes with nothing pending, then N with one tiny kernel."""
    sync = ctx.sync
    pc = time.perf_counter
    sync()
    us = []
    for _ in range(N):
        t0 = pc()
        sync()
        us.append((pc() - t0) * 1e6)
    _overhead_row(out, "synchronize_idle", 1, us, "torch.cuda.synchronize() with nothing pending")
    us = []
    for _ in range(N):
        t0 = pc()
        x.add_(1)
        sync()
        us.append((pc() - t0) * 1e6)
    _overhead_row(out, "tiny_kernel_plus_synchronize", 1, us, "x.add_(1); torch.cuda.synchronize(), idle GPU")


def _d2h_overheads(ctx, out, x, N):
    """The small device-to-host rows: N y.item() (alone, after a tiny kernel), then on the device a
    pinned async copy and an event round trip."""
    pc = time.perf_counter
    y = torch.zeros(1, device=ctx.dev, dtype=torch.int32)
    ctx.sync()
    us = []
    for _ in range(N):
        t0 = pc()
        y.item()
        us.append((pc() - t0) * 1e6)
    _overhead_row(out, "d2h_item_4B", 1, us, "y.item() of an int32 on an idle GPU (cudaMemcpy D2H + sync)")
    us = []
    for _ in range(N):
        t0 = pc()
        x.add_(1)
        y.item()
        us.append((pc() - t0) * 1e6)
    _overhead_row(out, "tiny_kernel_plus_item", 1, us, "x.add_(1); y.item()")
    if ctx.cuda:
        _device_d2h_overheads(out, y, N)


def _device_d2h_overheads(out, y, N):
    """The pinned async 4-byte copy and the event record/synchronize rows (device only)."""
    pc = time.perf_counter
    hb = torch.empty(1, dtype=torch.int32, pin_memory=True)
    us = []
    for _ in range(N):
        t0 = pc()
        hb.copy_(y, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        us.append((pc() - t0) * 1e6)
    _overhead_row(out, "d2h_4B_pinned_async_plus_stream_sync", 1, us,
                  "pinned host buffer, copy_(non_blocking) + stream sync")
    us = []
    for _ in range(N):
        e = torch.cuda.Event()
        t0 = pc()
        e.record()
        e.synchronize()
        us.append((pc() - t0) * 1e6)
    _overhead_row(out, "event_record_synchronize", 1, us, "event.record(); event.synchronize() on idle stream")


def bench_overheads(ctx):
    out = CsvOut(os.path.join(ctx.out, "overheads.csv"),
                 ["name", "n", "median_us", "p10_us", "p90_us", "n_reps", "note"])
    x = torch.zeros(1, device=ctx.dev)
    for _ in range(200):
        x.add_(1)
    ctx.sync()
    _eager_launch_overheads(ctx, out, x)
    if ctx.cuda:
        _graph_replay_overheads(ctx, out, x)
    # sync round trips
    N = 5000 if ctx.cuda else 200
    _sync_overheads(ctx, out, x, N)
    _d2h_overheads(ctx, out, x, N)
    out.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu", action="store_true", help="plumbing check on CPU with tiny sizes")
    ap.add_argument("--cpu-pool-mib", type=int, default=64, help="--cpu only: pool size")
    ap.add_argument("--max-reps", type=int, default=None, help="cap repetitions (interpreter tests)")
    ap.add_argument("--gemm-sustain-s", type=float, default=0.0, help="seconds of sustained 8192^3 GEMM")
    ap.add_argument("--only", default="hbm,gather,gemm,attention,overheads")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    ctx = Ctx(args)
    facts = machine_facts(ctx.cuda)
    facts["nvidia_smi_before"] = nvidia_smi_snapshot() if ctx.cuda else None
    log("machine:", {k: facts[k] for k in facts if k not in ("nvidia_smi_before",)})
    mpath = os.path.join(args.out, "machine_microbench.json")
    write_json(mpath, facts)
    only = args.only.split(",")
    timings = {}
    src = dst = None
    sections = [("overheads", lambda: bench_overheads(ctx))]  # first: nothing else resident, no sampler thread
    sections += [("hbm", None), ("gather", None), ("gemm", lambda: bench_gemm(ctx)),
                 ("attention", lambda: bench_attention(ctx))]
    for name, fn in sections:
        if name not in only:
            continue
        t0 = time.time()
        try:
            if name == "hbm":
                sampler = ClockSampler().start() if ctx.cuda else None
                src, dst = bench_hbm(ctx)
                if sampler:
                    ctx.notes["clocks_during_hbm"] = sampler.stop()
            elif name == "gather":
                if src is None:
                    pool = ctx.pool_bytes() // 4
                    src = torch.randn(pool, device=ctx.dev)
                del dst
                dst = None
                if ctx.cuda:
                    torch.cuda.empty_cache()
                bench_gather(ctx, src)
                del src
                src = None
                if ctx.cuda:
                    torch.cuda.empty_cache()
            else:
                fn()
        except Exception as e:  # noqa: BLE001
            log(f"!! section {name} failed: {e!r}")
            traceback.print_exc()
            ctx.notes[f"{name}_error"] = repr(e)
        timings[name] = time.time() - t0
        log(f"== section {name} took {timings[name]:.1f} s (total {ctx.elapsed():.1f} s)")
        facts["section_seconds"] = timings
        facts["notes"] = ctx.notes
        write_json(mpath, facts)
    if ctx.cuda:
        facts["nvidia_smi_after"] = nvidia_smi_snapshot()
    facts["section_seconds"] = timings
    facts["notes"] = ctx.notes
    write_json(mpath, facts)
    log("done in", round(ctx.elapsed(), 1), "s")


if __name__ == "__main__":
    main()
