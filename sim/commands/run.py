"""``decodesim run``: per-token decode latency, breakdown, bound and verdict for one setup.

The arguments; sim.commands.handlers.run runs it.
"""

from __future__ import annotations

from sim.commands.common import add_run_options, output_dir, output_file


def register(sub) -> None:
    p = sub.add_parser("run", help="simulate decode for one model on one hardware profile",
                       description="Simulate decode steps and report per-token latency, what bounds it, "
                                   "whether it fits and whether it meets the target.")
    add_run_options(p)
    p.add_argument("--out", type=output_dir, default=None, help="write per-step and per-op tables (Parquet + CSV) here")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--trace-out", type=output_file, default=None,
                   help="write a Chrome/Perfetto trace JSON of the timeline (every step; see --trace-steps)")
    p.add_argument("--html", type=output_file, default=None, metavar="FILE",
                   help="also write the explorer's view (breakdown, roofline, latency against batch and context) "
                        "as one self-contained HTML file that opens offline")
    p.add_argument("--trace-steps", default=None, metavar="A:B",
                   help="steps the trace keeps, A <= step < B (either end may be left out; default all)")
    p.set_defaults(handler="sim.commands.handlers.run")
