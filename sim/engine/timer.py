"""The step timer's rules: how the host turns a kernel program into issue times, and when an
op may start. Written once, used by the discrete-event engine (sim.engine.simulation), the
analytic model (sim.analytic) and, through it, the serving replay (sim.serve.stepmodel).

* The program is cut into segments: a segment ends at each op the host waits for (a graph
  cannot span a sync) and at the program's last op.
* Issue: in graph mode a segment costs one ``graph_launch_ns`` and all its ops are issued
  when it is launched; eagerly, every op costs its own ``dispatch_ns`` and is issued when
  its launch is done.
* Sync: after a segment that ends at a host sync, the host goes on at the later of its own
  clock and the op's end, plus ``sync_ns`` and the op's own host work (``host_ns``).
* An op starts at the later of when it is ready (its stream's previous op and its
  dependencies done) and when it was issued; alone on its links it then takes ``total_ns``.

``timeline`` applies the rules to a whole step in closed form: the step of a graph where no
stage's streams share anything (the discrete-event engine's case without events) and the
analytic model's every step, where nothing is shared by assumption.

Times are ns. Nothing here holds state: the callers keep the clocks.
"""

from __future__ import annotations

from itertools import accumulate

from sim.costs import HostTimes, OpCost
from sim.engine.records import StepOutcome
from sim.lowering.graph import OpGraph


def segments(graph: OpGraph) -> list[tuple[int, int]]:
    """The program's segments as (first, last) op indices, in issue order."""
    n = len(graph.ops)
    ends = list(graph.syncs)
    if n and (not ends or ends[-1] != n - 1):
        ends.append(n - 1)
    out, first = [], 0
    for last in ends:
        out.append((first, last))
        first = last + 1
    return out


def issue(first: int, last: int, t: float, op_costs: list[OpCost], host: HostTimes, graph_mode: bool,
          issue_time: list) -> float:
    """Issue ops ``first..last`` from host time ``t``: writes their issue times into
    ``issue_time`` and returns the host's time once they are issued."""
    if graph_mode:
        t += host.graph_launch_ns
        issue_time[first:last + 1] = [t] * (last + 1 - first)
        return t
    for idx in range(first, last + 1):
        t += op_costs[idx].dispatch_ns
        issue_time[idx] = t
    return t


def after_sync(t: float, end: float, host: HostTimes, cost: OpCost) -> float:
    """The host's time once it has waited for an op that ends at ``end`` and done its work."""
    return (t if t >= end else end) + host.sync_ns + cost.host_ns


def timeline(graph: OpGraph, op_costs: list[OpCost], host: HostTimes, graph_mode: bool,
            durations: list[float] | None = None) -> StepOutcome:
    """The step's timeline in closed form (no events, no contention): segment by segment, the
    host issues the ops (``issue``) and each op starts at the later of ready and issued, alone
    on its links for its ``total_ns`` (``durations``, where the caller keeps them between steps)."""
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
