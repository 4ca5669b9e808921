"""``decodesim moe-report``: regenerate reports/moe.md (sim/report/moe_report.py)."""

from __future__ import annotations

from pathlib import Path

from sim.options.run import output_file


def register(sub) -> None:
    p = sub.add_parser("moe-report", help="write reports/moe.md: MoE dispatch paths on GPU and SRAM-centric chips",
                       description="Run Mixtral-8x7B and DeepSeek-V3 on h200-sxm (1 and 8 chips) and groq-lpu "
                                   "with every dispatch path at batch 1, 8 and 64, and write the Markdown report.")
    p.add_argument("--out", type=output_file, default=Path("reports/moe.md"), help="output file (default reports/moe.md)")
    p.set_defaults(handler="sim.commands.handlers.moe_report")


