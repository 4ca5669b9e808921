"""Closed-form model of the same op graph: the cross-check and the fast path.

Each op takes ``gap + fill + max(per-link bytes / (capacity x efficiency), per-flow bytes /
cap, compute) + drain`` with nothing shared (a roofline per op); ops start when their
dependencies are done and the host has issued them, by the same launch and sync rules as
the engine. No contention is modelled, so the DES can only be slower; with one stream per
stage they agree to rounding.
"""

from __future__ import annotations

from sim.costs import HostTimes, OpCost
from sim.engine.records import OpTiming, StepOutcome
from sim.lowering.graph import OpGraph


def analyse(graph: OpGraph, op_costs: list[OpCost], host: HostTimes, graph_mode: bool) -> StepOutcome:
    """The step's timeline in closed form (no events, no contention)."""
    timings: list[OpTiming | None] = [None] * len(graph.ops)
    stream_end: dict[tuple[int, str], float] = {}
    t_host = 0.0
    new_segment = True
    sync_total = wait_total = end_all = 0.0
    for op in graph.ops:
        if graph_mode:
            t_host += host.graph_launch_ns if new_segment else 0.0
        else:
            t_host += op_costs[op.idx].dispatch_ns
        new_segment = False
        ready = max((timings[d].end for d in op.deps), default=0.0)
        ready = max(ready, stream_end.get((op.stage, op.stream), 0.0))
        start = max(ready, t_host)
        wait_total += start - ready
        cost = op_costs[op.idx]
        body_start = start + cost.gap_ns + cost.fill_ns
        body_end = body_start + cost.ideal_body_ns
        end = body_end + cost.drain_ns
        timings[op.idx] = OpTiming(ready, t_host, start, body_start, body_end, end)
        stream_end[(op.stage, op.stream)] = end
        end_all = max(end_all, end)
        if op.host_sync:
            before = t_host
            t_host = max(t_host, end) + host.sync_ns + cost.host_ns
            sync_total += t_host - max(before, end)
            new_segment = True
    return StepOutcome(graph.step, max(end_all, t_host), [], 0, sync_total, wait_total, last_end=end_all,
                       given=timings)
