"""Tidy results: per-op and per-step tables, the latency breakdown, the bound and the verdict.

The breakdown assigns every nanosecond of a step to one row:

* ``launch_sync``: waiting for the host: kernel launches (eager dispatch), graph launches,
  host syncs;
* ``kernel_startup``: each kernel's start-up and tail (the gap between kernels of a graph
  included): what a step pays for its kernel count rather than its bytes;
* ``latency``: latency before an op's body (on-chip network hops, host-link messages);
* memory rows by what the bytes are (``weights``, ``kv``, ``activations``, ``outliers``,
  ``expert_weights``), ``links`` (chip-to-chip, incl. collective latency), ``host_link``;
* ``compute`` (matrix and element-wise work) and ``dequant`` (dequantization on the
  vector units), or the op's own compute row (e.g. ``expert_compute``);
* an op that belongs to one phase as a whole (``router``, ``dispatch``, ``combine``) gives
  all but its launch time to that row;
* ``contention``: time an op's body took beyond its uncontended time (shared bandwidth).

An op's body is given to whichever of its loads or its compute is longest when alone,
split between the loads in proportion to their time. Rows sum to the step time; where
streams overlap, rows are scaled down to the step time.

``Ledger`` owns the memo of each distinct op's rows and byte totals (keyed by its Work and
its row names), so a step costs work proportional to its distinct ops, not to all of them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from operator import is_

from sim.costs import MEMO_LIMIT, CostModel, OpCost
from sim.engine.records import StepOutcome
from sim.lowering.graph import Op, OpGraph

BOUND_OF = {
    "weights": "memory", "kv": "memory", "activations": "memory", "outliers": "memory",
    "expert_weights": "memory", "staged_weights": "memory", "temp": "memory", "compute": "compute", "expert_compute": "compute", "router": "compute",
    "dequant": "dequant", "launch_sync": "overhead", "latency": "overhead", "links": "links",
    "host_link": "links", "contention": "contention", "dispatch": "overhead", "combine": "memory",
    "kernel_startup": "kernels",
}


def starts_with(entries: list, prefix: list) -> bool:
    """Whether ``entries`` begin with the very objects of ``prefix`` (a non-empty one): the test
    under which a running sum over ``prefix`` may be resumed instead of recomputed."""
    return bool(prefix) and len(prefix) <= len(entries) and all(map(is_, prefix, entries))


class PrefixSums:
    """Sums over a list of entries, resumed between calls: the sums over all entries but the
    last are kept, and a call whose entries start with those very objects adds only what
    follows them (between steps only a step's new attention, counted last, changes). The same
    additions in the same order as summing afresh, so bit-identical. ``add(base, entries,
    *args, keep=...)`` returns new sums: ``base`` (never changed) plus ``entries``; ``keep``
    False for the last entry, whose figures the owner need not memoise (it changes every step).
    ``add`` is passed at each call, not kept: a kept bound method of the owner would make a
    reference cycle per run."""

    __slots__ = ("_empty", "_prefix")

    def __init__(self, empty):
        self._empty = empty
        self._prefix: tuple[list, object] = ([], empty)  # (entries, their sums)

    def over(self, entries: list, add, *args):
        """The sums over ``entries`` (fresh objects the caller may change)."""
        prefix, base = self._prefix
        if starts_with(entries, prefix):
            start = len(prefix)
        else:
            start, base = 0, self._empty
        last = len(entries) - 1
        if start < last:
            base = add(base, entries[start:last], *args, keep=True)
            self._prefix = (entries[:last], base)
        return add(base, entries[last:] if start <= last else (), *args, keep=False)


def op_key(op: Op) -> tuple:
    """What an op's rows and byte totals depend on."""
    return (op.work, op.row, op.compute_row)


class Ledger:
    """Per-op rows and byte totals, memoised per distinct op; step sums from op counts."""

    def __init__(self, costs: CostModel):
        self.costs = costs
        self._rows: dict[tuple, dict[str, float]] = {}
        self._bytes: dict[object, tuple[dict, dict]] = {}
        self._sums = PrefixSums(({}, {}, {}, 0, 0))  # the graph sums, resumed between steps

    # -- one op -------------------------------------------------------------------------
    def ideal_rows(self, op: Op, cost: OpCost, keep: bool = True) -> dict[str, float]:
        """The op's rows when it runs alone (``keep``: memoised for the ops that share its key)."""
        key = op_key(op)
        rows = self._rows.get(key)
        if rows is None:
            rows = _ideal_rows(self.costs, op, cost)
            if keep:
                if len(self._rows) >= MEMO_LIMIT:  # bounded, as the cost model's memo is
                    self._rows.clear()
                self._rows[key] = rows
        return rows

    def op_rows(self, op: Op, cost: OpCost, timing, contended: float = 0.0) -> dict[str, float]:
        rows = dict(self.ideal_rows(op, cost))
        rows["launch_sync"] = rows.get("launch_sync", 0.0) + max(0.0, timing.start - timing.ready)
        if contended:
            rows["contention"] = rows.get("contention", 0.0) + contended
        return rows

    def work_bytes(self, work, keep: bool = True) -> tuple[dict[str, int], dict[str, int]]:
        """(bytes by category, bytes by level) of one op's work (``keep``: memoised)."""
        hit = self._bytes.get(work)
        if hit is None:
            by_category: dict[str, int] = {}
            by_level: dict[str, int] = {}
            for level, size, category, _write, _granule, _role in work.accesses:
                by_category[category] = by_category.get(category, 0) + size
                by_level[level] = by_level.get(level, 0) + size
            hit = (by_category, by_level)
            if keep:
                if len(self._bytes) >= MEMO_LIMIT:
                    self._bytes.clear()
                self._bytes[work] = hit
        return hit

    # -- one graph ------------------------------------------------------------------------
    def graph_sums_from(self, keys: dict[tuple, list], op_costs: list[OpCost]) -> "GraphSums":
        """Rows and bytes of a graph's ops when alone, summed over its distinct ops
        (``keys``: op_key -> [count, an op with that key]) in their order, resumed from the
        last call's sums where the entries allow (``PrefixSums``)."""
        return GraphSums(*self._sums.over(list(keys.values()), self._add_ops, op_costs))

    def _add_ops(self, base: tuple, entries, op_costs: list[OpCost], keep: bool) -> tuple:
        """``base`` sums (rows, bytes by category, bytes by level, FLOPs, kernels) plus ``entries``' ops."""
        rows, by_category, by_level, flops, kernels = base
        rows, by_category, by_level = dict(rows), dict(by_category), dict(by_level)
        for n, op in entries:
            for row, t in self.ideal_rows(op, op_costs[op.idx], keep).items():
                rows[row] = rows.get(row, 0.0) + n * t
            cats, levels = self.work_bytes(op.work, keep)
            for k, v in cats.items():
                by_category[k] = by_category.get(k, 0) + n * v
            for k, v in levels.items():
                by_level[k] = by_level.get(k, 0) + n * v
            flops += n * op.work.matrix_flops
            kernels += n * op.work.kernels
        return rows, by_category, by_level, flops, kernels

    def step_breakdown(self, sums: "GraphSums", outcome: StepOutcome) -> dict[str, float]:
        """The step's rows: the ops' rows alone, plus waits, contention and the host's tail."""
        rows = dict(sums.rows)
        rows["launch_sync"] = (rows.get("launch_sync", 0.0) + outcome.wait_ns
                               + max(0.0, outcome.time_ns - outcome.last_end))
        if outcome.contention_ns:
            rows["contention"] = rows.get("contention", 0.0) + outcome.contention_ns
        total = sum(rows.values())
        if total > outcome.time_ns > 0:
            scale = outcome.time_ns / total
            rows = {k: v * scale for k, v in rows.items()}
        return {k: v for k, v in rows.items() if v > 0}

    def op_table(self, graph: OpGraph, op_costs: list[OpCost], outcome: StepOutcome) -> list[dict]:
        """One row per op: timing, work, tiles and the row that bounds it."""
        out = []
        for op in graph.ops:
            t = outcome.timings[op.idx]
            cost = op_costs[op.idx]
            rows = self.op_rows(op, cost, t, outcome.contended.get(op.idx, 0.0))
            record = {
                "step": graph.step, "op": op.idx, "name": op.name, "layer": op.layer, "kind": op.kind,
                "stage": op.stage, "stream": op.stream, "t_start_ns": t.start, "t_end_ns": t.end,
                "duration_ns": t.end - t.start, "wait_ns": t.start - t.ready, "flops": op.matrix_flops,
                "vector_ops": op.vector_ops, "tiles": round(cost.tiles_share * self.costs.tiles),
                "compute_ns": cost.compute_ns + cost.drain_ns, "bound": max(rows, key=rows.get) if rows else "none",
            }
            for access in op.accesses:
                key = f"{'write' if access.write else 'read'}_{access.category}_{access.level}_bytes"
                record[key] = record.get(key, 0) + access.bytes
            out.append(record)
        return out


class GraphSums:
    """An op graph's ideal rows, byte totals (by category and by memory level), matrix
    FLOPs and kernel count."""

    __slots__ = ("rows", "by_category", "by_level", "flops", "kernels")

    def __init__(self, rows: dict[str, float], by_category: dict[str, int], by_level: dict[str, int],
                 flops: int, kernels: int):
        self.rows = rows
        self.by_category = by_category
        self.by_level = by_level
        self.flops = flops
        self.kernels = kernels


def _ideal_rows(costs: CostModel, op: Op, cost: OpCost) -> dict[str, float]:
    """An op's rows alone: its kernels' start-ups, latency before its body, and its body by
    what bounds each kernel (loads by category, compute, dequantization)."""
    head = "links" if op.work.collective else "kernel_startup"
    rows = {head: 0.0 + cost.gap_ns, "latency": 0.0 + cost.fill_ns}
    compute_row = op.compute_row
    for row, t in cost.rows:
        if row == "compute":
            row = compute_row
        rows[row] = rows.get(row, 0.0) + t
    if op.row:  # the whole op belongs to one phase row (e.g. MoE dispatch)
        total = sum(v for k, v in rows.items() if k != head)
        return {head: rows[head], op.row: total}
    return {k: v for k, v in rows.items() if v}


def bound_of(breakdown: dict[str, float]) -> str:
    groups: dict[str, float] = defaultdict(float)
    for row, t in breakdown.items():
        groups[BOUND_OF.get(row, row)] += t
    return max(groups, key=groups.get) if groups else "none"


def percentile(values, q: float) -> float:
    """The ``q``-th percentile with linear interpolation (numpy's default method)."""
    data = sorted(values)
    if not data:
        return float("nan")
    pos = (len(data) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return float(data[lo] + (data[hi] - data[lo]) * (pos - lo))
