"""What ``decodesim plot DIR`` does: redraw a study's plots and report from its saved results (no simulation)."""

from __future__ import annotations

from sim.errors import ConfigError
from sim.report.markdown import write_report
from sim.report.plots import make_plots


def handle(args) -> int:
    for name in ("results.parquet", "study.json"):
        if not (args.dir / name).is_file():
            raise ConfigError(str(args.dir), name, "missing; expected a folder written by `decodesim study`")

    written = make_plots(args.dir)
    for path in written:
        print(path)
    if not args.no_report:
        print(write_report(args.dir))
    return 0
