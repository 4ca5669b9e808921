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
Bare SimPy is measured again beside each figure (before and after it) and each ratio uses the
mean of the two, so a ratio holds while the machine's speed drifts (on the shared 2-core
machines this project runs on it moves by up to 2x within an hour). Events per step must not
grow with context length or model bytes (they grow with ops).

Aims (issue 26): >= 5,000 llama-3-8b DES steps/s at batch 16 on one core (">= 3x bare SimPy's
rate per op, since single-stream ops no longer pay an event"), <= 1 ms per configuration
in-process, a cached study re-run <= 1 s, "measured as ratios in one run". The issue measured
1,400-1,600 steps/s at 0.3 of bare SimPy's event rate when it was filed, so its machine ran bare
SimPy at about 1,500 x 292 / 0.3 = 1.46 M events/s: there 5,000 steps/s is ops/s = 1.0 x bare
SimPy's events/s (and 3.3x the rate at filing, 0.3 -> 1.0), and 1 ms is 1,460 bare SimPy events.
The aims block states them in these units, which hold on any machine: ops per second >= 1.0 x
bare SimPy's events per second, a new configuration <= 1,460 bare SimPy events; the cached
re-run stays in seconds (most of it is the process's start-up).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
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
# issue 40: MoE models at batch 32, context 1k, DES (each in its checkpoint's weight format)
MOE_CASES = [("mixtral-8x7b", "bf16"), ("deepseek-v3", "fp8")]
# issue 40's aims as steps/s (mixtral-8x7b, deepseek-v3) on the machine issue 26 calibrated (bare SimPy at
# 1.46 M events/s, see the module docstring): in bare SimPy events per step, 1.46e6 / (steps/s)
MOE_AIMS = {"mixtral-8x7b": 2000, "deepseek-v3": 500}
BARE_AT_FILING = 1.46e6


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


def _beside(run, repeats: int) -> tuple[float, float]:
    """``run()`` (which returns its wall seconds) ``repeats`` times, each between two short bare
    SimPy measurements: (the fastest wall, the median over the repeats of that repeat's wall times
    the mean bare SimPy rate just before and just after it, i.e. its cost in bare SimPy events).
    Pairing each repeat with the rate beside it keeps the ratio steady while the machine's speed
    drifts on a scale of seconds."""
    walls, events = [], []
    for _ in range(repeats):
        before = bare_simpy(events=100_000, repeats=1)
        wall = run()
        after = bare_simpy(events=100_000, repeats=1)
        walls.append(wall)
        events.append(wall * (before + after) / 2)
    return min(walls), statistics.median(events)


def measure(model: str, weights: str, context: int, steps: int, engine: str = "des", repeats: int = 3,
            batch: int = 16) -> dict:
    """Simulate ``steps`` steps ``repeats`` times, each without the cost memos of the runs before
    it (``_beside``): steps/s of the fastest (the least disturbed by whatever else the machine
    did, as timeit does), ops/s over bare SimPy's events/s from the median repeat."""
    kw = dict(model=model, weights=weights, batch=batch, context=context, engine=engine, check_capacity=False)
    simulate(steps=2, **kw)  # warm caches and imports
    kept = {}

    def run() -> float:
        forget_cost_models()  # each run pays for its own costs, as a run in a new process does
        t0 = time.perf_counter()
        kept["result"] = simulate(steps=steps, **kw)
        return time.perf_counter() - t0

    wall, events = _beside(run, repeats)
    result = kept["result"]
    s = result.summary
    ops = result.steps[0]["ops"]
    return {"model": model, "weights": weights, "batch": batch, "context": context, "engine": engine, "steps": steps,
            "wall_s": wall, "steps_per_s": steps / wall, "events_per_step": s["events"] / steps,
            "ops_per_step": ops, "kernels_per_step": result.steps[0]["kernels"],
            "per_token_ms": s["per_token_ms_p50"], "bare_events_per_step": events / steps,
            "op_rate_over_bare": ops * steps / events}


def ms_per_configuration(repeats: int = 3, points: int = 32) -> tuple[float, float, float, float]:
    """Milliseconds per ``simulate(steps=1)`` of llama-3-8b in this process (what a study or a
    search pays per point), the best of ``repeats`` sweeps of ``points`` batches after one warm-up
    sweep over batch 1..points: (new points, repeated points). Runs on one machine share its cost
    model (sim.costs.cost_model), so a point asking works an earlier point costed pays less: a new
    point's sweep uses batches no run of this process has used (no op's cost is memoised, as in
    a study over batch); a repeated point's sweep runs batch 1..points again (every cost memoised,
    as the matmuls of a study over context at a fixed batch are); then the same two in bare SimPy
    events (``_beside``)."""
    def sweep(batches) -> float:
        t0 = time.perf_counter()
        for batch in batches:
            simulate(steps=1, batch=batch, model="llama-3-8b", weights="bf16")
        return time.perf_counter() - t0

    sweep(range(1, points + 1))
    starts = iter(range(points + 1, 10**6, points))  # each repeat's batches: a block no run has used
    fresh, fresh_events = _beside(lambda: sweep(range(start := next(starts), start + points)), repeats)
    again, again_events = _beside(lambda: sweep(range(1, points + 1)), repeats)
    return 1e3 * fresh / points, 1e3 * again / points, fresh_events / points, again_events / points


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
    parser.add_argument("--moe-only", action="store_true", help="only the MoE rows (issue 40) and llama-3-8b DES at 1k")
    args = parser.parse_args()
    dense = [(m, w, c, e) for m, w in CASES for c in (1024, 32768) for e in ("des", "analytic")]
    if args.moe_only:
        dense = dense[:1]
    rows = [measure(m, w, c, args.steps, e, args.repeats) for m, w, c, e in dense]
    moe_rows = [measure(m, w, 1024, args.steps, "des", args.repeats, batch=32) for m, w in MOE_CASES]
    rows += moe_rows
    if args.moe_only:
        _print_moe(moe_rows, rows[0], args)
        return
    per_config, per_repeated, new_events, repeated_events = ms_per_configuration(repeats=args.repeats)
    study = None if args.no_study else cached_study_s()
    startup = startup_cpu_s()
    print(f"python {platform.python_version()} on {platform.machine()}, {args.steps} steps per row, "
          f"best of {args.repeats}; bare SimPy {bare_simpy(repeats=args.repeats):,.0f} events/s at the end")
    _print_rows(rows)
    print(f"per configuration in-process (llama-3-8b, steps=1): {per_config:.2f} ms ({new_events:,.0f} bare SimPy "
          f"events) a new point (batches no run used), {per_repeated:.2f} ms ({repeated_events:,.0f} events) a "
          f"repeated one (batch 1..32 again)")
    if study is not None:
        print(f"study hbm-bandwidth-what-if: first run {study[0]:.2f} s, cached re-run {study[1]:.2f} s wall")
    print(f"decodesim run --steps 1: {startup:.3f} s CPU (median of 5 processes)")
    step_ratio = next(r["op_rate_over_bare"] for r in rows if r["model"] == "llama-3-8b" and r["engine"] == "des"
                      and r["context"] == 1024)
    print("aims (issue 26), in units that hold on any machine (see the module docstring):")
    for text, met in ((f"llama-3-8b DES ops/s >= 1.0 x bare SimPy events/s: {step_ratio:.2f}", step_ratio >= 1.0),
                      (f"a new configuration <= 1,460 bare SimPy events: {new_events:,.0f}", new_events <= 1460),
                      ("a cached study re-run <= 1 s: " + (f"{study[1]:.2f} s" if study else "not run"),
                       study is not None and study[1] <= 1.0)):
        print(f"  {'met' if met else 'NOT met'}: {text}")
    _print_moe_aims(moe_rows)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"ms_per_configuration": per_config, "ms_per_repeated_configuration": per_repeated,
                       "bare_events_per_configuration": new_events,
                       "bare_events_per_repeated_configuration": repeated_events,
                       "study_first_s": study and study[0], "study_cached_s": study and study[1],
                       "startup_cpu_s": startup, "rows": rows}, out, indent=2)


def _print_rows(rows: list[dict]) -> None:
    print(f"{'model':<13}{'weights':>8}{'batch':>6}{'context':>8}{'engine':>9}{'steps/s':>9}{'events/step':>12}"
          f"{'ops/s / bare':>13}{'ops':>6}{'kernels':>8}{'ms/token':>9}")
    for r in rows:
        print(f"{r['model']:<13}{r['weights']:>8}{r['batch']:>6}{r['context']:>8}{r['engine']:>9}"
              f"{r['steps_per_s']:>9.0f}{r['events_per_step']:>12.0f}{r['op_rate_over_bare']:>13.2f}"
              f"{r['ops_per_step']:>6}{r['kernels_per_step']:>8}{r['per_token_ms']:>9.3f}")


def _print_moe_aims(moe_rows: list[dict]) -> None:
    """Issue 40's MoE step aims, as bare SimPy events per step (what holds on any machine)."""
    print("aims (issue 40), MoE DES steps at batch 32 in bare SimPy events per step:")
    for r in moe_rows:
        aim = BARE_AT_FILING / MOE_AIMS[r["model"]]
        met = r["bare_events_per_step"] <= aim
        print(f"  {'met' if met else 'NOT met'}: {r['model']} a step <= {aim:,.0f} bare SimPy events "
              f"({MOE_AIMS[r['model']]:,} steps/s at 1.46 M events/s): {r['bare_events_per_step']:,.0f}")


def _print_moe(moe_rows: list[dict], dense_row: dict, args) -> None:
    print(f"python {platform.python_version()} on {platform.machine()}, {args.steps} steps per row, "
          f"best of {args.repeats}; bare SimPy {bare_simpy(repeats=args.repeats):,.0f} events/s at the end")
    _print_rows([dense_row, *moe_rows])
    _print_moe_aims(moe_rows)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rows": [dense_row, *moe_rows]}, out, indent=2)


if __name__ == "__main__":
    main()
