#!/usr/bin/env python3
"""Energy microbenchmarks of the kernel classes on one GPU (an H200): the energy fit's input.

Each row is one shape of one class, repeated back to back for ``--window-s`` seconds (>= 1 s:
many updates of NVML's energy counter, see meter.py), at a duty cycle: one repetition is a
CUDA-graph replay of the work (a few ms) followed, below duty 1, by ``torch.cuda._sleep`` for
(1 - duty) / duty of the work's time, so the same kernels give many average powers and
static power separates from energy per byte and per FLOP. Classes:

* ``idle``: nothing queued (before everything and after everything): the lower bound.
* ``spin``: back-to-back ``torch.cuda._sleep`` (one block spinning): clocks up, no traffic.
* ``hbm_copy``: ``dst.copy_(src)`` of 128 MiB to 2 GiB (read + write from HBM; src + dst are
  larger than the 60 MiB L2); ``hbm_read``: ``torch.sum`` over 256 MiB to 4 GiB.
* ``l2_copy`` / ``l2_read``: the same over 8 MiB buffers replayed many times (L2-resident).
* ``gemm_bf16``: ``torch.matmul`` bf16 square 4096/8192 and decode-like skinny shapes
  (M = 64, 256 against K = 8192, N = 28672: memory-bound); ``gemm_fp8``: ``torch._scaled_mm``
  e4m3 with per-tensor scales, the same shapes.

Bytes are the kernels' minimum HBM traffic (inputs read once, outputs written once); L2 bytes
for the L2-resident rows; FLOPs are 2 M N K. Nothing here is fitted: fit.py reads the CSV.

Writes into --out: energy_bench.csv (one row per window), energy_bench_meta.json (machine,
counter tick period, _sleep rate, arguments).

Device:  python3 calibration/energy/bench.py --out $OUT
Smoke:   python3 calibration/energy/bench.py --quick --out /tmp/eb   (tiny sizes, short windows)
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # calibration/: harness, sweep

import torch  # noqa: E402
from harness import capture_graph  # noqa: E402
from sweep import axis  # noqa: E402

from meter import Meter  # noqa: E402

MiB = 1 << 20
FIELDS = ["name", "kind", "dtype", "m", "n", "k", "size_bytes", "duty", "reps", "device_s", "t_rep_s",
          "work_s", "avg_W", "power_samples_W", "energy_J", "energy_rep_J", "hbm_bytes", "l2_bytes",
          "flops_bf16", "flops_fp8", "kernels", "ticks", "tick_span_s", "window_s", "meter",
          "sm_MHz", "mem_MHz", "temp_C", "power_limit_W", "error"]


class Bench:
    def __init__(self, args):
        self.args = args
        self.meter = Meter()
        self.rows: list[dict] = []
        self.path = os.path.join(args.out, "energy_bench.csv")
        self.fh = open(self.path, "w", newline="")
        self.writer = csv.DictWriter(self.fh, fieldnames=FIELDS)
        self.writer.writeheader()
        self.sleep_ns_per_cycle = None

    def emit(self, row: dict):
        row.update({k: v for k, v in self.meter.state().items() if k not in row})
        self.rows.append(row)
        self.writer.writerow({k: row.get(k) for k in FIELDS})
        self.fh.flush()
        print(f"{row['name']:<34} duty {row.get('duty', ''):<5} {row.get('avg_W', float('nan')):7.1f} W "
              f"t_rep {row.get('t_rep_s', 0) * 1e3:8.3f} ms  E_rep {row.get('energy_rep_J', 0):9.5f} J "
              f"ticks {row.get('ticks')} {row.get('error') or ''}", flush=True)

    # -- helpers ------------------------------------------------------------------------
    def calibrate_sleep(self):
        cycles = 2_000_000
        torch.cuda._sleep(cycles)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(5):
            torch.cuda._sleep(cycles)
        b.record()
        b.synchronize()
        self.sleep_ns_per_cycle = a.elapsed_time(b) * 1e6 / (5 * cycles)

    def graph_of(self, fn, inner: int):
        """A CUDA graph of ``inner`` calls of fn (warmed up first)."""
        g, _ = capture_graph(lambda i: fn(), inner, warmup_calls=2)
        torch.cuda.synchronize()
        return g

    def axis(self, section, name):
        """One axis of the energy sweep at this run's mode (calibration/sweeps/energy.yaml)."""
        return axis("energy", section, name, "quick" if self.args.quick else "full")

    def work_time(self, g, reps: int = 5) -> float:
        g.replay()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3 / reps

    def window(self, name, kind, g, inner, duties, work: dict, **meta):
        """Rows of graph ``g`` (``inner`` kernels of ``work`` each) at each duty cycle."""
        try:
            t_work = self.work_time(g)
        except Exception as e:  # noqa: BLE001
            self.emit({"name": name, "kind": kind, "error": repr(e)[:200], **meta})
            return
        for duty in duties:
            cycles = 0
            if duty < 1:
                cycles = int(t_work * (1 - duty) / duty * 1e9 / self.sleep_ns_per_cycle)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

            def enqueue():
                g.replay()
                if cycles:
                    torch.cuda._sleep(cycles)
                return 1

            torch.cuda.synchronize()
            a.record()
            try:
                row = self.meter.measure(enqueue, lambda: (b.record(), b.synchronize()), self.args.window_s)
            except Exception as e:  # noqa: BLE001
                self.emit({"name": name, "kind": kind, "duty": duty, "error": repr(e)[:200], **meta})
                continue
            device_s = a.elapsed_time(b) / 1e3
            reps = row["reps"]
            t_rep = device_s / reps
            energy = row["avg_W"] * device_s
            out = {"name": name, "kind": kind, "duty": duty, "device_s": device_s, "t_rep_s": t_rep,
                   "work_s": t_work, "energy_J": energy, "energy_rep_J": energy / reps,
                   "kernels": inner + (1 if cycles else 0), **row, **meta}
            for key in ("hbm_bytes", "l2_bytes", "flops_bf16", "flops_fp8"):
                out[key] = inner * work.get(key, 0)
            self.emit(out)

    # -- classes ------------------------------------------------------------------------
    def idle(self, name):
        torch.cuda.synchronize()
        row = self.meter.idle(self.args.idle_s)
        row.update(name=name, kind="idle", duty=0.0, device_s=0.0, t_rep_s=0.0, energy_J=row["avg_W"] * row["window_s"],
                   hbm_bytes=0, l2_bytes=0, flops_bf16=0, flops_fp8=0, kernels=0)
        self.emit(row)

    def spin(self, name):
        cycles = int(2e6 / self.sleep_ns_per_cycle)  # ~2 ms per kernel
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        row = self.meter.measure(lambda: (torch.cuda._sleep(cycles), 1)[1], lambda: (b.record(), b.synchronize()),
                                 self.args.window_s)
        device_s = a.elapsed_time(b) / 1e3
        row.update(name=name, kind="spin", duty=0.0, device_s=device_s, t_rep_s=device_s / row["reps"],
                   energy_J=row["avg_W"] * device_s, energy_rep_J=row["avg_W"] * device_s / row["reps"],
                   hbm_bytes=0, l2_bytes=0, flops_bf16=0, flops_fp8=0, kernels=1)
        self.emit(row)

    def memory(self):
        copy_sizes = self.axis("memory", "copy_sizes_bytes")
        read_sizes = self.axis("memory", "read_sizes_bytes")
        duties = self.axis("memory", "duties")
        for size in copy_sizes:
            src = torch.empty(size // 2, dtype=torch.bfloat16, device="cuda").normal_()
            dst = torch.empty_like(src)
            inner = max(1, int(4e-3 * 4.0e12 / (2 * size)))  # ~4 ms of work per replay
            g = self.graph_of(lambda: dst.copy_(src), inner)
            self.window(f"hbm_copy_{size // MiB}MiB", "hbm_copy", g, inner, duties,
                        {"hbm_bytes": 2 * size}, size_bytes=size, dtype="bf16")
            del g, src, dst
            torch.cuda.empty_cache()
        for size in read_sizes:
            x = torch.empty(size // 2, dtype=torch.bfloat16, device="cuda").normal_()
            inner = max(1, int(4e-3 * 4.0e12 / size))
            g = self.graph_of(lambda: x.sum(), inner)
            self.window(f"hbm_read_{size // MiB}MiB", "hbm_read", g, inner, duties[:2],
                        {"hbm_bytes": size}, size_bytes=size, dtype="bf16")
            del g, x
            torch.cuda.empty_cache()
        size = self.axis("memory", "l2_size_bytes")
        src = torch.empty(size // 2, dtype=torch.bfloat16, device="cuda").normal_()
        dst = torch.empty_like(src)
        inner = self.axis("memory", "l2_calls_per_replay")
        g = self.graph_of(lambda: dst.copy_(src), inner)
        self.window(f"l2_copy_{size // MiB}MiB", "l2_copy", g, inner, duties[:2], {"l2_bytes": 2 * size},
                    size_bytes=size, dtype="bf16")
        g = self.graph_of(lambda: src.sum(), inner)
        self.window(f"l2_read_{size // MiB}MiB", "l2_read", g, inner, duties[:2], {"l2_bytes": size},
                    size_bytes=size, dtype="bf16")
        del g, src, dst
        torch.cuda.empty_cache()

    def gemms(self):
        shapes = self.axis("gemms", "MNK")
        duties_sq = self.axis("gemms", "duties_square")
        for dtype in self.axis("gemms", "dtypes"):
            for m, n, k in shapes:
                name = f"gemm_{dtype}_{m}x{n}x{k}"
                try:
                    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)  # weight [N, K]
                    if dtype == "bf16":
                        fn = lambda a=a, w=w: torch.matmul(a, w.t())  # noqa: E731
                        esize = 2
                    else:
                        a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
                        one = torch.ones((), device="cuda")
                        fn = lambda a8=a8, w8=w8, one=one: torch._scaled_mm(  # noqa: E731
                            a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                        esize = 1
                    flops = 2 * m * n * k
                    t_est = max(flops / (6e14 if dtype == "bf16" else 1.1e15), (m * k + n * k) * esize / 4e12)
                    inner = max(1, int(4e-3 / t_est))
                    g = self.graph_of(fn, inner)
                except Exception as e:  # noqa: BLE001
                    self.emit({"name": name, "kind": f"gemm_{dtype}", "error": repr(e)[:200]})
                    continue
                work = {"hbm_bytes": (m * k + n * k) * esize + m * n * 2, f"flops_{dtype}": flops}
                self.window(name, f"gemm_{dtype}", g, inner, duties_sq if m >= 4096 else [1.0, 0.5], work,
                            m=m, n=n, k=k, dtype=dtype)
                del g
                torch.cuda.empty_cache()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="tiny sizes and short windows (smoke run)")
    p.add_argument("--window-s", type=float, default=None)
    p.add_argument("--idle-s", type=float, default=None)
    args = p.parse_args(argv)
    args.window_s = args.window_s or (0.4 if args.quick else 1.0)
    args.idle_s = args.idle_s or (0.5 if args.quick else 2.5)
    os.makedirs(args.out, exist_ok=True)
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    b = Bench(args)
    meta = {"args": vars(args), "meter": b.meter.kind, "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "tick_period_s": b.meter.tick_period_s(), "state_start": b.meter.state()}
    b.calibrate_sleep()
    meta["sleep_ns_per_cycle"] = b.sleep_ns_per_cycle
    b.idle("idle_start")
    b.spin("spin_start")
    b.memory()
    b.gemms()
    b.spin("spin_end")
    b.idle("idle_end")
    meta["state_end"] = b.meter.state()
    with open(os.path.join(args.out, "energy_bench_meta.json"), "w") as fh:
        json.dump(meta, fh, indent=1, default=str)
    b.fh.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
