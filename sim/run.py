"""A run: one model on one hardware profile over one decode trace.

``RunSpec`` is what a user asks (names, sizes, options, dotted-path overrides); ``resolve``
turns it into validated objects; ``simulate`` lowers every step, runs the engine (or the
analytic model) and returns a ``RunResult`` with the summary, the per-step table and, when
asked, the per-op table and the event log.

Override paths (``--set`` and study axes) share one namespace: ``hardware.<path>`` into the
profile (a memory level can be named directly: ``hardware.hbm.channel_bandwidth_GBps``),
``model.<path>`` into the model, and the RunSpec fields themselves (``batch``, ``kv``, ...).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from pydantic import Field, field_validator

from sim import trace as traces
from sim.config.hardware import HardwareProfile
from sim.config.loader import apply_override, load_yaml, parse_assignment, validate
from sim.config.model import ModelSpec
from sim.config.quantity import Strict
from sim.costs import CostModel
from sim.errors import ConfigError
from sim.formats import get_format
from sim.lowering.decode import Plan, lower_step
from sim.paths import bundled, hardware_dir, models_dir
from sim.paths import resolve as resolve_path
from sim.results import bound_of, op_table_rows, percentile, step_breakdown
from sim.units import GB, ns_to_ms

Engine = Literal["des", "analytic"]


class RunSpec(Strict):
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
    graph: bool = True
    tp: int | None = Field(default=None, gt=0)
    pp: int | None = Field(default=None, gt=0)
    software: Literal["fused", "torch-eager"] = "fused"
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
        out = []
        for item in value or ():
            out.append(parse_assignment(item) if isinstance(item, str) else tuple(item))
        return tuple(out)


RUN_FIELDS = set(RunSpec.model_fields) - {"overrides"}


@dataclass
class Resolved:
    spec: RunSpec
    hardware: HardwareProfile
    model: ModelSpec
    plan: Plan
    steps: list[traces.Step]
    hardware_file: str
    model_file: str


@lru_cache(maxsize=64)
def _raw(path: str) -> dict:
    return load_yaml(path)


def _hardware_path(path: str, raw: dict) -> str:
    """``hardware.hbm.x`` -> ``memory.hbm.x`` when ``hbm`` names a memory level."""
    head = path.split(".", 1)[0]
    names = {level.get("name") for level in raw.get("memory", []) if isinstance(level, dict)}
    if head not in HardwareProfile.model_fields and head in names:
        return "memory." + path
    return path


def apply_run_overrides(spec: RunSpec) -> RunSpec:
    """Apply overrides that address RunSpec fields; the rest stay for resolve()."""
    updates = {}
    for path, value in spec.overrides:
        if path in RUN_FIELDS:
            updates[path] = value
        elif not path.startswith(("hardware.", "model.")):
            allowed = ", ".join(sorted(RUN_FIELDS | {"hardware.<path>", "model.<path>"}))
            raise ConfigError("--set", path, f"no such path; expected one of: {allowed}")
    if not updates:
        return spec
    data = spec.model_dump()
    for key, value in updates.items():
        current = data.get(key)
        if isinstance(value, dict) and set(value) <= {"scale", "add"}:
            if not isinstance(current, (int, float)):
                raise ConfigError("--set", key, "a scale or add override needs a number to act on", current)
            value = type(current)(current * value.get("scale", 1) + value.get("add", 0))
        data[key] = value
    data["overrides"] = tuple((p, v) for p, v in spec.overrides if p not in updates)
    return validate(RunSpec, data, "--set")


def resolve(spec: RunSpec) -> Resolved:
    spec = apply_run_overrides(spec)
    hw_path = str(resolve_path(spec.hardware, hardware_dir(), "hardware"))
    model_path = str(resolve_path(spec.model, models_dir(), "model"))
    hw_raw, model_raw = copy.deepcopy(_raw(hw_path)), copy.deepcopy(_raw(model_path))
    if spec.chips is not None:
        hw_raw = apply_override(hw_raw, "system.chips", spec.chips, HardwareProfile, hw_path, source="--chips")
    for path, value in spec.overrides:
        if path.startswith("hardware."):
            sub = _hardware_path(path[len("hardware."):], hw_raw)
            hw_raw = apply_override(hw_raw, sub, value, HardwareProfile, hw_path, source="override (--set)")
        elif path.startswith("model."):
            model_raw = apply_override(model_raw, path[len("model."):], value, ModelSpec, model_path)
    hardware = validate(HardwareProfile, hw_raw, hw_path)
    model = validate(ModelSpec, model_raw, model_path)
    weights, kv = get_format(spec.weights), get_format(spec.kv)
    tp, pp = parallelism(spec, hardware, model, hw_path)
    plan = Plan(model, hardware, weights, kv, tp=tp, pp=pp, software=spec.software)
    if spec.trace:
        steps = traces.read(spec.trace)[: spec.steps] if spec.steps else traces.read(spec.trace)
    else:
        steps = traces.fixed(spec.batch, spec.context, spec.steps)
    if model.moe is not None:
        plan.ffn = _moe_block(spec, plan, steps)
    return Resolved(spec, hardware, model, plan, steps, hw_path, model_path)


def _moe_block(spec: RunSpec, plan: Plan, steps: list):
    """The MoE FFN of the run: its routing trace (generated or read) and placement."""
    from sim.lowering.moe import build
    from sim.moe import routing

    moe = plan.model.moe
    layers = sum(1 for layer in range(plan.model.layers) if not moe.is_dense(layer))
    batches = [step.batch for step in steps]
    if spec.routing in routing.KINDS:
        trace = routing.generate(moe.experts, moe.top_k, layers, len(steps), max(batches), kind=spec.routing,
                                 skew=spec.routing_skew, locality=spec.routing_locality, seed=spec.seed)
    else:
        path = resolve_path(spec.routing, bundled("workloads", "routing"), "routing", suffixes=(".jsonl",))
        trace = routing.read(path, moe.experts, moe.top_k, layers)
        if trace.tokens < max(batches):
            raise ConfigError(spec.routing, "experts", f"each step needs {max(batches)} token rows "
                              f"(the largest batch of the run)", trace.tokens)
    return build(plan, dispatch=spec.dispatch, placement_policy=spec.placement, trace=trace, batches=batches,
                 graph_mode=spec.graph, sram_experts=spec.sram_experts)


def parallelism(spec: RunSpec, hardware: HardwareProfile, model: ModelSpec, hw_file: str = "hardware") -> tuple[int, int]:
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


# -- capacity --------------------------------------------------------------------------------


def capacity(res: Resolved) -> dict:
    """Bytes one chip must hold (the fullest stage) against its backing store."""
    plan, model = res.plan, res.model
    weights = max(plan.weight_bytes_per_chip(s) for s in range(plan.pp))
    per_layer_kv = max(sum(plan.kv.kv_footprint(c, plan.k_width, plan.v_width) for c in step.contexts)
                       for step in res.steps)
    kv = per_layer_kv * plan.layers_per_stage
    batch = max(step.batch for step in res.steps)
    activations = batch * (4 * model.hidden + 2 * model.ffn // plan.tp + plan.vocab) * 4
    needed = weights + kv + activations
    available = res.hardware.store.capacity_bytes
    return {"weights_bytes": weights, "kv_bytes": kv, "activation_bytes": activations,
            "needed_bytes": needed, "available_bytes": available, "fits": needed <= available}


# -- simulation ------------------------------------------------------------------------------


@dataclass
class RunResult:
    summary: dict
    steps: list[dict] = field(default_factory=list)
    ops: list[dict] = field(default_factory=list)
    log: list[tuple] = field(default_factory=list)
    resolved: Resolved | None = None

    def tables(self):
        """(per-step, per-op, event log) as pandas DataFrames."""
        import pandas as pd

        log = pd.DataFrame(self.log, columns=["step", "layer", "op", "resource", "kind", "t_start_ns",
                                              "t_end_ns", "bytes", "flops"])
        return pd.DataFrame(self.steps), pd.DataFrame(self.ops), log


def simulate(spec: RunSpec | dict | None = None, *, keep_ops: bool = False, keep_log: bool = False,
             check_capacity: bool = True, **fields) -> RunResult:
    """Run a spec (or keyword fields of one) and return its RunResult. With
    ``check_capacity=False`` a setup that does not fit is simulated anyway (for speed
    benchmarks and what-ifs); its summary still carries the capacity figures."""
    if spec is None:
        spec = RunSpec(**fields)
    elif isinstance(spec, dict):
        spec = validate(RunSpec, spec, "spec")
    wall = time.perf_counter()
    res = resolve(spec)
    cap = capacity(res)
    base = _identity(res, cap)
    if not cap["fits"] and check_capacity:
        floor_ms = ns_to_ms((cap["weights_bytes"] + cap["kv_bytes"]) / res.hardware.store.peak_GBps)
        base.update(verdict="does-not-fit", meets_target=False, bound="capacity", byte_floor_ms=floor_ms,
                    per_token_ms_p50=None, per_token_ms_p99=None, wall_s=time.perf_counter() - wall,
                    reason=(f"needs {cap['needed_bytes'] / GB:.1f} GB per chip "
                            f"(weights {cap['weights_bytes'] / GB:.1f} GB + KV {cap['kv_bytes'] / GB:.1f} GB "
                            f"+ activations {cap['activation_bytes'] / GB:.2f} GB), "
                            f"{res.hardware.store.name} holds {cap['available_bytes'] / GB:.1f} GB; even if it fit, "
                            f"reading weights and KV once at peak bandwidth takes {floor_ms:.1f} ms per step"))
        return RunResult(base, resolved=res)

    from sim.analytic import analyse
    from sim.engine.simulation import Simulation

    costs = CostModel(res.hardware)
    step_rows, op_rows, log = [], [], []
    events = 0
    for position, step in enumerate(res.steps):
        res.plan.extra["moe_step"] = position  # the MoE block's routing and placement row
        graph = lower_step(res.plan, step.contexts, step.index)
        graph.ops[-1].host_sync = True  # the host needs the step's tokens
        op_costs = [costs.cost(op) for op in graph.ops]
        if spec.engine == "des":
            outcome = Simulation(costs, graph, op_costs, spec.graph, log=keep_log).run()
        else:
            outcome = analyse(costs, graph, op_costs, spec.graph)
        events += outcome.events
        breakdown = step_breakdown(costs, graph, op_costs, outcome)
        by_category, by_level = _byte_totals(graph)
        step_rows.append({
            "step": step.index, "batch": step.batch, "mean_context": sum(step.contexts) / step.batch,
            "max_context": max(step.contexts), "time_ns": outcome.time_ns, "events": outcome.events,
            "store_bytes": by_level.get(res.hardware.store.name, 0),
            "weight_bytes": by_category.get("weights", 0) + by_category.get("expert", 0),
            "kv_bytes": by_category.get("kv", 0), "outlier_bytes": by_category.get("outliers", 0),
            "link_bytes": by_level.get("link", 0), "flops": graph.flops(), "kernels": graph.kernels,
            "ops": len(graph.ops), **{f"ms_{k}": ns_to_ms(v) for k, v in breakdown.items()},
        })
        if keep_ops:
            op_rows.extend(op_table_rows(costs, graph, op_costs, outcome))
        if keep_log:
            log.extend(outcome.log)
    base.update(_summary(res, step_rows, events, time.perf_counter() - wall))
    return RunResult(base, step_rows, op_rows, log, res)


def _byte_totals(graph) -> tuple[dict[str, int], dict[str, int]]:
    by_category: dict[str, int] = {}
    by_level: dict[str, int] = {}
    for op in graph.ops:
        for a in op.accesses:
            by_category[a.category] = by_category.get(a.category, 0) + a.bytes
            by_level[a.level] = by_level.get(a.level, 0) + a.bytes
    return by_category, by_level


def _identity(res: Resolved, cap: dict) -> dict:
    spec = res.spec
    return {
        "hardware": res.hardware.name, "model": res.model.name, "weights": spec.weights, "kv": spec.kv,
        "batch": max(s.batch for s in res.steps), "context": spec.context if not spec.trace else None,
        "trace": spec.trace, "steps": len(res.steps), "engine": spec.engine, "graph": spec.graph,
        "tp": res.plan.tp, "pp": res.plan.pp, "chips": res.hardware.chips, "software": spec.software,
        "target_ms": spec.target_ms, "capacity": cap,
    }


def _summary(res: Resolved, rows: list[dict], events: int, wall_s: float) -> dict:
    times = [ns_to_ms(r["time_ns"]) for r in rows]
    p50, p99 = percentile(times, 50), percentile(times, 99)
    keys = sorted({k for r in rows for k in r if k.startswith("ms_")})
    breakdown = {k[3:]: sum(r.get(k, 0.0) for r in rows) / len(rows) for k in keys}
    mean_time = sum(times) / len(times)
    tokens = sum(r["batch"] for r in rows)
    store_bytes = sum(r["store_bytes"] for r in rows)
    peak = res.hardware.store.peak_GBps
    achieved = store_bytes / (sum(r["time_ns"] for r in rows))  # bytes/ns == GB/s
    target = res.spec.target_ms
    meets = p99 <= target
    bound = bound_of(breakdown)
    margin = target - p99
    return {
        "per_token_ms_p50": p50, "per_token_ms_p99": p99, "per_token_ms_mean": mean_time,
        "meets_target": meets, "verdict": "meets-target" if meets else "misses-target",
        "margin_ms": margin, "bound": bound, "breakdown_ms": breakdown,
        "hbm_bytes_per_token": store_bytes / len(rows),  # per decode step: every sequence gets a token
        "weight_bytes_per_token": sum(r["weight_bytes"] for r in rows) / len(rows),
        "kv_bytes_per_token": sum(r["kv_bytes"] for r in rows) / len(rows),
        "achieved_hbm_gbps": achieved, "hbm_peak_gbps": peak, "hbm_fraction_of_peak": achieved / peak,
        "tokens_per_s": 1e3 * tokens / sum(times), "events": events, "wall_s": wall_s,
        "byte_floor_ms": ns_to_ms(store_bytes / len(rows) / peak),
        "batch_over_time": [r["batch"] for r in rows] if res.spec.trace else None,
        **_moe_summary(res),
    }


def _moe_summary(res: Resolved) -> dict:
    block = res.plan.ffn
    if res.model.moe is None or not hasattr(block, "placement"):
        return {}
    pl = block.placement
    return {"moe": {
        "dispatch": block.dispatch, "placement": pl.policy, "routing": block.trace.description,
        "expert_parallel": block.ep, "sram_level": block.sram_level, "sram_slots": pl.slots,
        "sram_hit_rate": pl.hit_rate, "active_experts_per_layer": float(pl.active.mean()),
        "resident_experts_per_layer": float(pl.resident.mean()),
    }}


__all__ = ["RunSpec", "RunResult", "simulate", "resolve", "capacity"]
