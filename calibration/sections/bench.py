"""The section runner of kernels.py: Config (one measured configuration), Bench (device, rotation
pool, budget, output writers; warm-up, profile and time every configuration of a section through
the harness) and the helpers every section shares.
"""
from __future__ import annotations

import bisect
import json
import math
import os
import statistics
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import torch
from harness import (GB, Budget, CsvOut, Timer, capture_graph, log, one_line, pct, queued_replays_us, run_mode)
from sweep import axis as sweep_axis
from torch.profiler import ProfilerActivity, profile, record_function


try:
    import triton  # noqa: F401  (whether the Triton sections can run)
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
    return Config(cid, section, meta, raiser(f"skipped: {why}"))


def dtype_name(dt) -> str:
    """Short dtype label for the CSV."""
    return {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16",
            torch.int8: "int8", torch.uint8: "uint8"}.get(dt, str(dt).replace("torch.", ""))


def esize(dt) -> int:
    """Bytes per element of a dtype."""
    return torch.empty((), dtype=dt).element_size()


# ============================================================================ section: elementwise

def round_to(n: int, m: int) -> int:
    """n rounded down to a multiple of m (at least m)."""
    return max(m, (n // m) * m)


def raiser(msg):
    """A build() that raises msg (for clear skips)."""
    def build():
        raise RuntimeError(msg)
    return build


# castred: casts (bf16/fp16/fp32/fp8/int8, int4 pack/unpack) and reductions over 1 KiB .. 1 GiB,
# contiguous and strided; kv_append: the new token's K/V quantized and appended per KV format;
# fp8_static: an FP8 linear with a static activation scale (one cast, then _scaled_mm) and
# with per-token dynamic scales; grouped_mm: torch._grouped_mm over experts with device-side
# offsets.

FP8 = torch.float8_e4m3fn if hasattr(torch, "float8_e4m3fn") else None
