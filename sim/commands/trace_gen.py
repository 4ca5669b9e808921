"""``decodesim trace``: make decode traces (fixed, synthetic arrivals, Azure production trace).

The arguments; sim.commands.handlers.trace writes them.
"""

from __future__ import annotations

from pathlib import Path

from sim.options.run import output_file


def register(sub) -> None:
    p = sub.add_parser("trace", help="generate a decode trace file (JSONL, Parquet or CSV)",
                       description="Generate a decode trace: per step, the active sequences and their contexts.")
    p.add_argument("kind", choices=["fixed", "synthetic", "azure"], help="generator")
    p.add_argument("--out", type=output_file, required=True, help="output file (.jsonl, .parquet or .csv)")
    p.add_argument("--batch", type=int, default=8, help="fixed: sequences; others: the maximum batch")
    p.add_argument("--context", type=int, default=4096, help="fixed: starting context")
    p.add_argument("--steps", type=int, default=256, help="steps to write (at most)")
    p.add_argument("--requests", type=int, default=2000, help="synthetic: requests; azure: rows read")
    p.add_argument("--rate", type=float, default=20.0, help="synthetic: arrivals per second")
    p.add_argument("--prompt-median", type=int, default=1024, help="synthetic: median prompt tokens")
    p.add_argument("--output-median", type=int, default=256, help="synthetic: median output tokens")
    p.add_argument("--azure", type=Path, default=None, help="azure: the AzureLLMInferenceTrace CSV")
    p.add_argument("--step-ms", type=float, default=20.0,
                   help="nominal step time that advances the arrival clock (default 20 ms)")
    p.add_argument("--speedup", type=float, default=1.0,
                   help="azure: replay arrivals k times faster than recorded (k x the load of one service)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler="sim.commands.handlers.trace")
