"""decodesim: a cycle-approximate, discrete-event simulator of LLM decode on accelerators.

Public API:

* ``load_profile(name_or_path)`` -> HardwareProfile
* ``load_model(name_or_path)`` -> ModelSpec
* ``simulate(spec=None, **fields)`` -> RunResult (``.summary``, ``.tables()``)
"""

from __future__ import annotations

__version__ = "0.1.0"


def load_profile(name_or_path: str):
    from sim.config.hardware import HardwareProfile
    from sim.config.loader import load_yaml, validate
    from sim.paths import hardware_dir, resolve

    path = resolve(name_or_path, hardware_dir(), "hardware")
    return validate(HardwareProfile, load_yaml(path), path)


def load_model(name_or_path: str):
    from sim.config.loader import load_yaml, validate
    from sim.config.model import ModelSpec
    from sim.paths import models_dir, resolve

    path = resolve(name_or_path, models_dir(), "model")
    return validate(ModelSpec, load_yaml(path), path)


def simulate(spec=None, **fields):
    from sim.run import simulate as _simulate

    return _simulate(spec, **fields)


__all__ = ["load_profile", "load_model", "simulate", "__version__"]
