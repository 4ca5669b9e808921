"""Simulator speed: wall seconds, events and simulated decode steps per wall second.

Run: ``python bench/bench_speed.py`` (add ``--steps N``, ``--json FILE``). It simulates
llama-3-8b and llama-3-70b at batch 16, context 1k and 32k, on h200-sxm with the DES engine,
and prints events per step, which must not grow with context length or model bytes.
The aim (issue 2): at least 200 simulated llama-3-8b decode steps per wall second on one core.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

from sim.run import simulate


def measure(model: str, context: int, steps: int, engine: str = "des") -> dict:
    # 70b in bf16 at batch 16 does not fit one H200; capacity is not what is measured here
    kw = dict(model=model, batch=16, context=context, engine=engine, check_capacity=False)
    simulate(steps=1, **kw)  # warm caches and imports
    t0 = time.perf_counter()
    result = simulate(steps=steps, **kw)
    wall = time.perf_counter() - t0
    s = result.summary
    ops = result.steps[0]["ops"]
    return {"model": model, "context": context, "engine": engine, "steps": steps, "wall_s": wall,
            "steps_per_s": steps / wall, "events": s["events"], "events_per_step": s["events"] / steps,
            "ops_per_step": ops, "per_token_ms": s["per_token_ms_p50"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = parser.parse_args()
    rows = [measure(m, c, args.steps, e) for m in ("llama-3-8b", "llama-3-70b") for c in (1024, 32768)
            for e in ("des", "analytic")]
    print(f"python {platform.python_version()} on {platform.machine()}, {args.steps} steps per row")
    print(f"{'model':<13}{'context':>8}{'engine':>9}{'wall s':>8}{'steps/s':>9}{'events/step':>12}"
          f"{'ops/step':>9}{'ms/token':>9}")
    for r in rows:
        print(f"{r['model']:<13}{r['context']:>8}{r['engine']:>9}{r['wall_s']:>8.2f}{r['steps_per_s']:>9.1f}"
              f"{r['events_per_step']:>12.0f}{r['ops_per_step']:>9}{r['per_token_ms']:>9.3f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)


if __name__ == "__main__":
    main()
