"""Simulator speed: simulated decode steps per wall second, against bare SimPy in the same run.

Run: ``python bench/bench_speed.py`` (add ``--steps N``, ``--repeats N``, ``--json FILE``; pin to one core
with ``taskset -c 0 python bench/bench_speed.py``). It first measures bare SimPy (a process
yielding timeouts) so every figure can be read as a ratio to what SimPy itself can do on
this machine, then simulates llama-3-8b (bf16) and llama-3-70b (int8) at batch 16, context
1k and 32k, on h200-sxm with the DES engine and the analytic model; then the milliseconds
per configuration in-process (``simulate(steps=1)`` of llama-3-8b at batches no run of the
process has used, and at batches run before, whose costs are memoised), the wall
time of a cached re-run of a bundled study (``python -m sim study hbm-bandwidth-what-if --out
DIR`` run twice: the second finds every point cached) and the CPU time of one ``decodesim run
--steps 1`` process (start-up included).

``ops/s / bare`` is a row's ops per wall second over bare SimPy's events per second: what a
simulated op costs against one SimPy event (above 1 when single-stream ops pay no event).
Events per step must not grow with context length or model bytes (they grow with ops).
Aims (issue 26): >= 5,000 llama-3-8b DES steps/s at batch 16 on one core (>= 3x bare
SimPy's rate per op), <= 1 ms per configuration in-process, a cached study re-run <= 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

import simpy

from sim.run import simulate

try:
    from sim.costs import forget_cost_models
except ImportError:  # a tree from before runs shared their cost model: each run made its own
    def forget_cost_models() -> None:
        pass

CASES = [("llama-3-8b", "bf16"), ("llama-3-70b", "int8")]


def bare_simpy(events: int = 300_000, repeats: int = 3) -> float:
    """Timeouts per second of a bare SimPy process (the ceiling for any SimPy model), the
    best of ``repeats`` runs."""
    def proc(env):
        for _ in range(events):
            yield env.timeout(1.0)

    best = float("inf")
    for _ in range(repeats):
        env = simpy.Environment()
        env.process(proc(env))
        start = time.perf_counter()
        env.run()
        best = min(best, time.perf_counter() - start)
    return events / best


def measure(model: str, weights: str, context: int, steps: int, engine: str = "des", repeats: int = 3) -> dict:
    """Simulate ``steps`` steps ``repeats`` times, each without the cost memos of the runs before
    it; the row keeps the fastest (the least disturbed by whatever else the machine did, as timeit
    does)."""
    kw = dict(model=model, weights=weights, batch=16, context=context, engine=engine, check_capacity=False)
    simulate(steps=2, **kw)  # warm caches and imports
    wall = float("inf")
    for _ in range(repeats):
        forget_cost_models()  # each run pays for its own costs, as a run in a new process does
        t0 = time.perf_counter()
        result = simulate(steps=steps, **kw)
        wall = min(wall, time.perf_counter() - t0)
    s = result.summary
    return {"model": model, "weights": weights, "context": context, "engine": engine, "steps": steps,
            "wall_s": wall, "steps_per_s": steps / wall, "events_per_step": s["events"] / steps,
            "ops_per_step": result.steps[0]["ops"], "kernels_per_step": result.steps[0]["kernels"],
            "per_token_ms": s["per_token_ms_p50"]}


def ms_per_configuration(repeats: int = 3, points: int = 32) -> tuple[float, float]:
    """Milliseconds per ``simulate(steps=1)`` of llama-3-8b in this process (what a study or a
    search pays per point), the best of ``repeats`` sweeps of ``points`` batches after one warm-up
    sweep over batch 1..points: (new points, repeated points). Runs on one machine share its cost
    model (sim.costs.cost_model), so a point asking works an earlier point costed pays less: a new
    point's sweep uses batches no run of this process has used (no op's cost is memoised, as in
    a study over batch); a repeated point's sweep runs batch 1..points again (every cost memoised,
    as the matmuls of a study over context at a fixed batch are)."""
    def sweep(batches) -> float:
        t0 = time.perf_counter()
        for batch in batches:
            simulate(steps=1, batch=batch, model="llama-3-8b", weights="bf16")
        return time.perf_counter() - t0

    sweep(range(1, points + 1))
    fresh = min(sweep(range(1 + points * (r + 1), 1 + points * (r + 2))) for r in range(repeats))
    again = min(sweep(range(1, points + 1)) for _ in range(repeats))
    return 1e3 * fresh / points, 1e3 * again / points


def cached_study_s(name: str = "hbm-bandwidth-what-if") -> tuple[float, float]:
    """Wall seconds of ``python -m sim study NAME --out DIR`` run twice into one folder: (first
    run, cached re-run)."""
    walls = []
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "sim", "study", name, "--out", os.path.join(folder, name)]
        for _ in range(2):
            t0 = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            walls.append(time.perf_counter() - t0)
    return walls[0], walls[1]


def startup_cpu_s(repeats: int = 5) -> float:
    """Median CPU seconds (user + system) of ``python -m sim run --steps 1`` in a fresh process,
    started from an empty folder as a user would (so ``-m sim`` finds the installed package,
    not a checkout in the current folder), after one uncounted run that leaves the bytecode
    cache in place (``PYTHONDONTWRITEBYTECODE`` is dropped: it would make every start compile
    the package again)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    command = [sys.executable, "-m", "sim", "run", "--steps", "1"]
    times = []
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(command, check=True, capture_output=True, cwd=folder, env=env)
        for _ in range(repeats):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(command, check=True, capture_output=True, cwd=folder, env=env)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            times.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3, help="runs per row; the fastest is kept")
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    parser.add_argument("--no-study", action="store_true", help="skip the cached study re-run")
    args = parser.parse_args()
    bare = bare_simpy(repeats=args.repeats)
    rows = [measure(m, w, c, args.steps, e, args.repeats)
            for m, w in CASES for c in (1024, 32768) for e in ("des", "analytic")]
    per_config, per_repeated = ms_per_configuration(repeats=args.repeats)
    study = None if args.no_study else cached_study_s()
    startup = startup_cpu_s()
    print(f"python {platform.python_version()} on {platform.machine()}, {args.steps} steps per row, "
          f"best of {args.repeats}; "
          f"bare SimPy {bare:,.0f} events/s")
    print(f"{'model':<13}{'weights':>8}{'context':>8}{'engine':>9}{'steps/s':>9}{'events/step':>12}"
          f"{'ops/s / bare':>13}{'ops':>6}{'kernels':>8}{'ms/token':>9}")
    for r in rows:
        r["op_rate_over_bare"] = r["steps_per_s"] * r["ops_per_step"] / bare
        print(f"{r['model']:<13}{r['weights']:>8}{r['context']:>8}{r['engine']:>9}{r['steps_per_s']:>9.0f}"
              f"{r['events_per_step']:>12.0f}{r['op_rate_over_bare']:>13.2f}{r['ops_per_step']:>6}"
              f"{r['kernels_per_step']:>8}{r['per_token_ms']:>9.3f}")
    print(f"per configuration in-process (llama-3-8b, steps=1): {per_config:.2f} ms a new point (batch 33..64), "
          f"{per_repeated:.2f} ms a repeated one (batch 1..32 again)")
    if study is not None:
        print(f"study hbm-bandwidth-what-if: first run {study[0]:.2f} s, cached re-run {study[1]:.2f} s wall")
    print(f"decodesim run --steps 1: {startup:.3f} s CPU (median of 5 processes)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"bare_simpy_events_per_s": bare, "ms_per_configuration": per_config,
                       "ms_per_repeated_configuration": per_repeated,
                       "study_first_s": study and study[0], "study_cached_s": study and study[1],
                       "startup_cpu_s": startup, "rows": rows}, out, indent=2)


if __name__ == "__main__":
    main()
