"""``decodesim plot DIR``: redraw a study's plots and report from its saved results (no simulation)."""

from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("plot", help="regenerate a study's plots and report.md from saved results",
                       description="Read DIR/results.parquet, DIR/study.json and DIR/detail/ and redraw "
                                   "DIR/plots/*.{png,svg} and DIR/report.md without re-simulating.")
    p.add_argument("dir", type=Path, help="a study output folder (e.g. reports/hbm-bandwidth-what-if)")
    p.add_argument("--no-report", action="store_true", help="plots only")
    p.set_defaults(handler="sim.commands.handlers.plot")


