"""Issue 26's speed aims as ratios to the tree the issue was filed against, measured in one run.

Run: ``git worktree add /tmp/filed c9f2276`` once, then ``python bench/bench_against.py --against
/tmp/filed`` (about a minute a round, four rounds by default; ``--rounds N``, ``--json FILE``).

Issue 26 states its aims in absolute figures beside what it measured when it was filed:
>= 5,000 llama-3-8b DES steps/s at batch 16 against 1,400-1,600, <= 1 ms per configuration
in-process against 6 ms, a cached study re-run <= 1 s against ~4.6 s, "measured as ratios in
one run". On a machine whose speed is not the filing machine's (on the shared machines this
project runs on, a speed that moves by up to 2x within an hour), what holds are the speed-ups
of this tree over the filed one measured side by side, against the speed-ups the aims ask for:
5,000 / 1,500 = 3.33x the steps per second, 6 / 1 = 6x per configuration, 4.6 / 1 = 4.6x the
cached re-run. c9f2276 (2026-12-04 21:13 UTC, the merge before the issue's first change) has
14,674 code lines in sim/ (blank, comment and docstring lines left out) where the issue counted
14,681.

A round measures each figure of both trees back to back (the filed tree first in odd rounds,
this tree first in even ones, so a drift of the machine's speed falls on both alike), each in
fresh processes importing that tree's ``sim`` and this tree's bench_speed.py (``CHILD``): its
``measure`` (llama-3-8b bf16 batch 16, context 1024, 300 DES steps, the fastest of three runs,
each without the memos of the ones before where the tree has them) and its
``ms_per_configuration`` (``simulate(steps=1)`` at 32 batches no run of the process used, the
best of three sweeps after a warm-up sweep); the wall time of ``python -m sim study
hbm-bandwidth-what-if`` run a second time into the folder of a first run (every point cached).
A round's speed-up is this tree's figure over the filed tree's; the verdict takes the median
over the rounds, and the range shows how far single rounds stray on this machine. Each tree's
best round against the other's best is printed beside it: this machine has slow spells of
seconds to minutes that fall on single measurements, and the best of several is what the
machine does outside them.

``--instructions`` adds the deterministic companion (needs valgrind; about six minutes): the
instructions of a llama-3-8b DES step and of a new configuration in each tree, counted as
bench_instructions.py counts them, and their ratios. On one Python build they do not move with
the machine's speed, but they overstate the wall-time speed-up: the filed tree spends more of its
time in compiled code (pydantic's validator) that runs more instructions per nanosecond than the
simulator's own Python.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bench_instructions  # beside this script (its folder is the first on the path)

CHILD = r'''
import sys

sys.path.insert(0, sys.argv[2])  # this tree's bench/, beside the sim of the tree under test
import bench_speed

if sys.argv[1] == "steps_per_s":
    print(bench_speed.measure("llama-3-8b", "bf16", 1024, 300)["steps_per_s"])
else:
    print(bench_speed.ms_per_configuration(repeats=3)[0])
'''

BENCH = Path(__file__).resolve().parent
STUDY = "hbm-bandwidth-what-if"
FILED = {"steps_per_s": 1500.0, "ms_per_configuration": 6.0, "cached_study_s": 4.6}  # issue 26, at filing
AIMS = {"steps_per_s": 5000.0, "ms_per_configuration": 1.0, "cached_study_s": 1.0}  # issue 26's aims
HIGHER_IS_BETTER = {"steps_per_s": True, "ms_per_configuration": False, "cached_study_s": False}


def measure(name: str, tree: Path) -> float:
    """One figure of one tree, from fresh processes importing that tree's ``sim``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    with tempfile.TemporaryDirectory() as folder:
        if name != "cached_study_s":
            done = subprocess.run([sys.executable, "-c", CHILD, name, str(BENCH)], env=env, cwd=folder,
                                  capture_output=True, text=True, check=True)
            return float(done.stdout.split()[-1])
        command = [sys.executable, "-m", "sim", "study", STUDY, "--out", os.path.join(folder, STUDY)]
        subprocess.run(command, env=env, cwd=folder, capture_output=True, check=True)
        t0 = time.perf_counter()
        subprocess.run(command, env=env, cwd=folder, capture_output=True, check=True)
        return time.perf_counter() - t0


def speedup(name: str, this: float, filed: float) -> float:
    """How many times better this tree's figure is than the filed tree's."""
    return this / filed if HIGHER_IS_BETTER[name] else filed / this


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, type=Path, help="a checkout of the filed tree (c9f2276)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of both trees (the order alternates)")
    parser.add_argument("--json", default=None, help="also write every round's figures as JSON here")
    parser.add_argument("--instructions", action="store_true",
                        help="also count both trees' instructions per step and per configuration (valgrind)")
    args = parser.parse_args()
    this_tree = BENCH.parent
    if not (args.against / "sim" / "run.py").is_file():
        raise SystemExit(f"bench_against: {args.against} holds no sim/run.py: expected a checkout of the filed tree")
    rounds = []
    for i in range(args.rounds):
        order = ("filed", "this") if i % 2 == 0 else ("this", "filed")
        figures: dict[str, dict[str, float]] = {"filed": {}, "this": {}}
        for name in FILED:  # both trees back to back, figure by figure
            for which in order:
                figures[which][name] = measure(name, args.against if which == "filed" else this_tree)
        rounds.append(figures)
        print(f"round {i + 1}: " + "; ".join(
            f"{name} {figures['this'][name]:.3g} vs {figures['filed'][name]:.3g} "
            f"({speedup(name, figures['this'][name], figures['filed'][name]):.2f}x)" for name in FILED), flush=True)
    print(f"this tree {this_tree} against {args.against}, {args.rounds} rounds; median speed-up (the aim's):")
    for name in FILED:
        ups = [speedup(name, r["this"][name], r["filed"][name]) for r in rounds]
        needed = speedup(name, AIMS[name], FILED[name])
        median = statistics.median(ups)
        print(f"  {'met' if median >= needed else 'NOT met'}: {name} {median:.2f}x (range {min(ups):.2f}-{max(ups):.2f}; "
              f"the aim {AIMS[name]:g} against {FILED[name]:g} at filing is {needed:.2f}x)")
    print("each tree's best round against the other's (where the machine's slow spells fall on single rounds):")
    for name in FILED:
        pick = max if HIGHER_IS_BETTER[name] else min
        this, filed = pick(r["this"][name] for r in rounds), pick(r["filed"][name] for r in rounds)
        print(f"  {name}: {this:.4g} against {filed:.4g}: {speedup(name, this, filed):.2f}x")
    counted = instruction_ratios(args.against, this_tree) if args.instructions else None
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"against": str(args.against), "rounds": rounds, "instructions": counted}, out, indent=2)


def instruction_ratios(filed: Path, this_tree: Path) -> dict:
    """Instructions per llama-3-8b DES step and per new configuration in both trees (callgrind, as
    bench_instructions.py counts them), two counts at a time, and the filed tree's over this one's."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(bench_instructions.WORK)
    jobs = [(kind, tree) for kind in ("step", "config") for tree in (str(filed), str(this_tree))]
    try:
        with ThreadPoolExecutor(2) as pool:
            counts = list(pool.map(lambda job: bench_instructions.per_unit(f.name, *job), jobs))
    finally:
        os.unlink(f.name)
    out = {}
    for (kind, tree), count in zip(jobs, counts, strict=True):
        out.setdefault(kind, {})["filed" if tree == str(filed) else "this"] = count
    for kind, pair in out.items():
        pair["ratio"] = pair["filed"] / pair["this"]
        print(f"  instructions per {kind}: {pair['this']:,.0f} against {pair['filed']:,.0f} in the filed tree: "
              f"{pair['ratio']:.2f}x fewer")
    return out


if __name__ == "__main__":
    main()
