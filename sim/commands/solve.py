"""``decodesim solve --target-ms 10 --vary DOTTED.PATH``: the value of one knob that just meets a target.

The arguments; sim.commands.handlers.solve runs it.
"""

from __future__ import annotations

from sim.options.run import add_run_options


def register(sub) -> None:
    p = sub.add_parser("solve", help="inverse what-if: bisect one parameter to just meet the latency target",
                       description="Find the smallest (or largest, where that is what helps) value of one dotted "
                                   "path at which the p99 per-token latency meets --target-ms, by bisection over "
                                   "a model monotone in it; says so when no value in the range does.")
    add_run_options(p)
    p.add_argument("--vary", required=True, metavar="DOTTED.PATH",
                   help="the parameter to solve for, e.g. hardware.hbm.channel_bandwidth_GBps, "
                        "hardware.l2.capacity_MB, chips, batch")
    p.add_argument("--range", dest="bounds", default=None, metavar="LO:HI",
                   help="values to search (default: current/16 .. current*16; integers 1 .. current*16)")
    p.add_argument("--rel-tol", type=float, default=2e-3, help="stop when the bracket is this narrow (default 0.2%%)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler="sim.commands.handlers.solve")
