"""Tidy results: per-op and per-step tables, the latency breakdown, the bound and the verdict.

The breakdown assigns every nanosecond of a step to one row:

* ``launch_sync``: waiting for the host to issue a kernel, kernel gaps, host syncs;
* ``latency``: first-byte latency before an op's body (fill);
* memory rows by what the bytes are (``weights``, ``kv``, ``activations``, ``outliers``,
  ``expert_weights``), ``links`` (chip-to-chip, incl. collective latency), ``host_link``;
* ``compute`` (matrix and element-wise work) and ``dequant`` (dequantization on the
  vector units), or the op's own compute row (e.g. ``expert_compute``, ``router``);
* ``contention``: time an op's body took beyond its uncontended time (shared bandwidth).

An op's body is given to whichever of its loads or its compute is longest when alone,
split between the loads in proportion to their time. Rows sum to the step time; where
streams overlap, rows are scaled down to the step time.
"""

from __future__ import annotations

from collections import defaultdict

from sim.costs import CostModel, OpCost
from sim.engine.simulation import StepOutcome
from sim.lowering.graph import OpGraph

CATEGORY_ROW = {"weights": "weights", "kv": "kv", "act": "activations", "outliers": "outliers",
                "expert": "expert_weights", "link": "links", "pcie": "host_link"}
BOUND_OF = {
    "weights": "memory", "kv": "memory", "activations": "memory", "outliers": "memory",
    "expert_weights": "memory", "compute": "compute", "expert_compute": "compute", "router": "compute",
    "dequant": "dequant", "launch_sync": "overhead", "latency": "overhead", "links": "links",
    "host_link": "links", "contention": "contention", "dispatch": "overhead", "combine": "memory",
}


def op_rows(costs: CostModel, op, cost: OpCost, timing) -> dict[str, float]:
    rows = dict(_ideal_rows(costs, op, cost))
    rows["launch_sync"] = rows.get("launch_sync", 0.0) + max(0.0, timing.start - timing.ready)
    extra = (timing.body_end - timing.body_start) - cost.ideal_body_ns
    if extra > 1e-9 * max(1.0, cost.ideal_body_ns):
        rows["contention"] = rows.get("contention", 0.0) + extra
    return rows


def _ideal_rows(costs: CostModel, op, cost: OpCost) -> dict[str, float]:
    """The op's rows when it runs alone (memoised per cost and tags: every layer shares them)."""
    key = (id(cost), op.tags.get("phase"), op.tags.get("compute_row"), op.collective is not None)
    memo = costs.__dict__.setdefault("_rows_memo", {})
    hit = memo.get(key)
    if hit is not None and hit[0] is cost:
        return hit[1]
    rows: dict[str, float] = defaultdict(float)
    rows["launch_sync"] += cost.gap_ns
    rows["links" if op.collective else "latency"] += cost.fill_ns
    body = cost.ideal_body_ns
    compute_row = op.tags.get("compute_row", "compute")
    load_times = defaultdict(float)
    for f in cost.flows:
        load_times[CATEGORY_ROW.get(f.category, f.category)] += max(f.bytes * f.weight / costs.capacity[f.link],
                                                                    f.bytes / f.rate_limit)
    longest_load = max(load_times.values(), default=0.0)
    if cost.compute_ns >= longest_load:
        _split_compute(rows, cost, body, compute_row)
    else:
        total = sum(load_times.values())
        for row, t in load_times.items():
            rows[row] += body * t / total
    _split_compute(rows, cost, cost.drain_ns, compute_row)
    if "phase" in op.tags:  # the whole op belongs to one phase row (e.g. MoE dispatch)
        total = sum(v for k, v in rows.items() if k != "launch_sync")
        rows = {"launch_sync": rows["launch_sync"], op.tags["phase"]: total}
    rows = dict(rows)
    memo[key] = (cost, rows)
    return rows


def _split_compute(rows, cost: OpCost, t: float, compute_row: str) -> None:
    if t <= 0:
        return
    total = cost.matrix_ns + cost.vector_ns
    if total <= 0:
        rows[compute_row] += t
        return
    rows["dequant"] += t * cost.dequant_ns / total
    rows[compute_row] += t * (total - cost.dequant_ns) / total


def step_breakdown(costs: CostModel, graph: OpGraph, op_costs: list[OpCost], outcome: StepOutcome) -> dict:
    rows: dict[str, float] = defaultdict(float)
    for op in graph.ops:
        for key, value in op_rows(costs, op, op_costs[op.idx], outcome.timings[op.idx]).items():
            rows[key] += value
    last_end = max((t.end for t in outcome.timings), default=0.0)
    rows["launch_sync"] += max(0.0, outcome.time_ns - last_end)
    total = sum(rows.values())
    if total > outcome.time_ns > 0:
        scale = outcome.time_ns / total
        rows = {k: v * scale for k, v in rows.items()}
    return {k: v for k, v in rows.items() if v > 0}


def bound_of(breakdown: dict[str, float]) -> str:
    groups: dict[str, float] = defaultdict(float)
    for row, t in breakdown.items():
        groups[BOUND_OF.get(row, row)] += t
    return max(groups, key=groups.get) if groups else "none"


def op_table_rows(costs: CostModel, graph: OpGraph, op_costs: list[OpCost], outcome: StepOutcome) -> list[dict]:
    out = []
    for op in graph.ops:
        t = outcome.timings[op.idx]
        cost = op_costs[op.idx]
        rows = op_rows(costs, op, cost, t)
        record = {
            "step": graph.step, "op": op.idx, "name": op.name, "layer": op.layer, "kind": op.kind,
            "stage": op.stage, "stream": op.stream, "start_ns": t.start, "end_ns": t.end,
            "duration_ns": t.end - t.start, "wait_ns": t.start - t.ready, "flops": op.matrix_flops,
            "vector_ops": op.vector_ops, "tiles": round(cost.tiles_share * costs.tiles),
            "compute_ns": cost.compute_ns + cost.drain_ns, "bound": max(rows, key=rows.get) if rows else "none",
        }
        for access in op.accesses:
            key = f"{'write' if access.write else 'read'}_{access.category}_{access.level}_bytes"
            record[key] = record.get(key, 0) + access.bytes
        out.append(record)
    return out


def percentile(values, q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) if len(values) else float("nan")
