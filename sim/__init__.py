"""decodesim: a cycle-approximate, discrete-event simulator of LLM decode on accelerators.

Public API:

* ``load_profile(name_or_path)`` -> HardwareProfile (sim.setup)
* ``load_model(name_or_path)`` -> ModelSpec (sim.setup)
* ``simulate(spec=None, *, set=(), **options)`` -> RunResult (``.summary``, ``.tables()``): ``decodesim
  run`` with the CLI's options as keywords, ``set=["PATH=VALUE"]`` as ``--set`` (sim.api)
* ``api``: every command as a function of the CLI's options, returning the CLI's ``--json``
  answer with its records as pandas tables: ``api.run``, ``api.serve``, ``api.search``,
  ``api.study``, ``api.compare``, ``api.command`` (sim.api; docs/api.md)

The package root imports nothing at start-up (``decodesim --help`` stays fast): each name
is looked up in its stage's module on first use (a module ``__getattr__``, PEP 562).
"""

from __future__ import annotations

import importlib

__version__ = "0.2.0"

_API = {"load_profile": "sim.setup", "load_model": "sim.setup", "simulate": "sim.api"}


def __getattr__(name: str):
    if name == "api":
        return importlib.import_module("sim.api")
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'sim' has no attribute {name!r}")


__all__ = ["load_profile", "load_model", "simulate", "api", "__version__"]
