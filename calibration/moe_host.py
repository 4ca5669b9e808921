#!/usr/bin/env python3
"""MoE layer executions as kernels, and host dispatch costs of eager PyTorch, on one GPU.

Expected wall time of the default run on one H200: 100-150 s; `--budget-s` (default 150) caps it.
About 12 s go to three repeats of the host section, a few seconds to CUDA start-up and Triton
compiles, and the rest to the MoE sweep, which stops starting configurations when its share of
the budget is spent (`truncated_by_budget` in the JSON says so). `--quick` runs every code path
on three small configurations in about 15 s.

Part 1: one MoE FFN layer. SwiGLU experts (gate_up [2F, H], down [H, F], bf16), T tokens (the
decode batch) routed top-k by a softmax router (HF Mixtral's: fp32 softmax, top-k, renormalise).
Shapes come from a grid, not from models: H in {1024, 2048, 4096, 7168}, F in {512, 768, 1408,
2048, 4096, 14336}, E in {8, 16, 64, 128, 256}, top_k in {1, 2, 4, 8}, T in {1, 4, 16, 64},
configurations whose expert weights exceed 4 GB left out; a seeded Latin-hypercube-like sample
of --n-configs (120) that always holds the corners (each corner lowered along F, then E, then H
until it fits). The router's routing is computed once on the device and then fixed (seeded).
Executions (`impl`):
  loop_graph       per touched expert: index_select of its tokens, gate_up F.linear, silu and mul
                   (2 kernels), down F.linear, multiply by the routing weights, index_add_ into the
                   output (plus one zero fill): a plain PyTorch MoE for a routing fixed at capture,
                   in a CUDA graph. The router is not included.
  loop_eager_sync  HF Mixtral's eager block end to end, router included: F.linear router, fp32
                   softmax, topk, renormalise; one_hot expert mask, expert_hit = nonzero; per hit
                   expert `e == E` test, torch.where(mask[e]), x[tok], gate_up linear + chunk,
                   silu * up, down linear, * routing weight, index_add_. Its syncs are HF's:
                   nonzero, torch.where, bool() and 0-dim CUDA-tensor indexing (item()). Timed on
                   the host clock between synchronize() calls; median of >= 10 calls.
  grouped_triton   vLLM/SGLang-style fused MoE in a CUDA graph: moe_align_block_size as two Triton
                   kernels (count, pad to BLOCK_M and map blocks to experts; then scatter the
                   (token, k) pairs into sorted order), one grouped GEMM kernel for gate_up over all
                   touched experts (a program = one BLOCK_M block of sorted pairs x one BLOCK_N
                   tile, reading that expert's weight tile), a silu_mul kernel, one grouped GEMM
                   for down that multiplies by the routing weight, torch.sum over top_k. Tiles are
                   vLLM's defaults without a tuned config file (M <= E: 16/32/64, group 1; else
                   64/64/32, group 8; 4 warps, 3 stages). The router is not included.
  grouped_torch    torch._grouped_mm with per-expert offsets (rows padded to 16 per expert, as
                   torchtitan does): index_select into expert order, grouped gate_up, silu, mul,
                   grouped down, * routing weight, index_add_ back. Routing prep fixed at capture.
  dense_all        every expert on every token: bmm over all E experts, silu, mul, bmm, multiply by
                   the routing weights as a dense [E, T] mask (zero where not routed), sum over E.
Graph timing: R invocations per graph (one replay ~2 ms and >= 256 MiB of weights read), each
invocation reading another copy of the weights and/or another relabelling of the experts (the
same routing with expert ids permuted), so weights stream from HBM as in a decode step; replay
time / R, median of 7 replays. Every output is checked against a float64 reference (rel_err).

Part 2: host time per call of eager PyTorch ops, time.perf_counter over `calls` back-to-back
calls, median over `blocks` blocks; with the GPU idle at the start of each block
(device_busy=False) and with the GPU held busy by torch.cuda._sleep for the whole block
(device_busy=True, so the host never waits for the device; busy_ok_fraction says how often the
device was still busy when the block ended). Ops that wait for the device (blocks_on_device,
found by a probe) have idle rows only. The whole section runs --host-repeats (3) times in the
process: once before the MoE sweep and the rest after it.

Outputs (in --out):
  moe.csv            config_id, impl, H, F, E, top_k, T, touched (distinct experts used),
                     expert_weight_bytes_touched (touched * 3*H*F*2), pairs (T*top_k), padded_rows
                     (grouped: rows after padding each expert to block_m), block_m,
                     invocations_per_graph, n_timed, weight_pool_bytes, bytes_read,
                     bytes_written, flops (minimal for the layer: weights read once, x read and
                     output written once; flops 6*H*F per (token, expert) pair; dense_all counts
                     all E experts), timing (graph_replay_per_invocation | eager_wall_end_to_end |
                     cpu_eager_per_invocation), median_us, p10_us, p90_us, kernels, memcpys,
                     memsets (device activities per invocation, from torch.profiler), rel_err,
                     error, note
  moe_kernels.csv    config_id, impl, kind (kernel | memcpy | memset | cpu_op), name, grid, block,
                     registers_per_thread, shared_memory_bytes, launches_per_invocation,
                     device_us_per_invocation, mean_us_per_launch (one row per distinct
                     kernel/launch shape of one invocation; from one profiled graph replay per
                     configuration, divided by R)
  host_dispatch.csv  repeat, op, variant, calls, blocks, device_busy, blocks_on_device,
                     busy_ok_fraction, host_us_per_call_median, host_us_p10, host_us_p90, note,
                     error
  moe_host_summary.json  machine facts, nvidia-smi before/after, clocks, budget use, notes

Usage on the device:  python3 calibration/moe_host.py --out $OUT
Smoke test (GPU):     python3 calibration/moe_host.py --quick --out $OUT
Plumbing check (CPU): TRITON_INTERPRET=1 python3 calibration/moe_host.py --cpu --out /tmp/moe
(--cpu: tiny shapes, no CUDA graphs, host timers, Triton interpreted; numbers mean nothing.)
"""
from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import itertools
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
import traceback
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from harness import (Budget, ClockSampler, CsvOut, capture_graph, host_times_us, log, machine_facts,  # noqa: E402
                     nvidia_smi_snapshot, one_line, pct, replay_us, write_json)
from sweep import axis  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

try:
    import triton
    from ops.moe import (_fused_moe_gemm_kernel, _moe_align_kernel, _moe_scatter_kernel, _profile_marker_kernel,
                         _silu_mul_kernel)
    HAVE_TRITON = True
except Exception:  # noqa: BLE001
    HAVE_TRITON = False

MiB = 1024 ** 2
BF16_BYTES = 2
# the grid (H, F, E, top_k, T) and the weight cap: calibration/sweeps/moe_host.yaml
LEVELS = tuple(tuple(v) for v in axis("moe_host", "grid", "levels", "full").values())
WEIGHT_CAP_BYTES = axis("moe_host", "grid", "weight_cap_bytes", "full")
POOL_TARGET_BYTES = 512 * MiB          # weight copies so the pool is >= 8x the 60 MiB L2
GRAPH_READ_TARGET_BYTES = 256 * MiB    # weights one graph replay reads, at least
REPLAY_TARGET_US = 2000.0
MAX_INVOCATIONS = 256
GRAPH_REPLAYS = 7
PROFILE_SHARE = 0.2                    # the profiler may take at most this share of the sweep's time
EAGER_REPS = 10
ALIGN_E_PAD = 256                      # one compiled align kernel for every E of the grid
ALIGN_CHUNK = 32
ALIGN_FILL = 256
SCATTER_CHUNK = 64
SILU_BLOCK = 1024
TORCH_GROUP_ALIGN_ROWS = 16
MARKER_KERNEL = "_profile_marker_kernel"
IMPL_ORDER = ("loop_graph", "loop_eager_sync", "dense_all", "grouped_torch", "grouped_triton")
STICKY_CUDA_ERRORS = ("illegal memory access", "device-side assert", "unspecified launch failure",
                      "CUBLAS_STATUS_EXECUTION_FAILED", "misaligned address", "illegal instruction")

MOE_FIELDS = ["config_id", "impl", "H", "F", "E", "top_k", "T", "touched",
              "expert_weight_bytes_touched", "pairs", "padded_rows", "block_m",
              "invocations_per_graph", "n_timed", "weight_pool_bytes", "bytes_read",
              "bytes_written", "flops", "timing", "median_us", "p10_us", "p90_us", "kernels",
              "memcpys", "memsets", "rel_err", "error", "note"]
KERNEL_FIELDS = ["config_id", "impl", "kind", "name", "grid", "block", "registers_per_thread",
                 "shared_memory_bytes", "launches_per_invocation", "device_us_per_invocation",
                 "mean_us_per_launch"]
HOST_FIELDS = ["repeat", "op", "variant", "calls", "blocks", "device_busy", "blocks_on_device",
               "busy_ok_fraction", "host_us_per_call_median", "host_us_p10", "host_us_p90",
               "note", "error"]


# ============================================================================ context

class Ctx:
    """Run-wide settings and state: device, dtype, clocks, budget, Triton availability."""

    def __init__(self, args):
        self.args = args
        self.cuda = not args.cpu
        self.dev = torch.device("cuda" if self.cuda else "cpu")
        self.dtype = torch.bfloat16
        self.budget = Budget(args.budget_s)
        self.interpret = os.environ.get("TRITON_INTERPRET") == "1"
        self.triton_ok = HAVE_TRITON and (self.cuda or self.interpret)
        self.cycles_per_us = 1500.0
        self.cuda_broken = ""
        self.profile_s = 0.0
        self.configs_profiled = 0
        self.notes = {}
        self.marker_buf = torch.zeros(1, device=self.dev, dtype=torch.int32)
        self.impls = [i for i in IMPL_ORDER if i in args.impls.split(",")]

    def elapsed_s(self):
        """Seconds since the script started."""
        return self.budget.elapsed_s()

    def sync(self):
        """Waits for the device (no-op on CPU)."""
        if self.cuda:
            torch.cuda.synchronize()

    def sleep_us(self, us):
        """Queues a device spin of about `us` microseconds (CUDA only)."""
        torch.cuda._sleep(int(max(1.0, us) * self.cycles_per_us))

    def marker(self):
        """Launches the profiler marker kernel."""
        if self.triton_ok and self.cuda:
            _profile_marker_kernel[(1,)](self.marker_buf)


def calibrate_sleep(ctx):
    """Measures torch.cuda._sleep cycles per microsecond with CUDA events."""
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    cycles = 4_000_000
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    torch.cuda._sleep(cycles)
    e1.record()
    torch.cuda.synchronize()
    ctx.cycles_per_us = cycles / (e0.elapsed_time(e1) * 1e3)
    ctx.notes["sleep_cycles_per_us"] = ctx.cycles_per_us


def summarize_us(us):
    """Median, p10 and p90 of a list of microseconds."""
    return {"median_us": statistics.median(us), "p10_us": pct(us, 10), "p90_us": pct(us, 90)}


# ============================================================================ configurations

@dataclasses.dataclass(frozen=True)
class MoeShape:
    """One MoE FFN layer: hidden size H, expert ffn size F, E experts, top_k, T tokens."""

    H: int
    F: int
    E: int
    top_k: int
    T: int

    @property
    def expert_bytes(self):
        """bf16 bytes of one expert (gate_up and down)."""
        return 3 * self.H * self.F * BF16_BYTES

    @property
    def total_weight_bytes(self):
        """bf16 bytes of all E experts."""
        return self.E * self.expert_bytes

    @property
    def pairs(self):
        """(token, expert) pairs: T * top_k."""
        return self.T * self.top_k


def weights_fit(H, F_, E):
    """True when E experts of H x F fit the 4 GB cap."""
    return E * 3 * H * F_ * BF16_BYTES <= WEIGHT_CAP_BYTES


def _lower_until_fit(row):
    """Lowers F, then E, then H one level at a time until the expert weights fit the cap."""
    row = list(row)
    for d in (1, 2, 0):
        while not weights_fit(*row[:3]) and LEVELS[d].index(row[d]) > 0:
            row[d] = LEVELS[d][LEVELS[d].index(row[d]) - 1]
    return tuple(row)


def corner_configs():
    """The 32 corners of the grid, each lowered until it fits, without duplicates."""
    out = []
    for picks in itertools.product((0, -1), repeat=len(LEVELS)):
        row = _lower_until_fit(tuple(LEVELS[d][p] for d, p in enumerate(picks)))
        if row not in out:
            out.append(row)
    return out


def _random_fitting(rng, exclude):
    """A uniformly drawn grid point that fits and is not in `exclude`."""
    while True:
        row = tuple(rng.choice(lv) for lv in LEVELS)
        if weights_fit(*row[:3]) and row not in exclude:
            return row


def _repair_rows(rows, rng):
    """Swaps H, F or E values between rows (keeping each column's level counts) until every row
    fits; a row no swap can fix is redrawn."""
    for i in range(len(rows)):
        if weights_fit(*rows[i][:3]):
            continue
        fixed = False
        for j in rng.sample(range(len(rows)), len(rows)):
            for d in rng.sample((0, 1, 2), 3):
                a, b = list(rows[i]), list(rows[j])
                a[d], b[d] = b[d], a[d]
                if i != j and weights_fit(*a[:3]) and weights_fit(*b[:3]):
                    rows[i], rows[j] = a, b
                    fixed = True
                    break
            if fixed:
                break
        if not fixed:
            rows[i] = list(_random_fitting(rng, []))


def sample_configs(n, seed):
    """Corners first, then a balanced (Latin-hypercube-like) shuffled sample of the grid."""
    rng = random.Random(seed)
    chosen = corner_configs()[:n]
    rest = n - len(chosen)
    cols = []
    for lv in LEVELS:
        col = [lv[i % len(lv)] for i in range(rest)]
        rng.shuffle(col)
        cols.append(col)
    rows = [list(r) for r in zip(*cols, strict=True)]
    _repair_rows(rows, rng)
    for r in rows:
        t = tuple(r)
        chosen.append(_random_fitting(rng, chosen) if t in chosen else t)
    return [MoeShape(*t) for t in chosen]


def fixed_configs(args):
    """The configurations of --quick and --cpu runs (None for the sampled sweep)."""
    if not (args.cpu or args.quick):
        return None
    return [MoeShape(*row) for row in axis("moe_host", "grid", "fixed", "cpu" if args.cpu else "quick")]


# ============================================================================ routing and weights

def hf_router(x, router_w, top_k):
    """HF Mixtral router: linear, fp32 softmax, top-k, renormalise. Returns fp32 weights, ids."""
    logits = F.linear(x, router_w)
    probs = F.softmax(logits, dim=1, dtype=torch.float)
    topw, topi = torch.topk(probs, top_k, dim=-1)
    topw /= topw.sum(dim=-1, keepdim=True)
    return topw, topi


@dataclasses.dataclass
class Slot:
    """Inputs of one invocation: one weight copy and one relabelling of the experts."""

    w13: torch.Tensor      # [E, 2F, H]
    w2: torch.Tensor       # [E, H, F]
    ids_cpu: torch.Tensor  # [T, top_k] int64, relabelled
    ids: torch.Tensor      # same on the device
    perm: torch.Tensor     # router row j of this slot is the original router row perm[j]


class MoeCase:
    """Weights (a pool of copies), activations, the seeded routing and its relabellings for one shape."""

    def __init__(self, shape: MoeShape, ctx: Ctx, seed: int):
        self.shape, self.ctx, self.seed = shape, ctx, seed
        dev, dt = ctx.dev, ctx.dtype
        E, H, ffn, T = shape.E, shape.H, shape.F, shape.T
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed)
        pool_target = POOL_TARGET_BYTES if ctx.cuda else 0
        self.copies = max(1, math.ceil(pool_target / shape.total_weight_bytes))
        self.w13_pool = torch.randn(self.copies * E, 2 * ffn, H, generator=gen, device=dev, dtype=dt)
        self.w13_pool.mul_(H ** -0.5)
        self.w2_pool = torch.randn(self.copies * E, H, ffn, generator=gen, device=dev, dtype=dt)
        self.w2_pool.mul_(ffn ** -0.5)
        self.x = torch.randn(T, H, generator=gen, device=dev, dtype=dt)
        self.router_w = (torch.randn(E, H, generator=gen, device=dev, dtype=torch.float32)
                         * H ** -0.5).to(dt)
        topw, topi = hf_router(self.x, self.router_w, shape.top_k)
        self.topw = topw.float()
        self.topw_cpu = self.topw.cpu()
        self.ids0_cpu = topi.cpu()
        self.touched = int(torch.unique(self.ids0_cpu).numel())
        self._slots = {}
        self._routers = {}

    @property
    def pool_bytes(self):
        """Bytes of all weight copies."""
        return self.copies * self.shape.total_weight_bytes

    def slot(self, i) -> Slot:
        """Invocation i: weight copy i % copies, relabelling i // copies (0 = identity)."""
        if i not in self._slots:
            E = self.shape.E
            c, p = i % self.copies, i // self.copies
            perm = torch.arange(E)
            if p:
                perm = torch.randperm(E, generator=torch.Generator().manual_seed(self.seed * 7919 + p))
            inv = torch.empty_like(perm)
            inv[perm] = torch.arange(E)
            ids_cpu = inv[self.ids0_cpu]
            self._slots[i] = Slot(w13=self.w13_pool[c * E:(c + 1) * E], w2=self.w2_pool[c * E:(c + 1) * E],
                                  ids_cpu=ids_cpu, ids=ids_cpu.to(self.ctx.dev), perm=perm)
        return self._slots[i]

    def router_for(self, i):
        """Router weights whose top-k picks slot i's relabelled experts."""
        if i not in self._routers:
            self._routers[i] = self.router_w[self.slot(i).perm.to(self.ctx.dev)].contiguous()
        return self._routers[i]

    def reference(self):
        """float64 output of slot 0 (copy 0, identity labels)."""
        s, ffn = self.slot(0), self.shape.F
        x = self.x.double()
        out = torch.zeros_like(x)
        w = self.topw.double()
        for e in torch.unique(self.ids0_cpu).tolist():
            tok, pos = (self.ids0_cpu == e).nonzero(as_tuple=True)
            tok, pos = tok.to(self.ctx.dev), pos.to(self.ctx.dev)
            h = x[tok] @ s.w13[e].double().T
            y = (F.silu(h[:, :ffn]) * h[:, ffn:]) @ s.w2[e].double().T
            out.index_add_(0, tok, y * w[tok, pos, None])
        return out

    def padded_rows(self, block_m):
        """Rows after padding each touched expert's pairs to a multiple of block_m (slot 0)."""
        counts = torch.bincount(self.ids0_cpu.flatten(), minlength=self.shape.E)
        return int(((counts + block_m - 1) // block_m * block_m).sum())


def rel_err(out, ref):
    """||out - ref|| / ||ref|| in float64."""
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-300))


# ============================================================================ executions

def loop_plan(case: MoeCase, slot: Slot):
    """Per touched expert (ascending id): its token rows (int64, device) and routing weights [n, 1]."""
    k, dev = case.shape.top_k, case.ctx.dev
    flat = slot.ids_cpu.flatten()
    order = torch.argsort(flat, stable=True)
    uniq, counts = torch.unique_consecutive(flat[order], return_counts=True)
    tok = (order // k).to(dev)
    w = case.topw_cpu.flatten()[order].to(dev, case.ctx.dtype).unsqueeze(1)
    plan, start = [], 0
    for e, n in zip(uniq.tolist(), counts.tolist(), strict=True):
        plan.append((e, tok[start:start + n], w[start:start + n]))
        start += n
    return plan


def loop_invoke(case: MoeCase, slot: Slot, plan):
    """The per-expert loop of a plain PyTorch MoE (7 kernels per touched expert + 1 zero fill)."""
    x, ffn = case.x, case.shape.F
    out = torch.zeros_like(x)
    for e, tok, w in plan:
        cur = x.index_select(0, tok)
        h = F.linear(cur, slot.w13[e])
        act = F.silu(h[:, :ffn]) * h[:, ffn:]
        y = F.linear(act, slot.w2[e]) * w
        out.index_add_(0, tok, y)
    return out


def hf_eager_moe(x, router_w, w13, w2, top_k):
    """HF Mixtral's eager sparse-MoE block (router included), with its host syncs."""
    n_experts = w13.shape[0]
    topw, topi = hf_router(x, router_w, top_k)
    topw = topw.to(x.dtype)
    out = torch.zeros_like(x)
    expert_mask = F.one_hot(topi, num_classes=n_experts).permute(2, 1, 0)
    expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in expert_hit:
        e = e[0]
        if e == n_experts:
            continue
        pos, tok = torch.where(expert_mask[e])
        gate, up = F.linear(x[tok], w13[e]).chunk(2, dim=-1)
        h = F.linear(F.silu(gate) * up, w2[e])
        h = h * topw[tok, pos, None]
        out.index_add_(0, tok, h.to(out.dtype))
    return out


@dataclasses.dataclass(frozen=True)
class GroupedConfig:
    """Tile sizes of the grouped Triton GEMM."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int


def vllm_default_config(T, E):
    """vLLM fused_moe get_default_config for bf16 without a tuned file (M = tokens)."""
    if T <= E:
        return GroupedConfig(16, 32, 64, 1)
    return GroupedConfig(64, 64, 32, 8)


def align_rows_max(pairs, E, block_m):
    """Upper bound of padded rows, rounded up to block_m (vLLM's max_num_tokens_padded)."""
    rows = pairs + min(E, pairs) * (block_m - 1)
    return (rows + block_m - 1) // block_m * block_m


def triton_plan(case: MoeCase, slot: Slot):
    """Flat int32 expert ids and fp32 routing weights of one slot (as vLLM's topk_softmax gives)."""
    return slot.ids.flatten().to(torch.int32).contiguous(), case.topw.flatten().contiguous()


def _launch_moe_gemm(a, w, c, topw, sorted_ids, expert_ids, total, em_max, n_valid, a_row_div,
                     mul_weight, cfg: GroupedConfig, dot_f32):
    """One grouped GEMM launch over all padded blocks x N tiles."""
    n_out, k_in = w.shape[1], w.shape[2]
    grid = (triton.cdiv(em_max, cfg.block_m) * triton.cdiv(n_out, cfg.block_n),)
    _fused_moe_gemm_kernel[grid](
        a, w, c, topw, sorted_ids, expert_ids, total, n_out, k_in, em_max, n_valid, a_row_div,
        a.stride(0), w.stride(0), w.stride(1), w.stride(2), c.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        MUL_WEIGHT=mul_weight, DOT_F32=dot_f32, num_warps=4, num_stages=3)


def grouped_triton_invoke(case: MoeCase, slot: Slot, plan):
    """align (2 kernels), gate_up grouped GEMM, silu_mul, down grouped GEMM x weight, sum over top_k."""
    ids32, topw = plan
    s, dev, dt = case.shape, case.ctx.dev, case.ctx.dtype
    cfg = vllm_default_config(s.T, s.E)
    n = s.pairs
    em_max = align_rows_max(n, s.E, cfg.block_m)
    sorted_ids = torch.empty(em_max, device=dev, dtype=torch.int32)
    expert_ids = torch.empty(em_max // cfg.block_m, device=dev, dtype=torch.int32)
    expert_start = torch.empty(s.E, device=dev, dtype=torch.int32)
    total = torch.empty(1, device=dev, dtype=torch.int32)
    _moe_align_kernel[(1,)](ids32, n, s.E, em_max, sorted_ids, expert_ids, expert_start, total,
                            BLOCK_M=cfg.block_m, E_PAD=max(ALIGN_E_PAD, triton.next_power_of_2(s.E)),
                            CHUNK=ALIGN_CHUNK, FILL=ALIGN_FILL)
    _moe_scatter_kernel[(triton.cdiv(n, SCATTER_CHUNK),)](ids32, n, expert_start, sorted_ids,
                                                          CHUNK=SCATTER_CHUNK)
    dot_f32 = case.ctx.interpret
    c1 = torch.empty(n, 2 * s.F, device=dev, dtype=dt)
    _launch_moe_gemm(case.x, slot.w13, c1, topw, sorted_ids, expert_ids, total, em_max, n, s.top_k,
                     False, cfg, dot_f32)
    c2 = torch.empty(n, s.F, device=dev, dtype=dt)
    _silu_mul_kernel[(n, triton.cdiv(s.F, SILU_BLOCK))](c1, c2, s.F, BLOCK=SILU_BLOCK)
    c3 = torch.empty(n, s.H, device=dev, dtype=dt)
    _launch_moe_gemm(c2, slot.w2, c3, topw, sorted_ids, expert_ids, total, em_max, n, 1,
                     True, cfg, dot_f32)
    return c3.view(s.T, s.top_k, s.H).sum(dim=1)


def grouped_torch_plan(case: MoeCase, slot: Slot):
    """Offsets (int32 cumulative padded rows per expert), the token of every padded row (T for a
    padding row) and every row's routing weight (0 for padding)."""
    s, dev = case.shape, case.ctx.dev
    flat = slot.ids_cpu.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=s.E)
    padded = (counts + TORCH_GROUP_ALIGN_ROWS - 1) // TORCH_GROUP_ALIGN_ROWS * TORCH_GROUP_ALIGN_ROWS
    ends = torch.cumsum(padded, 0)
    e_sorted = flat[order]
    rank = torch.arange(s.pairs) - (torch.cumsum(counts, 0) - counts)[e_sorted]
    dest = (ends - padded)[e_sorted] + rank
    rows = int(ends[-1])
    row_tok = torch.full((rows,), s.T, dtype=torch.int64)
    row_w = torch.zeros(rows)
    row_tok[dest] = order // s.top_k
    row_w[dest] = case.topw_cpu.flatten()[order]
    return (ends.to(torch.int32).to(dev), row_tok.to(dev),
            row_w.to(dev, case.ctx.dtype).unsqueeze(1))


def grouped_torch_invoke(case: MoeCase, slot: Slot, plan, x_pad):
    """index_select into expert order, torch._grouped_mm gate_up, silu, mul, _grouped_mm down,
    x routing weight, index_add_ back (x_pad has a zero row T for padding rows)."""
    offs, row_tok, row_w = plan
    s = case.shape
    a = x_pad.index_select(0, row_tok)
    h = torch._grouped_mm(a, slot.w13.transpose(-2, -1), offs=offs)
    act = F.silu(h[:, :s.F]) * h[:, s.F:]
    y = torch._grouped_mm(act, slot.w2.transpose(-2, -1), offs=offs) * row_w
    out = torch.zeros_like(x_pad)
    out.index_add_(0, row_tok, y)
    return out[:s.T]


def dense_plan(case: MoeCase, slot: Slot):
    """Routing weights as a dense [E, T, 1] mask (0 where a token does not use the expert)."""
    s = case.shape
    dense = torch.zeros(s.E, s.T)
    tok = torch.arange(s.T).unsqueeze(1).expand(s.T, s.top_k)
    dense[slot.ids_cpu, tok] = case.topw_cpu
    return dense.to(case.ctx.dev, case.ctx.dtype).unsqueeze(2)


def dense_invoke(case: MoeCase, slot: Slot, plan):
    """All E experts on all T tokens: bmm, silu, mul, bmm, x mask, sum over E."""
    ffn, E = case.shape.F, case.shape.E
    xe = case.x.unsqueeze(0).expand(E, -1, -1)
    h = torch.bmm(xe, slot.w13.transpose(1, 2))
    act = F.silu(h[..., :ffn]) * h[..., ffn:]
    y = torch.bmm(act, slot.w2.transpose(1, 2))
    return (y * plan).sum(0)


@dataclasses.dataclass(frozen=True)
class GraphImpl:
    """A graph-captured execution: per-slot plan (host side, before capture) and the invocation."""

    prepare: Callable
    invoke: Callable
    kernels_guess: Callable   # (case) -> kernels per invocation, for choosing R
    reads_all_experts: bool = False


def graph_impls(case: MoeCase):
    """The four graph-captured executions of one case."""
    x_pad = torch.cat([case.x, torch.zeros_like(case.x[:1])])
    return {
        "loop_graph": GraphImpl(loop_plan, loop_invoke, lambda c: 7 * c.touched + 1),
        "dense_all": GraphImpl(dense_plan, dense_invoke, lambda c: 7, reads_all_experts=True),
        "grouped_torch": GraphImpl(grouped_torch_plan,
                                   lambda c, s, p: grouped_torch_invoke(c, s, p, x_pad),
                                   lambda c: 9),
        "grouped_triton": GraphImpl(triton_plan, grouped_triton_invoke, lambda c: 7),
    }


# ============================================================================ timing

def choose_invocations(case: MoeCase, impl: GraphImpl):
    """R invocations per graph: replay ~REPLAY_TARGET_US and >= GRAPH_READ_TARGET_BYTES of weights."""
    if not case.ctx.cuda:
        return 2
    s = case.shape
    read = s.total_weight_bytes if impl.reads_all_experts else case.touched * s.expert_bytes
    est_us = impl.kernels_guess(case) * 2.5 + read / 3e6
    r = max(math.ceil(REPLAY_TARGET_US / est_us), math.ceil(GRAPH_READ_TARGET_BYTES / read))
    return int(min(MAX_INVOCATIONS, max(1, r)))


def time_replays(ctx, g, n_invocations, n_replays):
    """Per-invocation microseconds of n_replays replays (CUDA events, each behind a ~100 us backlog)."""
    g.replay()
    torch.cuda.synchronize()
    cycles = int(100 * ctx.cycles_per_us)
    return [replay_us(g, cycles) / n_invocations for _ in range(n_replays)]


# ============================================================================ kernel profiles

def _device_events(trace):
    """Kernel, memcpy and memset events of a chrome trace, by start time."""
    cats = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
    evs = []
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") in cats:
            evs.append(dict(e, kind=cats[e["cat"]]))
    evs.sort(key=lambda e: e.get("ts", 0))
    return evs


def split_by_marker(events, names):
    """Segments of `events` between consecutive marker kernels, one per name; {} if the count is off."""
    cuts = [i for i, e in enumerate(events) if MARKER_KERNEL in e.get("name", "")]
    if len(cuts) != len(names) + 1:
        return {}
    return {n: events[cuts[i] + 1:cuts[i + 1]] for i, n in enumerate(names)}


def _cpu_top_level_ops(trace, names):
    """CPU plumbing: top-level aten ops inside each record_function range named moe_impl:<name>."""
    evs = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    out = {}
    for n in names:
        ann = [e for e in evs if e.get("name") == f"moe_impl:{n}"]
        if not ann:
            continue
        t0, t1 = ann[0]["ts"], ann[0]["ts"] + ann[0]["dur"]
        ops = sorted((e for e in evs if e.get("cat") == "cpu_op" and t0 <= e["ts"] <= t1),
                     key=lambda e: (e["ts"], -e["dur"]))
        top, end = [], -1.0
        for e in ops:
            if e["ts"] >= end:
                top.append(dict(e, kind="cpu_op"))
                end = e["ts"] + e["dur"]
        out[n] = top
    return out


def aggregate_kernels(events, divisor):
    """Rows per distinct (kind, name, grid, block, registers, shared memory), counts / divisor."""
    groups = collections.OrderedDict()
    for e in events:
        a = e.get("args", {})
        key = (e["kind"], e.get("name", "")[:300], str(a.get("grid", "")), str(a.get("block", "")),
               a.get("registers per thread", ""), a.get("shared memory", ""))
        n, dur = groups.get(key, (0, 0.0))
        groups[key] = (n + 1, dur + float(e.get("dur", 0.0)))
    rows = []
    for (kind, name, grid, block, regs, smem), (n, dur) in groups.items():
        rows.append({"kind": kind, "name": name, "grid": grid, "block": block,
                     "registers_per_thread": regs, "shared_memory_bytes": smem,
                     "launches_per_invocation": n / divisor, "device_us_per_invocation": dur / divisor,
                     "mean_us_per_launch": dur / n})
    return rows


def profile_executions(ctx, items, tmp_dir):
    """One profiler session over items [(impl, thunk, divisor)]; returns {impl: kernel rows}."""
    names = [n for n, _, _ in items]
    acts = [ProfilerActivity.CUDA] if ctx.cuda else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        for name, thunk, _ in items:
            ctx.marker()
            with record_function(f"moe_impl:{name}"):
                thunk()
        ctx.marker()
        ctx.sync()
    fd, path = tempfile.mkstemp(suffix=".json", dir=tmp_dir)
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as fh:
            trace = json.load(fh)
    finally:
        os.remove(path)
    segs = split_by_marker(_device_events(trace), names) if ctx.cuda \
        else _cpu_top_level_ops(trace, names)
    return {n: aggregate_kernels(segs[n], div) for n, _, div in items if n in segs}


def self_test_split():
    """Checks split_by_marker and aggregate_kernels on a synthetic trace (no GPU needed)."""
    mk = {"ph": "X", "cat": "kernel", "name": MARKER_KERNEL, "dur": 1.0, "args": {}}
    k = {"ph": "X", "cat": "kernel", "name": "gemm", "dur": 4.0, "args": {"grid": [2, 1, 1]}}
    cp = {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "dur": 2.0, "args": {}}
    seq = [mk, k, k, cp, mk, k, mk]
    trace = {"traceEvents": [dict(e, ts=float(i)) for i, e in enumerate(seq)]}
    segs = split_by_marker(_device_events(trace), ["a", "b"])
    rows_a = aggregate_kernels(segs["a"], 2)
    assert [r["launches_per_invocation"] for r in rows_a] == [1.0, 0.5], rows_a
    assert len(segs["b"]) == 1 and split_by_marker(_device_events(trace), ["a"]) == {}
    return True


# ============================================================================ one configuration

def base_row(cid, case: MoeCase, impl):
    """The moe.csv fields every execution of a configuration shares."""
    s = case.shape
    return {"config_id": cid, "impl": impl, "H": s.H, "F": s.F, "E": s.E, "top_k": s.top_k,
            "T": s.T, "touched": case.touched,
            "expert_weight_bytes_touched": case.touched * s.expert_bytes, "pairs": s.pairs,
            "weight_pool_bytes": case.pool_bytes,
            "bytes_read": ((s.total_weight_bytes if impl == "dense_all" else case.touched * s.expert_bytes)
                           + s.T * s.H * BF16_BYTES),
            "bytes_written": s.T * s.H * BF16_BYTES,
            "flops": 6 * s.H * s.F * (s.E * s.T if impl == "dense_all" else s.pairs)}


def measure_graph_impl(ctx, case, impl: GraphImpl, ref):
    """Times one graph-captured execution; returns (row fields, profile thunk, divisor, keep-alive)."""
    n_inv = choose_invocations(case, impl)
    plans = [impl.prepare(case, case.slot(i)) for i in range(n_inv)]

    def call(i):
        return impl.invoke(case, case.slot(i % n_inv), plans[i % n_inv])

    if not ctx.cuda:
        us = host_times_us(call, reps=3, warmup=1, sync=ctx.sync)
        out = call(0)
        fields = {"timing": "cpu_eager_per_invocation", "invocations_per_graph": 1, "n_timed": len(us),
                  "rel_err": rel_err(out, ref), "note": "cpu: eager, no CUDA graph", **summarize_us(us)}
        return fields, (lambda: call(0)), 1, None
    g, outs = capture_graph(call, n_inv, warmup_calls=min(n_inv, 2), keep_outputs=True)
    us = time_replays(ctx, g, n_inv, GRAPH_REPLAYS)
    fields = {"timing": "graph_replay_per_invocation", "invocations_per_graph": n_inv,
              "n_timed": len(us), "rel_err": rel_err(outs[0], ref), **summarize_us(us)}
    return fields, g.replay, n_inv, (g, outs, plans)


def measure_eager(ctx, case, ref, reps):
    """Times HF's eager block end to end on the host clock, rotating weight copies and labels."""
    s = case.shape

    for i in range(reps):  # slots and routers built (H2D copies) before anything is timed
        case.router_for(i)

    def call(i):
        slot = case.slot(i)
        return hf_eager_moe(case.x, case.router_for(i), slot.w13, slot.w2, s.top_k)

    us = host_times_us(call, reps=reps, warmup=2, sync=ctx.sync)
    out = call(0)
    fields = {"timing": "eager_wall_end_to_end", "n_timed": len(us), "rel_err": rel_err(out, ref),
              **summarize_us(us)}
    return fields, (lambda: call(0)), 1, None


def impl_extras(case: MoeCase, impl):
    """padded_rows and block_m where the execution pads."""
    s = case.shape
    if impl == "grouped_triton":
        bm = vllm_default_config(s.T, s.E).block_m
        return {"block_m": bm, "padded_rows": case.padded_rows(bm)}
    if impl == "grouped_torch":
        return {"block_m": TORCH_GROUP_ALIGN_ROWS, "padded_rows": case.padded_rows(TORCH_GROUP_ALIGN_ROWS)}
    return {}


def check_sticky(ctx, err):
    """Marks the CUDA context broken on errors that poison it (the sweep then stops)."""
    if ctx.cuda and any(s.lower() in err.lower() for s in STICKY_CUDA_ERRORS):
        ctx.cuda_broken = err


def run_impl(ctx, case, impl, ref, impls):
    """Measures one execution of one case; returns (row fields, profile item or None, keep-alive)."""
    fields = impl_extras(case, impl)
    try:
        if impl == "grouped_triton" and not ctx.triton_ok:
            raise RuntimeError("Triton unavailable (on CPU set TRITON_INTERPRET=1)")
        if impl == "grouped_torch" and not hasattr(torch, "_grouped_mm"):
            raise RuntimeError("torch._grouped_mm not in this torch")
        if impl == "loop_eager_sync":
            res, thunk, div, keep = measure_eager(ctx, case, ref, EAGER_REPS if not ctx.args.cpu else 3)
        else:
            res, thunk, div, keep = measure_graph_impl(ctx, case, impls[impl], ref)
        ctx.sync()
        fields.update(res)
        if res["rel_err"] >= 2e-2:
            fields["error"] = f"numerics: rel_err {res['rel_err']:.3g} >= 2e-2"
        return fields, (impl, thunk, div), keep
    except Exception as e:  # noqa: BLE001
        err = one_line(e)
        fields["error"] = err
        check_sticky(ctx, err)
        log(f"   {impl} failed: {err}")
        if ctx.args.verbose:
            traceback.print_exc()
        try:
            ctx.sync()
        except Exception as e2:  # noqa: BLE001
            check_sticky(ctx, one_line(e2))
        return fields, None, None


def profile_config(ctx, cid, items, kout):
    """Profiles the executions of one configuration; writes moe_kernels.csv rows; returns counts."""
    counts = {}
    t0 = time.time()
    try:
        per_impl = profile_executions(ctx, items, ctx.args.out)
        ctx.configs_profiled += 1
        for impl, rows in per_impl.items():
            c = collections.Counter()
            for r in rows:
                kout.row(config_id=cid, impl=impl, **r)
                c[r["kind"]] += r["launches_per_invocation"]
            counts[impl] = {"kernels": c["kernel"] + c["cpu_op"], "memcpys": c["memcpy"],
                            "memsets": c["memset"]}
        if len(per_impl) < len(items):
            ctx.notes.setdefault("profile_gaps", []).append(cid)
    except Exception as e:  # noqa: BLE001
        err = one_line(e)
        ctx.notes.setdefault("profile_errors", []).append(f"config {cid}: {err}")
        log(f"   profiler failed: {err}")
        check_sticky(ctx, err)
    ctx.profile_s += time.time() - t0
    return counts


def run_config(ctx, cid, shape, mout, kout, profile_on):
    """Builds one case, measures every execution, profiles them once, writes the rows."""
    t0 = time.time()
    rows = []
    try:
        case = MoeCase(shape, ctx, seed=ctx.args.seed * 100003 + cid)
        ref = case.reference()
        impls = graph_impls(case)
    except Exception as e:  # noqa: BLE001
        err = one_line(e)
        check_sticky(ctx, err)
        for impl in ctx.impls:
            mout.row(config_id=cid, impl=impl, H=shape.H, F=shape.F, E=shape.E, top_k=shape.top_k,
                     T=shape.T, pairs=shape.pairs, error=f"setup: {err}")
        log(f"cfg {cid:3d} {shape}: setup failed: {err}")
        return
    items, keep = [], []
    for impl in ctx.impls:
        if ctx.cuda_broken:
            rows.append(dict(base_row(cid, case, impl), error=f"skipped: CUDA context broken ({ctx.cuda_broken[:80]})"))
            continue
        fields, item, alive = run_impl(ctx, case, impl, ref, impls)
        rows.append(dict(base_row(cid, case, impl), **fields))
        if item:
            items.append(item)
            keep.append(alive)
    counts = profile_config(ctx, cid, items, kout) if (profile_on and items and not ctx.cuda_broken) else {}
    for r in rows:
        r.update(counts.get(r["impl"], {}))
        if not profile_on:
            r["note"] = "; ".join(x for x in (r.get("note", ""), "not profiled (profiler share of budget)") if x)
        mout.row(**r)
    summary = "  ".join(f"{r['impl']}={r.get('median_us', float('nan')):.1f}" if not r.get("error")
                        else f"{r['impl']}=ERR" for r in rows)
    log(f"cfg {cid:3d} H={shape.H} F={shape.F} E={shape.E} k={shape.top_k} T={shape.T} "
        f"touched={case.touched}: {summary} us  ({time.time() - t0:.2f} s)")
    del keep, items, case, impls
    if ctx.cuda:
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001
            check_sticky(ctx, one_line(e))


def run_moe_sweep(ctx, configs, deadline_s, summary):
    """All configurations until the deadline; records what ran in `summary`."""
    mout = CsvOut(os.path.join(ctx.args.out, "moe.csv"), MOE_FIELDS)
    kout = CsvOut(os.path.join(ctx.args.out, "moe_kernels.csv"), KERNEL_FIELDS)
    done = 0
    t_sweep = time.time()
    summary["truncated_by_budget"] = False
    for cid, shape in enumerate(configs):
        if ctx.elapsed_s() > deadline_s:
            summary["truncated_by_budget"] = True
            log(f"budget: stopping the MoE sweep after {done} of {len(configs)} configurations")
            break
        if ctx.cuda_broken:
            summary["stopped_by_cuda_error"] = ctx.cuda_broken
            log(f"CUDA context broken ({ctx.cuda_broken}); stopping the MoE sweep")
            break
        profile_on = not ctx.args.no_profile and (
            cid < 3 or ctx.profile_s <= PROFILE_SHARE * (time.time() - t_sweep))
        run_config(ctx, cid, shape, mout, kout, profile_on)
        done += 1
    mout.close()
    kout.close()
    summary.update({"configs_planned": len(configs), "configs_done": done,
                    "configs_profiled": ctx.configs_profiled, "profile_s": ctx.profile_s})


# ============================================================================ part 2: host dispatch

@dataclasses.dataclass(frozen=True)
class HostOp:
    """One eager op: make() builds its inputs and returns the no-argument call to time."""

    op: str
    variant: str
    make: Callable


def _group_in_python(ids):
    """Python grouping of a routing list: expert -> list of pair indices."""
    groups = {}
    for i, e in enumerate(ids):
        groups.setdefault(e, []).append(i)
    return groups


def _sdpa_call(dev, dt):
    """Decode SDPA: q [1,32,1,128] against K, V [1,8,1024,128] (GQA)."""
    q = torch.randn(1, 32, 1, 128, device=dev, dtype=dt)
    kv = torch.randn(1, 8, 1024, 128, device=dev, dtype=dt)
    return lambda: F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)


def _pinned_h2d_call(dev):
    """A pinned 16 x int64 index tensor copied with non_blocking=True."""
    src = torch.arange(16, dtype=torch.int64).pin_memory()
    return lambda: src.to(dev, non_blocking=True)


def device_ops(dev, dt):
    """Kernel-launching ops of a decode step and of an eager MoE block."""
    x1 = torch.zeros(1, device=dev)
    a = torch.randn(1, 4096, device=dev, dtype=dt)
    w = torch.randn(4096, 4096, device=dev, dtype=dt)
    nw = torch.ones(4096, device=dev, dtype=dt)
    wide = torch.randn(1, 14336, device=dev, dtype=dt)
    logits = torch.randn(16, 64, device=dev)
    src = torch.randn(64, 4096, device=dev, dtype=dt)
    rows16 = torch.randn(16, 4096, device=dev, dtype=dt)
    idx16 = torch.randperm(64, device=dev)[:16]
    dst = torch.zeros(64, 4096, device=dev, dtype=dt)
    ids = torch.randint(0, 64, (16, 8), device=dev)
    w13 = torch.randn(8, 256, 128, device=dev, dtype=dt)
    e0 = torch.tensor(3, device=dev)
    return [
        HostOp("add_", "x[1] fp32 in place (tiny elementwise)", lambda: lambda: x1.add_(1)),
        HostOp("linear", "F.linear M=1 K=4096 N=4096 bf16", lambda: lambda: F.linear(a, w)),
        HostOp("sdpa", "q[1,32,1,128] kv[1,8,1024,128] bf16 enable_gqa", lambda: _sdpa_call(dev, dt)),
        HostOp("rms_norm", "F.rms_norm [1,4096] bf16", lambda: lambda: F.rms_norm(a, (4096,), nw, 1e-6)),
        HostOp("silu", "F.silu [1,14336] bf16", lambda: lambda: F.silu(wide)),
        HostOp("softmax", "router logits [16,64] fp32", lambda: lambda: F.softmax(logits, dim=-1)),
        HostOp("topk", "[16,64] fp32 k=8", lambda: lambda: torch.topk(logits, 8, dim=-1)),
        HostOp("cat", "2 x [1,4096] bf16 dim=-1", lambda: lambda: torch.cat([a, a], dim=-1)),
        HostOp("index_select", "[64,4096] bf16, 16 rows", lambda: lambda: src.index_select(0, idx16)),
        HostOp("index_copy_", "[64,4096] bf16, 16 rows", lambda: lambda: dst.index_copy_(0, idx16, rows16)),
        HostOp("index_add_", "[64,4096] bf16, 16 rows", lambda: lambda: dst.index_add_(0, idx16, rows16)),
        HostOp("one_hot", "ids [16,8] E=64", lambda: lambda: F.one_hot(ids, num_classes=64)),
        HostOp("index_0dim_tensor", "W[e], e a 0-dim device long (HF expert weight select)",
               lambda: lambda: w13[e0]),
    ]


def sync_and_copy_ops(dev):
    """Ops that copy between host and device or wait for it."""
    lst16 = list(range(16))
    pageable16 = torch.arange(16, dtype=torch.int64)
    ids64 = torch.randint(0, 64, (64,), device=dev)
    scalar = torch.tensor(7, device=dev)
    mask = torch.rand(8, 64, device=dev) < 0.1
    ops = [
        HostOp("h2d_index", "torch.tensor(list16, device=dev)",
               lambda: lambda: torch.tensor(lst16, device=dev)),
        HostOp("h2d_index", "pageable int64[16] .to(dev, non_blocking=True)",
               lambda: lambda: pageable16.to(dev, non_blocking=True)),
        HostOp("h2d_index", "pinned int64[16] .to(dev, non_blocking=True)", lambda: _pinned_h2d_call(dev)),
        HostOp("d2h", ".cpu() of int64[64]", lambda: lambda: ids64.cpu()),
        HostOp("d2h", ".item() of an int64", lambda: lambda: scalar.item()),
        HostOp("d2h", ".tolist() of int64[64]", lambda: lambda: ids64.tolist()),
        HostOp("where_nonzero", "torch.where(bool[8,64]) on device", lambda: lambda: torch.where(mask)),
    ]
    if dev.type == "cuda":
        ops.append(HostOp("synchronize", "torch.cuda.synchronize() idle", lambda: torch.cuda.synchronize))
    return ops


def host_grouping_ops():
    """Host-side grouping of a routing of n (token, expert) pairs over 64 experts."""
    ops = []
    gen = torch.Generator().manual_seed(0)
    for n in (8, 128, 512):
        ids = torch.randint(0, 64, (n,), generator=gen)
        lst = ids.tolist()
        ops += [
            HostOp("host_group", f"torch.bincount cpu n={n} E=64",
                   lambda ids=ids: lambda: torch.bincount(ids, minlength=64)),
            HostOp("host_group", f"torch.sort stable cpu n={n}",
                   lambda ids=ids: lambda: torch.sort(ids, stable=True)),
            HostOp("host_group", f"python dict n={n}", lambda lst=lst: lambda: _group_in_python(lst)),
        ]
    return ops


def host_ops(ctx):
    """Every op of the host section; failures to build inputs become error rows later."""
    return device_ops(ctx.dev, ctx.dtype) + sync_and_copy_ops(ctx.dev) + host_grouping_ops()


def time_block(ctx, fn, calls, busy_us):
    """Host us per call over `calls` back-to-back calls; with busy_us > 0 the device first gets a
    spin that long. Returns (us per call, device still busy at the end)."""
    ctx.sync()
    if busy_us:
        ctx.sleep_us(busy_us)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    still_busy = bool(busy_us) and not torch.cuda.current_stream().query()
    ctx.sync()
    return (t1 - t0) * 1e6 / calls, still_busy


def blocks_on_device(ctx, fn):
    """True when one call waits for a 3 ms device spin (twice in a row)."""
    waited = []
    for _ in range(2):
        ctx.sync()
        ctx.sleep_us(3000)
        t0 = time.perf_counter()
        fn()
        waited.append(time.perf_counter() - t0)
        ctx.sync()
    return min(waited) > 1.5e-3


def host_row(out, repeat, hop, calls, blocks, busy, us, **kw):
    """Writes one host_dispatch.csv row."""
    stats = {}
    if us:
        stats = {"host_us_per_call_median": statistics.median(us), "host_us_p10": pct(us, 10),
                 "host_us_p90": pct(us, 90)}
    out.row(repeat=repeat, op=hop.op, variant=hop.variant, calls=calls, blocks=blocks if us else 0,
            device_busy=busy, **stats, **kw)


def bench_host_op(ctx, out, repeat, hop, calls, blocks):
    """Idle and device-busy rows of one op (busy only where the op does not wait for the device)."""
    try:
        fn = hop.make()
        for _ in range(5 if ctx.cuda else 1):
            fn()
        ctx.sync()
        blocking = blocks_on_device(ctx, fn) if ctx.cuda else False
        idle = [time_block(ctx, fn, calls, 0)[0] for _ in range(blocks)]
        host_row(out, repeat, hop, calls, blocks, False, idle, blocks_on_device=blocking)
        if not ctx.cuda:
            host_row(out, repeat, hop, calls, blocks, True, [], note="skipped: no device (--cpu)")
        elif blocking:
            host_row(out, repeat, hop, calls, blocks, True, [], blocks_on_device=True,
                     note="skipped: the call waits for the device")
        else:
            spin_us = max(300.0, 3.0 * statistics.median(idle) * calls)
            busy = [time_block(ctx, fn, calls, spin_us) for _ in range(blocks)]
            host_row(out, repeat, hop, calls, blocks, True, [b[0] for b in busy], blocks_on_device=False,
                     busy_ok_fraction=sum(b[1] for b in busy) / len(busy))
        log(f"host r{repeat} {hop.op:18s} {hop.variant[:44]:44s} idle {statistics.median(idle):8.2f} us/call"
            f"{'  (waits for device)' if blocking else ''}")
    except Exception as e:  # noqa: BLE001
        err = one_line(e)
        host_row(out, repeat, hop, calls, blocks, False, [], error=err)
        log(f"host r{repeat} {hop.op} {hop.variant}: failed: {err}")
        check_sticky(ctx, err)
        try:
            ctx.sync()
        except Exception:  # noqa: BLE001
            pass


def run_host_section(ctx, out, repeat):
    """One repeat of the whole host section; returns its wall seconds."""
    t0 = time.time()
    calls, blocks = (64, 25) if ctx.cuda and not ctx.args.quick else (16, 5)
    if ctx.args.cpu:
        calls, blocks = 2, 2
    try:
        ops = host_ops(ctx)
    except Exception as e:  # noqa: BLE001
        log(f"host section: building inputs failed: {one_line(e)}")
        ctx.notes.setdefault("host_errors", []).append(one_line(e))
        return time.time() - t0
    for hop in ops:
        if ctx.cuda_broken:
            break
        bench_host_op(ctx, out, repeat, hop, calls, blocks)
    del ops
    return time.time() - t0


# ============================================================================ main

def parse_args(argv=None):
    """Command-line options."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--budget-s", type=float, default=150.0,
                    help="stop starting MoE configurations after this wall time (host repeats reserved)")
    ap.add_argument("--quick", action="store_true", help="GPU smoke run of every code path (< 15 s)")
    ap.add_argument("--cpu", action="store_true", help="plumbing check on CPU with tiny shapes")
    ap.add_argument("--n-configs", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--host-repeats", type=int, default=3)
    ap.add_argument("--impls", default=",".join(IMPL_ORDER), help="comma-separated subset of " + ",".join(IMPL_ORDER))
    ap.add_argument("--no-profile", action="store_true", help="skip the per-configuration profiler pass")
    ap.add_argument("--skip-host", action="store_true")
    ap.add_argument("--skip-moe", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    return ap.parse_args(argv)


def warm_up_device(ctx):
    """CUDA context, sleep calibration and the marker kernel, before anything is timed."""
    if not ctx.cuda:
        return
    torch.zeros(1, device=ctx.dev).add_(1)
    calibrate_sleep(ctx)
    if ctx.triton_ok:
        ctx.marker()
    torch.cuda.synchronize()


def print_final_table(path_moe):
    """Median per-invocation time per execution over the configurations that ran, and failures."""
    per = collections.defaultdict(list)
    errs = collections.Counter()
    with open(path_moe) as fh:
        for r in csv.DictReader(fh):
            if r["error"]:
                errs[r["impl"]] += 1
            elif r["median_us"]:
                per[r["impl"]].append(float(r["median_us"]))
    log("\n impl               configs   median of median_us   min      max     errors")
    for impl in IMPL_ORDER:
        xs = per.get(impl, [])
        if xs or errs[impl]:
            med = statistics.median(xs) if xs else float("nan")
            lo, hi = (min(xs), max(xs)) if xs else (float("nan"), float("nan"))
            log(f" {impl:18s} {len(xs):7d}   {med:12.1f}          {lo:8.1f} {hi:8.1f}   {errs[impl]:4d}")


def print_host_table(path_host):
    """Host us per call (idle device) of every op, one column per repeat, and busy-device medians."""
    table = collections.OrderedDict()
    with open(path_host) as fh:
        for r in csv.DictReader(fh):
            if r["host_us_per_call_median"]:
                key = (r["op"], r["variant"][:40])
                table.setdefault(key, {})[(r["repeat"], r["device_busy"])] = float(r["host_us_per_call_median"])
    log("\n op                 variant                                   idle us/call per repeat   busy (r0)")
    for (op, variant), vals in table.items():
        idle = "  ".join(f"{v:7.2f}" for (rep, busy), v in sorted(vals.items()) if busy == "False")
        busy = vals.get(("0", "True"))
        log(f" {op:18s} {variant:40s}  {idle:26s}  {'' if busy is None else f'{busy:7.2f}'}")


def main(argv=None):
    """Runs the host section, the MoE sweep and the remaining host repeats within the budget."""
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    ctx = Ctx(args)
    summary = {"script": "calibration/moe_host.py", "expected_wall_s_default": "100-150 (capped by --budget-s)",
               "args": vars(args), "facts": machine_facts(ctx.cuda),
               "triton_available": HAVE_TRITON, "triton_interpret": ctx.interpret,
               "grouped_mm_available": hasattr(torch, "_grouped_mm"),
               "grouped_triton_tiles": "vLLM get_default_config (bf16, no tuned file): tokens <= E -> "
                                       "BLOCK 16/32/64 group 1, else 64/64/32 group 8; 4 warps, 3 stages",
               "align_e_pad": ALIGN_E_PAD, "self_test_split": self_test_split()}
    summary["smi_before"] = nvidia_smi_snapshot() if ctx.cuda else None
    clocks = ClockSampler().start() if ctx.cuda else None
    warm_up_device(ctx)
    hout = CsvOut(os.path.join(args.out, "host_dispatch.csv"), HOST_FIELDS)
    host_s = []
    if not args.skip_host and args.host_repeats > 0:
        host_s.append(run_host_section(ctx, hout, 0))
    reserve_s = (args.host_repeats - 1) * (host_s[0] if host_s else 0.0) * 1.2 + 3.0
    configs = fixed_configs(args) or sample_configs(args.n_configs, args.seed)
    summary["configs"] = [dataclasses.asdict(c) for c in configs]
    t_sweep = time.time()
    if not args.skip_moe:
        run_moe_sweep(ctx, configs, args.budget_s - reserve_s, summary)
    summary["moe_sweep_s"] = time.time() - t_sweep
    for rep in range(1, args.host_repeats if not args.skip_host else 0):
        if ctx.elapsed_s() + 1.2 * (host_s[0] if host_s else 0.0) > args.budget_s:
            summary["host_repeats_truncated_by_budget"] = True
            break
        host_s.append(run_host_section(ctx, hout, rep))
    hout.close()
    summary.update({"host_section_s": host_s, "host_repeats_done": len(host_s),
                    "elapsed_s": ctx.elapsed_s(), "budget_s": args.budget_s, "notes": ctx.notes,
                    "cuda_broken": ctx.cuda_broken})
    summary["clocks"] = clocks.stop() if clocks else None
    summary["smi_after"] = nvidia_smi_snapshot() if ctx.cuda else None
    write_json(os.path.join(args.out, "moe_host_summary.json"), summary)
    if not args.skip_host:
        print_host_table(os.path.join(args.out, "host_dispatch.csv"))
    if not args.skip_moe:
        print_final_table(os.path.join(args.out, "moe.csv"))
    log(f"\ndone in {ctx.elapsed_s():.1f} s (budget {args.budget_s:.0f} s); "
        f"truncated_by_budget={summary.get('truncated_by_budget')}; outputs in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
