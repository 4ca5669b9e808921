"""The RunSpec that the run options (sim.options.run.add_run_options) ask for, validated as the
command line's (the CLI's handlers and the explorer make it here)."""

from __future__ import annotations

from sim.config.defaults import RUN_DEFAULTS
from sim.config.loader import validate
from sim.config.spec import RunSpec
from sim.errors import COMMAND_LINE, ConfigError
from sim.options.run import SPEC_ARGS

TRACE_GIVES = ("batch", "context")  # what a trace file sets for every step


def spec_from_args(args, **changes) -> RunSpec:
    """The RunSpec the arguments (and ``changes``) ask for. With ``--trace``, ``--batch`` and
    ``--context`` are refused rather than ignored: the trace gives every step's sequences."""
    data = {k: getattr(args, k) for k in SPEC_ARGS if hasattr(args, k)}
    if data.get("software") is None:
        data.pop("software", None)  # unnamed: the profile's own stack, else the default
    data.update(changes)
    _refuse_twice(data)
    if data.get("trace"):
        given = [k for k in TRACE_GIVES if k in data and data[k] != RUN_DEFAULTS[k]]
        if given:
            raise ConfigError(COMMAND_LINE, f"--{given[0]}", "does not apply with --trace: the trace gives every "
                              "step's batch and contexts", data[given[0]])
    return validate(RunSpec, data, COMMAND_LINE)


def _refuse_twice(data: dict) -> None:
    """A run field set both by its option (not at its default) and by ``--set`` is refused:
    one of the two would be dropped without notice."""
    for item in data.get("overrides") or ():
        path = (item.split("=", 1)[0] if isinstance(item, str) else item[0]).strip()
        if path in RUN_DEFAULTS and path in data and path != "overrides" and data[path] != RUN_DEFAULTS[path]:
            raise ConfigError(COMMAND_LINE, "--set", f"{path} is also given as --{path.replace('_', '-')}; "
                              "expected one of the two", data[path])
