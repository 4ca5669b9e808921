"""The RunSpec that the run options (sim.options.run.add_run_options) ask for, validated as the
command line's (the CLI's handlers and the explorer make it here)."""

from __future__ import annotations

from sim.config.loader import validate
from sim.config.spec import RunSpec
from sim.errors import COMMAND_LINE
from sim.options.run import SPEC_ARGS


def spec_from_args(args, **changes) -> RunSpec:
    """The RunSpec the arguments (and ``changes``) ask for."""
    data = {k: getattr(args, k) for k in SPEC_ARGS if hasattr(args, k)}
    if data.get("software") is None:
        data.pop("software", None)  # unnamed: the profile's own stack, else the default
    data.update(changes)
    return validate(RunSpec, data, COMMAND_LINE)
