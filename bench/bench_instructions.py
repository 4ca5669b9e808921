"""Simulator speed in instructions: deterministic figures where wall time is too noisy to compare.

Run: ``python bench/bench_instructions.py`` (needs valgrind; about three minutes). Each figure
is the difference of two runs of ``valgrind --tool=callgrind`` that differ only in how much work
they do (so start-up and imports cancel), divided by the extra work, with hash randomisation
off: the same on every run of the same Python build and tree, whatever else the machine is doing.
It counts

* bare SimPy: instructions per event of a process yielding timeouts (the ceiling for any SimPy model);
* a step: llama-3-8b bf16, batch 16, context from 1024, DES engine, per extra step;
* a new configuration: ``simulate(steps=1)`` of llama-3-8b at batches no run of the process used,
  per extra configuration (after a warm-up sweep over batch 1..32);

(``--moe``: instead of the last two, issue 40's MoE DES steps, mixtral-8x7b bf16 and deepseek-v3
fp8 at batch 32, context 1024, per extra step, the run's routing generation included) and
states the step and the configuration in bare SimPy events (instructions / instructions per
event). An instruction is not a nanosecond: the simulator's Python touches more memory per
instruction than bare SimPy's loop, so its wall-time ratios (bench/bench_speed.py) are lower.
Compare two trees with ``PYTHONPATH=<tree> python bench/bench_instructions.py``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

WORK = r'''
import sys
kind, n = sys.argv[1], int(sys.argv[2])
if kind == "bare":
    import simpy

    def proc(env):
        for _ in range(n):
            yield env.timeout(1.0)

    env = simpy.Environment()
    env.process(proc(env))
    env.run()
elif kind == "step":
    from sim.run import simulate

    simulate(model="llama-3-8b", weights="bf16", batch=16, context=1024, steps=n, check_capacity=False)
elif kind in ("mixtral", "deepseek"):
    from sim.run import simulate

    model, weights = {"mixtral": ("mixtral-8x7b", "bf16"), "deepseek": ("deepseek-v3", "fp8")}[kind]
    simulate(model=model, weights=weights, batch=32, context=1024, steps=n, check_capacity=False)
else:
    from sim.run import simulate

    for batch in range(1, 33):
        simulate(steps=1, batch=batch, model="llama-3-8b", weights="bf16")
    for batch in range(100, 100 + n):
        simulate(steps=1, batch=batch, model="llama-3-8b", weights="bf16")
'''

SIZES = {"bare": (10_000, 110_000), "step": (20, 220), "config": (8, 72), "mixtral": (20, 220), "deepseek": (4, 24)}
# issue 40's aims as bare SimPy events per step (1.46 M events/s / the aim's steps/s; bench_speed.py's MOE_AIMS)
MOE_AIMS_EVENTS = {"mixtral": 1.46e6 / 2000, "deepseek": 1.46e6 / 500}
OPS_PER_STEP = 292  # llama-3-8b's ops per step (bench/bench_speed.py prints them)


def instructions(script: str, kind: str, n: int, tree: str | None = None) -> int:
    """Instructions of one run of ``script`` (``tree``: the checkout whose ``sim`` it imports,
    through PYTHONPATH; default whichever ``sim`` this Python finds)."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "callgrind.out")
        env = dict(os.environ, PYTHONHASHSEED="0", **({"PYTHONPATH": tree} if tree else {}))
        done = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, script,
                               kind, str(n)], capture_output=True, text=True, env=env, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"valgrind printed no instruction count:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_unit(script: str, kind: str, tree: str | None = None) -> float:
    small, large = SIZES[kind]
    return (instructions(script, kind, large, tree) - instructions(script, kind, small, tree)) / (large - small)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moe", action="store_true", help="bare SimPy and issue 40's MoE DES steps (mixtral-8x7b "
                        "bf16 and deepseek-v3 fp8 at batch 32, routing included) only")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("bench_instructions: valgrind is not installed (Debian: apt-get install valgrind)")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(WORK)
    if args.moe:
        try:
            bare, *moe = (per_unit(f.name, kind) for kind in ("bare", "mixtral", "deepseek"))
        finally:
            os.unlink(f.name)
        print(f"bare SimPy: {bare:,.0f} instructions per event")
        for kind, step in zip(("mixtral", "deepseek"), moe, strict=True):
            aim = MOE_AIMS_EVENTS[kind]
            print(f"{kind} DES step (batch 32): {step:,.0f} instructions = {step / bare:,.0f} bare SimPy events "
                  f"(issue 40's aim: <= {aim:,.0f}, {'met' if step / bare <= aim else 'not met'})")
        return
    try:
        bare, step, config = (per_unit(f.name, kind) for kind in ("bare", "step", "config"))
    finally:
        os.unlink(f.name)
    print(f"bare SimPy: {bare:,.0f} instructions per event")
    print(f"llama-3-8b DES step (batch 16): {step:,.0f} instructions = {step / bare:,.0f} bare SimPy events; "
          f"ops/s over bare SimPy's events/s, by instructions: {OPS_PER_STEP * bare / step:.2f}")
    print(f"new configuration (llama-3-8b, steps=1): {config:,.0f} instructions = {config / bare:,.0f} bare SimPy "
          f"events")


if __name__ == "__main__":
    main()
