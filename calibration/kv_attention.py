#!/usr/bin/env python3
"""Decode attention over quantized KV caches: Triton split-K kernels, checked and timed.

One new query token per sequence (GQA decode): q [B, Hq, D] against a cache of L tokens per
sequence and KV head, [B, Hkv, L, D] (default Hq=32, Hkv=8, D=128: Llama-3-8B per layer).
Every implementation is a named `impl`:

* bf16 references: ``sdpa_cudnn`` (torch SDPA, ``enable_gqa=True``, default backend; the
  backend it picked is in the ``backend`` column), ``sdpa_flash`` (forced flash backend) and
  ``triton_bf16`` (our split-K flash-decode: grid (num_splits, Hkv, B), each program loads
  K/V blocks once for all Hq/Hkv query heads of its KV head (padded to 16 rows for
  ``tl.dot``), online softmax in the exp2 domain, writes partial (m, l, acc); a second small
  kernel combines the splits).
* ``triton_elem_<fmt>``: the same kernel, dequantizing per element the straightforward way:
  per element a byte-address computation and load of the code, shift/mask, int->fp32, a load
  of that element's scale/zero through an index computation, an FMA, a cast to fp16.
* ``triton_group_<fmt>``: the same kernel, dequantizing per group: packed rows loaded as wide
  vectors, unpacked with shifts/masks in registers, codes turned into fp16 without an
  int->float conversion (``(c | 0x6400)`` bit-cast to fp16 is 1024 + c), each group's
  scale/zero loaded once and broadcast over the group (a reshape exposes the group axis), or
  factored out of the dot where the scale is per token (int8, the outlier format's K) or per
  channel.

Formats (``fmt``), stored exactly so (per layer; ``kv_bytes`` is the sum of the bytes of
every stored tensor the kernel reads for one call, counted from the tensors themselves):

* ``bf16``: K, V [B, Hkv, L, D] bf16.
* ``int8``: symmetric, codes int8 [B, Hkv, L, D], one fp16 scale per token and KV head
  [B, Hkv, L]; x = s * c. K and V alike.
* ``int4-g32``, ``int4-g64``, ``int4-g128``: asymmetric, groups of G along the head dim per
  token, codes uint8 [B, Hkv, L, D/2] (byte j: dim 2j in the low nibble, dim 2j+1 in the high
  nibble), fp16 scale and fp16 zero [B, Hkv, L, D/G]; x = s * c + z, c in 0..15. K and V.
* ``int2-kivi``: KIVI-style. Quantized part = the first Lq = L - 128 tokens; the most recent
  128 tokens are kept in fp16 (``kw``, ``vw`` [B, Hkv, 128, D], read by one extra split).
  Codes uint8 [B, Hkv, Lq, D/4] (byte j holds dims 4j+i at bits 2i). K per channel in blocks
  of 32 tokens: scale/zero fp16 [B, Hkv, Lq/32, D]; V per token in groups of 32 channels:
  scale/zero fp16 [B, Hkv, Lq, D/32]; x = s * c + z, c in 0..3.
* ``int2-asym-outlier``: 2-bit asymmetric per token in one group of D (=128) channels, codes
  uint8 [B, Hkv, L, D/4], scale/zero fp16 [B, Hkv, L] for K and V; plus 5 % outliers
  (ceil(0.05 D) = 7 of 128): K keeps a fixed set of 7 channels per KV head in fp16, channel
  ids int16 [Hkv, 7] and values fp16 [B, Hkv, L, 7], which *replace* those channels after
  dequantization; V keeps 7 sparse fp16 values per token, CSR-like: per-token pointers int32
  [B, Hkv, L+1], 16-bit column indices int16 and values fp16 [B, Hkv, 7 L], *added* to the
  dequantized dense part (dense-and-sparse: V = deq(codes) + S).

Codes and scales are random (the kernels do not care what was quantized); every check
dequantizes the same stored codes in torch float64 and runs fp64 attention on that.

Writes into --out:

``kv_attention.csv``, one row per (configuration, impl); ``phase`` = ``check`` (the small
correctness shape, untimed) or ``sweep``:
  config_id, phase, impl, fmt, group_size, backend, B, Hq, Hkv, D, L, num_splits (quantized
  splits; the KIVI window adds one more program per head), block_n, num_warps, copies (cache
  copies rotated through), reps_per_replay (R), n_replays, kv_bytes (exact bytes of K,V
  codes + scales/zeros + fp16 window + outliers for one call), q_bytes, out_bytes,
  partial_bytes (split partials written and read back, fp32), median_us, p10_us, p90_us
  (per call = replay / R), achieved_GBps (kv_bytes / median, GB = 1e9 B), kernels (launches
  per call), n_regs, n_spills, shared_bytes (compiled split kernel), max_abs_err, rel_err
  (||out - ref||_2 / ||ref||_2 against fp64 attention on the dequantized cache, over batch
  elements 0 and B-1 in the sweep, all of them in the check phase), ok (rel_err < 2e-2),
  error (exception type and message, one line; empty when it worked).
``kv_attention_kernels.csv``: what ran, keyed by config_id: config_id, impl, source
  (``triton-metadata`` for our launches, ``profiler`` for SDPA), kernel, grid, block,
  registers_per_thread, shared_memory, n_spills, count.
``kv_attention_summary.json``: machine facts (``_common.machine_facts``), arguments, the split
  heuristic, per (fmt, impl) Triton compile info (n_regs, n_spills, shared, compile seconds),
  SDPA backends, skipped shapes (cache > --max-cache-gb), budget use and
  ``truncated_by_budget``.

Timing: each configuration is warmed up (Triton compile) and run once eagerly for the check;
then R invocations (split kernel + reduce kernel, or the SDPA call) rotating over ``copies``
cache copies (>= 256 MiB in all when one cache is below 128 MiB, so reads come from HBM) are
captured into one CUDA graph; 7..20 replays timed with CUDA events; per call = replay / R.

Expected wall time of the default sweep (16 shapes x 15 impls + 15 check rows) on the H200:
~60-100 s, estimated, not measured: ~5-10 s to compile the 13 split-kernel variants + the reduce
kernel in parallel threads up front (19 s sequentially on a 2-core box offline), ~0.1-0.3 s per
configuration. It stops starting new configurations at --budget-s (default 150 s) and says so
in the summary (``truncated_by_budget``). Shapes are visited corners first (greedy farthest
point in log B x log L), every (fmt, impl) at each shape, so a cut keeps all implementations.

Usage on the device:    python3 calibration/kv_attention.py --out $OUT/kv
GPU smoke test (~15 s):  python3 calibration/kv_attention.py --quick --out /tmp/kvq
CPU plumbing check:     TRITON_INTERPRET=1 python3 calibration/kv_attention.py --cpu --out /tmp/kv
Offline sm_90 compile:  python3 calibration/kv_attention.py --compile-check --out /tmp/kvc
  (no GPU, no TRITON_INTERPRET: compiles every kernel variant to an sm_90a cubin with the
  bundled ptxas and reports registers, spills, shared memory and layout conversions)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from harness import (GB, Budget, CsvOut, backlog, capture_graph, log, machine_facts, nvidia_smi_snapshot, pct,  # noqa: E402
                     one_line, replay_us, run_mode, write_json)
from sweep import axis, corners_first  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ops.attention import _reduce_kernel, _split_kernel  # noqa: E402

AsyncCompileMode = getattr(triton, "AsyncCompileMode", None)  # Triton >= 3.4

MiB = 1024 ** 2
REL_ERR_OK = 2e-2
KIVI_WINDOW = 128          # fp16 residual tokens of int2-kivi
KIVI_TOKEN_GROUP = 32      # K per-channel quantization block along tokens
OUTLIER_FRACTION = 0.05
POOL_TARGET_BYTES = 256 * MiB   # rotate copies up to this when one cache is < 128 MiB
ROTATE_BELOW_BYTES = 128 * MiB
MAX_COPIES = 512
BACKLOG_SLEEP_CYCLES = 1_000_000  # ~0.5 ms at the H200's ~1.98 GHz boost clock
SPLIT_PROGRAMS_PER_SM = 4       # split heuristic: aim for this many programs per SM
MAX_SPLITS = 256
REDUCE_CHUNK = 16

FMT_BF16, FMT_INT8, FMT_INT4, FMT_KIVI, FMT_OUTLIER, FMT_F16_WINDOW = 0, 1, 2, 3, 4, 5

CSV_FIELDS = ["config_id", "phase", "impl", "fmt", "group_size", "backend", "B", "Hq", "Hkv", "D", "L",
              "num_splits", "block_n", "num_warps", "copies", "reps_per_replay", "n_replays", "kv_bytes",
              "q_bytes", "out_bytes", "partial_bytes", "median_us", "p10_us", "p90_us", "achieved_GBps",
              "kernels", "n_regs", "n_spills", "shared_bytes", "max_abs_err", "rel_err", "ok", "error"]
KERNEL_FIELDS = ["config_id", "impl", "source", "kernel", "grid", "block", "registers_per_thread",
                 "shared_memory", "n_spills", "count"]


# ============================================================================ formats and storage

@dataclass(frozen=True)
class Fmt:
    """One KV storage format: its name (``fmt`` column), kernel code and group size."""
    name: str
    code: int
    group_size: int


@dataclass(frozen=True)
class Tile:
    """Tokens per block (BLOCK_N) and warps per program of one Triton implementation."""
    block_n: int
    num_warps: int


# Chosen from the offline sm_90 compile (--compile-check): no register spills where avoidable,
# then the most K/V bytes in flight per SM (programs per SM from registers and shared memory
# x bytes per block); the elem kernels need more registers, hence their smaller tiles.
DEFAULT_TILES = {"triton_bf16": Tile(64, 4),
                 "triton_elem_int8": Tile(64, 8), "triton_group_int8": Tile(128, 8),
                 "triton_elem_int4": Tile(64, 4), "triton_group_int4": Tile(128, 4),
                 "triton_elem_int2-kivi": Tile(64, 4), "triton_group_int2-kivi": Tile(128, 8),
                 "triton_elem_int2-asym-outlier": Tile(64, 8), "triton_group_int2-asym-outlier": Tile(64, 4)}


def parse_tiles(text):
    """--tiles "impl=BLOCK_N:num_warps,..." -> {impl: Tile}."""
    out = {}
    for item in filter(None, text.split(",")):
        name, bw = item.split("=")
        bn, nw = bw.split(":")
        out[name.strip()] = Tile(int(bn), int(nw))
    return out


def tile_for(impl_name, overrides):
    """Tile of a Triton implementation (int4 group sizes share one default)."""
    if impl_name in overrides:
        return overrides[impl_name]
    key = re.sub(r"(int4)-g\d+$", r"\1", impl_name)
    return DEFAULT_TILES[key]


def formats_for(D):
    """The formats of the sweep for head dim D (int4 groups larger than D are left out)."""
    fm = [Fmt("bf16", FMT_BF16, 0), Fmt("int8", FMT_INT8, D)]
    fm += [Fmt(f"int4-g{g}", FMT_INT4, g) for g in axis("kv_attention", "sweep", "int4_groups", "full") if g <= D]
    fm += [Fmt("int2-kivi", FMT_KIVI, KIVI_TOKEN_GROUP), Fmt("int2-asym-outlier", FMT_OUTLIER, D)]
    return fm


def impls_for(fmt):
    """Implementation names of one format."""
    if fmt.code == FMT_BF16:
        return ["sdpa_cudnn", "sdpa_flash", "triton_bf16"]
    return [f"triton_elem_{fmt.name}", f"triton_group_{fmt.name}"]


@dataclass(frozen=True)
class Shape:
    """Decode attention shape: batch, query heads, KV heads, head dim, cached tokens."""
    B: int
    Hq: int
    Hkv: int
    D: int
    L: int


def n_outliers(D):
    """Outlier channels of K per head and sparse V entries per token: ceil(5 % of D)."""
    return math.ceil(OUTLIER_FRACTION * D)


def storage_shapes(fmt, sh):
    """name -> (shape, dtype) of the tensors of one cache copy (all of them are read per call)."""
    B, H, L, D = sh.B, sh.Hkv, sh.L, sh.D
    if fmt.code == FMT_BF16:
        return {"kc": ((B, H, L, D), torch.bfloat16), "vc": ((B, H, L, D), torch.bfloat16)}
    if fmt.code == FMT_INT8:
        return {"kc": ((B, H, L, D), torch.int8), "ks": ((B, H, L), torch.float16),
                "vc": ((B, H, L, D), torch.int8), "vs": ((B, H, L), torch.float16)}
    if fmt.code == FMT_INT4:
        ng = D // fmt.group_size
        out = {}
        for t in "kv":
            out[t + "c"] = ((B, H, L, D // 2), torch.uint8)
            out[t + "s"] = ((B, H, L, ng), torch.float16)
            out[t + "z"] = ((B, H, L, ng), torch.float16)
        return out
    if fmt.code == FMT_KIVI:
        Lq = L - KIVI_WINDOW
        tg = KIVI_TOKEN_GROUP
        return {"kc": ((B, H, Lq, D // 4), torch.uint8), "ks": ((B, H, Lq // tg, D), torch.float16),
                "kz": ((B, H, Lq // tg, D), torch.float16), "kx": ((B, H, KIVI_WINDOW, D), torch.float16),
                "vc": ((B, H, Lq, D // 4), torch.uint8), "vs": ((B, H, Lq, D // tg), torch.float16),
                "vz": ((B, H, Lq, D // tg), torch.float16), "vx": ((B, H, KIVI_WINDOW, D), torch.float16)}
    no = n_outliers(D)
    return {"kc": ((B, H, L, D // 4), torch.uint8), "ks": ((B, H, L), torch.float16),
            "kz": ((B, H, L), torch.float16), "kx": ((H, no), torch.int16), "ky": ((B, H, L, no), torch.float16),
            "vc": ((B, H, L, D // 4), torch.uint8), "vs": ((B, H, L), torch.float16),
            "vz": ((B, H, L), torch.float16), "vx": ((B, H, L + 1), torch.int32),
            "vy": ((B, H, L * no), torch.int16), "vw": ((B, H, L * no), torch.float16)}


def check_shape_supported(fmt, sh):
    """Raise ValueError when fmt cannot store shape sh."""
    if sh.Hq % sh.Hkv:
        raise ValueError(f"Hq={sh.Hq} not a multiple of Hkv={sh.Hkv}")
    if sh.D & (sh.D - 1) or sh.D < 32:
        raise ValueError(f"D={sh.D} must be a power of two >= 32")
    if fmt.code == FMT_INT4 and sh.D % fmt.group_size:
        raise ValueError(f"D={sh.D} not a multiple of group {fmt.group_size}")
    if fmt.code == FMT_KIVI and (sh.L <= KIVI_WINDOW or (sh.L - KIVI_WINDOW) % KIVI_TOKEN_GROUP):
        raise ValueError(f"int2-kivi needs L - {KIVI_WINDOW} > 0 and a multiple of {KIVI_TOKEN_GROUP}, got L={sh.L}")


def cache_bytes(fmt, sh):
    """Exact bytes of one cache copy (what one call must read for K and V)."""
    tot = 0
    for shape, dt in storage_shapes(fmt, sh).values():
        tot += math.prod(shape) * torch.tensor([], dtype=dt).element_size()
    return tot


class Pool:
    """``copies`` copies of each tensor of a format, each copy 16-byte aligned inside one
    allocation per tensor; with ``guard`` the gaps between copies hold NaN (floats) or all-ones
    (integers) so an unmasked out-of-bounds read shows up in the output (CPU checks)."""

    def __init__(self, shapes, copies, device, guard):
        self.copies = copies
        self.bufs = {}
        self.stacked = {}
        self.views = [dict() for _ in range(copies)]
        for name, (shape, dt) in shapes.items():
            esz = torch.tensor([], dtype=dt).element_size()
            numel = math.prod(shape)
            pad = (64 if guard else 0) + (-numel * esz) % 16 // esz
            stride = numel + pad
            buf = torch.empty(copies * stride + (64 if guard else 0), dtype=dt, device=device)
            if guard:
                buf.fill_(float("nan") if dt.is_floating_point else (255 if dt == torch.uint8 else -1))
            self.bufs[name] = buf
            # all copies at once, [copies, *shape], the gaps left out
            self.stacked[name] = buf[:copies * stride].view(copies, stride)[:, :numel].view(copies, *shape)
            for j in range(copies):
                self.views[j][name] = buf[j * stride: j * stride + numel].view(shape)


def _uniform(shape, lo, hi, gen, dev, dtype):
    """Uniform values in [lo, hi)."""
    return torch.rand(shape, generator=gen, device=dev, dtype=dtype).mul_(hi - lo).add_(lo)


def _outlier_structure(sh, copies, gen, dev):
    """Outlier channel ids [copies, Hkv, no] (distinct, sorted) and per-token sparse columns
    [copies, B, Hkv, L*no] (distinct within a token: base + k*step mod D)."""
    no = n_outliers(sh.D)
    ch = torch.rand(copies * sh.Hkv, sh.D, generator=gen, device=dev).argsort(dim=1)[:, :no]
    ch = ch.sort(dim=1).values.view(copies, sh.Hkv, no)
    base = torch.randint(0, sh.D, (copies, sh.B, sh.Hkv, sh.L, 1), generator=gen, device=dev)
    step = max(1, sh.D // no - 1)
    cols = (base + step * torch.arange(no, device=dev)) % sh.D
    return ch.to(torch.int16), cols.view(copies, sh.B, sh.Hkv, sh.L * no).to(torch.int16)


def fill_random(fmt, sh, pool, gen):
    """Random codes and plausible scales/zeros (dequantized values of order 1), the KIVI fp16
    window, distinct outlier channels per head and distinct sparse columns per token; one
    generator call per tensor for all copies."""
    dev = next(iter(pool.bufs.values())).device
    scale_range = {FMT_INT8: (0.006, 0.012), FMT_INT4: (0.12, 0.25)}.get(fmt.code, (0.4, 0.8))
    for name, t in pool.stacked.items():
        kind = name[1]
        if fmt.code == FMT_BF16 or (kind == "x" and fmt.code == FMT_KIVI):
            t.copy_(torch.randn(t.shape, generator=gen, device=dev, dtype=t.dtype))
        elif kind == "c" and t.dtype == torch.int8:
            t.copy_(torch.randint(-127, 128, t.shape, generator=gen, device=dev, dtype=torch.int8))
        elif kind == "c":
            t.copy_(torch.randint(0, 256, t.shape, generator=gen, device=dev, dtype=torch.uint8))
        elif kind == "s":
            t.copy_(_uniform(t.shape, *scale_range, gen, dev, t.dtype))
        elif kind == "z":
            t.copy_(_uniform(t.shape, -2.0, -1.5, gen, dev, t.dtype))
    if fmt.code == FMT_OUTLIER:
        st = pool.stacked
        ch, cols = _outlier_structure(sh, pool.copies, gen, dev)
        st["kx"].copy_(ch)
        st["vy"].copy_(cols)
        st["ky"].copy_(torch.randn(st["ky"].shape, generator=gen, device=dev, dtype=torch.float16).mul_(4.0))
        st["vw"].copy_(torch.randn(st["vw"].shape, generator=gen, device=dev, dtype=torch.float16).mul_(4.0))
        st["vx"].copy_(torch.arange(sh.L + 1, device=dev, dtype=torch.int32) * n_outliers(sh.D))


# ============================================================================ fp64 reference

def _unpack_ref(codes, bits, D):
    """Packed uint8 codes [..., D*bits/8] -> float64 codes [..., D] (natural dim order)."""
    per = 8 // bits
    c = codes.to(torch.int32)
    parts = [(c >> (bits * i)) & ((1 << bits) - 1) for i in range(per)]
    return torch.stack(parts, -1).reshape(*codes.shape[:-1], D).double()


def dequant_fp64(fmt, view, sh, idx):
    """K, V of batch elements idx, dequantized in float64 from the stored codes: [nb, Hkv, L, D]."""
    D = sh.D
    if fmt.code == FMT_BF16:
        return view["kc"][idx].double(), view["vc"][idx].double()
    if fmt.code == FMT_INT8:
        return (view["kc"][idx].double() * view["ks"][idx].double()[..., None],
                view["vc"][idx].double() * view["vs"][idx].double()[..., None])
    out = []
    if fmt.code == FMT_INT4:
        G = fmt.group_size
        for t in "kv":
            c = _unpack_ref(view[t + "c"][idx], 4, D)
            c = c.view(*c.shape[:-1], D // G, G)
            x = c * view[t + "s"][idx].double()[..., None] + view[t + "z"][idx].double()[..., None]
            out.append(x.reshape(*x.shape[:-2], D))
        return tuple(out)
    if fmt.code == FMT_KIVI:
        tg = KIVI_TOKEN_GROUP
        c = _unpack_ref(view["kc"][idx], 2, D)
        nb, H, Lq, _ = c.shape
        c = c.view(nb, H, Lq // tg, tg, D)
        k = (c * view["ks"][idx].double()[:, :, :, None, :] + view["kz"][idx].double()[:, :, :, None, :])
        k = torch.cat([k.reshape(nb, H, Lq, D), view["kx"][idx].double()], dim=2)
        c = _unpack_ref(view["vc"][idx], 2, D).view(nb, H, Lq, D // tg, tg)
        v = c * view["vs"][idx].double()[..., None] + view["vz"][idx].double()[..., None]
        v = torch.cat([v.reshape(nb, H, Lq, D), view["vx"][idx].double()], dim=2)
        return k, v
    # outlier format
    k = _unpack_ref(view["kc"][idx], 2, D) * view["ks"][idx].double()[..., None] + view["kz"][idx].double()[..., None]
    ch = view["kx"].long()  # [H, no]
    nb, H, L, _ = k.shape
    k.scatter_(3, ch[None, :, None, :].expand(nb, H, L, ch.shape[1]), view["ky"][idx].double())
    v = _unpack_ref(view["vc"][idx], 2, D) * view["vs"][idx].double()[..., None] + view["vz"][idx].double()[..., None]
    ptr, col, val = view["vx"][idx].long(), view["vy"][idx].long(), view["vw"][idx].double()
    for bi in range(nb):
        for hi in range(H):
            p = ptr[bi, hi]
            nnz = int(p[-1] - p[0])
            tok = torch.repeat_interleave(torch.arange(L, device=p.device), p[1:] - p[:-1])
            v[bi, hi].index_put_((tok, col[bi, hi, p[0]:p[0] + nnz]), val[bi, hi, p[0]:p[0] + nnz], accumulate=True)
    return k, v


def attention_fp64(q, k, v):
    """fp64 GQA attention: q [nb, Hq, D], k/v [nb, Hkv, L, D] -> [nb, Hq, D]."""
    nb, Hq, D = q.shape
    Hkv = k.shape[1]
    qg = q.double().view(nb, Hkv, Hq // Hkv, D)
    s = torch.einsum("bgqd,bgld->bgql", qg, k) / math.sqrt(D)
    p = torch.softmax(s, dim=-1)
    return torch.einsum("bgql,bgld->bgqd", p, v).reshape(nb, Hq, D)


def check_output(fmt, view, q, out, sh, idx):
    """(max_abs_err, rel_err) of out[idx] against fp64 attention on the dequantized cache."""
    k, v = dequant_fp64(fmt, view, sh, idx)
    ref = attention_fp64(q[idx], k, v)
    diff = out[idx].double() - ref
    return float(diff.abs().max()), float(diff.norm() / ref.norm())


# ============================================================================ launch plans

@dataclass
class Plan:
    """How a Triton implementation is launched for one shape."""
    S_q: int
    S_tot: int
    tps: int
    Lq: int
    win: int


def plan_splits(fmt, bn, sh, n_sm, splits_override=None):
    """Split heuristic: num_splits = min(ceil(4 SMs / (B Hkv)), ceil(Lq / (2 BLOCK_N)), 256),
    at least 1; tokens per split rounded up to BLOCK_N and num_splits recomputed so that no
    split is empty. KIVI adds one program per (b, kv head) for the fp16 window."""
    win = KIVI_WINDOW if fmt.code == FMT_KIVI else 0
    Lq = sh.L - win
    if splits_override:
        S = splits_override
    else:
        S = min(math.ceil(SPLIT_PROGRAMS_PER_SM * n_sm / (sh.B * sh.Hkv)), math.ceil(Lq / (2 * bn)), MAX_SPLITS)
    S = max(1, S)
    tps = math.ceil(math.ceil(Lq / S) / bn) * bn
    S = math.ceil(Lq / tps)
    return Plan(S_q=S, S_tot=S + (1 if win else 0), tps=tps, Lq=Lq, win=win)


def split_call(fmt, elem, tile, sh, plan, view, q, parts):
    """(grid, positional args, constexpr kwargs) of the split kernel for one cache copy."""
    pm, pl, pacc = parts
    kt = [view.get(n, q) for n in ("kc", "ks", "kz", "kx", "ky")]
    vt = [view.get(n, q) for n in ("vc", "vs", "vz", "vx", "vy", "vw")]
    qh = sh.Hq // sh.Hkv
    no = n_outliers(sh.D)
    args = [q, pm, pl, pacc, *kt, *vt, sh.L, plan.Lq, plan.tps, plan.S_q, plan.S_tot,
            (1.0 / math.sqrt(sh.D)) * math.log2(math.e)]
    const = dict(HKV=sh.Hkv, QH=qh, HP=max(16, triton.next_power_of_2(qh)), D=sh.D, BLOCK_N=tile.block_n,
                 FMT=fmt.code, ELEM=bool(elem), G=fmt.group_size if fmt.code == FMT_INT4 else 1,
                 NOC=no, NOCP=max(16, triton.next_power_of_2(no)), KMAX=no,
                 NNZ=no, WIN=plan.win, TG=KIVI_TOKEN_GROUP)
    grid = (plan.S_tot, sh.Hkv, sh.B)
    return grid, args, const


class TritonImpl:
    """A Triton split-K implementation bound to one (format, shape): buffers for the partials
    and the output, and ``call(j)`` = split kernel + reduce kernel on cache copy j."""

    def __init__(self, name, fmt, sh, pool, qpool, device, n_sm, splits=None, tiles=None):
        self.name, self.fmt, self.sh = name, fmt, sh
        self.elem = name.startswith("triton_elem")
        self.tile = tile_for(name, tiles or {})
        self.plan = plan = plan_splits(fmt, self.tile.block_n, sh, n_sm, splits)
        self.pool, self.qpool = pool, qpool
        rows = sh.B * sh.Hq
        self.pm = torch.empty(rows * plan.S_tot, dtype=torch.float32, device=device)
        self.pl = torch.empty_like(self.pm)
        self.pacc = torch.empty(rows * plan.S_tot * sh.D, dtype=torch.float32, device=device)
        self.out = torch.empty(sh.B, sh.Hq, sh.D, dtype=torch.bfloat16, device=device)
        self.compiled = None
        self.kernels = 2
        self.partial_bytes = 2 * rows * plan.S_tot * (sh.D + 2) * 4

    def launch_args(self, j):
        """(grid, args, constexprs) of the split kernel on copy j."""
        return split_call(self.fmt, self.elem, self.tile, self.sh, self.plan, self.pool.views[j], self.qpool[j],
                          (self.pm, self.pl, self.pacc))

    def call(self, j):
        """One decode-attention call on cache copy j; returns the bf16 output buffer."""
        grid, args, const = self.launch_args(j)
        k = _split_kernel[grid](*args, **const, num_warps=self.tile.num_warps, num_stages=2)
        if self.compiled is None and k is not None and not isinstance(k, (list, tuple)):
            self.compiled = k
        _reduce_kernel[(self.sh.B * self.sh.Hq,)](self.pm, self.pl, self.pacc, self.out, self.plan.S_tot,
                                                   D=self.sh.D, SC=REDUCE_CHUNK, num_warps=4)
        return self.out

    def compile_info(self):
        """n_regs / n_spills / shared bytes of the compiled split kernel ({} when unknown)."""
        k = self.compiled
        if k is None:
            return {}
        info = {}
        for key, attr in (("n_regs", "n_regs"), ("n_spills", "n_spills")):
            try:
                info[key] = getattr(k, attr)
            except Exception:  # noqa: BLE001
                pass
        md = getattr(k, "metadata", None)
        if md is not None:
            info["shared_bytes"] = getattr(md, "shared", None)
            info["num_warps"] = getattr(md, "num_warps", None)
            info["num_stages"] = getattr(md, "num_stages", None)
        return info


class SdpaImpl:
    """torch SDPA on the bf16 cache (default backend, or forced flash)."""

    def __init__(self, name, sh, pool, qpool):
        self.name, self.sh, self.pool, self.qpool = name, sh, pool, qpool
        self.kernels = ""
        self.partial_bytes = 0
        self.compiled = None

    def backends(self):
        """The SDPBackend list to force, or None for the default choice."""
        if self.name == "sdpa_flash":
            return [SDPBackend.FLASH_ATTENTION]
        return None

    def call(self, j):
        """One SDPA call on copy j (must run inside ``sdpa_context``); output [B, Hq, D]."""
        v = self.pool.views[j]
        q4 = self.qpool[j].unsqueeze(2)
        o = F.scaled_dot_product_attention(q4, v["kc"], v["vc"], enable_gqa=True)
        return o.squeeze(2)

    def chosen_backend(self):
        """Name of the backend the default dispatcher picks for these inputs (best effort)."""
        if self.name == "sdpa_flash":
            return "FLASH_ATTENTION"
        try:
            v = self.pool.views[0]
            c = torch._fused_sdp_choice(self.qpool[0].unsqueeze(2), v["kc"], v["vc"], enable_gqa=True)
            return SDPBackend(c).name
        except Exception as e:  # noqa: BLE001
            return f"unknown ({type(e).__name__})"

    def compile_info(self):
        """SDPA has no Triton compile info."""
        return {}


class sdpa_context:
    """Context manager forcing the implementation's SDPA backend (no-op for the default)."""

    def __init__(self, impl):
        self.bl = impl.backends() if isinstance(impl, SdpaImpl) else None
        self.cm = None

    def __enter__(self):
        if self.bl is not None:
            self.cm = sdpa_kernel(self.bl)
            self.cm.__enter__()
        return self

    def __exit__(self, *exc):
        if self.cm is not None:
            return self.cm.__exit__(*exc)
        return False


# ============================================================================ timing

def graph_time_us(call, copies, cuda, target_replay_us=2000.0):
    """Per-call device time: R calls rotating over the copies captured into one CUDA graph,
    replayed 7..20 times with CUDA events; returns (list of per-call us, R)."""
    if not cuda:
        t0 = time.perf_counter()
        call(0)
        return [(time.perf_counter() - t0) * 1e6], 1
    for j in range(min(2, copies)):
        call(j)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    backlog(BACKLOG_SLEEP_CYCLES)
    e0.record()
    call(0)
    e1.record()
    e1.synchronize()
    est_us = max(1.0, e0.elapsed_time(e1) * 1e3)  # eager, so it includes launch gaps
    R = max(int(target_replay_us / est_us), min(copies, MAX_COPIES), 1)
    R = min(R, 1000)
    g, _ = capture_graph(lambda i: call(i % copies), R, warmup_calls=0)
    g.replay()
    g.replay()
    torch.cuda.synchronize()
    # each replay behind a ~0.5 ms backlog, so host submission stays out of the interval
    first_us = replay_us(g, BACKLOG_SLEEP_CYCLES, (e0, e1))
    n = int(min(20, max(7, 40_000 / max(first_us, 1.0))))
    us = [replay_us(g, BACKLOG_SLEEP_CYCLES, (e0, e1)) / R for _ in range(n)]
    del g
    return us, R


def sdpa_profile(impls, cuda):
    """Kernel names, grids and registers of one call of each SDPA implementation (profiler)."""
    if not cuda:
        return {}
    out = {}
    for impl in impls:
        with sdpa_context(impl):
            impl.call(0)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                impl.call(0)
                torch.cuda.synchronize()
        rows = {}
        for e in prof.events():
            if not str(getattr(e, "device_type", "")).endswith("CUDA"):
                continue
            r = rows.setdefault(e.name, {"kernel": e.name, "count": 0})
            r["count"] += 1
        try:
            with tempfile.NamedTemporaryFile("w+", suffix=".json", delete=False) as fh:
                path = fh.name
            prof.export_chrome_trace(path)
            with open(path) as fh:
                trace = json.load(fh)
            os.unlink(path)
            for ev in trace.get("traceEvents", []):
                if ev.get("cat") == "kernel" and ev.get("name") in rows:
                    a = ev.get("args", {})
                    rows[ev["name"]].update(grid=a.get("grid"), block=a.get("block"),
                                            registers_per_thread=a.get("registers per thread"),
                                            shared_memory=a.get("shared memory"))
        except Exception as e:  # noqa: BLE001
            log(f"  (chrome trace parse failed: {e!r})")
        out[impl.name] = list(rows.values())
    return out


# ============================================================================ sweep

@dataclass
class Run:
    """State of one script run: arguments, device, outputs, budget and what happened."""
    args: argparse.Namespace
    cuda: bool
    device: torch.device
    n_sm: int
    csv: CsvOut
    kcsv: CsvOut
    tiles: dict = field(default_factory=dict)
    compile_info: dict = field(default_factory=dict)
    backends: dict = field(default_factory=dict)
    skipped: list = field(default_factory=list)
    counts: dict = field(default_factory=lambda: {"rows": 0, "ok": 0, "failed": 0, "not_ok": 0})
    truncated: bool = False
    table: list = field(default_factory=list)
    profiled_shapes: int = 0
    budget: Budget = field(init=False)  # started with the run

    def __post_init__(self):
        self.budget = Budget(self.args.budget_s)

    def elapsed(self):
        """Seconds since the run started."""
        return self.budget.elapsed_s()

    def over_budget(self):
        """True once no new configuration may start."""
        return self.budget.spent()


def make_impl(run, name, fmt, sh, pool, qpool):
    """Implementation object for impl name."""
    if name.startswith("sdpa"):
        return SdpaImpl(name, sh, pool, qpool)
    return TritonImpl(name, fmt, sh, pool, qpool, run.device, run.n_sm, run.args.splits, run.tiles)


def base_row(cid, phase, impl_name, fmt, sh, copies):
    """The CSV columns known before anything runs."""
    return dict(config_id=cid, phase=phase, impl=impl_name, fmt=fmt.name, group_size=fmt.group_size,
                B=sh.B, Hq=sh.Hq, Hkv=sh.Hkv, D=sh.D, L=sh.L, kv_bytes=cache_bytes(fmt, sh),
                q_bytes=sh.B * sh.Hq * sh.D * 2, out_bytes=sh.B * sh.Hq * sh.D * 2, copies=copies)


def record_triton_kernels(run, cid, impl, row):
    """Rows of kv_attention_kernels.csv for a Triton implementation (from its launch metadata)."""
    sh, plan, tile = impl.sh, impl.plan, impl.tile
    run.kcsv.row(config_id=cid, impl=impl.name, source="triton-metadata", kernel="_split_kernel",
                 grid=str((plan.S_tot, sh.Hkv, sh.B)), block=str((tile.num_warps * 32, 1, 1)),
                 registers_per_thread=row.get("n_regs", ""), shared_memory=row.get("shared_bytes", ""),
                 n_spills=row.get("n_spills", ""), count=1)
    run.kcsv.row(config_id=cid, impl=impl.name, source="triton-metadata", kernel="_reduce_kernel",
                 grid=str((sh.B * sh.Hq, 1, 1)), block=str((128, 1, 1)), count=1)


def check_and_time(run, phase, impl, fmt, sh, pool, qpool, check_idx, row):
    """First call (compiles), fp64 check, compile info and (sweep phase) graph timing -> row."""
    t_first = time.time()
    with sdpa_context(impl):
        out = impl.call(0).clone()
        if run.cuda:
            torch.cuda.synchronize()
        first_s = time.time() - t_first
        err_abs, err_rel = check_output(fmt, pool.views[0], qpool[0], out, sh, check_idx)
        row.update(max_abs_err=err_abs, rel_err=err_rel, ok=bool(err_rel < REL_ERR_OK))
        info = impl.compile_info()
        if info:
            row.update({k: info.get(k, "") for k in ("n_regs", "n_spills", "shared_bytes")})
            if impl.name not in run.compile_info:
                run.compile_info[impl.name] = dict(info, first_call_s=round(first_s, 3), block_n=impl.tile.block_n)
        if phase == "sweep":
            us, R = graph_time_us(impl.call, pool.copies, run.cuda)
            med = pct(us, 50)
            row.update(median_us=med, p10_us=pct(us, 10), p90_us=pct(us, 90), reps_per_replay=R,
                       n_replays=len(us), achieved_GBps=row["kv_bytes"] / (med * 1e-6) / GB)
    if run.cuda:
        torch.cuda.synchronize()


def run_config(run, phase, cid, fmt, impl_name, sh, pool, qpool, check_idx, launches=None):
    """Check (and in the sweep phase time) one (shape, fmt, impl); writes its CSV row.
    ``launches``: kernels per call seen by the profiler (SDPA), if known."""
    row = base_row(cid, phase, impl_name, fmt, sh, pool.copies)
    impl = None
    try:
        impl = make_impl(run, impl_name, fmt, sh, pool, qpool)
        row.update(kernels=impl.kernels if launches is None else launches, partial_bytes=impl.partial_bytes)
        if isinstance(impl, TritonImpl):
            row.update(num_splits=impl.plan.S_q, block_n=impl.tile.block_n, num_warps=impl.tile.num_warps)
        else:
            row["backend"] = impl.chosen_backend()
            run.backends.setdefault(impl_name, {})[f"B{sh.B}_L{sh.L}"] = row["backend"]
        check_and_time(run, phase, impl, fmt, sh, pool, qpool, check_idx, row)
        if isinstance(impl, TritonImpl) and phase == "sweep":
            record_triton_kernels(run, cid, impl, row)
        run.counts["ok" if row.get("ok") else "not_ok"] += 1
    except Exception as e:  # noqa: BLE001
        row["error"] = one_line(e)
        run.counts["failed"] += 1
        log(f"  !! {cid} {impl_name}: {row['error']}")
        if run.args.verbose:
            traceback.print_exc()
        if run.cuda:
            try:
                torch.cuda.synchronize()
            except Exception as e2:  # noqa: BLE001
                row["error"] += f" | sync: {one_line(e2)}"
    run.csv.row(**row)
    run.counts["rows"] += 1
    run.table.append(row)
    med = row.get("median_us")
    log(f"  {phase:5s} {cid:28s} {impl_name:32s} "
        + (f"{med:10.2f} us {row['achieved_GBps']:8.1f} GB/s " if med else " " * 30)
        + f"rel={row.get('rel_err', float('nan')):.1e} S={row.get('num_splits', '')} {row.get('backend', '')}"
        + (f" ERR {row['error']}" if row.get("error") else ""))
    del impl
    return row


def copies_for(nbytes, cuda):
    """Cache copies to rotate through: enough for >= 256 MiB when one cache is < 128 MiB."""
    if not cuda:
        return 2
    if nbytes >= ROTATE_BELOW_BYTES:
        return 1
    return int(min(MAX_COPIES, max(2, math.ceil(POOL_TARGET_BYTES / nbytes))))


def build_pool(run, fmt, sh, copies, gen):
    """Cache copies (random codes) and matching query copies on the run's device."""
    pool = Pool(storage_shapes(fmt, sh), copies, run.device, guard=not run.cuda)
    fill_random(fmt, sh, pool, gen)
    qpool = [torch.randn(sh.B, sh.Hq, sh.D, generator=gen, device=run.device).to(torch.bfloat16)
             for _ in range(copies)]
    return pool, qpool


def profile_sdpa_shape(run, cid, impls):
    """Profiler pass over the SDPA implementations of one shape -> kv_attention_kernels.csv;
    returns {impl: kernel launches per call}."""
    launches = {}
    try:
        prof = sdpa_profile(impls, run.cuda)
        for name, rows in prof.items():
            for r in rows:
                run.kcsv.row(config_id=cid, impl=name, source="profiler", **r)
            launches[name] = sum(r["count"] for r in rows)
        run.profiled_shapes += 1
    except Exception as e:  # noqa: BLE001
        log(f"  (profiler failed: {one_line(e)})")
    return launches


def release_device_memory(run):
    """Synchronize and return cached blocks, so the next shape's caches fit."""
    if run.cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_shape_fmt(run, phase, sh, fmt, impls, gen):
    """Build the cache copies of one (shape, fmt) and run every implementation on them."""
    cid = f"{phase[:2]}-B{sh.B}-L{sh.L}-{fmt.name}"
    try:
        check_shape_supported(fmt, sh)
    except ValueError as e:
        run.skipped.append({"config_id": cid, "reason": str(e)})
        log(f"  skip {cid}: {e}")
        return
    copies = 1 if phase == "check" else copies_for(cache_bytes(fmt, sh), run.cuda)
    try:
        pool, qpool = build_pool(run, fmt, sh, copies, gen)
    except Exception as e:  # noqa: BLE001
        for name in impls:
            run.csv.row(**base_row(cid, phase, name, fmt, sh, copies), error="alloc: " + one_line(e))
            run.counts["failed"] += 1
        log(f"  !! {cid}: allocation failed: {one_line(e)}")
        release_device_memory(run)
        return
    check_idx = list(range(sh.B)) if phase == "check" else sorted({0, sh.B - 1})
    sdpa_impls = [SdpaImpl(n, sh, pool, qpool) for n in impls if n.startswith("sdpa")]
    launches = {}
    if phase == "sweep" and sdpa_impls and run.cuda and run.elapsed() < 0.6 * run.args.budget_s:
        launches = profile_sdpa_shape(run, cid, sdpa_impls)
    for name in impls:
        if phase == "sweep" and run.over_budget():
            run.truncated = True
            break
        run_config(run, phase, cid, fmt, name, sh, pool, qpool, check_idx, launches.get(name))
    del pool, qpool, sdpa_impls
    release_device_memory(run)


def precompile(run, sh, fmts, impl_filter):
    """Compile every Triton variant up front, in parallel threads (Triton's async compile
    mode); returns seconds spent. Failures are logged and left for the configs to report."""
    if not run.cuda:
        return 0.0
    t0 = time.time()
    if AsyncCompileMode is None:
        log("precompile: this Triton has no AsyncCompileMode; kernels compile on first use")
        return 0.0
    jobs = []
    for fmt in fmts:
        for name in impls_for(fmt):
            if name.startswith("sdpa") or not impl_filter(name):
                continue
            try:
                check_shape_supported(fmt, sh)
            except ValueError:
                continue
            jobs.append((fmt, name))
    if not jobs:
        return 0.0
    try:
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(jobs)))) as ex, AsyncCompileMode(ex, ignore_errors=True):
            for fmt, name in jobs:
                pool = Pool(storage_shapes(fmt, sh), 1, run.device, guard=False)
                q = torch.zeros(sh.B, sh.Hq, sh.D, dtype=torch.bfloat16, device=run.device)
                impl = TritonImpl(name, fmt, sh, pool, [q], run.device, run.n_sm, run.args.splits, run.tiles)
                grid, args, const = impl.launch_args(0)
                _split_kernel.warmup(*args, **const, grid=grid, num_warps=impl.tile.num_warps, num_stages=2)
            _reduce_kernel.warmup(impl.pm, impl.pl, impl.pacc, impl.out, impl.plan.S_tot, D=sh.D, SC=REDUCE_CHUNK,
                                  grid=(1,), num_warps=4)
    except Exception as e:  # noqa: BLE001
        log(f"precompile failed ({one_line(e)}); kernels compile on first use")
        if run.args.verbose:
            traceback.print_exc()
    dt = time.time() - t0
    log(f"precompile: {len(jobs)} split-kernel variants in {dt:.1f} s")
    return dt


def default_heads(args) -> str:
    """Hq,Hkv,D of the sweep file for this run mode (what --heads overrides)."""
    return ",".join(str(x) for x in axis("kv_attention", "sweep", "heads", run_mode(args)))


def sweep_shapes(args, cuda):
    """(check shape, list of sweep shapes in visiting order, skipped list) for the arguments."""
    mode = run_mode(args)
    Hq, Hkv, D = (int(x) for x in args.heads.split(","))
    check = Shape(axis("kv_attention", "sweep", "check_batch", mode), Hq, Hkv, D,
                  axis("kv_attention", "sweep", "check_context", mode))
    if args.batches or args.contexts or mode == "full":
        batches = [int(b) for b in args.batches.split(",")] if args.batches else \
            axis("kv_attention", "sweep", "batches", mode)
        contexts = [int(c) for c in args.contexts.split(",")] if args.contexts else \
            axis("kv_attention", "sweep", "contexts", mode)
        pts = [(b, ll) for b in batches for ll in contexts]
    else:
        pts = axis("kv_attention", "sweep", "points", mode)
    shapes, skipped = [], []
    for B, L in corners_first(pts):
        sh = Shape(B, Hq, Hkv, D, L)
        big = 2 * B * Hkv * L * D * 2  # the bf16 cache, the largest format
        if big > args.max_cache_gb * GB:
            skipped.append({"B": B, "L": L, "bf16_cache_GB": round(big / GB, 2),
                            "reason": f"cache > {args.max_cache_gb} GB"})
            continue
        shapes.append(sh)
    return check, shapes, skipped


def print_table(run):
    """Short final table: median us per impl (rows) and shape (columns)."""
    rows = [r for r in run.table if r.get("phase") == "sweep"]
    shapes = []
    for r in rows:
        k = (r["B"], r["L"])
        if k not in shapes:
            shapes.append(k)
    impls = []
    for r in rows:
        if r["impl"] not in impls:
            impls.append(r["impl"])
    log("\nmedian us per call (x = error, ! = rel_err >= 2e-2)")
    log(f"{'impl':34s}" + "".join(f"{f'B{b}/L{ll}':>13s}" for b, ll in shapes))
    for name in impls:
        cells = []
        for b, ll in shapes:
            r = next((r for r in rows if r["impl"] == name and r["B"] == b and r["L"] == ll), None)
            if r is None:
                cells.append("")
            elif r.get("error"):
                cells.append("x")
            else:
                med = r.get("median_us")
                cells.append((f"{med:.1f}" if med else "-") + ("" if r.get("ok") else "!"))
        log(f"{name:34s}" + "".join(f"{c:>13s}" for c in cells))


def sweep_device(args):
    """True when the sweep runs on CUDA; exits with a hint when the asked-for device cannot run."""
    cuda = not args.cpu and torch.cuda.is_available()
    if not args.cpu and not cuda:
        raise SystemExit("no CUDA device: use --cpu (with TRITON_INTERPRET=1) or --compile-check")
    if args.cpu and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--cpu needs TRITON_INTERPRET=1 (Triton kernels run in the interpreter)")
    return cuda


def start_run(args, cuda):
    """Run state with the output directory created and both CSV files opened."""
    os.makedirs(args.out, exist_ok=True)
    device = torch.device("cuda" if cuda else "cpu")
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count if cuda else 4
    return Run(args=args, cuda=cuda, device=device, n_sm=n_sm,
               csv=CsvOut(os.path.join(args.out, "kv_attention.csv"), CSV_FIELDS),
               kcsv=CsvOut(os.path.join(args.out, "kv_attention_kernels.csv"), KERNEL_FIELDS),
               tiles=parse_tiles(args.tiles))


def start_summary(run):
    """The summary as known before anything runs: machine facts, arguments and timing method."""
    return {"machine": machine_facts(run.cuda), "args": vars(run.args),
            "nvidia_smi_before": nvidia_smi_snapshot() if run.cuda else None,
            "split_heuristic": plan_splits.__doc__.strip(), "rel_err_ok": REL_ERR_OK,
            "timing": "CUDA graph of R calls (split + reduce) rotating over cache copies; 7..20 replays; "
                      "per call = replay / R", "sm_count": run.n_sm}


def selected_formats(args, D):
    """The formats of head dim D that --formats keeps (all when it is empty)."""
    return [f for f in formats_for(D) if not args.formats or f.name in args.formats.split(",")]


def impl_filter(args):
    """Predicate on impl names: True for those --impls keeps (all when it is empty)."""
    wanted = set(args.impls.split(",")) if args.impls else None

    def impl_ok(name):
        return wanted is None or name in wanted
    return impl_ok


def selected_impls(fmt, impl_ok):
    """Implementation names of one format that pass the impl filter."""
    return [n for n in impls_for(fmt) if impl_ok(n)]


def run_sweep(run, shapes, fmts, impl_ok, gen, summary, jpath):
    """Timed sweep: every selected (fmt, impl) at each shape in turn, until the budget is spent;
    rewrites the summary after each shape."""
    for sh in shapes:
        if run.over_budget():
            run.truncated = True
            break
        log(f"-- B={sh.B} L={sh.L} (t={run.elapsed():.1f} s)")
        for fmt in fmts:
            if run.over_budget():
                run.truncated = True
                break
            run_shape_fmt(run, "sweep", sh, fmt, selected_impls(fmt, impl_ok), gen)
        summary.update(elapsed_s=round(run.elapsed(), 2), counts=run.counts, compile_info=run.compile_info)
        write_json(jpath, summary)


def finish_summary(run, summary, skipped):
    """Adds what the whole run found to the summary: counts, compile info, SDPA backends, skips."""
    summary.update(elapsed_s=round(run.elapsed(), 2), budget_s=run.args.budget_s, truncated_by_budget=run.truncated,
                   counts=run.counts, compile_info=run.compile_info, sdpa_backends=run.backends,
                   skipped_shapes=skipped, skipped_configs=run.skipped, sdpa_profiled_shapes=run.profiled_shapes,
                   nvidia_smi_after=nvidia_smi_snapshot() if run.cuda else None)


def main_sweep(args):
    """Correctness check at the small shape, then the timed sweep; writes CSVs and JSON."""
    cuda = sweep_device(args)
    run = start_run(args, cuda)
    summary = start_summary(run)
    jpath = os.path.join(args.out, "kv_attention_summary.json")
    write_json(jpath, summary)
    log("machine:", {k: summary["machine"].get(k) for k in ("gpu_name", "torch", "triton", "cudnn", "sm_count")})
    check, shapes, skipped = sweep_shapes(args, cuda)
    fmts = selected_formats(args, check.D)
    impl_ok = impl_filter(args)
    gen = torch.Generator(device=run.device)
    gen.manual_seed(args.seed)
    summary["precompile_s"] = 0.0 if args.no_precompile else precompile(run, check, fmts, impl_ok)
    log(f"== check phase: B={check.B} L={check.L} heads={check.Hq},{check.Hkv},{check.D}")
    for fmt in fmts:
        run_shape_fmt(run, "check", check, fmt, selected_impls(fmt, impl_ok), gen)
    summary["check_done_s"] = round(run.elapsed(), 2)
    log(f"== sweep: {len(shapes)} shapes (corners first), skipped {len(skipped)} over {args.max_cache_gb} GB")
    run_sweep(run, shapes, fmts, impl_ok, gen, summary, jpath)
    run.csv.close()
    run.kcsv.close()
    finish_summary(run, summary, skipped)
    write_json(jpath, summary)
    print_table(run)
    log(f"done in {run.elapsed():.1f} s; rows {run.counts['rows']}, failed {run.counts['failed']}, "
        f"rel_err >= {REL_ERR_OK}: {run.counts['not_ok']}, truncated_by_budget={run.truncated}")
    return 0 if run.counts["failed"] == 0 and run.counts["not_ok"] == 0 else 1


# ============================================================================ offline compile check

def _sig_type(v):
    """Triton signature type of a launch argument."""
    if isinstance(v, torch.Tensor):
        return "*" + {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int8: "i8",
                      torch.uint8: "u8", torch.int16: "i16", torch.int32: "i32"}[v.dtype]
    if isinstance(v, bool):
        return "i1"
    if isinstance(v, int):
        return "i32"
    return "fp32"


def _ptxas_usage(ptx, arch="sm_90a"):
    """(registers, spill bytes, shared bytes) reported by the bundled ptxas for a PTX module."""
    ptxas = get_ptxas(90).path
    with tempfile.TemporaryDirectory() as td:
        src = os.path.join(td, "k.ptx")
        with open(src, "w") as fh:
            fh.write(ptx)
        p = subprocess.run([ptxas, "-v", f"--gpu-name={arch}", src, "-o", os.path.join(td, "k.cubin")],
                           capture_output=True, text=True)
    txt = p.stdout + p.stderr
    regs = re.search(r"Used (\d+) registers", txt)
    spill = re.search(r"(\d+) bytes spill stores", txt)
    smem = re.search(r"(\d+) bytes smem", txt)
    return (int(regs.group(1)) if regs else None, int(spill.group(1)) if spill else None,
            int(smem.group(1)) if smem else 0)


COMPILE_CHECK_FIELDS = ["kernel", "impl", "block_n", "num_warps", "compile_s", "ptxas_regs", "spill_bytes",
                        "shared_bytes_meta", "convert_layouts", "local_allocs", "error"]


def compile_jobs(args, D):
    """(fmt, impl name) of every Triton variant of head dim D that --formats and --impls keep."""
    jobs = []
    for fmt in formats_for(D):
        if args.formats and fmt.name not in args.formats.split(","):
            continue
        for name in impls_for(fmt):
            if not name.startswith("sdpa") and (not args.impls or name in args.impls.split(",")):
                jobs.append((fmt, name))
    return jobs


def split_signature(args, const):
    """(Triton signature, attributes) of the split kernel for its launch arguments ``args``:
    constexpr for the names in ``const``, tensors marked 16-byte divisible."""
    sig, attrs = {}, {}
    for i, nm in enumerate(_split_kernel.arg_names):
        if nm in const:
            sig[nm] = "constexpr"
        else:
            v = args[i]
            sig[nm] = _sig_type(v)
            if isinstance(v, torch.Tensor):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def dump_asm(dump_dir, name, ck):
    """Writes the ttgir and ptx of one compiled kernel into dump_dir as <name>.<kind>."""
    os.makedirs(dump_dir, exist_ok=True)
    for kind in ("ttgir", "ptx"):
        with open(os.path.join(dump_dir, f"{name}.{kind}"), "w") as fh:
            fh.write(ck.asm[kind])


def compile_split_variant(args, fmt, name, sh, target):
    """Compiles the split kernel of one (fmt, impl) for target; returns its compile_check.csv row
    (with ``error`` set when it failed)."""
    pool = Pool(storage_shapes(fmt, sh), 1, torch.device("cpu"), guard=False)
    q = torch.zeros(sh.B, sh.Hq, sh.D, dtype=torch.bfloat16)
    impl = TritonImpl(name, fmt, sh, pool, [q], torch.device("cpu"), 132, args.splits, parse_tiles(args.tiles))
    tile = impl.tile
    grid, a, const = impl.launch_args(0)
    sig, attrs = split_signature(a, const)
    t0 = time.time()
    row = dict(kernel="_split_kernel", impl=name, block_n=tile.block_n, num_warps=tile.num_warps)
    try:
        src = ASTSource(_split_kernel, sig, const, attrs)
        ck = triton.compile(src, target=target, options={"num_warps": tile.num_warps, "num_stages": 2})
        row["compile_s"] = round(time.time() - t0, 2)
        regs, spill, _ = _ptxas_usage(ck.asm["ptx"])
        ttgir = ck.asm["ttgir"]
        row.update(ptxas_regs=regs, spill_bytes=spill, shared_bytes_meta=ck.metadata.shared,
                   convert_layouts=ttgir.count("ttg.convert_layout"), local_allocs=ttgir.count("ttg.local_alloc"))
        if args.dump_dir:
            dump_asm(args.dump_dir, name, ck)
    except Exception as e:  # noqa: BLE001
        row["error"] = one_line(e)
        if args.verbose:
            traceback.print_exc()
    return row


def compile_reduce(out, D, target):
    """Compiles the reduce kernel for target and writes its row; returns the number of failures (0 or 1)."""
    try:
        sig = {"pm_ptr": "*fp32", "pl_ptr": "*fp32", "pacc_ptr": "*fp32", "out_ptr": "*bf16", "S_tot": "i32",
               "D": "constexpr", "SC": "constexpr"}
        ck = triton.compile(ASTSource(_reduce_kernel, sig, {"D": D, "SC": REDUCE_CHUNK},
                                      {(i,): [["tt.divisibility", 16]] for i in range(4)}),
                            target=target, options={"num_warps": 4})
        regs, spill, _ = _ptxas_usage(ck.asm["ptx"])
        out.row(kernel="_reduce_kernel", ptxas_regs=regs, spill_bytes=spill, shared_bytes_meta=ck.metadata.shared)
        log(f"_reduce_kernel regs {regs} spill {spill}")
        return 0
    except Exception as e:  # noqa: BLE001
        log(f"_reduce_kernel failed: {one_line(e)}")
        return 1


def compile_check(args):
    """Compile every split-kernel variant (and the reduce kernel) for sm_90 without a GPU; print
    registers, spills, shared memory and layout conversions; write compile_check.csv."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("--compile-check must run without TRITON_INTERPRET")
    os.makedirs(args.out, exist_ok=True)
    Hq, Hkv, D = (int(x) for x in args.heads.split(","))
    sh = Shape(2, Hq, Hkv, D, 4096)
    target = GPUTarget("cuda", 90, 32)
    out = CsvOut(os.path.join(args.out, "compile_check.csv"), COMPILE_CHECK_FIELDS)
    failures = 0
    jobs = compile_jobs(args, D)
    for fmt, name in jobs:
        row = compile_split_variant(args, fmt, name, sh, target)
        if "error" in row:
            failures += 1
        out.row(**row)
        log(f"{name:34s} BN={row['block_n']:3d} w={row['num_warps']} compile {row.get('compile_s', '-')} s "
            f"regs {row.get('ptxas_regs')} spill {row.get('spill_bytes')} smem {row.get('shared_bytes_meta')} "
            f"cvt {row.get('convert_layouts')} {row.get('error', '')}")
    failures += compile_reduce(out, D, target)
    out.close()
    log(f"compile check: {len(jobs) + 1 - failures}/{len(jobs) + 1} compiled")
    return 1 if failures else 0


# ============================================================================ CLI

def parse_args(argv=None):
    """Command-line arguments."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--budget-s", type=float, default=150.0, help="stop starting configurations after this")
    ap.add_argument("--quick", action="store_true", help="GPU smoke run of every code path (tiny sweep)")
    ap.add_argument("--cpu", action="store_true", help="CPU plumbing check (needs TRITON_INTERPRET=1)")
    ap.add_argument("--compile-check", action="store_true", help="offline sm_90 compile of every kernel (no GPU)")
    ap.add_argument("--heads", default=None, help="Hq,Hkv,D (default 32,8,128; --cpu: 8,2,128)")
    ap.add_argument("--batches", default=None, help="sweep batches (default 1,4,16,64)")
    ap.add_argument("--contexts", default=None, help="sweep contexts L (default 1024,4096,16384,65536)")
    ap.add_argument("--formats", default="", help="comma list of fmt names (default all)")
    ap.add_argument("--impls", default="", help="comma list of impl names (default all)")
    ap.add_argument("--tiles", default="", help='override tiles per impl, e.g. "triton_group_int2-kivi=64:4" (BLOCK_N:num_warps)')
    ap.add_argument("--splits", type=int, default=None, help="force num_splits (default: heuristic)")
    ap.add_argument("--max-cache-gb", type=float, default=20.0, help="skip shapes whose bf16 cache is larger")
    ap.add_argument("--no-precompile", action="store_true",
                    help="compile each Triton variant at first use instead of in parallel up front")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dump-dir", default="", help="--compile-check: write ttgir/ptx here")
    ap.add_argument("--verbose", action="store_true", help="print tracebacks")
    return ap.parse_args(argv)


def main(argv=None):
    """Entry point."""
    args = parse_args(argv)
    args.heads = args.heads or default_heads(args)
    if args.compile_check:
        return compile_check(args)
    return main_sweep(args)


if __name__ == "__main__":
    sys.exit(main())
