"""decodesim: a cycle-approximate, discrete-event simulator of LLM decode on accelerators.

Public API:

* ``load_profile(name_or_path)`` -> HardwareProfile
* ``load_model(name_or_path)`` -> ModelSpec
* ``simulate(spec=None, **fields)`` -> RunResult (``.summary``, ``.tables()``)

The package root imports nothing at start-up (``decodesim --help`` stays fast); each
function imports its stage when called.
"""

from __future__ import annotations

__version__ = "0.2.0"


def load_profile(name_or_path: str):
    """A bundled hardware profile by name, or a profile YAML file, validated."""
    from sim.setup import load_profile as load

    return load(name_or_path)


def load_model(name_or_path: str):
    """A bundled model by name, or a model YAML file, validated."""
    from sim.setup import load_model as load

    return load(name_or_path)


def simulate(spec=None, **fields):
    """Run one setup (a RunSpec, a dict, or RunSpec fields as keywords) -> RunResult."""
    from sim.run import simulate as run

    return run(spec, **fields)


__all__ = ["load_profile", "load_model", "simulate", "__version__"]
