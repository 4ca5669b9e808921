"""``decodesim study FILE``: run a YAML what-if study and write its table, plots and report.

The arguments; sim.commands.handlers.study runs it.
"""

from __future__ import annotations

from sim.options.run import output_dir, output_file


def register(sub) -> None:
    p = sub.add_parser("study", help="run a YAML what-if study (sweeps, overrides) with caching and resume",
                       description="Expand a study (base + overrides + sweeps + seeds), check every point, run "
                                   "the points not yet cached, and write results.{parquet,csv}, plots and "
                                   "report.md under --out (default reports/<study name>/).")
    p.add_argument("file", help="study YAML path or bundled study name (workloads/studies/)")
    p.add_argument("--out", type=output_dir, default=None, help="output folder (default reports/<study name>/)")
    p.add_argument("--executor", choices=["local", "dask"], default="local",
                   help="local process pool (default) or a Dask distributed cluster")
    p.add_argument("--address", default=None, help="Dask scheduler address, e.g. tcp://10.0.0.1:8786")
    p.add_argument("--jobs", "-j", type=int, default=None, help="local worker processes (default: CPU count; 1 = "
                                                                 "in this process)")
    p.add_argument("--max-points", type=int, default=None, metavar="N",
                   help="refuse studies of more than N points (default 100,000; checked before expanding)")
    p.add_argument("--check", action="store_true", help="validate every point and print the plan; run nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-report", action="store_true", help="write the table only (no plots or report)")
    p.add_argument("--trace-out", type=output_file, default=None,
                   help="also write the detail point's Chrome/Perfetto trace JSON (its one DES step) here")
    p.add_argument("--json", action="store_true", help="print one JSON object (the plan, and what ran) instead")
    p.set_defaults(handler="sim.commands.handlers.study")
