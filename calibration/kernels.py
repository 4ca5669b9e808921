#!/usr/bin/env python3
"""Kernel-class microbenchmarks of one GPU, for decodesim's kernel-level cost model.

Each row is one kernel class at one shape: a bf16 GEMM, an FP8 GEMM, a weight-only quantized
GEMV, an elementwise/reduction/gather kernel, a streaming read at a given number of programs,
an empty kernel at a given grid, or two kernels contending for HBM on two streams. The fit
that reads these CSVs models each kernel as start-up + bytes / achieved bandwidth (bandwidth
by bytes and by parallelism) + matrix time by M/N/K tiling. Whole decode steps are never
measured here.

Timing (the calibration method shared by these scripts): warm up, then capture R invocations of the
configuration in one CUDA graph (R so that one replay lasts ~1.5 ms), rotating through input
buffers whose total size is >= 2x L2 where the invocation count allows it, so each invocation
reads from HBM; time >= 7 replays with CUDA events behind a `torch.cuda._sleep` backlog;
per-invocation time = replay time / R (this includes the ~1 us gap between kernels of a graph
replay). Gathers and scatters draw fresh random row indices between replays (outside the
timed interval). If capture fails, the row falls back to back-to-back eager calls timed with events
(column `timing` says which). Each section first runs every configuration once eagerly
(warm-up, error check), then profiles one call of each with torch.profiler to record which
kernels ran (names, grids, blocks, registers, shared memory, durations), then times them.

Sections (``--only a,b``; default order, cheap and important first):
  launch      Triton empty / one-store kernels at grids {1,132,1320,13200} x blocks {128,1024}
  grid        Triton streaming read (each program one contiguous chunk), sizes 1..1024 MiB x
              programs 1..4224; Triton persistent strided read at 1x and 4x the SM count
  elementwise copy, add, mul, silu, silu*mul, casts, F.rms_norm, HF fp32 RMSNorm, softmax,
              sum, cat over 4 KB..1 GB; argmax and vocab softmax over logits rows;
              index_copy_, index_select, F.embedding, index_add_ of B rows in a 1 GB table
  gemm        bf16 F.linear(x[M,K], W[N,K]) for M 1..256 over 45 (N,K) projection/LM-head pairs
  gemm_fp8    torch._scaled_mm with e4m3 weights (GEMM alone), the activation quantization
              alone, and the whole plain-PyTorch FP8 linear
  gemm_wonly  int4 tinygemm (torch._weight_int4pack_mm, groups 32/64/128), int8 weight-only
              unfused (plain PyTorch), and Triton fused-dequant split-K GEMV for int8
              (per-channel) and int4 (asymmetric, group 128, 2 per byte)
  overlap     a bf16 GEMV and a decode SDPA alone and together on two streams (graphs), and
              two GEMVs together

Expected wall time of the default run on one H200: about 150 s (EXPECTED_SECONDS below, plus
~10 s start-up); ``--budget-s`` (default 170) stops starting new configurations in time, and
each section leaves room for the ones after it.

Output files (in --out):

kernels.csv: one row per timed configuration (all sections; columns a section does not use
are empty):
  config_id        unique id "<section>:<impl>:<shape>" (key into kernel_names.csv)
  section, impl    section name; the implementation (e.g. F.linear, torch._scaled_mm,
                   triton_splitk_int4_g128, copy_, hf_rmsnorm_fp32)
  kclass           kernel class for the cost model (gemm, gemv_wq, elementwise, reduction,
                   row_norm, gather, scatter, stream_read, launch, overlap, ...)
  dtype            data type of the main operand (bf16, fp32, fp8_e4m3, int8, int4)
  M, N, K          GEMM shape: x[M,K], W[N,K], y[M,N]
  M_padded         M actually passed to the kernel (if padding was needed; else = M)
  group_size       quantization group along K (0 = per output channel)
  elements         elements of the main tensor (elementwise sections)
  rows, row_width  row count and row width in elements (row-wise ops, gathers, scatters)
  size_bytes       the nominal size of the sweep axis (elementwise: bytes read + written,
                   except rms_norm rows = size/8 KiB; grid: bytes read)
  n_programs       launched programs (Triton sections)
  block_threads    threads per program (launch section)
  bytes_read       minimal bytes the operation must read (inputs once)
  bytes_written    minimal bytes the operation must write (outputs once)
  bytes_intermediate extra bytes the eager kernels move through HBM/L2 for intermediates
                   (written + read back; estimate from the op sequence; 0 for one kernel)
  flops            floating-point operations (2*M*N*K for GEMMs; 0 where not meaningful)
  reps             invocations per graph replay (R)
  replays          timed replays
  timing           graph | eager_backlog | cpu_host (meaningless numbers)
  median_us, p10_us, p90_us   per-invocation time over replays (replay time / R)
  achieved_GBps    (bytes_read + bytes_written) / median, decimal GB/s
  achieved_TFLOPs  flops / median
  rotation_bytes   bytes touched by distinct buffers within one replay (rotation pool)
  hbm_cold         True if rotation_bytes >= 2x L2 (inputs come from HBM), else False
  kernels          kernels (incl. memset/memcpy) one invocation launched (profiler)
  grid, block      grid and block of the longest kernel (profiler), "x*y*z"
  kernel_main      name of the longest kernel (truncated)
  kernels_sum_us   sum of the profiled kernel durations of one eager invocation
  rel_err          relative error against a float64 reference where checked
  alone_a_us, alone_b_us, together_us, sequential_us, finish_a_us, finish_b_us,
  bytes_a, bytes_b, reps_a, reps_b
                   overlap section only: makespan of stream a's graph alone, b's alone, both
                   launched together on two streams, both one after the other on one stream;
                   time from the common start to the end of a and of b when together;
                   bytes per invocation of a and b; invocations per graph (whole graphs, not
                   per invocation)
  note             free text
  error            exception type and message (one line) when the configuration failed

kernel_names.csv: config_id, section, kernel_index, kind (kernel|memcpy|memset), name, grid,
  block, registers, shared_memory_bytes, duration_us (one profiled eager invocation).

kernels_summary.json: machine facts (_common.machine_facts), arguments, expected and used
  seconds per section, budget, truncated_by_budget, rows/errors per section (first error
  messages), numerics checks, skipped configurations.

Usage on the device:   python3 calibration/kernels.py --out $OUT/kernels
GPU smoke test (<15 s): python3 calibration/kernels.py --quick --out /tmp/kq
CPU plumbing check:     TRITON_INTERPRET=1 python calibration/kernels.py --cpu --out /tmp/k
"""
from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from harness import (GB, Budget, CsvOut, Timer, capture_graph, log, machine_facts, nvidia_smi_snapshot, pct,  # noqa: E402
                     one_line, queued_replays_us, run_mode, write_json)
from sweep import coverage_order  # noqa: E402
from sweep import axis as sweep_axis  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

try:
    import triton
    from ops.gemv_wq import _splitk_reduce_kernel, _wq_splitk_kernel
    from ops.stream import _chunk_read_kernel, _launch_kernel, _strided_read_kernel
    HAVE_TRITON = True
except Exception:  # noqa: BLE001
    HAVE_TRITON = False

KiB, MiB, GiB = 1024, 1024 ** 2, 1024 ** 3

# Expected seconds per section on one H200 at the default (full) sweep, including Triton
# compiles and the profiler pass. Start-up (import, CUDA init, pool fill) adds ~10 s.
EXPECTED_SECONDS = {
    "launch": 5,
    "grid": 12,
    "elementwise": 25,
    "gemm": 38,
    "gemm_fp8": 20,
    "gemm_wonly": 30,
    "overlap": 8,
    "castred": 55,
    "kv_append": 12,
    "fp8_static": 18,
    "grouped_mm": 20,
    "bcast": 10,
    "fp8_narrow": 10,
}
DEFAULT_ORDER = ["launch", "grid", "elementwise", "gemm", "gemm_fp8", "gemm_wonly", "overlap"]
# issue 21's sections: run with --only (not part of the default run)
EXTRA_ORDER = ["castred", "kv_append", "fp8_static", "grouped_mm", "bcast", "fp8_narrow"]

REPLAY_TARGET_US = 1500.0      # one graph replay lasts about this long
MAX_GRAPH_NODES = 1200         # R * kernels per invocation stays below this
MAX_REPS = 600
ROTATION_TARGET_BYTES = 256 * MiB   # rotating input pools are at least this large
SLEEP_CYCLES = 400_000         # ~0.2 ms backlog before the timed replays

CSV_FIELDS = [
    "config_id", "section", "impl", "kclass", "dtype", "M", "N", "K", "M_padded", "group_size",
    "elements", "rows", "row_width", "size_bytes", "n_programs", "block_threads",
    "bytes_read", "bytes_written", "bytes_intermediate", "flops", "reps", "replays", "timing",
    "median_us", "p10_us", "p90_us", "achieved_GBps", "achieved_TFLOPs", "rotation_bytes",
    "hbm_cold", "kernels", "grid", "block", "kernel_main", "kernels_sum_us", "rel_err",
    "alone_a_us", "alone_b_us", "together_us", "sequential_us", "finish_a_us", "finish_b_us",
    "bytes_a", "bytes_b", "reps_a", "reps_b", "note", "error",
]
NAME_FIELDS = ["config_id", "section", "kernel_index", "kind", "name", "grid", "block",
               "registers", "shared_memory_bytes", "duration_us"]


# ============================================================================ infrastructure

@dataclass
class Config:
    """One measured configuration.

    build() returns fn(i) (one invocation, rotating its buffers by i) and may raise.
    meta holds the CSV fields known before timing (shape, bytes, flops, note...).
    n_slots and bytes_per_slot describe the rotation (for rotation_bytes / hbm_cold).
    between(), if set, runs between timed replays (outside the timed interval), e.g. to draw
    fresh random row indices so that indexed rows are not L2-resident from the last replay.
    """

    cid: str
    section: str
    meta: dict
    build: Callable[[], Callable[[int], object]]
    est_us: float = 10.0
    n_slots: int = 1
    bytes_per_slot: int = 0
    between: Callable | None = None
    fn: Callable | None = None
    error: str = ""


@dataclass
class SectionStats:
    """Bookkeeping of one section for the summary."""

    expected_s: float
    used_s: float = 0.0
    configs: int = 0
    rows: int = 0
    errors: int = 0
    skipped_unsupported: int = 0
    skipped_budget: int = 0
    not_started: bool = False
    first_errors: list = field(default_factory=list)


def cdiv(a: int, b: int) -> int:
    """Ceiling division of positive integers."""
    return -(-a // b)


class Bench:
    """Holds device, pools, budget and output writers; runs sections of Configs."""

    def __init__(self, args):
        self.args = args
        self.cuda = not args.cpu
        self.mode = run_mode(args)
        self.dev = torch.device("cuda" if self.cuda else "cpu")
        self.budget = Budget(args.budget_s)
        self.deadline = self.budget.deadline
        self.truncated = False
        props = torch.cuda.get_device_properties(0) if self.cuda else None
        self.nsm = props.multi_processor_count if self.cuda else 4
        self.l2_bytes = (getattr(props, "L2_cache_size", 60 * MiB) or 60 * MiB) if self.cuda else 1 * MiB
        self.triton_ok = HAVE_TRITON and (self.cuda or os.environ.get("TRITON_INTERPRET") == "1")
        self.interpret = os.environ.get("TRITON_INTERPRET") == "1"
        self.csv = CsvOut(os.path.join(args.out, "kernels.csv"), CSV_FIELDS)
        self.names = CsvOut(os.path.join(args.out, "kernel_names.csv"), NAME_FIELDS)
        self.stats: dict[str, SectionStats] = {}
        self.checks: dict = {}
        self.notes: dict = {}
        self.skipped: list = []
        self.pool_bytes = {"full": 3 * GiB, "quick": 512 * MiB, "cpu": 32 * MiB}[self.mode]
        self.rot_target = ROTATION_TARGET_BYTES if self.cuda else 2 * MiB
        self._pool = None
        self.reps_cap = MAX_REPS if self.cuda else 2
        self.replays = {"full": 7, "quick": 3, "cpu": 2}[self.mode]

    # ------------------------------------------------------------------ basics
    def axis(self, section: str, name: str):
        """One axis of a section's sweep at this run's mode (calibration/sweeps/kernels.yaml)."""
        return sweep_axis("kernels", section, name, self.mode)

    def elapsed_s(self) -> float:
        """Seconds since start."""
        return self.budget.elapsed_s()

    def sync(self):
        """Wait for the device (no-op on CPU)."""
        if self.cuda:
            torch.cuda.synchronize()

    def pool(self) -> torch.Tensor:
        """A flat uint8 buffer filled with bf16 N(0,1) values; views of it feed every section."""
        if self._pool is None:
            n = self.pool_bytes // 2
            self._pool = torch.empty(n, dtype=torch.bfloat16, device=self.dev).normal_().view(torch.uint8)
            self.sync()
        return self._pool

    def carve(self, specs, n_slots: int):
        """n_slots sets of tensors (one per spec = (shape, dtype)) carved from the pool.

        Views are 256-byte aligned and laid out one after the other; raises if they do not fit.
        """
        pool = self.pool()
        off = 0
        slots = []
        for _ in range(n_slots):
            views = []
            for shape, dtype in specs:
                nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
                if off + nbytes > pool.numel():
                    raise MemoryError(f"rotation pool of {pool.numel()} bytes too small")
                views.append(pool[off:off + nbytes].view(dtype).view(shape))
                off += cdiv(nbytes, 256) * 256
            slots.append(views)
        return slots

    def slots_for(self, bytes_per_slot: int, cap: int = 1024) -> int:
        """Number of rotating buffer sets so that they total >= the rotation target."""
        fit = max(1, int(self.pool_bytes * 0.95) // max(1, bytes_per_slot))
        return max(1, min(cap, fit, cdiv(self.rot_target, max(1, bytes_per_slot))))

    # ------------------------------------------------------------------ budget
    def section_deadline(self, name: str, order: list) -> float:
        """Wall-clock time after which this section starts no configuration.

        The global deadline minus 70% of the expected time of the sections after it.
        """
        later = order[order.index(name) + 1:]
        reserve = 0.7 * sum(EXPECTED_SECONDS.get(s, 0) for s in later) if self.mode == "full" else 0.0
        return self.deadline - reserve

    # ------------------------------------------------------------------ timing
    def choose_reps(self, cfg: Config, n_kernels: int, prof_us: float) -> int:
        """Invocations per graph replay: ~REPLAY_TARGET_US per replay, bounded by graph size,
        and raised (within bounds) so the rotation exceeds 2x L2 where possible."""
        if not self.cuda:
            return self.reps_cap
        est = max(cfg.est_us, prof_us, 1.5 * max(1, n_kernels))
        reps = int(REPLAY_TARGET_US / est)
        node_cap = max(1, MAX_GRAPH_NODES // max(1, n_kernels))
        cap = min(self.reps_cap, node_cap)
        if cfg.bytes_per_slot and cfg.n_slots > 1:
            want = cdiv(2 * self.l2_bytes, cfg.bytes_per_slot)
            if est * want < 8 * REPLAY_TARGET_US:
                reps = max(reps, min(want, cfg.n_slots))
        return max(1, min(reps, cap))

    def time_graph(self, fn, reps: int, between=None) -> list:
        """Per-invocation microseconds, one value per replay of a graph of `reps` invocations
        (the replays queued behind one backlog; one untimed replay first)."""
        g, _ = capture_graph(fn, reps, warmup_calls=2)
        g.replay()
        torch.cuda.synchronize()
        us = [t / reps for t in queued_replays_us(g, self.replays, SLEEP_CYCLES, between)]
        del g
        return us

    def time_eager(self, fn, reps: int) -> list:
        """Fallback: back-to-back eager calls, each between CUDA events (queue backlogged)."""
        return Timer(True, batch=min(48, reps)).time(fn, max(reps, 10), warmup=2)

    def time_cpu(self, fn, reps: int, between=None) -> list:
        """CPU plumbing: host time per call (meaningless as a measurement)."""
        out = []
        for _ in range(self.replays):
            t0 = time.perf_counter()
            for i in range(reps):
                fn(i)
            out.append((time.perf_counter() - t0) * 1e6 / reps)
            if between is not None:
                between()
        return out

    def measure(self, cfg: Config, reps: int):
        """Times one built configuration; returns (per-call us list, timing method, note)."""
        if not self.cuda:
            return self.time_cpu(cfg.fn, reps, cfg.between), "cpu_host", ""
        try:
            return self.time_graph(cfg.fn, reps, cfg.between), "graph", ""
        except Exception as e:  # noqa: BLE001
            note = f"graph failed ({one_line(e)}); eager fallback"
            torch.cuda.synchronize()
            return self.time_eager(cfg.fn, reps), "eager_backlog", note

    # ------------------------------------------------------------------ profiler
    def profile(self, cfgs: list) -> dict:
        """One profiled eager call per configuration; returns cid -> list of kernel dicts."""
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        with profile(activities=acts) as prof:
            for c in cfgs:
                with record_function(f"cfg:{c.cid}"):
                    try:
                        c.fn(1)
                        self.sync()
                    except Exception:  # noqa: BLE001
                        pass
        with tempfile.TemporaryDirectory() as td:
            path = os.path.join(td, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as fh:
                trace = json.load(fh)
        return kernels_by_config(trace.get("traceEvents", []), self.cuda)

    # ------------------------------------------------------------------ running
    def run_section(self, name: str, make_configs: Callable, order: list):
        """Builds, warms, profiles and times every configuration of one section."""
        st = self.stats.setdefault(name, SectionStats(EXPECTED_SECONDS.get(name, 0)))
        t0 = time.time()
        deadline = self.section_deadline(name, order)
        log(f"== section {name} (expected {EXPECTED_SECONDS.get(name, 0)} s, "
            f"deadline in {deadline - time.time():.0f} s)")
        try:
            cfgs = make_configs()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            self.record_error(st, f"{name}:setup", one_line(e))
            self.csv.row(config_id=f"{name}:setup", section=name, error=one_line(e))
            cfgs = []
        cfgs = unique_configs(cfgs)
        st.configs = len(cfgs)
        ready = self.warm_all(cfgs, deadline, st)
        kinfo = self.profile_all(name, ready, deadline)
        for c in cfgs:
            if c.fn is None and c.error:
                continue
            if c.fn is None or time.time() > deadline:
                st.skipped_budget += 1
                self.truncated = True
                self.skipped.append(c.cid)
                continue
            self.time_and_write(c, kinfo.get(c.cid, []), st)
            c.fn = None
        del cfgs, ready
        if self.cuda:
            torch.cuda.empty_cache()
        st.used_s = time.time() - t0
        log(f"== section {name}: {st.rows} rows, {st.errors} errors, {st.skipped_unsupported} "
            f"unsupported, {st.skipped_budget} skipped by budget, {st.used_s:.1f} s (expected {st.expected_s} s); total {self.elapsed_s():.1f} s")

    def warm_all(self, cfgs: list, deadline: float, st: SectionStats) -> list:
        """Builds each configuration and runs it once; failures become error rows."""
        ready = []
        for c in cfgs:
            if time.time() > deadline:
                break
            try:
                c.fn = c.build()
                c.fn(0)
                self.sync()
                ready.append(c)
            except Exception as e:  # noqa: BLE001
                c.fn = None
                self.write_error(c, e, st)
        return ready

    def profile_all(self, name: str, ready: list, deadline: float) -> dict:
        """Profiler pass over the warmed configurations; writes kernel_names.csv rows."""
        if not ready or time.time() > deadline - 2:
            return {}
        try:
            t0 = time.time()
            kinfo = self.profile(ready)
            for c in ready:
                for j, k in enumerate(kinfo.get(c.cid, [])):
                    self.names.row(config_id=c.cid, section=name, kernel_index=j, **k)
            log(f"   profiled {len(ready)} configurations in {time.time() - t0:.1f} s")
            return kinfo
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            self.notes[f"{name}_profiler_error"] = one_line(e)
            return {}

    def time_and_write(self, c: Config, kernels: list, st: SectionStats):
        """Times one configuration and writes its kernels.csv row."""
        n_k = len(kernels)
        prof_us = sum(k["duration_us"] for k in kernels) if self.cuda else 0.0
        meta = dict(c.meta)
        try:
            reps = self.choose_reps(c, n_k, prof_us)
            us, timing, note = self.measure(c, reps)
            self.sync()
        except Exception as e:  # noqa: BLE001
            self.write_error(c, e, st)
            return
        med = statistics.median(us)
        moved = (meta.get("bytes_read") or 0) + (meta.get("bytes_written") or 0)
        flops = meta.get("flops") or 0
        rot = min(reps, c.n_slots) * c.bytes_per_slot
        main = max(kernels, key=lambda k: k["duration_us"]) if kernels else {}
        meta["note"] = "; ".join(x for x in (meta.get("note", ""), note) if x)
        self.csv.row(config_id=c.cid, section=c.section, reps=reps, replays=len(us), timing=timing,
                     median_us=med, p10_us=pct(us, 10), p90_us=pct(us, 90),
                     achieved_GBps=moved / (med * 1e-6) / GB if moved else "",
                     achieved_TFLOPs=flops / (med * 1e-6) / 1e12 if flops else "",
                     rotation_bytes=rot, hbm_cold=rot >= 2 * self.l2_bytes,
                     kernels=n_k if kernels else "", grid=main.get("grid", ""),
                     block=main.get("block", ""), kernel_main=main.get("name", "")[:120],
                     kernels_sum_us=prof_us if kernels else "", **meta)
        st.rows += 1
        gbps = moved / (med * 1e-6) / GB if moved else 0.0
        log(f"   {c.cid:58s} {med:10.2f} us  {gbps:8.1f} GB/s  R={reps:4d} k={n_k} {timing}")

    def write_error(self, c: Config, e: BaseException, st: SectionStats):
        """Error row for a failed configuration; the sweep continues."""
        msg = one_line(e)
        c.error = msg
        self.csv.row(config_id=c.cid, section=c.section, error=msg, **c.meta)
        self.record_error(st, c.cid, msg)
        log(f"   !! {c.cid}: {msg}")
        if self.cuda:
            try:
                torch.cuda.synchronize()
            except Exception as e2:  # noqa: BLE001
                log(f"   !! device error after {c.cid}: {one_line(e2)}")

    def record_error(self, st: SectionStats, cid: str, msg: str):
        """Counts an error (or a clear skip) and keeps the first few messages for the summary."""
        if "skipped:" in msg:
            st.skipped_unsupported += 1
        else:
            st.errors += 1
        if len(st.first_errors) < 8:
            st.first_errors.append(f"{cid}: {msg}")


def unique_configs(cfgs: list) -> list:
    """Drops configurations whose id repeats an earlier one (e.g. row ops at the two
    smallest sizes both have one row)."""
    seen, out = set(), []
    for c in cfgs:
        if c.cid not in seen:
            seen.add(c.cid)
            out.append(c)
    return out


def kernels_by_config(events: list, cuda: bool) -> dict:
    """Maps chrome-trace device events to the `cfg:<id>` ranges whose launch they came from.

    On CUDA a kernel is matched through its correlation id to the runtime/driver launch
    call, whose CPU timestamp lies inside one range; kernels without a matched launch are
    placed by their own timestamp. On CPU (plumbing) the aten ops inside a range stand in.
    """
    ranges = sorted((e["ts"], e["ts"] + e.get("dur", 0), e["name"][4:]) for e in events
                    if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                    and str(e.get("name", "")).startswith("cfg:"))
    starts = [r[0] for r in ranges]

    def find(ts):
        i = bisect.bisect_right(starts, ts) - 1
        if i >= 0 and ts <= ranges[i][1]:
            return ranges[i][2]
        return None

    kinds = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
    if not cuda:
        kinds = {"cpu_op": "cpu_op"}
    launch_ts = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launch_ts[e["args"]["correlation"]] = e["ts"]
    out: dict = {}
    for e in sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in kinds),
                    key=lambda e: e["ts"]):
        a = e.get("args", {})
        ts = launch_ts.get(a.get("correlation"), e["ts"])
        cid = find(ts)
        if cid is None:
            continue
        out.setdefault(cid, []).append({
            "kind": kinds[e["cat"]], "name": e.get("name", ""),
            "grid": "*".join(str(v) for v in a.get("grid", [])),
            "block": "*".join(str(v) for v in a.get("block", [])),
            "registers": a.get("registers per thread", ""),
            "shared_memory_bytes": a.get("shared memory", ""),
            "duration_us": float(e.get("dur", 0.0)),
        })
    return out


def skip_config(section: str, cid: str, meta: dict, why: str) -> Config:
    """A configuration that fails at build with a clear reason (e.g. needs CUDA)."""
    return Config(cid, section, meta, _raiser(f"skipped: {why}"))


def dtype_name(dt) -> str:
    """Short dtype label for the CSV."""
    return {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16",
            torch.int8: "int8", torch.uint8: "uint8"}.get(dt, str(dt).replace("torch.", ""))


def esize(dt) -> int:
    """Bytes per element of a dtype."""
    return torch.empty((), dtype=dt).element_size()


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


# ============================================================================ section: elementwise

def _round_to(n: int, m: int) -> int:
    """n rounded down to a multiple of m (at least m)."""
    return max(m, (n // m) * m)


def ew_simple_specs():
    """(impl, kclass, in dtypes, out dtype, eager kernels, intermediate bytes/elem, op).

    op(ins, out) runs one invocation on a rotation slot.
    """
    bf, f32 = torch.bfloat16, torch.float32
    return [
        ("copy_", "elementwise", [bf], bf, 0, lambda x, y: y.copy_(x[0])),
        ("add", "elementwise", [bf, bf], bf, 0, lambda x, y: torch.add(x[0], x[1], out=y)),
        ("mul", "elementwise", [bf, bf], bf, 0, lambda x, y: torch.mul(x[0], x[1], out=y)),
        ("silu", "elementwise", [bf], bf, 0, lambda x, y: torch.ops.aten.silu.out(x[0], out=y)),
        ("silu_mul", "elementwise", [bf, bf], bf, 4, lambda x, y: torch.mul(F.silu(x[0]), x[1], out=y)),
        ("cast_bf16_fp32", "elementwise", [bf], f32, 0, lambda x, y: y.copy_(x[0])),
        ("cast_fp32_bf16", "elementwise", [f32], bf, 0, lambda x, y: y.copy_(x[0])),
        ("sum", "reduction", [bf], None, 0, lambda x, y: x[0].sum()),
        ("cat2", "concat", [bf, bf], "cat", 0, lambda x, y: torch.cat([x[0], x[1]], out=y)),
    ]


def elementwise_configs(b: Bench) -> list:
    """All elementwise-section configurations."""
    cfgs = []
    for size in coverage_order(b.axis("elementwise", "sizes_bytes")):
        for spec in ew_simple_specs():
            cfgs.append(_ew_simple_cfg(b, size, *spec))
        cfgs += _row_op_cfgs(b, size)
    cfgs += _logit_cfgs(b)
    cfgs += _index_cfgs(b)
    return cfgs


def _ew_simple_cfg(b: Bench, size, impl, kclass, in_dts, out_dt, inter_per_elem, op) -> Config:
    """A 1-D elementwise/reduction/concat op whose bytes read + written total `size`."""
    per_elem = sum(esize(d) for d in in_dts)
    if out_dt == "cat":
        per_elem *= 2
    elif out_dt is not None:
        per_elem += esize(out_dt)
    n = _round_to(size // per_elem, 256)
    in_bytes = n * sum(esize(d) for d in in_dts)
    if out_dt == "cat":
        out_spec, out_bytes = ((2 * n,), in_dts[0]), in_bytes
    elif out_dt is None:
        out_spec, out_bytes = None, 4
    else:
        out_spec, out_bytes = ((n,), out_dt), n * esize(out_dt)
    specs = [((n,), d) for d in in_dts] + ([out_spec] if out_spec else [])
    per_slot = in_bytes + (out_bytes if out_spec else 0)
    n_slots = b.slots_for(per_slot)
    note = "eager: silu then mul (2 kernels)" if impl == "silu_mul" else ""
    moves_only = impl.startswith(("copy", "cast", "cat"))
    meta = dict(impl=impl, kclass=kclass, dtype=dtype_name(in_dts[0]), elements=n, size_bytes=size,
                bytes_read=in_bytes, bytes_written=out_bytes, bytes_intermediate=inter_per_elem * n,
                flops=0 if moves_only else n, note=note)

    def build():
        slots = b.carve(specs, n_slots)
        k = len(in_dts)
        return lambda i: op(slots[i % n_slots][:k], slots[i % n_slots][k] if out_spec else None)
    return Config(f"elementwise:{impl}:n{n}", "elementwise", meta, build,
                  est_us=3.0 + per_slot / 2.5e12 * 1e6, n_slots=n_slots, bytes_per_slot=per_slot)


def hf_rmsnorm(x, w, eps=1e-6):
    """RMSNorm as Hugging Face's LlamaRMSNorm writes it (fp32 statistics, bf16 output)."""
    h = x.float()
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(x.dtype)


def _row_op_cfgs(b: Bench, size) -> list:
    """F.rms_norm, HF RMSNorm and softmax over bf16 rows of width 4096 (rows = size / 8 KiB)."""
    W = b.axis("elementwise", "row_width")
    rows = max(1, size // (2 * W))
    n = rows * W
    nb = 2 * n
    w = torch.ones(W, dtype=torch.bfloat16, device=b.dev)
    n_slots = b.slots_for(2 * nb)
    specs = [((rows, W), torch.bfloat16), ((rows, W), torch.bfloat16)]
    items = [
        ("F.rms_norm", "row_norm", 0, "", lambda x, y: F.rms_norm(x, (W,), weight=w, eps=1e-6)),
        ("hf_rmsnorm_fp32", "row_norm", 32 * n,
         "x.float(); pow(2).mean(-1); +eps; rsqrt; mul; .to(bf16); *w (eager group); "
         "bytes_intermediate ~ 32 B/elem estimate", lambda x, y: hf_rmsnorm(x, w)),
        ("softmax", "row_softmax", 0, "", lambda x, y: torch.ops.aten._softmax.out(x, -1, False, out=y)),
    ]
    cfgs = []
    for impl, kclass, inter, note, op in items:
        meta = dict(impl=impl, kclass=kclass, dtype="bf16", elements=n, rows=rows, row_width=W,
                    size_bytes=size, bytes_read=nb + (2 * W if "rms" in impl else 0), bytes_written=nb,
                    bytes_intermediate=inter, flops=4 * n, note=note)

        def build(op=op):
            slots = b.carve(specs, n_slots)
            return lambda i: op(slots[i % n_slots][0], slots[i % n_slots][1])
        cfgs.append(Config(f"elementwise:{impl}:rows{rows}_w{W}", "elementwise", meta, build,
                           est_us=3.0 + 2 * nb / 2.5e12 * 1e6, n_slots=n_slots, bytes_per_slot=2 * nb))
    return cfgs


def _logit_cfgs(b: Bench) -> list:
    """argmax (bf16 and fp32 logits) and fp32 softmax over vocab-width rows."""
    widths = b.axis("elementwise", "logit_widths")
    row_counts = b.axis("elementwise", "logit_rows")
    cfgs = []
    for W in widths:
        for rows in row_counts:
            for impl, dt in (("argmax", torch.bfloat16), ("argmax", torch.float32),
                             ("softmax_vocab", torch.float32)):
                nb = rows * W * esize(dt)
                out_b = rows * 8 if impl == "argmax" else nb
                n_slots = b.slots_for(nb)
                meta = dict(impl=impl, kclass="row_reduce" if impl == "argmax" else "row_softmax",
                            dtype=dtype_name(dt), elements=rows * W, rows=rows, row_width=W,
                            bytes_read=nb, bytes_written=out_b, flops=rows * W)

                def build(rows=rows, W=W, dt=dt, impl=impl, n_slots=n_slots):
                    xs = [s[0] for s in b.carve([((rows, W), dt)], n_slots)]
                    if impl == "argmax":
                        return lambda i: torch.argmax(xs[i % n_slots], dim=-1)
                    return lambda i: torch.softmax(xs[i % n_slots], dim=-1)
                cfgs.append(Config(f"elementwise:{impl}:{dtype_name(dt)}_rows{rows}_w{W}", "elementwise",
                                   meta, build, est_us=4.0 + (nb + out_b) / 2e12 * 1e6,
                                   n_slots=n_slots, bytes_per_slot=nb))
    return cfgs


def _index_cfgs(b: Bench) -> list:
    """index_copy_ / index_add_ of B rows into a 1 GB table; index_select / embedding gathers."""
    table_bytes = b.axis("elementwise", "index_table_bytes")
    Bs = b.axis("elementwise", "index_batches")
    cfgs = []
    scatter_row_bytes = b.axis("elementwise", "scatter_row_bytes")
    gather_widths = b.axis("elementwise", "gather_widths")
    for B in Bs:
        for rb in scatter_row_bytes:
            for impl in ("index_copy_", "index_add_"):
                cfgs.append(_index_cfg(b, impl, B, rb // 2, table_bytes))
        for W in gather_widths:
            for impl in ("index_select", "F.embedding"):
                cfgs.append(_index_cfg(b, impl, B, W, table_bytes))
    return cfgs


def _index_cfg(b: Bench, impl, B, W, table_bytes) -> Config:
    """One indexed-row op: B rows of W bf16 elements against a table of table_bytes.

    Each of the up to MAX_REPS invocations of a replay has its own B random row indices, and
    between replays all indices are drawn again, so the touched rows are not L2-resident.
    """
    row_b = 2 * W
    n_rows = table_bytes // row_b
    rows_b = B * row_b
    idx_b = B * 8
    if impl in ("index_copy_", "index_add_"):
        kclass = "scatter"
        rd = rows_b + idx_b + (rows_b if impl == "index_add_" else 0)
        wr = rows_b
    else:
        kclass = "gather"
        rd, wr = rows_b + idx_b, rows_b
    meta = dict(impl=impl, kclass=kclass, dtype="bf16", rows=B, row_width=W, elements=B * W,
                size_bytes=table_bytes, bytes_read=rd, bytes_written=wr, flops=0,
                note=f"table {n_rows} rows x {W} bf16; fresh random row indices per invocation")
    n_sets = MAX_REPS if b.cuda else 4
    idx_all = torch.zeros(n_sets, B, dtype=torch.int64, device=b.dev)

    def refresh():
        idx_all.random_(0, n_rows)

    def build():
        table = b.carve([((n_rows, W), torch.bfloat16)], 1)[0][0]
        refresh()
        idx = list(idx_all.unbind(0))
        src = [torch.randn(B, W, device=b.dev, dtype=torch.bfloat16) for _ in range(4)]
        out = torch.empty(B, W, device=b.dev, dtype=torch.bfloat16)
        if impl == "index_copy_":
            return lambda i: table.index_copy_(0, idx[i % n_sets], src[i % 4])
        if impl == "index_add_":
            return lambda i: table.index_add_(0, idx[i % n_sets], src[i % 4])
        if impl == "index_select":
            return lambda i: torch.index_select(table, 0, idx[i % n_sets], out=out)
        return lambda i: F.embedding(idx[i % n_sets], table)
    return Config(f"elementwise:{impl}:B{B}_w{W}", "elementwise", meta, build, est_us=4.0,
                  n_slots=1, bytes_per_slot=table_bytes, between=refresh)


# ============================================================================ section: gemm

def gemm_configs(b: Bench) -> list:
    """bf16 F.linear(x[M,K], W[N,K]) over (N,K) pairs and M; W rotates through the pool."""
    Ms = b.axis("gemm", "M")
    lm_heads = b.axis("gemm", "lm_head_NK")
    NKs = b.axis("gemm", "projection_NK") + lm_heads
    gemm_check(b)
    cfgs = []
    for M in coverage_order(Ms):
        for (N, K) in NKs:
            wbytes = N * K * 2
            n_slots = b.slots_for(wbytes, cap=256)
            meta = dict(impl="F.linear", kclass="gemm", dtype="bf16", M=M, N=N, K=K, M_padded=M,
                        bytes_read=wbytes + M * K * 2, bytes_written=M * N * 2, flops=2 * M * N * K,
                        note="lm_head" if (N, K) in lm_heads else "")

            def build(M=M, N=N, K=K, n_slots=n_slots):
                Ws = [s[0] for s in b.carve([((N, K), torch.bfloat16)], n_slots)]
                x = torch.randn(M, K, device=b.dev, dtype=torch.bfloat16)
                return lambda i: F.linear(x, Ws[i % n_slots])
            est = 4.0 + max(wbytes / 3.0e12, 2 * M * N * K / 500e12) * 1e6
            cfgs.append(Config(f"gemm:F.linear:M{M}_N{N}_K{K}", "gemm", meta, build, est_us=est,
                               n_slots=n_slots, bytes_per_slot=wbytes))
    return cfgs


def gemm_check(b: Bench):
    """Relative error of bf16 F.linear against float64 (summary check)."""
    try:
        x = torch.randn(16, 512, device=b.dev, dtype=torch.bfloat16)
        w = torch.randn(384, 512, device=b.dev, dtype=torch.bfloat16)
        ref = x.double() @ w.double().T
        b.checks["gemm_bf16_rel_err"] = float((F.linear(x, w).double() - ref).norm() / ref.norm())
    except Exception as e:  # noqa: BLE001
        b.checks["gemm_bf16_rel_err"] = f"failed: {one_line(e)}"


# ============================================================================ section: gemm_fp8

FP8_MAX = 448.0


def fp8_quantize(x):
    """Per-tensor dynamic e4m3 quantization as plain PyTorch writes it; returns (xq, scale)."""
    scale = (x.abs().amax().float() / FP8_MAX).clamp(min=1e-12)
    return (x / scale).to(torch.float8_e4m3fn), scale


def fp8_linear(x, w8t, w_scale):
    """Plain-PyTorch FP8 linear: quantize x, torch._scaled_mm with the e4m3 weight, bf16 out."""
    xq, xs = fp8_quantize(x)
    return torch._scaled_mm(xq, w8t, scale_a=xs, scale_b=w_scale, out_dtype=torch.bfloat16)


def fp8_weight_pool(b: Bench, N, K, n_slots):
    """n_slots e4m3 weight copies [N,K] (values from the bf16 pool, scaled to about +-4)."""
    src = b.carve([((N, K), torch.bfloat16)], n_slots)
    return [(s[0] * 2.0).to(torch.float8_e4m3fn) for s in src]


def gemm_fp8_configs(b: Bench) -> list:
    """FP8 GEMM alone, activation quantization alone, and the whole FP8 linear."""
    Ms, NKs = b.axis("gemm_fp8", "M"), b.axis("gemm_fp8", "NK")
    fp8_check(b)
    cfgs = []
    pools: dict = {}
    for M in coverage_order(Ms):
        for (N, K) in NKs:
            n_slots = b.slots_for(N * K, cap=256)
            for impl in ("torch._scaled_mm", "fp8_linear"):
                cfgs.append(_fp8_cfg(b, impl, M, N, K, n_slots, pools))
        for K in sorted({k for _, k in NKs}):
            cfgs.append(_fp8_quant_cfg(b, M, K))
    return cfgs


def _fp8_cfg(b: Bench, impl, M, N, K, n_slots, pools) -> Config:
    """_scaled_mm alone (pre-quantized x) or the whole FP8 linear, at one shape."""
    wbytes = N * K
    meta = dict(impl=impl, kclass="gemm_fp8", dtype="fp8_e4m3", M=M, N=N, K=K, M_padded=M,
                bytes_read=wbytes + M * K * (1 if impl == "torch._scaled_mm" else 2) + 8,
                bytes_written=M * N * 2, flops=2 * M * N * K,
                bytes_intermediate=0 if impl == "torch._scaled_mm" else 7 * M * K,
                note="per-tensor fp32 scales; W passed as W8.t() (column-major)")
    if impl == "fp8_linear":
        meta["note"] += "; quantize (abs, amax, /448, clamp, div, cast) + _scaled_mm"

    def build():
        if (N, K) not in pools:
            pools[(N, K)] = fp8_weight_pool(b, N, K, n_slots)
        Ws = pools[(N, K)]
        ws = torch.tensor(0.5, device=b.dev)
        x = torch.randn(M, K, device=b.dev, dtype=torch.bfloat16)
        mp = _fp8_m_padded(b, x, Ws[0], ws)
        if mp != M:
            meta["M_padded"] = mp
            meta["note"] += f"; M padded {M}->{mp} (_scaled_mm rejected M={M})"
            x = torch.cat([x, x.new_zeros(mp - M, K)])
        if impl == "torch._scaled_mm":
            xq, xs = fp8_quantize(x)
            return lambda i: torch._scaled_mm(xq, Ws[i % n_slots].t(), scale_a=xs, scale_b=ws,
                                              out_dtype=torch.bfloat16)
        return lambda i: fp8_linear(x, Ws[i % n_slots].t(), ws)
    est = 5.0 + max(wbytes / 3.0e12, 2 * M * N * K / 1000e12) * 1e6
    return Config(f"gemm_fp8:{impl}:M{M}_N{N}_K{K}", "gemm_fp8", meta, build, est_us=est,
                  n_slots=n_slots, bytes_per_slot=wbytes)


def _fp8_m_padded(b: Bench, x, w8, ws) -> int:
    """M as given if _scaled_mm accepts it, else M rounded up to 16 (raises if that fails too)."""
    M, K = x.shape
    try:
        xq, xs = fp8_quantize(x)
        torch._scaled_mm(xq, w8.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)
        b.sync()
        return M
    except Exception:  # noqa: BLE001
        mp = cdiv(M, 16) * 16
        if mp == M:
            raise
        xp = torch.cat([x, x.new_zeros(mp - M, K)])
        xq, xs = fp8_quantize(xp)
        torch._scaled_mm(xq, w8.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)
        b.sync()
        return mp


def _fp8_quant_cfg(b: Bench, M, K) -> Config:
    """The activation quantization kernels alone (abs, amax, scale, divide, cast)."""
    meta = dict(impl="fp8_quantize", kclass="quantize", dtype="bf16", M=M, K=K, elements=M * K,
                bytes_read=2 * M * K, bytes_written=M * K + 4, bytes_intermediate=7 * M * K,
                flops=3 * M * K, note="x.abs().amax() -> scale -> (x/scale).to(e4m3) (eager group)")

    def build():
        xs = [torch.randn(M, K, device=b.dev, dtype=torch.bfloat16) for _ in range(4)]
        return lambda i: fp8_quantize(xs[i % 4])
    return Config(f"gemm_fp8:fp8_quantize:M{M}_K{K}", "gemm_fp8", meta, build, est_us=15.0)


def fp8_check(b: Bench):
    """Relative error of the FP8 linear against float64 of the dequantized operands."""
    try:
        x = torch.randn(16, 512, device=b.dev, dtype=torch.bfloat16)
        w8 = (torch.randn(256, 512, device=b.dev) * 2).to(torch.float8_e4m3fn)
        ws = torch.tensor(0.5, device=b.dev)
        y = fp8_linear(x, w8.t(), ws)
        ref = x.double() @ (w8.double() * 0.5).T
        b.checks["fp8_linear_rel_err_vs_unquantized_x"] = float((y.double() - ref).norm() / ref.norm())
    except Exception as e:  # noqa: BLE001
        b.checks["fp8_linear_rel_err_vs_unquantized_x"] = f"failed: {one_line(e)}"
    log("   check fp8:", b.checks["fp8_linear_rel_err_vs_unquantized_x"])


# ============================================================================ section: gemm_wonly



@dataclass
class QuantWeights:
    """One rotation pool of quantized weights: per slot (w, scales, zeros); bytes per slot."""

    slots: list
    bytes_per_slot: int


def quant_int8_pool(b: Bench, N, K, n_slots) -> QuantWeights:
    """Symmetric per-output-channel int8 weights [N,K] with bf16 scales [1,N]."""
    slots = []
    for _ in range(n_slots):
        w = torch.randint(-127, 128, (N, K), dtype=torch.int8, device=b.dev)
        s = (torch.rand(1, N, device=b.dev) * 0.01 + 0.001).to(torch.bfloat16)
        slots.append((w, s, None))
    return QuantWeights(slots, N * K + 2 * N)


def quant_int4_pool(b: Bench, N, K, group, n_slots) -> QuantWeights:
    """Asymmetric int4 weights packed two per byte [N,K/2] (even k low nibble), bf16 scales
    and zero points [K/group, N]; w = (q - z) * s."""
    slots = []
    for _ in range(n_slots):
        w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=b.dev)
        s = (torch.rand(K // group, N, device=b.dev) * 0.01 + 0.001).to(torch.bfloat16)
        z = torch.randint(0, 16, (K // group, N), device=b.dev).to(torch.bfloat16)
        slots.append((w, s, z))
    return QuantWeights(slots, N * K // 2 + 4 * N * (K // group))


def dequant_ref(w, s, z, bits, group):
    """float64 [N,K] weights from a quantized slot (the reference for numerics checks)."""
    if bits == 8:
        return w.double() * s.double().view(1, -1).T
    q = torch.stack([(w & 0xF), (w >> 4)], dim=-1).reshape(w.shape[0], -1).double()
    sk = s.double().T.repeat_interleave(group, dim=1)
    zk = z.double().T.repeat_interleave(group, dim=1)
    return (q - zk) * sk


class SplitKGemv:
    """Launcher of the Triton fused-dequant split-K kernel for one shape and weight format."""

    def __init__(self, b: Bench, M, N, K, bits, group):
        self.M, self.N, self.K, self.bits, self.group = M, N, K, bits, group
        self.BLOCK_N = 64 if b.cuda else 16
        self.BLOCK_K = 128 if b.cuda else 32
        if bits == 4:
            assert group % self.BLOCK_K == 0, "group must be a multiple of BLOCK_K"
        self.BLOCK_M = 1 if M == 1 else max(16, triton.next_power_of_2(M))
        n_blocks = cdiv(N, self.BLOCK_N)
        k_blocks = cdiv(K, self.BLOCK_K)
        target = 4 * b.nsm
        self.splits = max(1, min(k_blocks, round(target / n_blocks)))
        self.kb_per_prog = cdiv(k_blocks, self.splits)
        self.splits = cdiv(k_blocks, self.kb_per_prog)
        self.dot_fp32 = b.interpret
        self.num_warps = 4 if b.cuda else 1
        dev = b.dev
        self.part = (torch.empty(self.splits, M, N, device=dev, dtype=torch.float32)
                     if self.splits > 1 else torch.empty(1, device=dev))
        self.y = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        self.kernels = 1 if self.splits == 1 else 2

    def __call__(self, x, w, s, z):
        """y = x @ dequant(w)^T (bf16), one or two kernels."""
        grid = (cdiv(self.N, self.BLOCK_N), self.splits)
        direct = self.splits == 1
        _wq_splitk_kernel[grid](
            x, w, s, z if z is not None else s, self.part, self.y, self.M, self.N, self.K,
            self.kb_per_prog, BITS=self.bits, GROUP=self.group, HAS_ZERO=z is not None,
            BLOCK_M=self.BLOCK_M, BLOCK_N=self.BLOCK_N, BLOCK_K=self.BLOCK_K,
            USE_DOT=self.BLOCK_M > 1, DOT_FP32=self.dot_fp32, DIRECT=direct,
            num_warps=self.num_warps)
        if not direct:
            MN = self.M * self.N
            BLOCK = 1024 if self.num_warps > 1 else 64
            _splitk_reduce_kernel[(cdiv(MN, BLOCK),)](self.part, self.y, MN, self.splits, BLOCK=BLOCK)
        return self.y


def check_splitk(b: Bench):
    """Triton split-K int8/int4 kernels against float64 of the dequantized weights."""
    if not b.triton_ok:
        b.checks["splitk"] = "skipped: no Triton"
        return
    res = {}
    N, K = (256, 1024) if b.cuda else (32, 256)
    for bits, group in ((8, 0), (4, 128 if b.cuda else 32)):
        pool = quant_int8_pool(b, N, K, 1) if bits == 8 else quant_int4_pool(b, N, K, group, 1)
        w, s, z = pool.slots[0]
        wd = dequant_ref(w, s, z, bits, group)
        for M in (1, 5, 16):
            for force_split in (None, 1):
                try:
                    g = SplitKGemv(b, M, N, K, bits, group)
                    if force_split == 1:
                        g.splits, g.kb_per_prog = 1, cdiv(K, g.BLOCK_K)
                    x = torch.randn(M, K, device=b.dev, dtype=torch.bfloat16)
                    y = g(x, w, s, z).double()
                    ref = x.double() @ wd.T
                    err = float((y - ref).norm() / ref.norm())
                    res[f"int{bits}_M{M}_splits{g.splits}"] = {"rel_err": err, "ok": err < 1e-2}
                except Exception as e:  # noqa: BLE001
                    res[f"int{bits}_M{M}_split{force_split}"] = f"failed: {one_line(e)}"
    b.checks["splitk"] = res
    log("   check splitk:", json.dumps(res))


def tinygemm_pool(b: Bench, N, K, group, n_slots) -> QuantWeights:
    """tinygemm int4 weights (torch._convert_weight_to_int4pack, inner_k_tiles 8) and
    qScaleAndZeros [K/group, N, 2] bf16; slots are clones of one conversion."""
    q = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=b.dev)
    packed = torch._convert_weight_to_int4pack(q, 8)
    sz = torch.empty(K // group, N, 2, device=b.dev, dtype=torch.bfloat16)
    sz[..., 0] = torch.rand(K // group, N, device=b.dev) * 0.01 + 0.001
    sz[..., 1] = torch.randn(K // group, N, device=b.dev) * 0.01
    slots = [(packed.clone(), sz.clone(), None) for _ in range(n_slots)]
    return QuantWeights(slots, N * K // 2 + 4 * N * (K // group))


def check_tinygemm(b: Bench):
    """tinygemm against w = (q - 8) * scale + zero with q from the uint8 nibbles (high = even k).

    Records the error for both nibble orders so a layout surprise is visible, not fatal.
    """
    if not b.cuda:
        b.checks["tinygemm"] = "skipped: needs CUDA"
        return
    try:
        N, K, G = 256, 1024, 128
        q8 = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=b.dev)
        packed = torch._convert_weight_to_int4pack(q8, 8)
        sz = torch.empty(K // G, N, 2, device=b.dev, dtype=torch.bfloat16)
        sz[..., 0] = torch.rand(K // G, N, device=b.dev) * 0.01 + 0.001
        sz[..., 1] = torch.randn(K // G, N, device=b.dev) * 0.01
        x = torch.randn(4, K, device=b.dev, dtype=torch.bfloat16)
        y = torch._weight_int4pack_mm(x, packed, G, sz).double()
        s = sz[..., 0].double().T.repeat_interleave(G, 1)
        z = sz[..., 1].double().T.repeat_interleave(G, 1)
        res = {}
        for order, (a, c) in {"high_even": (q8 >> 4, q8 & 15), "low_even": (q8 & 15, q8 >> 4)}.items():
            q = torch.stack([a, c], -1).reshape(N, K).double()
            ref = x.double() @ ((q - 8) * s + z).T
            res[order] = float((y - ref).norm() / ref.norm())
        b.checks["tinygemm_rel_err"] = res
    except Exception as e:  # noqa: BLE001
        b.checks["tinygemm_rel_err"] = f"failed: {one_line(e)}"
    log("   check tinygemm:", b.checks.get("tinygemm_rel_err"))


def gemm_wonly_configs(b: Bench) -> list:
    """Weight-only int4/int8 GEMV/GEMM: tinygemm, plain-PyTorch int8, Triton split-K."""
    Ms, NKs = b.axis("gemm_wonly", "M"), b.axis("gemm_wonly", "NK")
    check_splitk(b)
    check_tinygemm(b)
    g4 = b.axis("gemm_wonly", "int4_group")
    pools: dict = {}
    cfgs = []
    for M in coverage_order(Ms):
        for (N, K) in NKs:
            for G in b.axis("gemm_wonly", "tinygemm_groups"):
                cfgs.append(_tinygemm_cfg(b, M, N, K, G, pools))
            cfgs.append(_int8_unfused_cfg(b, M, N, K, pools))
            cfgs.append(_splitk_cfg(b, M, N, K, 8, K, pools))
            cfgs.append(_splitk_cfg(b, M, N, K, 4, g4, pools))
    return cfgs


def _pool_get(b: Bench, pools, key, make):
    """Rotation pools are shared by the M values (and impls) of one (N,K) and format."""
    if key not in pools:
        pools[key] = make()
    return pools[key]


def _wq_meta(impl, bits, group, M, N, K, wbytes, inter=0, note=""):
    """CSV fields of a weight-only quantized GEMM row."""
    return dict(impl=impl, kclass="gemv_wq", dtype=f"int{bits}", M=M, N=N, K=K, M_padded=M,
                group_size=group, bytes_read=wbytes + 2 * M * K, bytes_written=2 * M * N,
                bytes_intermediate=inter, flops=2 * M * N * K, note=note)


def _n_slots_q(b: Bench, bytes_per_slot) -> int:
    """Rotation count for quantized weights (each slot is its own allocation)."""
    return b.slots_for(bytes_per_slot, cap=64)


def _tinygemm_cfg(b: Bench, M, N, K, G, pools) -> Config:
    """torch._weight_int4pack_mm at one shape and group size."""
    wbytes = N * K // 2 + 4 * N * (K // G)
    meta = _wq_meta(f"tinygemm_int4_g{G}", 4, G, M, N, K, wbytes,
                    note="torch._weight_int4pack_mm, inner_k_tiles 8, bf16 scale+zero")
    cid = f"gemm_wonly:tinygemm_int4_g{G}:M{M}_N{N}_K{K}"
    if not b.cuda:
        return Config(cid, "gemm_wonly", meta, _raiser("skipped: tinygemm int4 needs CUDA"))
    n_slots = _n_slots_q(b, wbytes)

    def build():
        if not hasattr(torch, "_weight_int4pack_mm"):
            raise RuntimeError("torch._weight_int4pack_mm not available")
        pool = _pool_get(b, pools, ("tiny", N, K, G), lambda: tinygemm_pool(b, N, K, G, n_slots))
        x = torch.randn(M, K, device=b.dev, dtype=torch.bfloat16)
        sl = pool.slots
        return lambda i: torch._weight_int4pack_mm(x, sl[i % n_slots][0], G, sl[i % n_slots][1])
    return Config(cid, "gemm_wonly", meta, build, est_us=5.0 + wbytes / 2.5e12 * 1e6,
                  n_slots=n_slots, bytes_per_slot=wbytes)


def _raiser(msg):
    """A build() that raises msg (for clear skips)."""
    def build():
        raise RuntimeError(msg)
    return build


def _int8_unfused_cfg(b: Bench, M, N, K, pools) -> Config:
    """Plain PyTorch int8 weight-only: F.linear(x, W8.to(bf16)) * scales (3 kernels)."""
    wbytes = N * K + 2 * N
    meta = _wq_meta("int8_unfused", 8, 0, M, N, K, wbytes, inter=4 * N * K,
                    note="F.linear(x, W_int8.to(bf16)) * scale[N]; the cast writes and the GEMM "
                         "reads a bf16 copy of W (bytes_intermediate)")
    n_slots = _n_slots_q(b, wbytes)

    def build():
        pool = _pool_get(b, pools, ("int8", N, K), lambda: quant_int8_pool(b, N, K, n_slots))
        x = torch.randn(M, K, device=b.dev, dtype=torch.bfloat16)
        sl = pool.slots
        return lambda i: F.linear(x, sl[i % n_slots][0].to(torch.bfloat16)) * sl[i % n_slots][1]
    return Config(f"gemm_wonly:int8_unfused:M{M}_N{N}_K{K}", "gemm_wonly", meta, build,
                  est_us=10.0 + 5 * N * K / 2.5e12 * 1e6, n_slots=n_slots, bytes_per_slot=wbytes)


def _splitk_cfg(b: Bench, M, N, K, bits, group, pools) -> Config:
    """Triton fused-dequant split-K GEMV (int8 per-channel or int4 asymmetric grouped)."""
    g_label = 0 if bits == 8 else group
    impl = f"triton_splitk_int{bits}" + (f"_g{group}" if bits == 4 else "")
    wbytes = N * K + 2 * N if bits == 8 else N * K // 2 + 4 * N * (K // group)
    cid = f"gemm_wonly:{impl}:M{M}_N{N}_K{K}"
    meta = _wq_meta(impl, bits, g_label, M, N, K, wbytes)
    if not b.triton_ok:
        return Config(cid, "gemm_wonly", meta, _raiser("skipped: Triton needs CUDA or TRITON_INTERPRET=1"))
    n_slots = _n_slots_q(b, wbytes)
    ok = b.checks.get("splitk")
    if isinstance(ok, dict) and not all(isinstance(v, dict) and v.get("ok") for v in ok.values()):
        meta["note"] = "numerics check failed or incomplete (see summary)"

    def build():
        key = ("int8", N, K) if bits == 8 else ("int4", N, K, group)
        make = (lambda: quant_int8_pool(b, N, K, n_slots)) if bits == 8 else \
            (lambda: quant_int4_pool(b, N, K, group, n_slots))
        pool = _pool_get(b, pools, key, make)
        g = SplitKGemv(b, M, N, K, bits, 0 if bits == 8 else group)
        meta["n_programs"] = cdiv(N, g.BLOCK_N) * g.splits
        meta["bytes_intermediate"] = 0 if g.splits == 1 else 2 * 4 * g.splits * M * N
        tiling = f"splits={g.splits} BLOCK_N={g.BLOCK_N} BLOCK_K={g.BLOCK_K} BLOCK_M={g.BLOCK_M}"
        tiling += "; fp32 partials + reduce kernel" if g.splits > 1 else "; one split, bf16 out"
        meta["note"] = "; ".join(x for x in (meta.get("note", ""), tiling) if x)
        x = torch.randn(M, K, device=b.dev, dtype=torch.bfloat16)
        sl = pool.slots
        return lambda i: g(x, *sl[i % n_slots])
    return Config(cid, "gemm_wonly", meta, build, est_us=6.0 + wbytes / 2.0e12 * 1e6,
                  n_slots=n_slots, bytes_per_slot=wbytes)


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


# ============================================================================ main

# ============================================================================ sections of issue 21
# castred: casts (bf16/fp16/fp32/fp8/int8, int4 pack/unpack) and reductions over 1 KiB .. 1 GiB,
# contiguous and strided; kv_append: the new token's K/V quantized and appended per KV format;
# fp8_static: an FP8 linear with a static activation scale (one cast, then _scaled_mm) and
# with per-token dynamic scales; grouped_mm: torch._grouped_mm over experts with device-side
# offsets.

FP8 = torch.float8_e4m3fn if hasattr(torch, "float8_e4m3fn") else None


def _cast_pairs():
    bf, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    pairs = [(bf, f32), (f32, bf), (bf, f16), (f16, bf), (f16, f32), (bf, torch.int8), (torch.int8, bf)]
    if FP8 is not None:
        pairs += [(bf, FP8), (FP8, bf), (f32, FP8)]
    return pairs


def castred_configs(b: Bench) -> list:
    """Casts and reductions over many sizes, layouts and dtypes."""
    cfgs = []
    for size in coverage_order(b.axis("castred", "cast_sizes_bytes")):
        for src, dst in _cast_pairs():
            cfgs.append(_cast_cfg(b, size, src, dst, "contiguous"))
        for src, dst in ((torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
                         (torch.bfloat16, FP8 or torch.float16)):
            cfgs.append(_cast_cfg(b, size, src, dst, "transpose"))
        for src, dst in ((torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16)):
            cfgs.append(_cast_cfg(b, size, src, dst, "slice"))
        for impl in ("int4_pack", "int4_unpack"):
            cfgs.append(_int4_cfg(b, size, impl))
    widths = b.axis("castred", "reduce_widths")
    for size in coverage_order(b.axis("castred", "reduce_sizes_bytes")):
        for W in widths:
            for impl in ("sum", "amax", "mean_fp32", "argmax", "softmax", "topk8", "colsum"):
                if impl == "topk8" and W > 1024:
                    continue
                if impl == "colsum" and W not in (64, 8192):
                    continue
                c = _reduce_cfg(b, size, W, impl)
                if c is not None:
                    cfgs.append(c)
        for impl in ("full_sum", "full_amax"):
            c = _reduce_cfg(b, size, b.axis("castred", "whole_tensor_width"), impl)
            if c is not None:
                cfgs.append(c)
    return cfgs


def _cast_cfg(b: Bench, size, src, dst, layout) -> Config:
    """y.copy_(x) from dtype src to dst; layout contiguous, transpose (x read through .t()) or
    slice (x = the first half of each row of a [R, 2W] tensor); size = bytes read + written."""
    per = esize(src) + esize(dst)
    n = _round_to(size // per, 256)
    W = 256 if n >= 256 * 256 else 16
    R = max(1, n // W)
    n = R * W
    read_specs = [((R, 2 * W), src)] if layout == "slice" else [((R, W), src)]
    out_shape = (W, R) if layout == "transpose" else (R, W)
    specs = read_specs + [(out_shape, dst)]
    per_slot = math.prod(read_specs[0][0]) * esize(src) + n * esize(dst)
    n_slots = b.slots_for(per_slot)
    impl = f"cast_{dtype_name(src)}_{dtype_name(dst)}" + ("" if layout == "contiguous" else f"_{layout}")
    meta = dict(impl=impl, kclass="cast", dtype=dtype_name(src), elements=n, rows=R, row_width=W, size_bytes=size,
                bytes_read=n * esize(src), bytes_written=n * esize(dst), flops=0,
                note=f"y.copy_(x) {dtype_name(src)} -> {dtype_name(dst)}, layout {layout}")

    def build():
        slots = b.carve(specs, n_slots)
        if layout == "transpose":
            return lambda i: slots[i % n_slots][1].copy_(slots[i % n_slots][0].t())
        if layout == "slice":
            return lambda i: slots[i % n_slots][1].copy_(slots[i % n_slots][0][:, :W])
        return lambda i: slots[i % n_slots][1].copy_(slots[i % n_slots][0])
    return Config(f"castred:{impl}:n{n}", "castred", meta, build, est_us=3.0 + per_slot / 2.5e12 * 1e6,
                  n_slots=n_slots, bytes_per_slot=per_slot)


def _int4_cfg(b: Bench, size, impl) -> Config:
    """int4 pack (uint8 codes -> two per byte: slice, shift, or) or unpack (bytes -> two bf16
    values: and, shift, stack, cast), as plain PyTorch writes them (several kernels)."""
    if impl == "int4_pack":
        n = _round_to(size // 2 * 2 // 3, 512)  # read n, write n/2
        rd, wr = n, n // 2
        specs = [((n,), torch.uint8), ((n // 2,), torch.uint8)]
    else:
        n = _round_to(size // 5, 256)  # read n bytes, write 2n bf16
        rd, wr = n, 4 * n
        specs = [((n,), torch.uint8), ((2 * n,), torch.bfloat16)]
    per_slot = rd + wr
    n_slots = b.slots_for(per_slot)
    meta = dict(impl=impl, kclass="cast_int4", dtype="int4", elements=n, size_bytes=size, bytes_read=rd,
                bytes_written=wr, flops=n, note="plain PyTorch, several kernels (see kernel_names.csv)")

    def build():
        slots = b.carve(specs, n_slots)
        if impl == "int4_pack":
            def f(i):
                q, out = slots[i % n_slots]
                torch.bitwise_or(q[0::2] & 15, (q[1::2] & 15) << 4, out=out)
            return f

        def g(i):
            p, out = slots[i % n_slots]
            torch.stack(((p & 15), (p >> 4)), dim=-1).view(-1).to(torch.bfloat16)
        return g
    return Config(f"castred:{impl}:n{n}", "castred", meta, build, est_us=6.0 + per_slot / 1.5e12 * 1e6,
                  n_slots=n_slots, bytes_per_slot=per_slot)


def _reduce_cfg(b: Bench, size, W, impl):
    """A reduction over rows of width W (or over the whole tensor, or over columns) of a bf16
    (mean_fp32: fp32) [R, W] tensor whose input bytes are ``size``; None if R < 1."""
    dt = torch.float32 if impl == "mean_fp32" else torch.bfloat16
    R = size // (W * esize(dt))
    if R < 1:
        return None
    n = R * W
    rd = n * esize(dt)
    out_b = {"sum": R * 2, "amax": R * 2, "mean_fp32": R * 4, "argmax": R * 8, "softmax": rd, "topk8": R * 8 * 10,
             "colsum": W * 2, "full_sum": 2, "full_amax": 2}[impl]
    n_slots = b.slots_for(rd)
    kclass = "reduction"
    meta = dict(impl=f"reduce_{impl}", kclass=kclass, dtype=dtype_name(dt), elements=n, rows=R, row_width=W,
                size_bytes=size, bytes_read=rd, bytes_written=out_b, flops=n,
                note={"colsum": "x.sum(0): a strided (column) reduction", "full_sum": "x.sum(): whole tensor",
                      "full_amax": "x.amax(): whole tensor"}.get(impl, "over the last dim"))
    ops = {"sum": lambda x: x.sum(-1), "amax": lambda x: x.amax(-1), "mean_fp32": lambda x: x.mean(-1),
           "argmax": lambda x: x.argmax(-1), "softmax": lambda x: torch.softmax(x, -1),
           "topk8": lambda x: torch.topk(x, 8, dim=-1), "colsum": lambda x: x.sum(0),
           "full_sum": lambda x: x.sum(), "full_amax": lambda x: x.amax()}
    op = ops[impl]

    def build():
        xs = [s[0] for s in b.carve([((R, W), dt)], n_slots)]
        return lambda i: op(xs[i % n_slots])
    return Config(f"castred:reduce_{impl}:R{R}_W{W}", "castred", meta, build,
                  est_us=4.0 + (rd + out_b) / 2.5e12 * 1e6, n_slots=n_slots, bytes_per_slot=rd)


# ---- KV quantize-and-append (the new token's K and V into the cache), per format

def kv_append_bf16(cache, new, pos):
    """bf16 cache: index_copy_ of the new token's rows (K or V)."""
    cache["q"].index_copy_(2, pos, new)


def kv_append_int8(cache, new, pos):
    """int8 per-token symmetric: scale = amax(|x|) / 127 per (token, head); q = round(x / s)."""
    s = new.abs().amax(-1, keepdim=True).float().clamp_(min=1e-8) / 127.0
    q = (new.float() / s).round_().clamp_(-127, 127).to(torch.int8)
    cache["q"].index_copy_(2, pos, q)
    cache["s"].index_copy_(2, pos, s.to(torch.bfloat16))


def kv_append_int4(cache, new, pos, group=32):
    """int4 asymmetric, groups of 32 along head_dim: min/max per group, 15 levels, two codes
    per byte; codes, scales and zeros each index_copy_ into their tensors."""
    B, H, T, D = new.shape
    g = new.float().view(B, H, T, D // group, group)
    mn = g.amin(-1, keepdim=True)
    s = (g.amax(-1, keepdim=True) - mn).clamp_(min=1e-6) / 15.0
    q = ((g - mn) / s).round_().clamp_(0, 15).to(torch.uint8).view(B, H, T, D)
    packed = q[..., 0::2] | (q[..., 1::2] << 4)
    cache["q"].index_copy_(2, pos, packed)
    cache["s"].index_copy_(2, pos, s.view(B, H, T, D // group).to(torch.bfloat16))
    cache["z"].index_copy_(2, pos, mn.view(B, H, T, D // group).to(torch.bfloat16))


def _kv_cache(fmt, B, H, L, D, dev):
    if fmt == "bf16":
        return {"q": torch.zeros(B, H, L, D, dtype=torch.bfloat16, device=dev)}
    if fmt == "int8":
        return {"q": torch.zeros(B, H, L, D, dtype=torch.int8, device=dev),
                "s": torch.zeros(B, H, L, 1, dtype=torch.bfloat16, device=dev)}
    return {"q": torch.zeros(B, H, L, D // 2, dtype=torch.uint8, device=dev),
            "s": torch.zeros(B, H, L, D // 32, dtype=torch.bfloat16, device=dev),
            "z": torch.zeros(B, H, L, D // 32, dtype=torch.bfloat16, device=dev)}


KV_APPEND = {"bf16": kv_append_bf16, "int8": kv_append_int8, "int4": kv_append_int4}


def kv_append_configs(b: Bench) -> list:
    """K and V of the new token quantized and appended, per format, B sequences x Hkv heads x D."""
    shapes, Bs = b.axis("kv_append", "heads_dims"), b.axis("kv_append", "batches")
    L = b.axis("kv_append", "context")
    cfgs = []
    for fmt in b.axis("kv_append", "formats"):
        for H, D in shapes:
            for B in Bs:
                cfgs.append(_kv_append_cfg(b, fmt, B, H, D, L))
    return cfgs


def _kv_append_cfg(b: Bench, fmt, B, H, D, L) -> Config:
    row = B * H * D
    wr = {"bf16": 2 * row, "int8": row + 2 * B * H, "int4": row // 2 + 2 * 2 * B * H * (D // 32)}[fmt]
    meta = dict(impl=f"kv_append_{fmt}", kclass="kv_append", dtype=fmt, rows=B * H, row_width=D, elements=2 * row,
                size_bytes=L, bytes_read=2 * 2 * row, bytes_written=2 * wr, flops=2 * row,
                note=f"K and V of one new token, cache [B={B}, Hkv={H}, L={L}, D={D}]; plain PyTorch ops "
                     f"(validation/whole_step.py has its own copy); position fixed")

    def build():
        kc, vc = _kv_cache(fmt, B, H, L, D, b.dev), _kv_cache(fmt, B, H, L, D, b.dev)
        ks = [torch.randn(B, H, 1, D, dtype=torch.bfloat16, device=b.dev) for _ in range(4)]
        vs = [torch.randn(B, H, 1, D, dtype=torch.bfloat16, device=b.dev) for _ in range(4)]
        pos = torch.tensor([L // 2], dtype=torch.long, device=b.dev)
        fn = KV_APPEND[fmt]

        def f(i):
            fn(kc, ks[i % 4], pos)
            fn(vc, vs[i % 4], pos)
        return f
    return Config(f"kv_append:{fmt}:B{B}_H{H}_D{D}", "kv_append", meta, build, est_us=40.0 if fmt != "bf16" else 5.0)


# ---- FP8 linears with a static scale and with per-token dynamic scales

def fp8_static_configs(b: Bench) -> list:
    if b.mode == "cpu" or FP8 is None:
        return [skip_config("fp8_static", "fp8_static:cpu", dict(impl="fp8_static_linear", kclass="gemm_fp8"),
                            "torch._scaled_mm needs CUDA")]
    Ms, NKs = b.axis("fp8_static", "M"), b.axis("fp8_static", "NK")
    cfgs = []
    pools: dict = {}
    for M in coverage_order(Ms):
        for N, K in NKs:
            n_slots = b.slots_for(N * K, cap=256)
            for impl in ("fp8_static_linear", "fp8_per_token_linear"):
                cfgs.append(_fp8s_cfg(b, impl, M, N, K, n_slots, pools))
        for K in sorted({k for _, k in NKs}):
            cfgs.append(_fp8_cast_cfg(b, M, K))
    return cfgs


def fp8_narrow_configs(b: Bench) -> list:
    """Static FP8 linears and bf16 F.linear at narrow output widths (GQA K/V projections)."""
    if b.mode == "cpu" or FP8 is None:
        return [skip_config("fp8_narrow", "fp8_narrow:cpu", dict(impl="fp8_static_linear", kclass="gemm_fp8"),
                            "torch._scaled_mm needs CUDA")]
    Ms, NKs = b.axis("fp8_narrow", "M"), b.axis("fp8_narrow", "NK")
    cfgs, pools = [], {}
    for M in coverage_order(Ms):
        for N, K in NKs:
            n_slots = b.slots_for(N * K, cap=256)
            c = _fp8s_cfg(b, "fp8_static_linear", M, N, K, n_slots, pools)
            cfgs.append(Config(c.cid.replace("fp8_static:", "fp8_narrow:"), "fp8_narrow", c.meta, c.build, c.est_us,
                               c.n_slots, c.bytes_per_slot))
            cfgs.append(_bf16_narrow_cfg(b, M, N, K))
    return cfgs


def _bf16_narrow_cfg(b: Bench, M, N, K) -> Config:
    n_slots = b.slots_for(2 * N * K, cap=256)
    meta = dict(impl="F.linear", kclass="gemm", dtype="bf16", M=M, N=N, K=K, M_padded=M, bytes_read=2 * N * K + 2 * M * K,
                bytes_written=2 * M * N, flops=2 * M * N * K, note="bf16 F.linear at a narrow output width")

    def build():
        ws = [s[0] for s in b.carve([((N, K), torch.bfloat16)], n_slots)]
        x = torch.randn(M, K, device=b.dev, dtype=torch.bfloat16)
        return lambda i: F.linear(x, ws[i % n_slots])
    return Config(f"fp8_narrow:F.linear:M{M}_N{N}_K{K}", "fp8_narrow", meta, build,
                  est_us=6.0 + 2 * N * K / 3e12 * 1e6, n_slots=n_slots, bytes_per_slot=2 * N * K)


def _fp8s_cfg(b: Bench, impl, M, N, K, n_slots, pools) -> Config:
    wbytes = N * K
    static = impl == "fp8_static_linear"
    meta = dict(impl=impl, kclass="gemm_fp8", dtype="fp8_e4m3", M=M, N=N, K=K, M_padded=M,
                bytes_read=wbytes + M * K * 2, bytes_written=M * N * 2, flops=2 * M * N * K,
                bytes_intermediate=2 * M * K if static else 8 * M * K,
                note="x.to(e4m3) with a constant scale, then torch._scaled_mm (per-tensor scales)" if static else
                "per-token: s = |x|.amax(-1)/448; (x/s).to(e4m3); _scaled_mm with rowwise scales (w per channel)")

    def build():
        if (N, K) not in pools:
            pools[(N, K)] = fp8_weight_pool(b, N, K, n_slots)
        Ws = pools[(N, K)]
        x = torch.randn(M, K, device=b.dev, dtype=torch.bfloat16)
        mp = cdiv(M, 16) * 16 if M % 16 else M
        if static:
            xs = torch.tensor(1.0, device=b.dev)
            ws = torch.tensor(0.5, device=b.dev)
            try:
                torch._scaled_mm(x.to(FP8), Ws[0].t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)
                b.sync()
            except Exception:  # noqa: BLE001
                meta["M_padded"] = mp
                x = torch.cat([x, x.new_zeros(mp - M, K)])
            return lambda i: torch._scaled_mm(x.to(FP8), Ws[i % n_slots].t(), scale_a=xs, scale_b=ws,
                                              out_dtype=torch.bfloat16)
        wrow = torch.full((1, N), 0.5, device=b.dev, dtype=torch.float32)

        def per_token(i, x=x):
            s = x.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
            xq = (x / s).to(FP8)
            return torch._scaled_mm(xq, Ws[i % n_slots].t(), scale_a=s, scale_b=wrow, out_dtype=torch.bfloat16)
        try:
            per_token(0)
            b.sync()
        except Exception:  # noqa: BLE001
            meta["M_padded"] = mp
            x = torch.cat([x, x.new_zeros(mp - M, K)])
            return lambda i, x=x: per_token(i, x)
        return per_token
    est = 8.0 + max(wbytes / 3.0e12, 2 * M * N * K / 1000e12) * 1e6
    return Config(f"fp8_static:{impl}:M{M}_N{N}_K{K}", "fp8_static", meta, build, est_us=est,
                  n_slots=n_slots, bytes_per_slot=wbytes)


def _fp8_cast_cfg(b: Bench, M, K) -> Config:
    """The static-scale activation quantization alone: x.to(e4m3) (one cast kernel)."""
    meta = dict(impl="cast_bf16_fp8_act", kclass="cast", dtype="bf16", M=M, K=K, elements=M * K, rows=M, row_width=K,
                bytes_read=2 * M * K, bytes_written=M * K, flops=0, note="x.to(float8_e4m3fn), x [M, K] in L2")

    def build():
        xs = [torch.randn(M, K, device=b.dev, dtype=torch.bfloat16) for _ in range(4)]
        return lambda i: xs[i % 4].to(FP8)
    return Config(f"fp8_static:cast_bf16_fp8_act:M{M}_K{K}", "fp8_static", meta, build, est_us=3.0)


# ---- torch._grouped_mm over experts, device-side offsets

GROUPED_ROUTINGS = sweep_axis("kernels", "grouped_mm", "routings", "full")  # routings rotated through a replay


def grouped_mm_configs(b: Bench) -> list:
    if not b.cuda or not hasattr(torch, "_grouped_mm"):
        return [skip_config("grouped_mm", "grouped_mm:cpu", dict(impl="torch._grouped_mm", kclass="grouped_mm"),
                            "torch._grouped_mm needs CUDA (sm90)")]
    shapes, Ts = b.axis("grouped_mm", "shapes"), b.axis("grouped_mm", "tokens")
    cfgs = []
    weights: dict = {}
    for H, F_, E, k in shapes:
        for T in coverage_order(Ts):
            for part in ("gate_up", "down"):
                cfgs.append(_grouped_cfg(b, H, F_, E, k, T, part, weights))
    return cfgs


def _grouped_routing(E, k, T, seed):
    """Per-expert row counts of T tokens routed top-k uniformly at random, padded to 16 rows."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)])
    counts = torch.bincount(ids.view(-1), minlength=E)
    padded = (counts + 15) // 16 * 16
    return counts, padded


def _grouped_cfg(b: Bench, H, F_, E, k, T, part, weights) -> Config:
    K, N = (H, 2 * F_) if part == "gate_up" else (F_, H)
    routings = [_grouped_routing(E, k, T, seed) for seed in range(GROUPED_ROUTINGS)]
    rows = max(int(p.sum()) for _, p in routings)
    touched = sum(int((c > 0).sum()) for c, _ in routings) / len(routings)
    per_expert = K * N * 2
    meta = dict(impl=f"torch._grouped_mm_{part}", kclass="grouped_mm", dtype="bf16", M=T * k, N=N, K=K,
                M_padded=rows, elements=E, rows=round(touched, 2), row_width=k,
                bytes_read=round(touched * per_expert) + rows * K * 2, bytes_written=rows * N * 2,
                flops=2 * T * k * N * K,
                note=f"E={E} experts, T={T} tokens top-{k}; rows padded to 16 per expert; offs on the device; "
                     f"rows = mean touched experts over {GROUPED_ROUTINGS} rotated routings")

    def build():
        key = (H, F_, E, part)
        if key not in weights:
            weights[key] = torch.randn(E, N, K, device=b.dev, dtype=torch.bfloat16) * 0.02
        w = weights[key].transpose(-2, -1)  # [E, K, N], column-major as torchtitan passes it
        a = torch.randn(rows, K, device=b.dev, dtype=torch.bfloat16)
        offs = [torch.cumsum(p, 0).to(torch.int32).to(b.dev) for _, p in routings]
        views = [a[:int(p.sum())] for _, p in routings]  # each routing's rows exactly (offs[-1] = rows)
        return lambda i: torch._grouped_mm(views[i % len(offs)], w, offs=offs[i % len(offs)])
    est = 10.0 + touched * per_expert / 2.5e12 * 1e6
    return Config(f"grouped_mm:{part}:H{H}_F{F_}_E{E}_k{k}_T{T}", "grouped_mm", meta, build, est_us=est,
                  n_slots=GROUPED_ROUTINGS, bytes_per_slot=round(touched * per_expert))


# ---- broadcast and sliced elementwise (the kernels of a dequantizing cache), added after the first call

def bcast_configs(b: Bench) -> list:
    """bf16 [R, W] times / plus a [R, 1] or [R, W/32, 1] broadcast operand; int8/uint8 -> bf16 casts
    and uint8 bit ops on a slice of the rows (x[:, :, :n] of a cache longer than n), 1 MiB .. 1 GiB."""
    cfgs = []
    for size in coverage_order(b.axis("bcast", "sizes_bytes")):
        for impl in ("mul_rowscale", "mul_groupscale", "add_groupzero", "cast_int8_bf16_sliced",
                     "cast_uint8_bf16_sliced", "and15_sliced", "shr4_sliced", "stack2_uint8"):
            cfgs.append(_bcast_cfg(b, size, impl))
    return cfgs


def _bcast_cfg(b: Bench, size, impl) -> Config:
    bf, u8, i8 = torch.bfloat16, torch.uint8, torch.int8
    if impl in ("mul_rowscale", "mul_groupscale", "add_groupzero"):
        n = _round_to(size // 4, 4096)  # read n bf16, write n bf16
        D = 128
        R = n // D
        scale_shape = (R, 1) if impl == "mul_rowscale" else (R, D // 32, 1)
        x_shape = (R, D) if impl == "mul_rowscale" else (R, D // 32, 32)
        specs = [(x_shape, bf), (scale_shape, bf), (x_shape, bf)]
        rd, wr = 2 * n + 2 * math.prod(scale_shape), 2 * n
        op = (lambda s: torch.mul(s[0], s[1], out=s[2])) if impl != "add_groupzero" else (
            lambda s: torch.add(s[0], s[1], out=s[2]))
        kclass, note = "elementwise", f"x {x_shape} bf16 with a broadcast {scale_shape} operand"
    elif impl in ("cast_int8_bf16_sliced", "cast_uint8_bf16_sliced"):
        n = _round_to(size // 3, 4096)
        D, R = 128, n // 128
        src = i8 if impl.startswith("cast_int8") else u8
        specs = [((R + R // 64 + 1, D), src), ((R, D), bf)]
        rd, wr = n, 2 * n
        op = lambda s, R=R: s[1].copy_(s[0][:R])  # noqa: E731
        kclass, note = "cast", "rows [:R] of a longer cache, to bf16 (contiguous slice of the rows)"
    elif impl in ("and15_sliced", "shr4_sliced"):
        n = _round_to(size // 2, 4096)
        D, R = 64, n // 64
        specs = [((4, R // 4 + 16, D), u8), ((4, R // 4, D), u8)]
        rd, wr = n, n
        if impl == "and15_sliced":
            op = lambda s, R=R: torch.bitwise_and(s[0][:, :R // 4], 15, out=s[1])  # noqa: E731
        else:
            op = lambda s, R=R: torch.bitwise_right_shift(s[0][:, :R // 4], 4, out=s[1])  # noqa: E731
        kclass, note = "elementwise", "uint8 codes of 4 heads, [:, :L] of a longer cache (strided over heads)"
    else:  # stack2_uint8: torch.stack((lo, hi), -1)
        n = _round_to(size // 4, 4096)
        specs = [((n,), u8), ((n,), u8), ((n, 2), u8)]
        rd, wr = 2 * n, 2 * n
        op = lambda s: torch.stack((s[0], s[1]), dim=-1, out=s[2])  # noqa: E731
        kclass, note = "copy", "torch.stack of two uint8 code tensors along a new last dim"
    per_slot = rd + wr
    n_slots = b.slots_for(per_slot)
    meta = dict(impl=impl, kclass=kclass, dtype="bf16" if kclass == "elementwise" and "mul" in impl else "uint8",
                elements=n, size_bytes=size, bytes_read=rd, bytes_written=wr, flops=n, note=note)

    def build():
        slots = b.carve(specs, n_slots)
        return lambda i: op(slots[i % n_slots])
    return Config(f"bcast:{impl}:n{n}", "bcast", meta, build, est_us=3.0 + per_slot / 2e12 * 1e6,
                  n_slots=n_slots, bytes_per_slot=per_slot)


SECTION_CONFIGS = {
    "bcast": bcast_configs,
    "fp8_narrow": fp8_narrow_configs,
    "castred": castred_configs,
    "kv_append": kv_append_configs,
    "fp8_static": fp8_static_configs,
    "grouped_mm": grouped_mm_configs,
    "launch": launch_configs,
    "grid": grid_configs,
    "elementwise": elementwise_configs,
    "gemm": gemm_configs,
    "gemm_fp8": gemm_fp8_configs,
    "gemm_wonly": gemm_wonly_configs,
}


def parse_args(argv=None):
    """Command-line arguments."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--budget-s", type=float, default=170.0,
                    help="stop starting configurations after this many seconds (default 170)")
    ap.add_argument("--quick", action="store_true", help="tiny GPU smoke run of every code path")
    ap.add_argument("--cpu", action="store_true", help="plumbing check on CPU, tiny shapes")
    ap.add_argument("--only", default=",".join(DEFAULT_ORDER),
                    help="comma-separated sections, run in the default order")
    return ap.parse_args(argv)


def run_sections(b: Bench, order: list):
    """Runs the selected sections in order, each guarded so a failure costs only itself."""
    for name in order:
        if time.time() > b.deadline:
            b.truncated = True
            b.stats.setdefault(name, SectionStats(EXPECTED_SECONDS.get(name, 0))).not_started = True
            log(f"== section {name} skipped: budget spent")
            continue
        try:
            if name == "overlap":
                st = b.stats.setdefault(name, SectionStats(EXPECTED_SECONDS[name]))
                t0 = time.time()
                log(f"== section overlap (expected {EXPECTED_SECONDS[name]} s)")
                overlap_section(b, st)
                st.used_s = time.time() - t0
            else:
                if name == "grid":
                    check_grid_kernels(b)
                b.run_section(name, lambda name=name: SECTION_CONFIGS[name](b), order)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            st = b.stats.setdefault(name, SectionStats(EXPECTED_SECONDS.get(name, 0)))
            b.record_error(st, f"{name}:section", one_line(e))
        write_summary(b, order, final=False)


def write_summary(b: Bench, order: list, final: bool, facts=None):
    """kernels_summary.json (rewritten after every section, so a cut run keeps one)."""
    path = os.path.join(b.args.out, "kernels_summary.json")
    if facts is None:
        facts = getattr(b, "facts", {})
    obj = {
        "script": "calibration/kernels.py", "final": final, "mode": b.mode,
        "args": vars(b.args), "sections": order,
        "budget_s": b.args.budget_s, "elapsed_s": round(b.elapsed_s(), 2),
        "truncated_by_budget": b.truncated,
        "expected_seconds": EXPECTED_SECONDS,
        "section_stats": {k: vars(v) for k, v in b.stats.items()},
        "rows_total": sum(v.rows for v in b.stats.values()),
        "errors_total": sum(v.errors for v in b.stats.values()),
        "checks": b.checks, "notes": b.notes, "skipped_by_budget": b.skipped[:500],
        "l2_bytes": b.l2_bytes, "sm_count": b.nsm,
        "timing": {"replay_target_us": REPLAY_TARGET_US, "max_graph_nodes": MAX_GRAPH_NODES,
                   "rotation_target_bytes": b.rot_target, "replays": b.replays},
        "machine": facts,
    }
    write_json(path, obj)


def print_table(b: Bench):
    """Short final table: per section rows, errors, skips and seconds."""
    log(f"{'section':12s} {'rows':>5s} {'errors':>6s} {'unsupp':>6s} {'budget':>6s} {'used_s':>7s} "
        f"{'expected_s':>10s}")
    for name, st in b.stats.items():
        log(f"{name:12s} {st.rows:5d} {st.errors:6d} {st.skipped_unsupported:6d} {st.skipped_budget:6d} "
            f"{st.used_s:7.1f} {st.expected_s:10.0f}" + ("  (not started: budget)" if st.not_started else ""))
    log(f"total {b.elapsed_s():.1f} s of budget {b.args.budget_s:.0f} s; truncated_by_budget={b.truncated}")
    log("checks:", json.dumps(b.checks, default=str)[:2000])


def main(argv=None):
    """Entry point."""
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if not args.cpu and not torch.cuda.is_available():
        log("no CUDA device; use --cpu for a plumbing check")
        return 2
    b = Bench(args)
    facts = machine_facts(b.cuda)
    if b.cuda:
        facts["nvidia_smi_before"] = nvidia_smi_snapshot()
    b.facts = facts
    log("machine:", {k: v for k, v in facts.items() if not k.startswith("nvidia_smi")})
    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in DEFAULT_ORDER + EXTRA_ORDER]
    if unknown:
        log(f"unknown sections {unknown}; known: {DEFAULT_ORDER + EXTRA_ORDER}")
        return 2
    order = [s for s in DEFAULT_ORDER + EXTRA_ORDER if s in wanted]
    log(f"mode {b.mode}, sections {order}, budget {args.budget_s:.0f} s, "
        f"expected {sum(EXPECTED_SECONDS[s] for s in order)} s + start-up")
    run_sections(b, order)
    if b.cuda:
        facts["nvidia_smi_after"] = nvidia_smi_snapshot()
    write_summary(b, order, final=True, facts=facts)
    b.csv.close()
    b.names.close()
    print_table(b)
    return 0


if __name__ == "__main__":
    sys.exit(main())
