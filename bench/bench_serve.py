"""Serving replay speed: an hour of the Azure 2023 conversation trace, end to end.

Run: ``python bench/bench_serve.py`` (options: ``--requests azure-code``, ``--rate-scale K``,
``--duration-s S``, ``--kv FMT``, ``--out DIR`` to also stream the per-step and per-request
Parquet tables, ``--json FILE``). It replays the full trace (19,366 requests over 3,502 s)
for llama-3-8b (bf16 weights, fp16 KV) on one h200-sxm with chunked prefill, and prints the
wall time, peak memory (tracemalloc's peak of Python allocations, and the process's maximum
resident set size from ``resource.getrusage``), simulated steps and steps per wall second.

The aim (issue 16): under 2 minutes on one core and under 1 GB of memory, independent of
trace length (the replay keeps live requests, a few numbers per finished request and per
step, and streams its tables to Parquet in row groups). Issue 40's aims: ``--duration-s 3600``
of llama-3-8b in <= 30 s and an hour of a Mixture-of-Experts model (``--model mixtral-8x7b``,
its steps' expert loads from the live routing, sim.moe.live) in <= 120 s; ``--model``,
``--hardware``, ``--weights`` and ``--set`` (run fields such as ``placement=spread``) pick it.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
import tracemalloc

from sim.serve.replay import serve
from sim.serve.spec import ServeSpec


def measure(spec: ServeSpec, out_dir: str | None, trace_memory: bool) -> dict:
    """Replay ``spec`` once; wall time, memory and throughput of the simulator itself."""
    if trace_memory:
        tracemalloc.start()
    t0 = time.perf_counter()
    summary = serve(spec, out_dir)
    wall = time.perf_counter() - t0
    peak_traced = tracemalloc.get_traced_memory()[1] if trace_memory else None
    if trace_memory:
        tracemalloc.stop()
    maxrss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"requests": spec.requests, "kv": spec.kv, "rate_scale": spec.rate_scale, "duration_s": spec.duration_s,
            "requests_done": summary["requests_done"], "steps": summary["steps"], "simulated_s": summary["simulated_s"],
            "wall_s": wall, "steps_per_s": summary["steps"] / wall,
            "peak_traced_MB": peak_traced / 1e6 if peak_traced is not None else None,
            "max_rss_MB": maxrss_kib * 1024 / 1e6, "tpot_ms_p99": summary["tpot_ms_p99"],
            "ttft_ms_p99": summary["ttft_ms_p99"], "mean_batch": summary["mean_batch"],
            "step_model": summary.get("step_model"), "moe": summary.get("moe")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", default="azure-conv")
    parser.add_argument("--kv", default="fp16")
    parser.add_argument("--rate-scale", type=float, default=None)
    parser.add_argument("--duration-s", type=float, default=None, help="replay only arrivals before this (default all)")
    parser.add_argument("--out", default=None, help="also write steps.parquet and requests.parquet here")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="also trace Python allocations (slows the replay several times; maxrss is always reported)")
    parser.add_argument("--json", default=None, help="also write the row as JSON here")
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--hardware", default="h200-sxm")
    parser.add_argument("--weights", default="bf16")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="a run field or profile override, as `decodesim serve --set`")
    args = parser.parse_args(argv)
    spec = ServeSpec(requests=args.requests, kv=args.kv, rate_scale=args.rate_scale, duration_s=args.duration_s,
                     model=args.model, hardware=args.hardware, weights=args.weights, overrides=tuple(args.overrides))
    row = measure(spec, args.out, args.tracemalloc)
    print(f"python {platform.python_version()} on {platform.machine()}; {row['requests']} x{row['rate_scale'] or 1:g}, "
          f"KV {row['kv']}, {args.model} ({args.weights}) on {args.hardware}, chunked prefill"
          + (f", {' '.join(args.overrides)}" if args.overrides else ""))
    print(f"  {row['requests_done']} requests, {row['steps']} steps, {row['simulated_s']:.0f} s simulated")
    print(f"  wall {row['wall_s']:.1f} s ({row['steps_per_s']:.0f} steps/s)"
          + (f", peak traced {row['peak_traced_MB']:.0f} MB" if row["peak_traced_MB"] is not None else "")
          + f", max RSS {row['max_rss_MB']:.0f} MB")
    print(f"  p99 TPOT {row['tpot_ms_p99']:.2f} ms, p99 TTFT {row['ttft_ms_p99']:.1f} ms, "
          f"mean batch {row['mean_batch']:.1f}; step model {row['step_model']}")
    if row["moe"]:
        print(f"  experts: {row['moe']}")
    aim = 30.0 if args.model == "llama-3-8b" else 120.0 if row["moe"] else None
    if aim is not None and (args.duration_s or 0) >= 3600:
        print(f"  issue 40's aim, an hour in <= {aim:.0f} s: {'met' if row['wall_s'] <= aim else 'NOT met'} "
              f"({row['wall_s']:.1f} s wall)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(row, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
