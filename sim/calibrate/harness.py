"""The measuring harness `decodesim calibrate`, every calibration script and validation/whole_step.py time through.

What is shared: the run mode (full device sweep, ``--quick`` GPU smoke run with tiny shapes,
``--cpu`` plumbing check whose numbers mean nothing), the wall-clock budget, warm-up and CUDA
graph capture, replays timed with CUDA events behind a ``torch.cuda._sleep`` backlog (so host
submission stays out of the interval), host-clock timing of synchronized calls, medians and
percentiles, CSV rows flushed as they come, JSON summaries, machine facts and NVML clock
samples. What a script measures is its sweep (calibration/sweeps/*.yaml, read by sweep.py; the
``calibrate`` command's in sim/calibrate/sweeps.yaml);
how one point runs is its kernel code. Keeping HBM cold is each script's rotation of buffer
copies (sized from the pool and the 60 MiB L2), not a flush here.
"""
from __future__ import annotations

import csv
import datetime as _dt
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time

from sim.units import GB, MS_PER_S, MW_PER_W, US_PER_MS, US_PER_S  # noqa: F401 (GB: the scripts import it from here)


class _LazyTorch:
    """PyTorch, imported at the first use of one of its names (importing this module, as the CLI
    and the tests do, loads nothing heavy; the measuring needs PyTorch)."""

    def __getattr__(self, name: str):
        import torch as real  # noqa: PLC0415 - deferred on purpose: a heavy third-party library

        globals()["torch"] = real
        return getattr(real, name)


torch = _LazyTorch()


def torch_installed() -> bool:
    """Whether PyTorch can be imported here (without importing it)."""
    return importlib.util.find_spec("torch") is not None

HBM_PEAK_GBPS = 4800.0  # H200 SXM datasheet
BF16_DENSE_PEAK_TFLOPS = 989.4  # H100/H200 SXM datasheet, dense


def log(*a):
    """A progress line, flushed at once (device logs are read while the run goes on)."""
    print(*a, flush=True)
    sys.stdout.flush()


def one_line(e: BaseException) -> str:
    """Exception type and the first line of its message, at most 300 characters (a row's `error`)."""
    msg = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {msg}"[:300]


def run_mode(args) -> str:
    """full, quick or cpu: the key of the sweep files' per-mode axes."""
    return "cpu" if args.cpu else ("quick" if getattr(args, "quick", False) else "full")


class Budget:
    """Wall-clock budget of a run: configurations are not started once it is spent."""

    def __init__(self, seconds: float):
        self.t_start = time.time()
        self.deadline = self.t_start + seconds

    def elapsed_s(self) -> float:
        """Seconds since the run started."""
        return time.time() - self.t_start

    def left_s(self) -> float:
        """Seconds until the deadline (negative once spent)."""
        return self.deadline - time.time()

    def spent(self) -> bool:
        """True once the deadline has passed."""
        return time.time() > self.deadline


# ----------------------------------------------------------------------------- timing

class Timer:
    """Per-operation device timing.

    On CUDA: each repetition is bracketed by a pair of CUDA events. To keep host
    launch latency out of the measured interval, every batch of repetitions is
    preceded by ``torch.cuda._sleep`` so the GPU queue is backed up while the host
    enqueues the batch; the events then measure back-to-back device execution of
    the one kernel (plus the event record itself, well under 1 us).
    On CPU: perf_counter around each call.
    """

    def __init__(self, cuda: bool, batch: int = 48, sleep_cycles: int = 3_000_000, max_reps=None):
        self.cuda = cuda
        self.max_reps = max_reps
        self.batch = batch
        self.sleep_cycles = sleep_cycles

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, fn, reps: int, warmup: int = 3, backlog: bool = True):
        """fn(i) is called once per repetition; returns list of microseconds."""
        if self.max_reps:
            reps = min(reps, self.max_reps)
            warmup = min(warmup, 1)
        for w in range(warmup):
            fn(w)
        self.sync()
        out = []
        if not self.cuda:
            for i in range(reps):
                t0 = time.perf_counter()
                fn(i)
                out.append((time.perf_counter() - t0) * US_PER_S)
            return out
        i = 0
        while i < reps:
            n = min(self.batch, reps - i)
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(n)]
            if backlog:
                torch.cuda._sleep(self.sleep_cycles)
            for j in range(n):
                ev[j][0].record()
                fn(warmup + i + j)
                ev[j][1].record()
            torch.cuda.synchronize()
            out.extend(a.elapsed_time(b) * US_PER_MS for a, b in ev)
            i += n
        return out


def backlog(cycles: int) -> None:
    """Queue a GPU spin of `cycles` clock cycles, so the host can enqueue what follows before the
    device reaches it (the events around the next kernel or replay then see device time only)."""
    torch.cuda._sleep(cycles)


def capture_graph(call, invocations: int, warmup_calls: int = 2, keep_outputs: bool = False):
    """call(i) warmed up `warmup_calls` times on a side stream (lazy init, autotuning and the
    allocator stay out of the capture), then `invocations` calls captured into one CUDA graph.
    Returns the graph and, with keep_outputs, the outputs of the captured calls (each then keeps
    its own memory in the graph's pool; without, a freed output's memory is reused by the next
    invocation, as a decode step reuses its buffers)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(warmup_calls):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    outs = []
    with torch.cuda.graph(graph):
        for i in range(invocations):
            out = call(i)
            if keep_outputs:
                outs.append(out)
            del out
    return graph, outs


def replay_us(graph, backlog_cycles: int = 0, events=None) -> float:
    """Microseconds of one replay between CUDA events, waited for (behind a backlog if given)."""
    e0, e1 = events or (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
    if backlog_cycles:
        backlog(backlog_cycles)
    e0.record()
    graph.replay()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) * US_PER_MS


def queued_replays_us(graph, replays: int, backlog_cycles: int, between=None) -> list:
    """Microseconds of `replays` replays queued back to back behind one backlog, each between its
    own CUDA events; between(), if given, runs on the host after each replay is queued (e.g. fresh
    random indices; it must not synchronize). One wait at the end."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(replays)]
    backlog(backlog_cycles)
    for a, b in events:
        a.record()
        graph.replay()
        b.record()
        if between is not None:
            between()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) * US_PER_MS for a, b in events]


def host_times_us(call, reps: int, warmup: int, sync) -> list:
    """Host microseconds of call(i), each call followed by sync() inside the interval, after
    `warmup` untimed calls and a sync()."""
    for i in range(warmup):
        call(i)
    sync()
    out = []
    for i in range(reps):
        t0 = time.perf_counter()
        call(i)
        sync()
        out.append((time.perf_counter() - t0) * US_PER_S)
    return out


def synced_step_ms(fn, reps, cuda, warmup=3):
    """Each call synchronized (as a serving loop does after sampling): (CUDA-event ms, host ms)
    per call; on the CPU both are host ms."""
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    ev, wall = [], []
    for _ in range(reps):
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            e0.record()
            fn()
            e1.record()
            torch.cuda.synchronize()
            wall.append((time.perf_counter() - t0) * MS_PER_S)
            ev.append(e0.elapsed_time(e1))
        else:
            t0 = time.perf_counter()
            fn()
            wall.append((time.perf_counter() - t0) * MS_PER_S)
            ev.append(wall[-1])
    return ev, wall


def pct(xs, q):
    """The q-th percentile of xs, linearly interpolated (nan for no values)."""
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(us):
    """median, p10, p90 and count of a list of microseconds (a result row's timing columns)."""
    return {"median_us": statistics.median(us), "p10_us": pct(us, 10), "p90_us": pct(us, 90),
            "n_reps": len(us)}


def reps_for(est_us: float, budget_us: float = 150_000.0, lo: int = 20, hi: int = 200) -> int:
    if est_us <= 0:
        return hi
    return int(max(lo, min(hi, budget_us / est_us)))


# ----------------------------------------------------------------------------- output

class CsvOut:
    """Row-wise CSV writer that flushes after every row (partial results survive)."""

    def __init__(self, path, fields):
        self.path = path
        self.fields = list(fields)
        self.f = open(path, "w", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=self.fields, extrasaction="ignore")
        self.w.writeheader()
        self.f.flush()

    def row(self, **kw):
        r = {}
        for k in self.fields:
            v = kw.get(k, "")
            if isinstance(v, float):
                v = f"{v:.6g}"
            r[k] = v
        self.w.writerow(r)
        self.f.flush()

    def close(self):
        self.f.close()


# ----------------------------------------------------------------------------- machine facts

def _run(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return (p.stdout + p.stderr).strip()
    except Exception as e:  # noqa: BLE001
        return f"unavailable: {e!r}"


SMI_FIELDS = ("name,driver_version,pstate,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,"
              "power.draw,power.limit,temperature.gpu,memory.total,memory.used,"
              "clocks_throttle_reasons.active,ecc.mode.current")


def nvidia_smi_snapshot():
    q = _run(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv"])
    if "unavailable" in q or "not a valid field" in q.lower() or "invalid" in q.lower():
        q2 = _run(["nvidia-smi", "--query-gpu=name,driver_version,pstate,clocks.sm,clocks.mem,"
                   "clocks.max.sm,clocks.max.mem,power.draw,temperature.gpu,memory.total",
                   "--format=csv"])
        q = q + "\n--fallback--\n" + q2
    return {"time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(), "query": q}


def machine_facts(cuda: bool):
    f = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "hostname": platform.node(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": getattr(torch.version, "cuda", None),
        "cpu_count": os.cpu_count(),
    }
    try:
        import triton  # noqa: F401
        f["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        f["triton"] = f"unavailable: {e!r}"
    if cuda:
        p = torch.cuda.get_device_properties(0)
        f.update({
            "gpu_name": p.name,
            "sm_count": p.multi_processor_count,
            "compute_capability": f"{p.major}.{p.minor}",
            "total_memory_bytes": p.total_memory,
            "l2_cache_bytes": getattr(p, "L2_cache_size", None),
            "cudnn": torch.backends.cudnn.version(),
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None,
            "device_count": torch.cuda.device_count(),
        })
        for attr in ("max_threads_per_multi_processor", "regs_per_multiprocessor",
                     "shared_memory_per_multiprocessor", "clock_rate", "memory_clock_rate",
                     "memory_bus_width"):
            if hasattr(p, attr):
                f[attr] = getattr(p, attr)
        f["nvidia_smi_L"] = _run(["nvidia-smi", "-L"])
        f["nvcc"] = (_run(["nvcc", "--version"]).splitlines() or [""])[-1]
    return f


class ClockSampler:
    """Samples SM/memory clock and power through NVML in a thread (best effort)."""

    def __init__(self, period_s=0.05):
        self.period = period_s
        self.samples = []
        self._stop = threading.Event()
        self._t = None
        self.ok = False
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nv = pynvml
            self._h = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.ok = True
        except Exception as e:  # noqa: BLE001
            self.err = repr(e)

    def _loop(self):
        nv = self._nv
        while not self._stop.is_set():
            try:
                sm = nv.nvmlDeviceGetClockInfo(self._h, nv.NVML_CLOCK_SM)
                mem = nv.nvmlDeviceGetClockInfo(self._h, nv.NVML_CLOCK_MEM)
                pw = nv.nvmlDeviceGetPowerUsage(self._h) / MW_PER_W
                self.samples.append((time.time(), sm, mem, pw))
            except Exception:  # noqa: BLE001
                pass
            time.sleep(self.period)

    def start(self):
        if self.ok:
            self.samples = []
            self._stop.clear()
            self._t = threading.Thread(target=self._loop, daemon=True)
            self._t.start()
        return self

    def stop(self):
        if not self.ok or self._t is None:
            return {"available": False, "error": getattr(self, "err", "")}
        self._stop.set()
        self._t.join()
        s = self.samples
        if not s:
            return {"available": True, "n": 0}
        sm = [x[1] for x in s]
        mem = [x[2] for x in s]
        pw = [x[3] for x in s]
        return {"available": True, "n": len(s), "sm_mhz_min": min(sm), "sm_mhz_median": statistics.median(sm),
                "sm_mhz_max": max(sm), "mem_mhz_median": statistics.median(mem),
                "power_w_median": statistics.median(pw), "power_w_max": max(pw)}


def write_json(path, obj):
    """A summary or machine-facts file (rewritten whole, so a cut run keeps the last one)."""
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=2, default=str)
