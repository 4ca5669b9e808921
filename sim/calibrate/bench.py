"""The microbenchmarks of ``decodesim calibrate``: one GPU, through PyTorch (CUDA or ROCm).

Each section times one kind of figure a hardware profile holds, as the sweep
(sim/calibrate/sweeps.yaml) lists it for the run mode:

* ``overheads``: host time of an eager kernel launch behind a busy device, the per-kernel time inside
  a CUDA graph replay, a graph launch, an idle ``synchronize()`` and a 4-byte ``.item()``;
* ``hbm``: ``torch.sum`` and ``copy_`` over HBM-cold buffers (a stream and its start-up);
* ``l2``: a buffer re-read inside one graph (the L2's rate);
* ``classes``: the kernel classes of sim/kernel_classes.py (element-wise, cast, copy, row
  reduction, gather) over sizes of the main operand;
* ``gemm``: bf16 ``F.linear`` at decode batch sizes over decode-shaped weights;
* ``sdpa``: decode SDPA over a KV cache (the default backend);
* ``peak``: square bf16 matmuls (the matrix unit's rate), with NVML power samples.

Timing (the house method, calibration/README.md): R invocations captured in one CUDA graph,
inputs rotated over copies so that one replay reads at least twice the L2 where the size allows
(``hbm_cold``), the median of several replays divided by R. Rows go to one CSV as they come;
a configuration that fails records its error and the run goes on. Units: microseconds in the
CSV (``median_us``), bytes, FLOPs.
"""

from __future__ import annotations

import math
import statistics
import time

from sim.calibrate.harness import ClockSampler, CsvOut, capture_graph, log, one_line, queued_replays_us, torch
from sim.units import MW_PER_W, US_PER_MS, US_PER_S

FIELDS = ("section", "impl", "kclass", "config_id", "size_bytes", "bytes_read", "bytes_written", "rows", "M", "N", "K",
          "B", "L", "flops", "hbm_cold", "invocations", "copies", "median_us", "p10_us", "p90_us", "error")
KiB, MiB = 1024, 1024 * 1024


class Bench:
    """One calibration run on device 0: the sweep for its mode, the CSV it writes, the L2 size
    that decides which rows are HBM-cold."""

    def __init__(self, sweep: dict, mode: str, csv_path, budget_s: float):
        self.sweep, self.mode = sweep, mode
        self.cuda = mode != "cpu"  # cpu: a plumbing check of every code path (numbers mean nothing)
        self.dev = "cuda" if self.cuda else "cpu"
        self.csv = CsvOut(csv_path, FIELDS)
        self.deadline = time.time() + budget_s
        props = torch.cuda.get_device_properties(0) if self.cuda else None
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or (50 if self.cuda else 1) * MiB)
        self.pool = self.at("pool_MiB") * MiB
        self.replay_us = float(self.at("replay_us"))
        self.replays = int(self.at("replays"))
        self.power: dict = {}
        self.rows = 0

    def at(self, key: str, section: str | None = None):
        """The sweep value ``key`` (of ``section``) for this run mode."""
        node = self.sweep[section][key] if section else self.sweep[key]
        return node[self.mode] if isinstance(node, dict) and self.mode in node else node

    def left(self) -> bool:
        return time.time() < self.deadline

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def free(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()

    # -- timing ---------------------------------------------------------------------------

    def copies_for(self, nbytes: int) -> int:
        """Input copies to rotate over: enough to read twice the L2 per pass, within the pool."""
        want = math.ceil(2 * self.l2_bytes / max(nbytes, 1))
        return int(max(1, min(want, self.pool // max(nbytes, 1), 4096)))

    def time_graph(self, call, est_us: float, copies: int) -> dict:
        """call(i) captured R times in one graph (R for a replay of ``replay_us``); per-call
        median/p10/p90 of the replays."""
        reps = int(min(max(self.replay_us / max(est_us, 0.5), 8), 4000))
        reps = max(reps, min(copies, 4000))
        if not self.cuda:  # plumbing: each call timed on the host
            us = sorted(_host_us(call, i) for i in range(min(reps, 3)))
            return {"median_us": statistics.median(us), "p10_us": us[0], "p90_us": us[-1], "invocations": len(us)}
        graph, _ = capture_graph(call, reps, warmup_calls=2)
        graph.replay()
        self.sync()
        us = sorted(t / reps for t in queued_replays_us(graph, self.replays, backlog_cycles=2_000_000))
        del graph
        return {"median_us": statistics.median(us), "p10_us": us[len(us) // 10], "p90_us": us[-1 - len(us) // 10],
                "invocations": reps}

    def row(self, section: str, impl: str, kclass: str, call, est_us: float, copies: int, **facts) -> None:
        """Time one configuration and write its row (its error instead, if it fails)."""
        config_id = f"{section}:{impl}:" + ":".join(f"{k}={v}" for k, v in facts.items() if k not in ("flops",))
        base = dict(section=section, impl=impl, kclass=kclass, config_id=config_id, copies=copies, **facts)
        cold = copies * (facts.get("bytes_read", 0) + facts.get("bytes_written", 0)) >= 2 * self.l2_bytes
        try:
            timing = self.time_graph(call, est_us, copies)
            self.csv.row(**base, **timing, hbm_cold=cold)
        except Exception as err:  # noqa: BLE001 - one configuration's failure is its row's error
            self.csv.row(**base, hbm_cold=cold, error=one_line(err))
            self.sync()
        self.rows += 1

    # -- sections -------------------------------------------------------------------------

    def overheads(self) -> None:
        """Launch, graph, sync and D2H overheads (rows in microseconds per call; a GPU's only)."""
        if not self.cuda:
            return
        x = torch.zeros(16, device=self.dev)
        n = int(self.at("launches", "overheads"))
        for _ in range(3):
            x.add_(1)
        self.sync()
        samples = []
        for _ in range(5):
            torch.cuda._sleep(200_000_000)  # keep the device busy: the host never waits
            t0 = time.perf_counter()
            for _ in range(n):
                x.add_(1)
            samples.append((time.perf_counter() - t0) * US_PER_S / n)
            self.sync()
        self._host_row("launch_eager", samples)
        k = int(self.at("graph_kernels", "overheads"))
        graph, _ = capture_graph(lambda i: x.add_(1), k)
        us = queued_replays_us(graph, self.replays, backlog_cycles=2_000_000)
        self._host_row("graph_per_kernel", [t / k for t in us])
        one, _ = capture_graph(lambda i: x.add_(1), 1)
        one.replay()
        self.sync()
        launch = []
        for _ in range(200):
            t0 = time.perf_counter()
            one.replay()
            launch.append((time.perf_counter() - t0) * US_PER_S)
            self.sync()
        self._host_row("graph_launch", launch)
        syncs = []
        for _ in range(int(self.at("syncs", "overheads"))):
            t0 = time.perf_counter()
            self.sync()
            syncs.append((time.perf_counter() - t0) * US_PER_S)
        self._host_row("sync_idle", syncs)
        items = []
        for _ in range(500):
            t0 = time.perf_counter()
            x[0].item()
            items.append((time.perf_counter() - t0) * US_PER_S)
        self._host_row("item_d2h", items)

    def _host_row(self, impl: str, us: list) -> None:
        us = sorted(us)
        self.csv.row(section="overheads", impl=impl, kclass="host", config_id=f"overheads:{impl}", median_us=statistics.median(us),
                     p10_us=us[len(us) // 10], p90_us=us[-1 - len(us) // 10], invocations=len(us))
        self.rows += 1

    def hbm(self) -> None:
        """Streams from HBM: torch.sum (read) and copy_ (read + write)."""
        for mib in self.at("sizes_MiB", "hbm"):
            if not self.left():
                return
            size = mib * MiB
            copies = max(2, min(self.pool // size, 8))
            xs = [torch.randn(size // 2, device=self.dev, dtype=torch.bfloat16) for _ in range(copies)]
            self.row("hbm", "read_sum", "reduction", lambda i, xs=xs, copies=copies: xs[i % copies].sum(dtype=torch.float32),
                     size / 3e6, copies, size_bytes=size, bytes_read=size, bytes_written=4, rows=1)
            out = torch.empty_like(xs[0])
            self.row("hbm", "copy", "copy", lambda i, xs=xs, out=out, copies=copies: out.copy_(xs[i % copies]), 2 * size / 3e6, copies,
                     size_bytes=size, bytes_read=size, bytes_written=size)
        self.free()

    def l2(self) -> None:
        """L2-resident re-reads: one buffer read again and again inside one graph."""
        for mib in self.at("sizes_MiB", "l2"):
            size = mib * MiB
            x = torch.randn(size // 2, device=self.dev, dtype=torch.bfloat16)
            out = torch.empty(size // 4, device=self.dev, dtype=torch.bfloat16)
            self.row("l2", "read_sum", "reduction", lambda i, x=x: x.sum(dtype=torch.float32), size / 6e6, 1,
                     size_bytes=size, bytes_read=size, bytes_written=4, rows=1)
            self.row("l2", "copy_half", "copy", lambda i, x=x, out=out, n=size // 4: out.copy_(x[:n]), size / 6e6, 1,
                     size_bytes=size // 2, bytes_read=size // 2, bytes_written=size // 2)

    def classes(self) -> None:
        """The kernel classes over the sweep's sizes."""
        width = int(self.sweep["classes"]["row_width"])
        for kib in self.at("sizes_KiB", "classes"):
            for kclass, impls in self.sweep["classes"]["impls"].items():
                for impl in impls:
                    if not self.left():
                        return
                    self.class_row(kclass, impl, kib * KiB, width)
            self.free()

    def class_row(self, kclass: str, impl: str, size: int, width: int) -> None:
        """One kernel-class configuration: its inputs (rotated copies), call and bytes."""
        copies = self.copies_for(size)
        est = 3.0 + size / 3e6
        if impl == "cast_fp32_bf16":
            xs = [torch.randn(max(size // 4, 1), device=self.dev) for _ in range(copies)]
            call, facts = (lambda i: xs[i % copies].to(torch.bfloat16)), dict(bytes_read=size, bytes_written=size // 2)
        elif impl in ("add", "mul", "silu", "copy_"):
            n = max(size // 2, 1)
            xs = [torch.randn(n, device=self.dev, dtype=torch.bfloat16) for _ in range(copies)]
            ys = [torch.randn(n, device=self.dev, dtype=torch.bfloat16) for _ in range(copies)] if impl == "add" else xs
            out = torch.empty(n, device=self.dev, dtype=torch.bfloat16)
            ops = {"add": lambda i: xs[i % copies] + ys[i % copies], "mul": lambda i: xs[i % copies] * 1.5,
                   "silu": lambda i: torch.nn.functional.silu(xs[i % copies]),
                   "copy_": lambda i, xs=xs, out=out, copies=copies: out.copy_(xs[i % copies])}
            call = ops[impl]
            facts = dict(bytes_read=size * (2 if impl == "add" else 1), bytes_written=size)
        elif impl == "reduce_sum":
            rows = max(size // (2 * width), 1)
            xs = [torch.randn(rows, width, device=self.dev, dtype=torch.bfloat16) for _ in range(copies)]
            call, facts = (lambda i: xs[i % copies].sum(-1)), dict(bytes_read=rows * width * 2, bytes_written=rows * 2,
                                                                   rows=rows)
        else:  # index_select: rows of a table much larger than the L2
            rows = max(size // (2 * width), 1)
            table = torch.randn(max(4 * self.l2_bytes // (2 * width), rows * 4), width, device=self.dev, dtype=torch.bfloat16)
            idx = [torch.randint(0, table.shape[0], (rows,), device=self.dev) for _ in range(8)]
            copies = 8
            call = lambda i: table.index_select(0, idx[i % 8])  # noqa: E731
            facts = dict(bytes_read=rows * width * 2, bytes_written=rows * width * 2, rows=rows)
        self.row("classes", impl, kclass, call, est, copies, size_bytes=size, **facts)

    def gemm(self) -> None:
        """bf16 F.linear at decode batch sizes (weights rotated: read from HBM)."""
        for n, k in self.at("shapes", "gemm"):
            wbytes = n * k * 2
            copies = max(1, min(self.copies_for(wbytes), self.pool // wbytes))
            ws = [torch.randn(n, k, device=self.dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
            for m in self.at("M", "gemm"):
                if not self.left():
                    return
                x = torch.randn(m, k, device=self.dev, dtype=torch.bfloat16)
                self.row("gemm", "F.linear", "matrix", lambda i, x=x, ws=ws, copies=copies: torch.nn.functional.linear(x, ws[i % copies]),
                         5 + wbytes / 3e6, copies, size_bytes=wbytes, bytes_read=wbytes + m * k * 2,
                         bytes_written=m * n * 2, M=m, N=n, K=k, flops=2 * m * n * k)
            del ws
            self.free()

    def sdpa(self) -> None:
        """Decode SDPA, one query token per sequence, GQA, the default backend."""
        hq, hkv, d = self.sweep["sdpa"]["heads"]
        for b in self.at("batch", "sdpa"):
            for ctx in self.at("context", "sdpa"):
                if not self.left():
                    return
                kv = 2 * b * hkv * ctx * d * 2
                if kv > self.pool * 2:
                    continue
                copies = max(1, min(self.copies_for(kv), (self.pool * 2) // kv))
                ks = [torch.randn(b, hkv, ctx, d, device=self.dev, dtype=torch.bfloat16) for _ in range(copies)]
                vs = [torch.randn(b, hkv, ctx, d, device=self.dev, dtype=torch.bfloat16) for _ in range(copies)]
                q = torch.randn(b, hq, 1, d, device=self.dev, dtype=torch.bfloat16)
                sdpa = torch.nn.functional.scaled_dot_product_attention
                self.row("sdpa", "sdpa", "attention",
                         lambda i, q=q, ks=ks, vs=vs, copies=copies, sdpa=sdpa: sdpa(q, ks[i % copies], vs[i % copies], enable_gqa=True), 8 + kv / 3e6, copies,
                         size_bytes=kv, bytes_read=kv + q.numel() * 2, bytes_written=q.numel() * 2, B=b, L=ctx,
                         flops=4 * b * hq * ctx * d)
                self.free()

    def peak(self) -> None:
        """Square bf16 matmuls, with NVML power and clocks sampled while they run."""
        sampler = ClockSampler().start()
        for n in self.at("n", "peak"):
            a = torch.randn(n, n, device=self.dev, dtype=torch.bfloat16)
            b = torch.randn(n, n, device=self.dev, dtype=torch.bfloat16)
            reps = int(self.at("reps", "peak"))
            for _ in range(3):
                a @ b
            self.sync()
            if self.cuda:
                ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
                for e0, e1 in ev:
                    e0.record()
                    a @ b
                    e1.record()
                self.sync()
                us = sorted(e0.elapsed_time(e1) * US_PER_MS for e0, e1 in ev)
            else:
                us = sorted(_host_us(lambda i, a=a, b=b: a @ b, i) for i in range(min(reps, 3)))
            self.csv.row(section="peak", impl="matmul", kclass="matrix", config_id=f"peak:matmul:n={n}", M=n, N=n, K=n,
                         flops=2 * n ** 3, bytes_read=4 * n * n, bytes_written=2 * n * n,
                         median_us=statistics.median(us), p10_us=us[len(us) // 10], p90_us=us[-1 - len(us) // 10],
                         invocations=reps)
            self.rows += 1
        self.power["matmul"] = sampler.stop()

    def idle_power(self) -> None:
        """NVML power with nothing queued (1 s of samples) and the enforced power limit."""
        self.sync()
        sampler = ClockSampler(period_s=0.05).start()
        time.sleep(1.0)
        self.power["idle"] = sampler.stop()
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.power["limit_w"] = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / MW_PER_W
        except Exception as err:  # noqa: BLE001 - power is read where it can be
            self.power["limit_error"] = one_line(err)


def _host_us(call, i: int) -> float:
    t0 = time.perf_counter()
    call(i)
    return (time.perf_counter() - t0) * US_PER_S


SECTIONS = ("overheads", "hbm", "l2", "classes", "gemm", "sdpa", "peak")


def run(sweep: dict, mode: str, csv_path, budget_s: float, only: tuple[str, ...] = SECTIONS) -> dict:
    """Run the sections (cheapest first) on device 0; returns per-section seconds, errors and power."""
    bench = Bench(sweep, mode, csv_path, budget_s)
    bench.idle_power()
    seconds, failed = {}, {}
    for name in only:
        t0 = time.time()
        try:
            getattr(bench, name)()
        except Exception as err:  # noqa: BLE001 - a section that breaks costs only its rows
            failed[name] = one_line(err)
            log(f"calibrate: section {name} failed: {failed[name]}")
        seconds[name] = round(time.time() - t0, 1)
        log(f"calibrate: {name} done in {seconds[name]} s ({bench.rows} rows so far)")
        bench.free()
    bench.csv.close()
    return {"seconds": seconds, "failed": failed, "power": bench.power, "rows": bench.rows,
            "l2_bytes": bench.l2_bytes, "truncated_by_budget": not bench.left()}
