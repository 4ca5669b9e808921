"""The runner: one model on one hardware profile over one decode trace.

``simulate(spec)`` resolves the spec into a sealed Setup (sim.config.setup), checks that
it fits, then for every step lowers the op graph (through a ``GraphCache`` it owns, so only
what changed is lowered again), looks up each op's cost, runs the engine (or the analytic
model) and turns the outcome into a step row. Work per step is proportional to the ops
that changed: unchanged ops keep their costs, and the breakdown and byte totals are sums
over the graph's distinct ops, kept between steps.

Returns a ``RunResult`` with the summary, the per-step table and, when asked, the per-op
table and the event log.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from sim.analytic import analyse
from sim.config.loader import validate
from sim.config.setup import Setup, resolve
from sim.config.spec import RUN_FIELDS, RunSpec, apply_run_overrides
from sim.costs import CostModel
from sim.engine.records import LOG_COLUMNS, Span
from sim.engine.simulation import Simulation
from sim.lowering.cache import GraphCache
from sim.lowering.decode import weight_bytes_per_chip
from sim.results import Ledger, bound_of, op_key, percentile
from sim.units import GB, ns_to_ms

__all__ = ["RunSpec", "RunResult", "RUN_FIELDS", "simulate", "resolve", "capacity", "apply_run_overrides"]


# -- capacity --------------------------------------------------------------------------------


def capacity(setup: Setup) -> dict:
    """Bytes one chip must hold (the fullest stage) against its backing store."""
    model = setup.model
    weights = max(weight_bytes_per_chip(setup, s) for s in range(setup.pp))
    footprint = setup.kv.kv_footprint
    per_layer_kv = max(sum(n * footprint(c, setup.k_width, setup.v_width) for c, n in Counter(step.contexts).items())
                       for step in setup.steps)
    kv = per_layer_kv * setup.layers_per_stage
    batch = max(step.batch for step in setup.steps)
    activations = batch * (4 * model.hidden + 2 * model.ffn // setup.tp + setup.vocab) * 4
    needed = weights + kv + activations
    available = setup.hardware.store.capacity_bytes
    return {"weights_bytes": weights, "kv_bytes": kv, "activation_bytes": activations,
            "needed_bytes": needed, "available_bytes": available, "fits": needed <= available}


# -- simulation ------------------------------------------------------------------------------


@dataclass
class RunResult:
    summary: dict
    steps: list[dict] = field(default_factory=list)
    ops: list[dict] = field(default_factory=list)
    log: list[Span] = field(default_factory=list)
    resolved: Setup | None = None

    def tables(self):
        """(per-step, per-op, event log) as pandas DataFrames."""
        import pandas as pd

        return pd.DataFrame(self.steps), pd.DataFrame(self.ops), pd.DataFrame(self.log, columns=list(LOG_COLUMNS))


class _Step:
    """The runner's state between steps: the last graph, its op costs and op counts."""

    __slots__ = ("graph", "costs", "keys")

    def __init__(self, graph, costs, keys):
        self.graph, self.costs, self.keys = graph, costs, keys


def simulate(spec: RunSpec | dict | None = None, *, keep_ops: bool = False, keep_log: bool = False,
             check_capacity: bool = True, **fields) -> RunResult:
    """Run a spec (or keyword fields of one) and return its RunResult. With
    ``check_capacity=False`` a setup that does not fit is simulated anyway (for speed
    benchmarks and what-ifs); its summary still carries the capacity figures."""
    if spec is None:
        spec = validate(RunSpec, fields, "simulate()")
    elif isinstance(spec, dict):
        spec = validate(RunSpec, spec, "spec")
    wall = time.perf_counter()
    setup = resolve(spec)
    cap = capacity(setup)
    base = _identity(setup, cap)
    if not cap["fits"] and check_capacity:
        base.update(_does_not_fit(setup, cap), wall_s=time.perf_counter() - wall)
        return RunResult(base, resolved=setup)

    costs = CostModel(setup.hardware, setup.stack)
    ledger = Ledger(costs)
    cache = GraphCache(setup)
    des = setup.spec.engine == "des"
    step_rows, op_rows, log = [], [], []
    events = 0
    state: _Step | None = None
    for position, step in enumerate(setup.steps):
        graph = cache.lower(step.contexts, step.index, position)
        state = _advance(state, graph, costs, cache.changed)
        if des:
            outcome = Simulation(graph, state.costs, costs.capacity, costs.host, setup.graph, log=keep_log).run()
        else:
            outcome = analyse(graph, state.costs, costs.host, setup.graph)
        events += outcome.events
        sums = ledger.graph_sums_from(state.keys, state.costs)
        breakdown = ledger.step_breakdown(sums, outcome)
        step_rows.append(_step_row(setup, step, graph, outcome, sums, breakdown))
        if keep_ops:
            op_rows.extend(ledger.op_table(graph, state.costs, outcome))
        if keep_log:
            log.extend(outcome.log)
    base.update(_summary(setup, step_rows, events, time.perf_counter() - wall))
    return RunResult(base, step_rows, op_rows, log, setup)


def _advance(state: _Step | None, graph, costs: CostModel, changed: tuple[int, ...] | None) -> _Step:
    """The op costs and distinct-op counts of ``graph``: from the previous step's when the
    graph cache says only the ops ``changed`` differ, else afresh."""
    ops = graph.ops
    if state is not None and changed is not None:
        old_ops, op_costs, keys = state.graph.ops, list(state.costs), dict(state.keys)
        net: dict[tuple, int] = {}  # op key -> change in its count
        holder: dict[tuple, int] = {}  # op key -> an op of the new graph that has it
        work = cost = None
        for idx in changed:
            old_key, new_key = op_key(old_ops[idx]), op_key(ops[idx])
            if ops[idx].work is not work:  # the re-lowered ops share one Work
                work, previous = ops[idx].work, old_ops[idx].work
                # unchanged work keeps its cost; a new one (a step's attention) is not memoised
                cost = op_costs[idx] if work == previous else costs.cost_once(work)
            op_costs[idx] = cost
            net[old_key] = net.get(old_key, 0) - 1
            net[new_key] = net.get(new_key, 0) + 1
            holder[new_key] = idx
        for key, delta in net.items():
            if delta:
                _count(keys, key, ops, delta, holder.get(key))
        return _Step(graph, op_costs, keys)
    keys: dict[tuple, list] = {}
    for op in ops:
        _count(keys, op_key(op), ops, 1, op.idx)
    return _Step(graph, [costs.cost(op.work) for op in ops], keys)


def _count(keys: dict, key: tuple, ops, delta: int, idx: int | None = None) -> None:
    """Add ``delta`` ops of ``key`` (``idx``: an op that has it) to ``keys``: key -> [count, op]."""
    entry = keys.get(key)
    if entry is None:
        keys[key] = [delta, ops[idx]]
        return
    entry = keys[key] = [entry[0] + delta, entry[1] if idx is None else ops[idx]]
    if entry[0] == 0:
        del keys[key]


def _step_row(setup: Setup, step, graph, outcome, sums, breakdown) -> dict:
    by_category, by_level = sums.by_category, sums.by_level
    return {
        "step": step.index, "batch": step.batch, "mean_context": sum(step.contexts) / step.batch,
        "max_context": max(step.contexts), "time_ns": outcome.time_ns, "events": outcome.events,
        "store_bytes": by_level.get(setup.store, 0),
        "weight_bytes": by_category.get("weights", 0) + by_category.get("expert", 0),
        "kv_bytes": by_category.get("kv", 0), "outlier_bytes": by_category.get("outliers", 0),
        "link_bytes": by_level.get("link", 0), "flops": sums.flops, "kernels": sums.kernels,
        "ops": len(graph.ops), **{f"ms_{k}": ns_to_ms(v) for k, v in breakdown.items()},
    }


def _does_not_fit(setup: Setup, cap: dict) -> dict:
    floor_ms = ns_to_ms((cap["weights_bytes"] + cap["kv_bytes"]) / setup.hardware.store.peak_GBps)
    return dict(verdict="does-not-fit", meets_target=False, bound="capacity", byte_floor_ms=floor_ms,
                per_token_ms_p50=None, per_token_ms_p99=None,
                reason=(f"needs {cap['needed_bytes'] / GB:.1f} GB per chip "
                        f"(weights {cap['weights_bytes'] / GB:.1f} GB + KV {cap['kv_bytes'] / GB:.1f} GB "
                        f"+ activations {cap['activation_bytes'] / GB:.2f} GB), "
                        f"{setup.hardware.store.name} holds {cap['available_bytes'] / GB:.1f} GB; even if it fit, "
                        f"reading weights and KV once at peak bandwidth takes {floor_ms:.1f} ms per step"))


def _identity(setup: Setup, cap: dict) -> dict:
    spec = setup.spec
    return {
        "hardware": setup.hardware.name, "model": setup.model.name, "weights": spec.weights, "kv": spec.kv,
        "batch": max(s.batch for s in setup.steps), "context": spec.context if not spec.trace else None,
        "trace": spec.trace, "steps": len(setup.steps), "engine": spec.engine, "graph": setup.graph,
        "tp": setup.tp, "pp": setup.pp, "chips": setup.hardware.chips, "software": spec.software,
        "target_ms": spec.target_ms, "capacity": cap,
    }


def _summary(setup: Setup, rows: list[dict], events: int, wall_s: float) -> dict:
    times = [ns_to_ms(r["time_ns"]) for r in rows]
    p50, p99 = percentile(times, 50), percentile(times, 99)
    keys = sorted({k for r in rows for k in r if k.startswith("ms_")})
    breakdown = {k[3:]: sum(r.get(k, 0.0) for r in rows) / len(rows) for k in keys}
    mean_time = sum(times) / len(times)
    tokens = sum(r["batch"] for r in rows)
    store_bytes = sum(r["store_bytes"] for r in rows)
    peak = setup.hardware.store.peak_GBps
    achieved = store_bytes / (sum(r["time_ns"] for r in rows))  # bytes/ns == GB/s
    target = setup.spec.target_ms
    meets = p99 <= target
    return {
        "per_token_ms_p50": p50, "per_token_ms_p99": p99, "per_token_ms_mean": mean_time,
        "meets_target": meets, "verdict": "meets-target" if meets else "misses-target",
        "margin_ms": target - p99, "bound": bound_of(breakdown), "breakdown_ms": breakdown,
        "hbm_bytes_per_token": store_bytes / len(rows),  # per decode step: every sequence gets a token
        "weight_bytes_per_token": sum(r["weight_bytes"] for r in rows) / len(rows),
        "kv_bytes_per_token": sum(r["kv_bytes"] for r in rows) / len(rows),
        "hbm_achieved_GBps": achieved, "hbm_peak_GBps": peak, "hbm_fraction_of_peak": achieved / peak,
        "throughput_tokens_per_s": 1e3 * tokens / sum(times), "events": events, "wall_s": wall_s,
        "byte_floor_ms": ns_to_ms(store_bytes / len(rows) / peak),
        "batch_over_time": [r["batch"] for r in rows] if setup.spec.trace else None,
        **_moe_summary(setup),
    }


def _moe_summary(setup: Setup) -> dict:
    plan = setup.moe
    if plan is None:
        return {}
    pl = plan.placement
    return {"moe": {
        "dispatch": plan.dispatch, "placement": pl.policy, "routing": plan.trace.description,
        "expert_parallel": plan.ep, "sram_level": plan.sram_level, "sram_slots": pl.slots,
        "sram_hit_rate": pl.hit_rate, "active_experts_per_layer": float(pl.active.mean()),
        "resident_experts_per_layer": float(pl.resident.mean()),
    }}
