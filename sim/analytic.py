"""Closed-form model of the same op graph: the cross-check and the fast path.

Each op takes ``gap + fill + max(per-link bytes / (capacity x efficiency), per-flow bytes /
cap, compute) + drain`` with nothing shared (a roofline per op); ops start when their
dependencies are done and the host has issued them, by the engine's launch and sync rules
(sim.engine.timer). No contention is modelled, so the DES can only be slower; with one stream per
stage they agree to rounding.
"""

from __future__ import annotations

from itertools import accumulate

from sim.costs import HostTimes, OpCost
from sim.engine.records import StepOutcome
from sim.engine.timer import after_sync, issue, segments
from sim.lowering.graph import OpGraph


def analyse(graph: OpGraph, op_costs: list[OpCost], host: HostTimes, graph_mode: bool,
            durations: list[float] | None = None) -> StepOutcome:
    """The step's timeline in closed form (no events, no contention): segment by segment, the
    host issues the ops and the ops start at the later of ready and issued (sim.engine.timer).
    ``durations``: each op's ``total_ns``, where the caller keeps them between steps."""
    n = len(graph.ops)
    ops, chains = graph.ops, graph.chains
    if durations is None:
        durations = [c.total_ns for c in op_costs]
    ready_of, issued_of, start_of, end_of = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    stream_end: dict[tuple[int, str], float] = {}
    t_host = 0.0
    sync_total = wait_total = end_all = 0.0
    for first, last in segments(graph):
        t_host = issue(first, last, t_host, op_costs, host, graph_mode, issued_of)
        idx = first
        while idx <= last:
            op = ops[idx]
            lane = (op.stage, op.stream)
            ready = stream_end.get(lane, 0.0)
            for dep in op.deps:
                if end_of[dep] > ready:
                    ready = end_of[dep]
            issued = issued_of[idx]
            start = ready if ready >= issued else issued
            wait_total += start - ready
            end = start + durations[idx]
            ready_of[idx], start_of[idx], end_of[idx] = ready, start, end
            tail = min(chains[idx], last + 1)  # ops idx+1 .. tail-1 wait only for the op before them
            if tail > idx + 1 and issued_of[tail - 1] <= end:  # and are issued by then: a chain
                ends = list(accumulate(durations[idx + 1:tail], initial=end))
                ready_of[idx + 1:tail] = start_of[idx + 1:tail] = ends[:-1]
                end_of[idx + 1:tail] = ends[1:]
                end = ends[-1]
                idx = tail - 1
            stream_end[lane] = end
            if end > end_all:
                end_all = end
            idx += 1
        op = ops[last]
        if op.host_sync:
            resumed = after_sync(t_host, end_of[last], host, op_costs[last])
            sync_total += resumed - max(t_host, end_of[last])
            t_host = resumed
    return StepOutcome(graph.step, max(end_all, t_host), [], 0, sync_total, wait_total, last_end=end_all,
                       moments=(ready_of, issued_of, start_of, end_of, op_costs, {}))
