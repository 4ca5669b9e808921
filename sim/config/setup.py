"""The setup stage: one frozen ``Setup`` per run, resolved before anything is simulated.

``resolve(spec)`` reads the hardware profile and the model (the one loader), applies the
overrides (the one grammar, sim.config.spec), validates both, loads the weight and KV
formats, picks tensor and pipeline parallelism, reads or generates the decode trace and,
for a Mixture-of-Experts model, builds its routing and placement (sim.moe.plan). The result
is sealed: the later stages (lowering, costs, engine, results) only read it.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from functools import lru_cache

from sim import trace as traces
from sim.config.hardware import HardwareProfile
from sim.config.loader import load_yaml, validate
from sim.config.model import ModelSpec
from sim.config.software import SoftwareStack, load_stack
from sim.config.spec import RunSpec, apply_run_overrides, override_raw, validate_overridden
from sim.errors import ConfigError
from sim.formats import Format, get_format
from sim.paths import hardware_dir, models_dir
from sim.paths import resolve as resolve_path

ACT_BYTES = 2  # activations in bf16


@dataclass(frozen=True)
class Setup:
    """A resolved run. Widths are per chip under tensor parallelism ``tp``."""

    spec: RunSpec
    hardware: HardwareProfile
    model: ModelSpec
    weights: Format
    kv: Format
    tp: int
    pp: int
    software: str
    stack: SoftwareStack
    graph: bool  # captured graph (True) or eager launches: the stack's, unless the run says
    steps: tuple[traces.Step, ...]
    hardware_file: str
    model_file: str
    moe: object | None  # sim.moe.plan.MoEPlan for a model with a moe: section
    # derived (per chip)
    heads: int
    kv_heads: int
    q_width: int
    k_width: int
    v_width: int
    vocab: int
    layers_per_stage: int  # the fullest pipeline stage
    store: str  # the backing store level
    act_level: str  # where activations live between ops

    def stage_layers(self, stage: int) -> range:
        """Layers of ``stage``: split as evenly as possible (sizes differ by at most one)."""
        layers = self.model.layers
        return range(stage * layers // self.pp, (stage + 1) * layers // self.pp)

    def stage_of(self, layer: int) -> int:
        return next(s for s in range(self.pp) if layer in self.stage_layers(s))

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer in self.moe.moe_index


@lru_cache(maxsize=64)
def _raw(path: str) -> dict:
    return load_yaml(path)


def resolve(spec: RunSpec) -> Setup:
    """Resolve ``spec`` into a sealed Setup (ConfigError / SimulationError on bad input)."""
    spec = apply_run_overrides(spec)
    stack = load_stack(spec.software)
    hw_path = str(resolve_path(spec.hardware, hardware_dir(), "hardware"))
    model_path = str(resolve_path(spec.model, models_dir(), "model"))
    hw_raw, model_raw = copy.deepcopy(_raw(hw_path)), copy.deepcopy(_raw(model_path))
    chips = () if spec.chips is None else (("hardware.system.chips", spec.chips),)
    hw_raw, model_raw = override_raw(hw_raw, model_raw, (*chips, *spec.overrides), hw_path, model_path,
                                     HardwareProfile, ModelSpec)
    hardware = validate_overridden(HardwareProfile, hw_raw, hw_path, (*chips, *spec.overrides), "hardware.")
    model = validate_overridden(ModelSpec, model_raw, model_path, spec.overrides, "model.")
    weights, kv = get_format(spec.weights), get_format(spec.kv)
    tp, pp = parallelism(spec, hardware, model, hw_path)
    if spec.trace:
        steps = traces.read(spec.trace)[: spec.steps]
    else:
        steps = traces.fixed(spec.batch, spec.context, spec.steps)
    check_context(spec, model, steps)
    moe = None
    if model.moe is not None:
        from sim.moe.plan import build  # numpy and the placement: only for MoE models (start-up time)

        moe = build(spec, model, hardware, weights, tp, [step.batch for step in steps],
                    graph=stack.launch == "graph" if spec.graph is None else spec.graph)
    shared = hardware.shared_sram
    store = hardware.store.name
    heads, kv_heads = max(1, model.heads // tp), max(1, model.kv_heads // tp)  # KV heads replicate when tp > kv_heads
    per_head = model.kv_heads * model.head_dim
    return Setup(
        spec=spec, hardware=hardware, model=model, weights=weights, kv=kv, tp=tp, pp=pp, software=stack.name,
        stack=stack, graph=stack.launch == "graph" if spec.graph is None else spec.graph,
        steps=tuple(steps), hardware_file=hw_path, model_file=model_path, moe=moe,
        heads=heads, kv_heads=kv_heads, q_width=heads * model.head_dim,
        k_width=kv_heads * model.head_dim * model.k_width // per_head,
        v_width=kv_heads * model.head_dim * model.v_width // per_head,
        vocab=math.ceil(model.vocab / tp), layers_per_stage=math.ceil(model.layers / pp),
        store=store, act_level=shared.name if shared is not None else store)


def check_context(spec: RunSpec, model: ModelSpec, steps) -> None:
    """No step may hold more tokens than the model's ``max_context`` unless the run says
    ``allow_long_context`` (a what-if beyond what the model was trained for)."""
    if spec.allow_long_context:
        return
    longest = max(max(step.contexts) for step in steps) if spec.trace else spec.context + spec.steps - 1
    if longest <= model.max_context:
        return
    where = (spec.trace, "context") if spec.trace else ("--context", "context")
    how = "a step" if spec.trace else f"the last step (context {spec.context:,} + {spec.steps - 1:,} steps)"
    raise ConfigError(*where, f"{how} holds {longest:,} tokens, beyond {model.name}'s max_context of "
                      f"{model.max_context:,}; pass --allow-long-context (allow_long_context: true) to simulate "
                      "it anyway", longest)


def parallelism(spec: RunSpec, hardware: HardwareProfile, model: ModelSpec, hw_file: str = "hardware") -> tuple[int, int]:
    """(tp, pp) for the run: as asked, or tp = min(chips, 8) and pp = chips / tp."""
    chips = hardware.chips
    tp = spec.tp or (min(chips, 8) if spec.pp is None else max(1, chips // spec.pp))
    pp = spec.pp or max(1, chips // tp)
    where = ("--tp/--pp", "parallelism") if spec.tp or spec.pp else (hw_file, "system.chips.value")
    if tp * pp != chips:
        raise ConfigError(*where, f"tp x pp must equal the chip count {chips}", f"{tp} x {pp}")
    if pp > model.layers:
        raise ConfigError(*where, f"at most one pipeline stage per layer ({model.layers}); "
                          f"{chips} chips at tp {tp} need {pp} stages", pp)
    return tp, pp


def load_profile(name_or_path: str) -> HardwareProfile:
    """A bundled hardware profile by name, or a profile YAML file, validated."""
    path = resolve_path(name_or_path, hardware_dir(), "hardware")
    return validate(HardwareProfile, load_yaml(path), path)


def load_model(name_or_path: str) -> ModelSpec:
    """A bundled model by name, or a model YAML file, validated."""
    path = resolve_path(name_or_path, models_dir(), "model")
    return validate(ModelSpec, load_yaml(path), path)


__all__ = ["Setup", "resolve", "parallelism", "ACT_BYTES", "load_profile", "load_model"]
