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

Times are ns. Nothing here holds state: the callers keep the clocks.
"""

from __future__ import annotations

from sim.costs import HostTimes, OpCost
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
