"""``decodesim search``: the best deployment under latency targets, as a Pareto front.

``load_space(path, changes)`` reads a search file (sim.search.space; ``changes`` are the
command line's settings on top) and checks it against the bundled profiles, formats and
stacks; ``run_search(space)`` enumerates the deployments, prunes what does not fit, screens
the rest on the analytic step model (sim.search.screen), confirms the Pareto front of
output tokens/s per chip against tokens/s per user with serving replays and a DES step
(sim.search.verify, sim.search.front) and returns a ``SearchResult``; ``write_outputs``
(sim.search.output) writes its table, JSON, plot and report. docs/search.md is the guide.
"""

from __future__ import annotations

from pathlib import Path

from sim.config.software import load_stack
from sim.errors import ConfigError
from sim.formats import get_format
from sim.search.runner import SearchResult, run_search
from sim.search.space import Deployment, SearchSpec, Space, build_space, load_spec
from sim.setup import load_model, load_profile


def _profile_chips(name: str) -> int:
    return load_profile(name).chips


def _known(axis: str, value: str) -> None:
    """Raise ConfigError unless ``value`` names a hardware profile, format or stack."""
    if axis == "hardware":
        _profile_chips(value)
    elif axis in ("weights", "kv"):
        get_format(value)
    elif axis == "software":
        load_stack(value)


def load_space(path: str | Path | None = None, changes: dict | None = None) -> Space:
    """The checked search space of a search file (or of ``changes`` alone)."""
    spec, file = load_spec(path, changes)
    if spec.model is not None:
        try:
            load_model(spec.model)
        except ConfigError as err:
            raise ConfigError(file, "model", err.expected, spec.model) from None
    return build_space(spec, file, _profile_chips, _known)


__all__ = ["Deployment", "SearchResult", "SearchSpec", "Space", "load_space", "run_search"]
