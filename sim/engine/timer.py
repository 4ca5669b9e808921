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

import sys
from bisect import bisect_right
from functools import reduce
from itertools import accumulate, islice
from operator import add

from sim.costs import HostTimes, OpCost
from sim.engine.records import StepOutcome
from sim.lowering.graph import OpGraph

if sys.version_info < (3, 12):
    # Python 3.11's sum() of floats adds them in order in one C double: the additions of
    # ``reduce(add, ...)``, bit for bit, without a float object per op (4x faster on a chain)
    ordered_sum = sum
else:
    def ordered_sum(values, start: float) -> float:
        """``start`` plus ``values`` added one by one, in order (3.12's sum() compensates the
        rounding, which would give other step times than the engine's own additions)."""
        return reduce(add, values, start)


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
             durations: list[float] | None = None, moments: bool = True) -> StepOutcome:
    """The step's timeline in closed form (no events, no contention): segment by segment, the
    host issues the ops (``issue``) and each op starts at the later of ready and issued, alone
    on its links for its ``total_ns`` (``durations``, where the caller keeps them between steps).
    ``moments``: keep every op's ready, start and end for ``StepOutcome.timings`` (an op table,
    a log); without them a chain of ops (``OpGraph.chains``) keeps only its last op's end, and
    another op's end is worked out when something waits for it (``_interior_end``): the same
    additions in the same order, so the same step time and totals, from fewer lists."""
    n = len(graph.ops)
    ops, chains = graph.ops, graph.chains
    if durations is None:
        durations = [c.total_ns for c in op_costs]
    issued_of = [0.0] * n
    if moments:
        ready_of, start_of, end_of = [0.0] * n, [0.0] * n, [0.0] * n
    else:
        end_of = [None] * n  # None: inside a chain whose ends were not kept (``heads``)
    heads: list[int] = []  # without moments: the first op of each such chain, in order
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
                done = end_of[dep]
                if done is None:
                    done = _interior_end(dep, heads, durations, end_of)
                if done > ready:
                    ready = done
            issued = issued_of[idx]
            start = ready if ready >= issued else issued
            wait_total += start - ready
            end = start + durations[idx]
            end_of[idx] = end
            if moments:
                ready_of[idx], start_of[idx] = ready, start
            tail = min(chains[idx], last + 1)  # ops idx+1 .. tail-1 wait only for the op before them
            if tail > idx + 1 and issued_of[tail - 1] <= end:  # and are issued by then: a chain
                if moments:  # each starts, ready, when the op before it ends
                    ends = list(accumulate(durations[idx + 1:tail], initial=end))  # ends[0]: op idx's
                    end_of[idx:tail] = ends
                    ready_of[idx + 1:tail] = start_of[idx + 1:tail] = ends[:-1]
                    end = ends[-1]
                else:
                    end = end_of[tail - 1] = ordered_sum(islice(durations, idx + 1, tail), end)
                    heads.append(idx)
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
    kept = (ready_of, issued_of, start_of, end_of, op_costs, {}) if moments else None
    return StepOutcome(graph.step, max(end_all, t_host), [], 0, sync_total, wait_total, last_end=end_all,
                       moments=kept)


def _interior_end(idx: int, heads: list[int], durations: list[float], end_of: list) -> float:
    """The end of op ``idx`` inside a chain whose ends ``timeline`` did not keep (``heads``: each
    such chain's first op, whose end it kept): the chain's additions up to ``idx``, kept now."""
    head = heads[bisect_right(heads, idx) - 1]
    ends = list(accumulate(durations[head + 1:idx + 1], initial=end_of[head]))
    end_of[head:idx + 1] = ends
    return ends[-1]
