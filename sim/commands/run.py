"""``decodesim run``: per-token decode latency, breakdown, bound and verdict for one setup.

The arguments (sim.options.run, which the explorer parses too); sim.commands.handlers.run runs it.
"""

from __future__ import annotations

from sim.options.run import add_run_command_options


def register(sub) -> None:
    p = sub.add_parser("run", help="simulate decode for one model on one hardware profile",
                       description="Simulate decode steps and report per-token latency, what bounds it, "
                                   "whether it fits and whether it meets the target.")
    add_run_command_options(p)
    p.set_defaults(handler="sim.commands.handlers.run")
