"""What ``decodesim plot DIR`` does: redraw a study's plots and report from its saved results (no simulation)."""

from __future__ import annotations

from sim.report.markdown import write_report
from sim.report.plots import make_plots
from sim.study.folder import DRAWINGS, check_places, load_saved


def handle(args) -> int:
    """Check the saved files and the places the drawings go first (sim.study.folder), so a
    damaged folder is one error before any plot is redrawn, then draw."""
    load_saved(args.dir)
    check_places(args.dir, ["plots/"] if args.no_report else list(DRAWINGS))
    written = make_plots(args.dir)
    for path in written:
        print(path)
    if not args.no_report:
        print(write_report(args.dir))
    return 0
