"""The RunSpec that the run options (sim.commands.common.add_run_options) ask for."""

from __future__ import annotations

from sim.commands.common import SPEC_ARGS
from sim.config.loader import validate
from sim.config.spec import RunSpec


def spec_from_args(args, **changes) -> RunSpec:
    """The RunSpec the arguments (and ``changes``) ask for."""
    data = {k: getattr(args, k) for k in SPEC_ARGS if hasattr(args, k)}
    if data.get("software") is None:
        data.pop("software", None)  # unnamed: the profile's own stack, else the default
    data.update(changes)
    return validate(RunSpec, data, "command line")
