"""What ``decodesim moe-report`` does: regenerate reports/moe.md (sim/report/moe_report.py)."""

from __future__ import annotations

from sim.experiments import moe
from sim.io import write_atomic
from sim.report.moe_report import PLOT_NAME, build_report


def handle(args) -> int:
    command = "decodesim moe-report" + (f" --out {args.out}" if str(args.out) != "reports/moe.md" else "")
    text = build_report(moe.run(), command, plot_path=args.out.parent / PLOT_NAME)
    write_atomic(args.out, text)
    print(f"wrote {args.out} and {args.out.parent / PLOT_NAME}")
    return 0
