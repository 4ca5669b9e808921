"""kernels.py's launch and grid sections: empty and one-store Triton kernels at many grids; a
Triton streaming read at many program counts and a persistent strided read.
"""
from __future__ import annotations

import math

import torch
from harness import log, one_line

from sections.bench import Bench, Config, HAVE_TRITON, MiB, cdiv, skip_config

if HAVE_TRITON:
    from ops.stream import _chunk_read_kernel, _launch_kernel, _strided_read_kernel

# ============================================================================ section: launch

def launch_configs(b: Bench) -> list:
    """Triton empty and one-store kernels at several grids and block sizes."""
    grids = b.axis("launch", "grids")
    blocks = b.axis("launch", "block_threads")
    out = torch.zeros(max(grids), dtype=torch.int32, device=b.dev)
    cfgs = []
    for store in (False, True):
        impl = "triton_store1" if store else "triton_empty"
        for threads in blocks:
            for g in grids:
                meta = dict(impl=impl, kclass="launch", dtype="int32", n_programs=g,
                            block_threads=threads, bytes_read=0, bytes_written=4 * g if store else 0,
                            flops=0)
                cid = f"launch:{impl}:grid{g}_block{threads}"
                if not b.triton_ok:
                    cfgs.append(skip_config("launch", cid, meta, "Triton needs CUDA or TRITON_INTERPRET=1"))
                    continue

                def build(g=g, threads=threads, store=store):
                    nw = threads // 32 if b.cuda else 1
                    return lambda i: _launch_kernel[(g,)](out, STORE=store, num_warps=nw)
                cfgs.append(Config(cid, "launch", meta, build, est_us=2.5 + g / (8 * b.nsm) * 0.5))
    return cfgs


# ============================================================================ section: grid

def grid_configs(b: Bench) -> list:
    """Streaming read bandwidth vs number of programs (chunked) and a persistent read."""
    sizes, progs = b.axis("grid", "sizes_MiB"), b.axis("grid", "programs")
    BLOCK = 4096 if b.cuda else 1024
    nw = 8 if b.cuda else 1
    partial = torch.zeros(max(progs + [8 * b.nsm]), dtype=torch.float32, device=b.dev)
    cfgs = []
    for s_mib in sizes:
        nbytes = int(s_mib * MiB)
        n = nbytes // 4
        for p in progs:
            cfgs.append(_grid_cfg(b, "triton_chunk_read", nbytes, n, p, BLOCK, nw, partial))
        for per_sm in b.axis("grid", "persistent_programs_per_sm"):
            cfgs.append(_grid_cfg(b, f"triton_persistent_{per_sm}x_sm", nbytes, n, per_sm * b.nsm,
                                  BLOCK, nw, partial))
    return cfgs


def _grid_cfg(b: Bench, impl, nbytes, n, p, BLOCK, nw, partial) -> Config:
    """One streaming-read configuration: n fp32 elements read by p programs."""
    meta = dict(impl=impl, kclass="stream_read", dtype="fp32", elements=n, size_bytes=nbytes,
                n_programs=p, bytes_read=nbytes, bytes_written=4 * p, flops=n)
    cid = f"grid:{impl}:bytes{nbytes}_prog{p}"
    if not b.triton_ok:
        return skip_config("grid", cid, meta, "Triton needs CUDA or TRITON_INTERPRET=1")
    n_slots = b.slots_for(nbytes)
    per_cta_GBps = 25.0
    est = 3.0 + nbytes / min(3.0e12, p * per_cta_GBps * 1e9) * 1e6

    def build():
        views = [v[0] for v in b.carve([((n,), torch.float32)], n_slots)]
        if impl == "triton_chunk_read":
            chunk = cdiv(n, p)
            return lambda i: _chunk_read_kernel[(p,)](views[i % n_slots], partial, chunk, n,
                                                       BLOCK=BLOCK, num_warps=nw)
        iters = cdiv(n, p * BLOCK)
        return lambda i: _strided_read_kernel[(p,)](views[i % n_slots], partial, n, iters,
                                                     BLOCK=BLOCK, num_warps=nw)
    return Config(cid, "grid", meta, build, est_us=est, n_slots=n_slots, bytes_per_slot=nbytes)


def check_grid_kernels(b: Bench):
    """Both read kernels against a float64 sum (stored in the summary's checks)."""
    if not b.triton_ok:
        b.checks["grid_read"] = "skipped: no Triton"
        return
    try:
        n = 100_003 if b.cuda else 5_003
        x = torch.randn(n, device=b.dev)
        part = torch.zeros(64, device=b.dev)
        BLOCK = 4096 if b.cuda else 64
        ref = x.double().sum().item()
        _chunk_read_kernel[(7,)](x, part, cdiv(n, 7), n, BLOCK=BLOCK)
        got_c = part[:7].double().sum().item()
        part.zero_()
        _strided_read_kernel[(5,)](x, part, n, cdiv(n, 5 * BLOCK), BLOCK=BLOCK)
        got_s = part[:5].double().sum().item()
        tol = 1e-3 * math.sqrt(n)
        b.checks["grid_read"] = {"ref": ref, "chunk": got_c, "strided": got_s,
                                 "ok": abs(got_c - ref) < tol and abs(got_s - ref) < tol}
    except Exception as e:  # noqa: BLE001
        b.checks["grid_read"] = f"failed: {one_line(e)}"
    log("   check grid_read:", b.checks["grid_read"])
