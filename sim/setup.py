"""The setup stage: one frozen ``RunSetup`` per run, resolved before anything is simulated.

``resolve(spec)`` reads the hardware profile and the model (the one loader), applies the
overrides (the one grammar, sim.config.spec), validates both, loads the weight and KV
formats, picks tensor and pipeline parallelism, reads or generates the decode trace and,
for a Mixture-of-Experts model, builds its routing and placement (sim.moe.plan). The result
is sealed: the later stages (lowering, costs, engine, results) only read it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from sim import decode_trace as traces
from sim.config.hardware import OFF_CHIP, SRAM, HardwareProfile, Place
from sim.config.loader import load_yaml, validate
from sim.config.model import ModelSpec
from sim.config.software import SoftwareStack, load_stack
from sim.config.spec import HARDWARE, MODEL, RunSpec, apply_run_overrides, override_raw, validate_overridden
from sim.errors import ConfigError
from sim.formats import Format, get_format, list_formats
from sim.paths import hardware_dir, models_dir
from sim.paths import resolve as resolve_path

ACT_BYTES = 2  # activations in bf16


@dataclass(frozen=True)
class RunSetup:
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
    layers_per_stage: int  # the fullest pipeline stage (layers whose attention, hence KV, it holds)
    store: str  # the backing store level
    act_level: str  # where activations live between ops
    # per stage, its units: (layer, "attn" | "ffn"), with (-1, "embed") and (-1, "head") at the ends
    partition: tuple[tuple[tuple[int, str], ...], ...] = ()
    # attention data-parallel groups (``steps`` are then the fullest group's share of each step) and
    # every group's sequences per step together (the deployment's batch; the MoE routing's tokens)
    attention_dp: int = 1
    deployment_batches: tuple[int, ...] = ()

    def stage_units(self, stage: int) -> tuple[tuple[int, str], ...]:
        return self.partition[stage]

    def stage_layers(self, stage: int) -> range:
        """Layers of ``stage`` (whole or in part)."""
        layers = sorted({layer for layer, _ in self.partition[stage] if layer >= 0})
        return range(layers[0], layers[-1] + 1) if layers else range(0)

    def stage_of(self, layer: int) -> int:
        return next(s for s in range(self.pp) if layer in self.stage_layers(s))

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer in self.moe.moe_index


def _version(path: str) -> tuple[str, int]:
    """A file's path and modification time: what a file read once per version is keyed by."""
    return path, os.stat(path).st_mtime_ns


@lru_cache(maxsize=64)
def _raw(path: str, mtime_ns: int) -> dict:
    """The YAML data of one version of a file (callers never mutate it: overrides copy)."""
    return load_yaml(path)


@lru_cache(maxsize=64)
def _file_model(model, path: str, mtime_ns: int):
    """One version of a profile or model file, validated once; the result is frozen, so runs share it."""
    return validate(model, _raw(path, mtime_ns), path)


def _validated(model, raw: dict, version: tuple[str, int], overrides, prefix: str):
    """``model`` from ``raw`` (a file's data, the ``overrides`` under ``prefix`` applied); a file
    that no override addresses is validated once per version (``_file_model``)."""
    if any(path.startswith(prefix) for path, _ in overrides):
        return validate_overridden(model, raw, version[0], overrides, prefix)
    return _file_model(model, *version)


def _by_name(key: str, find, name: str, *args):
    """``find(name, *args)``; a name that is not there is said against the RunSpec ``key``
    that gave it (``kv: unknown format 'x'``, not which lookup failed)."""
    try:
        return find(name, *args)
    except ConfigError as err:
        if err.file is not None:  # a file that is there but bad: its own path and key say where
            raise
        raise ConfigError(None, key, err.expected, err.got) from None


ROLE_NAMES = {"weights": "a weight format", "kv": "a KV-cache format"}


def _format(role: str, name: str) -> Format:
    """The format ``name`` for ``role`` (weights or kv): one made for the other role (``role:``
    in its file) is refused, as its numbers would mean nothing there (kivi-2's per-token
    grouping read as a weight layout)."""
    fmt = _by_name(role, get_format, name)
    if fmt.role not in (role, "both"):
        fitting = ", ".join(f.name for f in list_formats(role))
        raise ConfigError(None, role, f"format {fmt.name!r} is {ROLE_NAMES[fmt.role]} (role: {fmt.role}); "
                          f"expected {ROLE_NAMES[role]}: {fitting}", name)
    return fmt


def format_for(role: str, name: str) -> Format:
    """The format ``name`` checked for ``role`` (weights or kv), as a run resolves it: for a
    command that takes several and wants each refused before any work (compare's ``--kv``)."""
    return _format(role, name)


class _Machine(NamedTuple):
    """What a run resolves to whatever its batch, contexts and engine: the validated profile and
    model, the stack, the formats, the parallelism and the per-chip widths."""

    hardware: HardwareProfile
    model: ModelSpec
    stack: SoftwareStack
    weights: Format
    kv: Format
    tp: int
    pp: int
    heads: int
    kv_heads: int
    q_width: int
    k_width: int
    v_width: int


_MACHINES: dict[tuple, _Machine] = {}  # see ``_machine``
_MACHINES_LIMIT = 64


def resolve(spec: RunSpec) -> RunSetup:
    """Resolve ``spec`` into a sealed RunSetup (ConfigError / SimulationError on bad input)."""
    spec = apply_run_overrides(spec)
    hw_path = str(_by_name("hardware", resolve_path, spec.hardware, hardware_dir(), "hardware"))
    model_path = str(_by_name("model", resolve_path, spec.model, models_dir(), "model"))
    hardware, model, stack, weights, kv, tp, pp, heads, kv_heads, q_width, k_width, v_width = _machine(
        spec, hw_path, model_path)
    if spec.trace:
        steps = traces.read(spec.trace, spec.steps)
    else:
        steps = traces.fixed(spec.batch, spec.context, spec.steps)
    check_context(spec, model, steps)
    deployment_batches = tuple(step.batch for step in steps)
    spec = _stack_microbatches(spec, model, stack, steps)
    if spec.attention_dp > 1:
        steps = [group_share(step, spec.attention_dp) for step in steps]
    shared = hardware.shared_sram
    store = hardware.store.name
    if hardware.system.partition == "balanced":
        sizes = unit_bytes(model, weights, kv, tp, q_width, k_width, v_width, steps)
        partition = balanced_partition(sizes, pp)
    else:
        partition = layer_partition(model.layers, pp)
    if hardware.placement is not None and hardware.placement.policy == "fit":
        hardware = fit_placement(hardware, partition, unit_bytes(model, weights, kv, tp, q_width, k_width, v_width,
                                                                 steps, split_experts=True))
    moe = None
    if model.moe is not None:
        from sim.moe.plan import build  # numpy and the placement: only for MoE models (start-up time)

        moe = build(spec, model, hardware, weights, tp, list(deployment_batches),
                    graph=stack.launch == "graph" if spec.graph is None else spec.graph)
    layers_per_stage = _most_attention_units(partition)
    return RunSetup(
        spec=spec, hardware=hardware, model=model, weights=weights, kv=kv, tp=tp, pp=pp, software=stack.name,
        stack=stack, graph=stack.launch == "graph" if spec.graph is None else spec.graph,
        steps=tuple(steps), hardware_file=hw_path, model_file=model_path, moe=moe,
        heads=heads, kv_heads=kv_heads, q_width=q_width, k_width=k_width, v_width=v_width,
        vocab=math.ceil(model.vocab / tp), layers_per_stage=layers_per_stage,
        store=store, act_level=shared.name if shared is not None else store, partition=partition,
        attention_dp=spec.attention_dp, deployment_batches=deployment_batches)


def _stack_microbatches(spec: RunSpec, model: ModelSpec, stack: SoftwareStack, steps) -> RunSpec:
    """``spec`` with the stack's micro-batches for a MoE model (``moe_microbatches``: its
    two-batch overlap) where the run names none and every step (each attention group's share)
    has a sequence for each."""
    m = stack.moe_microbatches
    if model.moe is None or m == 1 or "microbatches" in spec.model_fields_set:
        return spec
    if min(step.batch for step in steps) < m * spec.attention_dp:
        return spec
    return spec.model_copy(update={"microbatches": m})


def group_share(step: traces.Step, groups: int) -> traces.Step:
    """The sequences of ``step`` that the first (the fullest) of ``groups`` attention data-parallel
    groups decodes: every ``groups``-th one, as a scheduler deals them out."""
    return traces.Step(step.index, step.seq_ids[::groups], step.contexts[::groups])


def _machine(spec: RunSpec, hw_path: str, model_path: str) -> _Machine:
    """``_resolve_machine``, kept per version of the two files and the spec's fields it reads
    (the points of a sweep over batch, context or engine share one: the same objects, so the
    same cost model and its memos). A key with an override value that does not hash (a list)
    is resolved afresh."""
    hw_version, model_version = _version(hw_path), _version(model_path)
    key = (hw_version, model_version, spec.chips, spec.overrides, "software" in spec.model_fields_set,
           spec.software, spec.weights, spec.kv, spec.tp, spec.pp, spec.attention_dp)
    try:
        machine = _MACHINES.get(key)
    except TypeError:
        return _resolve_machine(spec, hw_version, model_version)
    if machine is None:
        machine = _resolve_machine(spec, hw_version, model_version)
        if len(_MACHINES) >= _MACHINES_LIMIT:
            _MACHINES.clear()
        _MACHINES[key] = machine
    return machine


def _resolve_machine(spec: RunSpec, hw_version: tuple[str, int], model_version: tuple[str, int]) -> _Machine:
    """The profile and model (overrides applied, validated), the stack, the formats, tp and pp
    and the per-chip widths of ``spec`` (see ``_Machine``)."""
    hw_path, model_path = hw_version[0], model_version[0]
    chips = () if spec.chips is None else (("hardware.system.chips", spec.chips),)
    overrides = (*chips, *spec.overrides)
    hw_raw, model_raw = override_raw(_raw(*hw_version), _raw(*model_version), overrides, hw_path, model_path,
                                     HardwareProfile, ModelSpec)
    hardware = _validated(HardwareProfile, hw_raw, hw_version, overrides, HARDWARE)
    model = _validated(ModelSpec, model_raw, model_version, spec.overrides, MODEL)
    # a run that names no stack runs the one its machine runs (a compiler's static schedule), else the default
    named = "software" in spec.model_fields_set
    if named or hardware.software is None:
        stack = _by_name("software", load_stack, spec.software)
    else:
        try:
            stack = load_stack(hardware.software)
        except ConfigError as err:  # the profile names a stack that is not there: say so against the profile
            raise ConfigError(hw_path, "software", f"the stack this machine runs: {err.expected}",
                              hardware.software) from None
    weights, kv = _format("weights", spec.weights), _format("kv", spec.kv)
    weights = weights.on_chip(frozenset(hardware.compute.matrix_flops_per_cycle), hardware.name,
                              stack.native_weight_codes)
    tp, pp = parallelism(spec, hardware, model, hw_path)
    # the fullest chip's heads (tp need not divide them on a spatial machine); KV heads replicate when tp > kv_heads
    heads, kv_heads = max(1, math.ceil(model.heads / tp)), max(1, math.ceil(model.kv_heads / tp))
    per_head = model.kv_heads * model.head_dim
    k_width = kv_heads * model.head_dim * model.k_width // per_head
    v_width = kv_heads * model.head_dim * model.v_width // per_head
    return _Machine(hardware, model, stack, weights, kv, tp, pp, heads, kv_heads, heads * model.head_dim, k_width,
                    v_width)


# -- pipeline partitions ---------------------------------------------------------------------


@lru_cache(maxsize=256)
def _most_attention_units(partition: tuple[tuple[tuple[int, str], ...], ...]) -> int:
    """The most attention units (layers' KV caches) one stage of ``partition`` holds."""
    return max(sum(1 for _, part in stage if part == "attn") for stage in partition)


def layer_units(layers: int) -> list[tuple[int, str]]:
    """The pipeline units of a model in program order: the embedding, each layer's attention
    and FFN halves, the LM head."""
    return [(-1, "embed"), *[(layer, part) for layer in range(layers) for part in ("attn", "ffn")], (-1, "head")]


@lru_cache(maxsize=256)
def layer_partition(layers: int, pp: int) -> tuple[tuple[tuple[int, str], ...], ...]:
    """Whole layers split as evenly as possible (sizes differ by at most one); the embedding
    on the first stage, the LM head on the last (immutable: kept per layer count and depth,
    as every run of a sweep asks the same)."""
    stages = []
    for s in range(pp):
        units = [(layer, part) for layer in range(s * layers // pp, (s + 1) * layers // pp) for part in ("attn", "ffn")]
        stages.append(([(-1, "embed")] if s == 0 else []) + units + ([(-1, "head")] if s == pp - 1 else []))
    return tuple(tuple(stage) for stage in stages)


def unit_bytes(model: ModelSpec, weights: Format, kv: Format, tp: int, q_width: int, k_width: int, v_width: int,
               steps, split_experts: bool = False) -> list:
    """Bytes one chip of a stage holds for each unit (weights, and the KV cache of the longest
    step for attention units), from the model's shapes and the formats. ``split_experts``:
    per unit (dense weights, expert weights, KV) instead of their sum."""
    h = model.hidden
    kv_layer = max(sum(kv.kv_footprint(c, k_width, v_width) for c in step.contexts) for step in steps)
    attn = weights.weight_bytes(q_width + k_width + v_width, h) + weights.weight_bytes(h, q_width) + h * ACT_BYTES
    ffn_local = math.ceil(model.ffn / tp)
    dense = weights.weight_bytes((model.ffn_matrices - 1) * ffn_local, h) + weights.weight_bytes(h, ffn_local)
    vocab = weights.weight_bytes(math.ceil(model.vocab / tp), h)
    out: list = []
    for unit in layer_units(model.layers):
        layer, part = unit
        experts = cache = 0
        if part == "embed":
            size = vocab
        elif part == "head":
            size = vocab + h * ACT_BYTES
        elif part == "attn":
            size, cache = attn, kv_layer
        elif model.moe is None or model.moe.is_dense(layer):
            size = dense + h * ACT_BYTES
        else:
            moe = model.moe
            experts = moe.experts * (weights.weight_bytes((model.ffn_matrices - 1) * moe.expert_ffn, h)
                                     + weights.weight_bytes(h, moe.expert_ffn))
            shared = moe.shared_experts * (weights.weight_bytes((model.ffn_matrices - 1) * moe.shared_ffn, h)
                                           + weights.weight_bytes(h, moe.shared_ffn))
            size = math.ceil(shared / tp) + h * moe.experts * ACT_BYTES + h * ACT_BYTES
            experts = math.ceil(experts / tp)
        out.append((unit, (size, experts, cache)) if split_experts else (unit, size + experts + cache))
    return out


def fit_placement(hardware: HardwareProfile, partition, sizes) -> HardwareProfile:
    """``hardware`` with its placement chosen by the ``fit`` policy for the fullest stage:
    KV in the home tier; dense weights resident in the fastest tier that holds them beside
    what is already there, else streamed from the fastest off-chip tier that does; then the
    experts the same way. Where nothing holds them they stay in the home tier (the capacity
    check then names the tier that overflows)."""
    by_unit = dict(sizes)
    stages = [[by_unit[u] for u in stage] for stage in partition]
    dense = max(sum(s[0] for s in stage) for stage in stages)
    experts = max(sum(s[1] for s in stage) for stage in stages)
    kv = max(sum(s[2] for s in stage) for stage in stages)
    store = hardware.store
    free = {lv.name: (lv.resident_bytes if isinstance(lv, SRAM) and lv is not store else lv.capacity_bytes)
            for lv in hardware.memory}
    free[store.name] -= kv
    fastest = sorted(hardware.memory, key=lambda lv: -lv.sustained_GBps)
    buffer = (hardware.shared_sram or hardware.tile_sram)

    def choose(size: int) -> Place:
        for lv in fastest:
            if size <= free[lv.name]:
                free[lv.name] -= size
                return Place(tier=lv.name)
        return Place(tier=store.name)

    weights = choose(dense)
    if weights.tier not in (lv.name for lv in fastest[:1]) and buffer is not None and isinstance(
            hardware.level(weights.tier), OFF_CHIP):
        weights = Place(tier=weights.tier, mode="streamed", buffer=buffer.name)
    chosen = {"weights": weights, "kv": Place(tier=store.name)}
    if experts:
        place = choose(experts)
        if buffer is not None and isinstance(hardware.level(place.tier), OFF_CHIP):
            place = Place(tier=place.tier, mode="streamed", buffer=buffer.name)
        chosen["experts"] = place
    placement = hardware.placement.model_copy(update={**chosen, "policy": "given",
                                                      "source": f"chosen by the fit policy; {hardware.placement.source}"})
    return hardware.model_copy(update={"placement": placement})


def balanced_partition(sizes: list[tuple[tuple[int, str], int]], pp: int) -> tuple[tuple[tuple[int, str], ...], ...]:
    """Contiguous units split into ``pp`` non-empty stages minimising the largest stage's bytes
    (binary search over that bound, greedy fill; exact for contiguous partitions)."""
    values = [size for _, size in sizes]
    if pp > len(values):
        raise ValueError(f"{pp} stages for {len(values)} units")

    def stages_needed(bound: int) -> int:
        count, filled = 1, 0
        for v in values:
            if filled + v > bound:
                count, filled = count + 1, v
            else:
                filled += v
        return count

    lo, hi = max(values), sum(values)
    while lo < hi:
        mid = (lo + hi) // 2
        if stages_needed(mid) <= pp:
            hi = mid
        else:
            lo = mid + 1
    groups: list[list[tuple[int, str]]] = [[]]
    filled = 0
    for i, (unit, size) in enumerate(sizes):
        remaining_units, remaining_stages = len(sizes) - i, pp - len(groups)
        must_split = groups[-1] and remaining_units <= remaining_stages  # every later stage needs a unit
        if groups[-1] and (filled + size > lo or must_split):
            groups.append([])
            filled = 0
        groups[-1].append(unit)
        filled += size
    return tuple(tuple(group) for group in groups)


def check_context(spec: RunSpec, model: ModelSpec, steps) -> None:
    """No step may hold more tokens than the model's ``max_context`` unless the run says
    ``allow_long_context`` (a what-if beyond what the model was trained for)."""
    if spec.allow_long_context:
        return
    longest = max(max(step.contexts) for step in steps) if spec.trace else spec.context + spec.steps - 1
    if longest <= model.max_context:
        return
    where = (spec.trace, "context") if spec.trace else (None, "context")  # no file: the command line or a study point
    how = "a step" if spec.trace else f"the last step (context {spec.context:,} + {spec.steps - 1:,} steps)"
    raise ConfigError(*where, f"{how} holds {longest:,} tokens, beyond {model.name}'s max_context of "
                      f"{model.max_context:,}; pass --allow-long-context (allow_long_context: true) to simulate "
                      "it anyway", longest)


def parallelism(spec: RunSpec, hardware: HardwareProfile, model: ModelSpec, hw_file: str = "hardware") -> tuple[int, int]:
    """(tp, pp) for the run: as asked, or chosen. Stages hold whole layers (``partition:
    layers``, at most one stage per layer) or half-layer units (``balanced``, at most two per
    layer plus the embedding and the LM head). The default tensor-parallel degree is the
    profile's ``system.tensor_parallel``, else the chips of a group (``scaleout.chips_per_group``)
    or min(chips, 8); where that leaves more stages
    than units, the smallest larger divisor of the chip count that fits (one that divides the
    heads when there is one)."""
    dp = spec.attention_dp
    if hardware.chips % dp:
        raise ConfigError(None, "attention_dp", f"attention data-parallel groups must divide the chip count "
                          f"{hardware.chips} ({hardware.name})", dp)
    chips = hardware.chips // dp  # each group's
    balanced = hardware.system.partition == "balanced"
    units = 2 * model.layers + 2 if balanced else model.layers
    asked = bool(spec.tp or spec.pp)
    where = (None, "tp" if spec.tp else "pp") if asked else (hw_file, "system.chips.value")
    tp, pp = _asked_parallelism(spec, chips, where, dp) if asked else _chosen_parallelism(hardware, model, units, chips)
    if pp > units:
        what = "half-layer units (attention or FFN, plus the embedding and the LM head)" if balanced else "layers"
        hint = "" if balanced else "; a profile with system.partition: balanced splits layers in half"
        raise ConfigError(*where, f"at most one pipeline stage per unit: {model.name} has {units} {what}, and "
                          f"{chips} chips at tp {tp} make {pp} stages; use tp >= {math.ceil(chips / units)}{hint}", pp)
    return tp, pp


def _asked_parallelism(spec: RunSpec, chips: int, where: tuple[str, str], dp: int = 1) -> tuple[int, int]:
    """(tp, pp) from --tp and/or --pp, the missing one filling the chip count (of one of ``dp``
    attention data-parallel groups)."""
    tp = spec.tp or max(1, chips // spec.pp)
    pp = spec.pp or max(1, chips // tp)
    if tp * pp != chips:
        what = (f"the chips of each of the {dp} attention data-parallel groups ({chips})" if dp > 1
                else f"the chip count {chips}")
        raise ConfigError(*where, f"tp x pp must equal {what}", f"{tp} x {pp}")
    return tp, pp


def _chosen_parallelism(hardware: HardwareProfile, model: ModelSpec, units: int, chips: int) -> tuple[int, int]:
    """(tp, pp) over ``chips`` (an attention data-parallel group's) from the profile's default
    tensor-parallel degree (see ``parallelism``)."""
    scaleout = hardware.system.scaleout
    base = min(chips, scaleout.chips_per_group.value if scaleout is not None else 8)
    if hardware.system.tensor_parallel is not None:
        base = hardware.system.tensor_parallel.value
    fits = [t for t in range(1, chips + 1) if chips % t == 0 and chips // t <= units]
    even = [t for t in fits if model.heads % t == 0] or fits
    tp = next((t for t in even if t >= base), next(t for t in fits if t >= base))
    return tp, chips // tp


def load_profile(name_or_path: str) -> HardwareProfile:
    """A bundled hardware profile by name, or a profile YAML file, validated."""
    path = resolve_path(name_or_path, hardware_dir(), "hardware")
    return validate(HardwareProfile, load_yaml(path), path)


def load_model(name_or_path: str) -> ModelSpec:
    """A bundled model by name, or a model YAML file, validated."""
    path = resolve_path(name_or_path, models_dir(), "model")
    return validate(ModelSpec, load_yaml(path), path)


__all__ = ["RunSetup", "resolve", "parallelism", "ACT_BYTES", "load_profile", "load_model"]
