"""What a user asks for one run (``RunSpec``), and the one override grammar.

``RunSpec`` holds names, sizes and options as the user wrote them, plus dotted-path
overrides. Every caller that changes a setup by path (``--set`` on the command line, a
study's overrides and sweep axes, ``solve --vary``) goes through ``Overrides.split`` and
``override_hardware`` / ``override_model`` here, so there is one grammar:

* a RunSpec field by its name (``batch=16``, ``kv=int8``);
* ``hardware.<path>`` into the hardware profile, where a memory level may be named directly
  (``hardware.hbm.channel_bandwidth_GBps`` is ``hardware.memory.hbm.channel_bandwidth_GBps``);
* ``model.<path>`` into the model.

A value is absolute, or ``{scale: f}`` / ``{add: x}`` relative to the current number.
Setting a sourced quantity sets its value and records the override as its source.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from sim.config.loader import apply_override, parse_assignment, validate
from sim.config.quantity import Strict
from sim.errors import ConfigError

Engine = Literal["des", "analytic"]


class RunSpec(Strict):
    """One run as asked: hardware, model, formats, workload, engine and options."""

    hardware: str = "h200-sxm"
    model: str = "llama-3-8b"
    weights: str = "bf16"
    kv: str = "fp16"
    batch: int = Field(default=1, gt=0)
    context: int = Field(default=4096, gt=0)
    trace: str | None = None
    steps: int = Field(default=8, gt=0)
    target_ms: float = Field(default=10.0, gt=0)
    engine: Engine = "des"
    graph: bool | None = None  # None: the software stack's launch mode
    tp: int | None = Field(default=None, gt=0)
    pp: int | None = Field(default=None, gt=0)
    software: str = "fused"  # a stack of workloads/software/ or a stack YAML path
    overrides: tuple[tuple[str, Any], ...] = ()
    seed: int = 0
    # Mixture-of-Experts (used when the model has a `moe:` section; see sim.lowering.moe)
    dispatch: Literal["host_sync", "device", "sram_zero_copy"] = "device"
    placement: Literal["all-hbm", "static", "lru", "lfu", "spread"] = "static"
    routing: str = "uniform"  # uniform | zipf | a routing file (sim.moe.routing)
    routing_skew: float = Field(default=1.0, ge=0)
    routing_locality: float = Field(default=0.0, ge=0, le=1)
    sram_experts: int | None = Field(default=None, ge=0)  # experts to pin per chip (default: as many as fit)
    chips: int | None = Field(default=None, gt=0)  # overrides hardware.system.chips

    @field_validator("overrides", mode="before")
    @classmethod
    def _pairs(cls, value):
        return tuple(parse_assignment(item) if isinstance(item, str) else tuple(item) for item in value or ())


RUN_FIELDS = frozenset(RunSpec.model_fields) - {"overrides"}
HARDWARE, MODEL = "hardware.", "model."


def check_path(path: str, where: str = "--set") -> None:
    """Raise unless ``path`` is a run field or starts with ``hardware.`` / ``model.``."""
    if path in RUN_FIELDS or path.startswith((HARDWARE, MODEL)):
        return
    allowed = ", ".join(sorted(RUN_FIELDS | {"hardware.<path>", "model.<path>"}))
    raise ConfigError(where, path, f"no such path; expected one of: {allowed}")


def canonical(path: str) -> str:
    """The form two spellings of one path share (``hardware.memory.hbm.x`` == ``hardware.hbm.x``)."""
    return path.replace("hardware.memory.", "hardware.", 1)


def hardware_subpath(path: str, raw: dict) -> str:
    """``hbm.x`` -> ``memory.hbm.x`` when ``hbm`` names a memory level of profile ``raw``."""
    head = path.split(".", 1)[0]
    names = {level.get("name") for level in raw.get("memory", []) if isinstance(level, dict)}
    top = {"name", "description", "memory", "compute", "noc", "host", "system"}
    if head not in top and head in names:
        return "memory." + path
    return path


def apply_run_overrides(spec: RunSpec) -> RunSpec:
    """``spec`` with the overrides that address RunSpec fields applied; the hardware and
    model overrides stay in ``spec.overrides`` for the setup stage."""
    updates: dict[str, Any] = {}
    for path, value in spec.overrides:
        check_path(path)
        if path in RUN_FIELDS:
            updates[path] = value
    if not updates:
        return spec
    data = spec.model_dump()
    for key, value in updates.items():
        current = data.get(key)
        if isinstance(value, dict) and set(value) <= {"scale", "add"}:
            if not isinstance(current, (int, float)) or isinstance(current, bool):
                raise ConfigError("--set", key, "a scale or add override needs a number to act on", current)
            value = type(current)(current * value.get("scale", 1) + value.get("add", 0))
        data[key] = value
    data["overrides"] = tuple((p, v) for p, v in spec.overrides if p not in updates)
    return validate(RunSpec, data, "--set")


def override_raw(hw_raw: dict, model_raw: dict, overrides, hw_file: str, model_file: str,
                 hardware_model, model_model) -> tuple[dict, dict]:
    """Apply the ``hardware.`` and ``model.`` overrides to the raw YAML data of a profile
    and a model (validated afterwards by the caller)."""
    for path, value in overrides:
        if path.startswith(HARDWARE):
            sub = hardware_subpath(path[len(HARDWARE):], hw_raw)
            hw_raw = apply_override(hw_raw, sub, value, hardware_model, hw_file, source="override (--set)")
        elif path.startswith(MODEL):
            model_raw = apply_override(model_raw, path[len(MODEL):], value, model_model, model_file)
    return hw_raw, model_raw


def with_overrides(spec: RunSpec, extra) -> RunSpec:
    """``spec`` with more overrides appended (later ones win)."""
    return RunSpec.model_validate({**spec.model_dump(), "overrides": list(spec.overrides) + list(extra)})


__all__ = ["RunSpec", "RUN_FIELDS", "Engine", "apply_run_overrides", "canonical", "check_path",
           "hardware_subpath", "override_raw", "with_overrides"]
