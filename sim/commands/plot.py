"""``decodesim plot DIR``: redraw a study's plots and report from its saved results (no simulation)."""

from __future__ import annotations

from pathlib import Path

from sim.errors import ConfigError


def register(sub) -> None:
    p = sub.add_parser("plot", help="regenerate a study's plots and report.md from saved results",
                       description="Read DIR/results.parquet, DIR/study.json and DIR/detail/ and redraw "
                                   "DIR/plots/*.{png,svg} and DIR/report.md without re-simulating.")
    p.add_argument("dir", type=Path, help="a study output folder (e.g. reports/hbm-bandwidth-what-if)")
    p.add_argument("--no-report", action="store_true", help="plots only")
    p.set_defaults(handler=handle)


def handle(args) -> int:
    for name in ("results.parquet", "study.json"):
        if not (args.dir / name).is_file():
            raise ConfigError(str(args.dir), name, "missing; expected a folder written by `decodesim study`")
    # deferred: the CLI imports every command at start-up; these load matplotlib and pandas
    from sim.report.markdown import write_report
    from sim.report.plots import make_plots

    written = make_plots(args.dir)
    for path in written:
        print(path)
    if not args.no_report:
        print(write_report(args.dir))
    return 0
