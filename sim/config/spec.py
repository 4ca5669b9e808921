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

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, field_validator, model_validator

from sim.config.defaults import DISPATCHES, PLACEMENTS
from sim.config.defaults import RUN_DEFAULTS as D
from sim.config.loader import apply_override, parse_assignment, validate
from sim.config.model import MAX_CONTEXT
from sim.config.quantity import MAX_COUNT, Strict, real, whole
from sim.errors import ConfigError

Engine = Literal["des", "analytic"]
MAX_BATCH = 1_000_000  # sequences per step
MAX_STEPS = 1_000_000  # decode steps
MAX_SEQUENCE_STEPS = 10_000_000  # batch x steps: (sequence, step) entries of a generated trace
MAX_TARGET_MS = 1e6  # a per-token target beyond 1000 s is a typo
MAX_CHIPS = 1_000_000
MAX_NAME = 1024  # characters of a name or path (hardware, model, formats, stack, trace, routing)
NAME_PART = 255  # characters of one path component (the usual file-system limit)


def _name(text: str) -> str:
    if not text.strip():
        raise ValueError("expected a name or a path, not an empty text")
    if len(text) > MAX_NAME:
        raise ValueError(f"expected a name or a path of at most {MAX_NAME:,} characters, got {len(text):,}")
    if any(len(part) > NAME_PART for part in text.split("/")):
        raise ValueError(f"expected a name or a path whose parts have at most {NAME_PART} characters")
    if "\x00" in text:
        raise ValueError("expected a name or a path without NUL characters")
    return text


Name = Annotated[str, AfterValidator(_name)]


class RunSpec(Strict):
    """One run as asked: hardware, model, formats, workload, engine and options."""

    hardware: Name = D["hardware"]
    model: Name = D["model"]
    weights: Name = D["weights"]
    kv: Name = D["kv"]
    batch: whole(1, MAX_BATCH, strict=False) = D["batch"]
    context: whole(1, MAX_CONTEXT, strict=False) = D["context"]
    trace: Name | None = None
    steps: whole(1, MAX_STEPS, strict=False) = D["steps"]
    target_ms: real(0, MAX_TARGET_MS, lo_open=True) = D["target_ms"]
    engine: Engine = D["engine"]
    graph: bool | None = None  # None: the software stack's launch mode
    tp: whole(1, MAX_CHIPS, strict=False) | None = None
    pp: whole(1, MAX_CHIPS, strict=False) | None = None
    software: Name = D["software"]  # a stack of workloads/software/ or a stack YAML path
    overrides: tuple[tuple[str, Any], ...] = ()
    seed: whole(0, 2**63 - 1, strict=False) = 0
    allow_long_context: bool = False  # simulate contexts beyond the model's max_context
    # Mixture-of-Experts (used when the model has a `moe:` section; see sim.lowering.moe)
    dispatch: Literal[DISPATCHES] = D["dispatch"]
    placement: Literal[PLACEMENTS] = D["placement"]
    routing: Name = D["routing"]  # uniform | zipf | a routing file (sim.moe.routing)
    routing_skew: real(0, 100) = 1.0
    routing_locality: real(0, 1) = 0.0
    sram_experts: whole(0, MAX_COUNT, strict=False) | None = None  # experts to pin per chip (default: as many as fit)
    chips: whole(1, MAX_CHIPS, strict=False) | None = None  # overrides hardware.system.chips
    microbatches: whole(1, 64, strict=False) = 1  # micro-batches in flight per step, each on its own streams
    # expert-parallel deployments (sim.moe.plan): extra replicas of hot experts per MoE layer
    # over the EP ranks (DeepSeek's EPLB), and attention data-parallel groups (each holds
    # ``batch / attention_dp`` of the sequences; experts spread over every chip of every group)
    redundant_experts: whole(0, MAX_COUNT, strict=False) = 0
    attention_dp: whole(1, MAX_CHIPS, strict=False) = 1

    @field_validator("overrides", mode="before")
    @classmethod
    def _pairs(cls, value):
        if isinstance(value, str):
            value = [value]
        if isinstance(value, dict):
            value = list(value.items())
        if not isinstance(value, (list, tuple)):
            raise ValueError("overrides must be a list of DOTTED.PATH=VALUE texts or (path, value) pairs")
        pairs = []
        for item in value:
            if isinstance(item, str):
                pairs.append(parse_assignment(item))
            elif isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str):
                pairs.append(tuple(item))
            else:
                raise ValueError(f"each override must be DOTTED.PATH=VALUE text or a (path, value) pair, got {item!r}")
        return tuple(pairs)

    @model_validator(mode="after")
    def _microbatches(self):
        if self.microbatches > 1 and self.trace is None and self.microbatches > self.batch:
            raise ValueError(f"microbatches ({self.microbatches}) must be at most the batch ({self.batch})")
        return self

    @model_validator(mode="after")
    def _bounded_work(self):
        if self.batch * self.steps > MAX_SEQUENCE_STEPS:
            raise ValueError(f"batch x steps must be at most {MAX_SEQUENCE_STEPS:,} (every step lists every "
                             f"sequence), got {self.batch:,} x {self.steps:,}")
        return self


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
    data = spec.model_dump(exclude_unset=True)  # a field left unset stays unset (software: the profile's own)
    for key, value in updates.items():
        current = getattr(spec, key)
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
        try:
            if path.startswith(HARDWARE):
                sub = hardware_subpath(path[len(HARDWARE):], hw_raw)
                hw_raw = apply_override(hw_raw, sub, value, hardware_model, hw_file, source="override (--set)")
            elif path.startswith(MODEL):
                model_raw = apply_override(model_raw, path[len(MODEL):], value, model_model, model_file)
        except ConfigError as err:  # name the override, not the (maybe installed) file it was applied to
            prefix = HARDWARE if path.startswith(HARDWARE) else MODEL
            raise ConfigError("--set", canonical(prefix + err.key_path), err.expected, err.got) from None
    return hw_raw, model_raw


def validate_overridden(model, raw: dict, file: str, overrides, prefix: str):
    """``validate(model, raw, file)`` for a profile or model after ``overrides``; an error at
    (or around) a path an override set names that override (``--set: PATH: ...``), since the
    file itself is not at fault."""
    try:
        return validate(model, raw, file)
    except ConfigError as err:
        culprit = _culprit(err.key_path, overrides, prefix, raw)
        if culprit is None:
            raise
        at = canonical(prefix + err.key_path)
        inner = "" if not err.key_path or at in (canonical(culprit), canonical(culprit) + ".value") \
            else f" (at {err.key_path})"
        raise ConfigError("--set", culprit, err.expected + inner, err.got) from None


def _level_named(sub: str, raw: dict) -> str:
    """``memory.0.x`` -> ``memory.hbm.x`` (errors name list items by their name)."""
    parts = sub.split(".")
    levels = raw.get("memory")
    if len(parts) > 1 and parts[0] == "memory" and parts[1].lstrip("-").isdigit() and isinstance(levels, list):
        index = int(parts[1])
        if -len(levels) <= index < len(levels) and isinstance(levels[index], dict):
            parts[1] = str(levels[index].get("name", parts[1]))
    return ".".join(parts)


def _culprit(key_path: str, overrides, prefix: str, raw: dict) -> str | None:
    """The last override at, below or above ``key_path`` (a whole-file check: the last override)."""
    mine = [path for path, _ in overrides if path.startswith(prefix)]
    if not key_path:
        return mine[-1] if mine else None
    error = canonical(prefix + key_path)
    for path in reversed(mine):
        sub = _level_named(hardware_subpath(path[len(prefix):], raw), raw) if prefix == HARDWARE \
            else path[len(prefix):]
        mine_path = canonical(prefix + sub)
        if error == mine_path or error.startswith(mine_path + ".") or mine_path.startswith(error + "."):
            return path
    return None


def with_overrides(spec: RunSpec, extra) -> RunSpec:
    """``spec`` with more overrides appended (later ones win)."""
    return RunSpec.model_validate({**spec.model_dump(), "overrides": list(spec.overrides) + list(extra)})


__all__ = ["RunSpec", "Name", "MAX_NAME", "RUN_FIELDS", "Engine", "apply_run_overrides", "canonical", "check_path",
           "hardware_subpath", "override_raw", "validate_overridden", "with_overrides"]
