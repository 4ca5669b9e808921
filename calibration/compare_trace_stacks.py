#!/usr/bin/env python3
"""Predicted vs measured for stacks written by `decodesim stack --from-profile` against the hand-written
torch-graph stack, on the frozen H200 CUDA-graph rows (bf16 weights and KV, dense models) of
validation/data/h200/val/steps.csv. The traces are tests/fixtures/traces/*.json.gz (converted from the H200
profiler census by calibration/census_to_trace.py); the Llama-3.2-1B trace's stack is also applied to
Qwen2.5-14B and Mistral-NeMo-12B, whose code it has not seen (the same Hugging Face-style step).

    python calibration/compare_trace_stacks.py
"""
from __future__ import annotations

import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from sim.run import simulate

ROOT = Path(__file__).resolve().parents[1]
TRACES = {"llama-3.2-1b": "llama-3.2-1b_graph_b1_l1024", "phi-3-mini": "phi-3-mini_graph_b1_l1024",
          "qwen2.5-14b": "llama-3.2-1b_graph_b1_l1024", "mistral-nemo-12b": "llama-3.2-1b_graph_b1_l1024"}


def error_pct(model: str, stack: str, row: dict) -> float:
    s = simulate(model=model, weights="bf16", kv="bf16", batch=int(row["batch"]), context=int(row["context"]),
                 software=stack, hardware="h200-sxm", steps=2, check_capacity=False, allow_long_context=True).summary
    return 100 * (s["per_token_ms_p50"] - float(row["median_ms"])) / float(row["median_ms"])


def main() -> int:
    rows = [r for r in csv.DictReader(open(ROOT / "validation/data/h200/val/steps.csv"))
            if r.get("median_ms") and r["stack"] == "torch-graph" and not r["execution"] and r["weights"] == "bf16"]
    print("| model | trace | rows | hand-written torch-graph: median / worst |error| | from the trace: median / worst |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for model, trace in TRACES.items():
            out = Path(tmp) / f"{trace}.yaml"
            subprocess.run([sys.executable, "-m", "sim", "stack", "--from-profile",
                            str(ROOT / "tests/fixtures/traces" / f"{trace}.json.gz"), "--out", str(out)],
                           check=True, capture_output=True)
            rs = [r for r in rows if r["model"] == model]
            hand = [abs(error_pct(model, "torch-graph", r)) for r in rs]
            tool = [abs(error_pct(model, str(out), r)) for r in rs]
            print(f"| {model} | {trace} | {len(rs)} | {statistics.median(hand):.1f}% / {max(hand):.1f}% | "
                  f"{statistics.median(tool):.1f}% / {max(tool):.1f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
