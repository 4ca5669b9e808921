"""Closed-form model of the same op graph: the cross-check and the fast path.

Each op takes ``gap + fill + max(per-link bytes / (capacity x efficiency), per-flow bytes /
cap, compute) + drain`` with nothing shared (a roofline per op); ops start when their
dependencies are done and the host has issued them, by the same launch and sync rules as
the engine. No contention is modelled, so the DES can only be slower; with one stream per
stage they agree to rounding.
"""

from __future__ import annotations

from sim.costs import HostTimes, OpCost
from sim.engine.records import StepOutcome
from sim.lowering.graph import OpGraph


def analyse(graph: OpGraph, op_costs: list[OpCost], host: HostTimes, graph_mode: bool) -> StepOutcome:
    """The step's timeline in closed form (no events, no contention)."""
    n = len(graph.ops)
    ready_of, issued_of, start_of, end_of = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    stream_end: dict[tuple[int, str], float] = {}
    t_host = 0.0
    new_segment = True
    sync_total = wait_total = end_all = 0.0
    for op, cost in zip(graph.ops, op_costs):
        if graph_mode:
            if new_segment:
                t_host += host.graph_launch_ns
                new_segment = False
        else:
            t_host += cost.dispatch_ns
        lane = (op.stage, op.stream)
        ready = stream_end.get(lane, 0.0)
        for dep in op.deps:
            if end_of[dep] > ready:
                ready = end_of[dep]
        start = ready if ready >= t_host else t_host
        wait_total += start - ready
        end = start + cost.total_ns
        idx = op.idx
        ready_of[idx], issued_of[idx], start_of[idx], end_of[idx] = ready, t_host, start, end
        stream_end[lane] = end
        if end > end_all:
            end_all = end
        if op.host_sync:
            before = t_host
            t_host = max(t_host, end) + host.sync_ns + cost.host_ns
            sync_total += t_host - max(before, end)
            new_segment = True
    return StepOutcome(graph.step, max(end_all, t_host), [], 0, sync_total, wait_total, last_end=end_all,
                       moments=(ready_of, issued_of, start_of, end_of, op_costs, {}))
