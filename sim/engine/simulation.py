"""One decode step in simulated time.

Components (nouns): a ``FlowNetwork`` per pipeline stage (its memory levels, on-chip
network, chip links, host link and compute tiles as links), and the ``Host``. Processes
(verbs): ``issue_kernels`` on the host, and one ``run_stream`` per (stage, stream) that
executes its ops in order, as a GPU stream does:

1. wait for the op's dependencies and for the host to have issued it;
2. the kernel gap, then the fill latency (paid before the transfer, as in SimGrid);
3. the body: all the op's memory flows and its compute flow, sharing links with whatever
   else runs; the op's tiles overlap loads with compute (double buffering);
4. the drain (the last chunk's compute).

The host issues kernels in program order: ``launch_overhead_ns`` per kernel in eager mode,
one ``graph_launch_ns`` per captured segment in graph mode. An op with ``host_sync`` makes
the host wait for it and pay ``sync_round_trip_ns``; a graph cannot span a sync, so each
sync starts a new segment. The step ends when the host holds the step's tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import simpy

from sim.costs import COMPUTE, CostModel, OpCost
from sim.engine.flows import FlowNetwork, Merged, merge
from sim.lowering.graph import OpGraph


@dataclass(slots=True)
class OpTiming:
    ready: float = 0.0  # dependencies done
    issued: float = 0.0  # host has issued it
    start: float = 0.0  # GPU starts its kernel gap
    body_start: float = 0.0
    body_end: float = 0.0
    end: float = 0.0


@dataclass
class StepOutcome:
    step: int
    time_ns: float
    timings: list[OpTiming]
    log: list[tuple]
    events: int
    host_sync_ns: float


class Simulation:
    def __init__(self, costs: CostModel, graph: OpGraph, op_costs: list[OpCost], graph_mode: bool,
                 log: bool = True):
        self.model = costs
        self.graph = graph
        self.op_costs = op_costs
        self.graph_mode = graph_mode
        self.env = simpy.Environment()
        self.log: list[tuple] = [] if log else None
        self.networks = {stage: FlowNetwork(self.env, costs.capacity, self.log, (stage,))
                         for stage in range(graph.stages)}
        host = costs.hw.host
        self.launch_ns = host.launch_overhead_ns.value
        self.graph_launch_ns = host.graph_launch_ns.value
        self.sync_ns = host.sync_round_trip_ns.value
        n = len(graph.ops)
        self.timings = [OpTiming() for _ in range(n)]
        self.end: list[float | None] = [None] * n
        self._waiters: dict[int, simpy.Event] = {}
        # ops another process waits for: dependents on another stream, or a host sync
        self.watched = [op.host_sync for op in graph.ops]
        for op in graph.ops:
            for dep in op.deps:
                other = graph.ops[dep]
                if (other.stage, other.stream) != (op.stage, op.stream):
                    self.watched[dep] = True
        self.issue_time: list[float | None] = [None] * n
        self.published = self.env.event()
        self.host_sync_ns = 0.0

    # -- host -------------------------------------------------------------------------------
    def issue_kernels(self):
        env, ops = self.env, self.graph.ops
        t = env.now
        new_segment = True
        for op in ops:
            if self.graph_mode:
                if new_segment:
                    t += self.graph_launch_ns
                    self._log_host(op, "host.graph_launch", t - self.graph_launch_ns, t)
            else:
                t += self.launch_ns * op.kernels
            new_segment = False
            self.issue_time[op.idx] = t
            if op.host_sync:
                self._publish()
                if self.end[op.idx] is None:
                    yield self._wait_for(op.idx)
                start = max(t, env.now)
                t = start + self.sync_ns + op.host_ns
                self.host_sync_ns += t - env.now
                self._log_host(op, "host.sync", env.now, t)
                if t > env.now:
                    yield env.timeout(t - env.now)
                new_segment = True
        self._publish()

    def _publish(self):
        event, self.published = self.published, self.env.event()
        event.succeed()

    def _log_host(self, op, kind, t0, t1):
        if self.log is not None:
            self.log.append((self.graph.step, op.layer, op.name, "host", kind, t0, t1, 0, 0))

    # -- streams ------------------------------------------------------------------------------
    def _wait_for(self, idx: int) -> simpy.Event:
        event = self._waiters.get(idx)
        if event is None:
            event = self._waiters[idx] = self.env.event()
        return event

    def _finish(self, idx: int, end: float) -> None:
        self.end[idx] = end
        self.timings[idx].end = end
        event = self._waiters.pop(idx, None)
        if event is not None:
            event.succeed()

    def run_stream(self, ops):
        """Run ``ops`` in order. An op's drain is folded into the next op's lead-in when no
        other process waits for it (no cross-stream dependents, no host sync): its end time
        is recorded without an event of its own."""
        env = self.env
        free = env.now  # when this stream's previous op ends
        for op in ops:
            idx = op.idx
            timing = self.timings[idx]
            ready = free
            for dep in op.deps:
                if self.end[dep] is None:
                    yield self._wait_for(dep)
                ready = max(ready, self.end[dep])
            timing.ready = ready
            while self.issue_time[idx] is None:
                yield self.published
            issued = self.issue_time[idx]
            timing.issued = issued
            start = max(ready, issued, env.now if env.now > ready else ready)
            timing.start = start
            cost = self.op_costs[idx]
            body_start = start + cost.gap_ns + cost.fill_ns
            if body_start > env.now:
                yield env.timeout(body_start - env.now)
            timing.body_start = env.now
            specs = _specs(cost)
            if specs.flows:
                yield self.networks[op.stage].transfer_merged(
                    specs, (self.graph.step, op.layer, op.name, op.matrix_flops + op.vector_ops))
            timing.body_end = env.now
            end = env.now + cost.drain_ns
            if self.watched[idx]:
                if cost.drain_ns > 0:
                    yield env.timeout(cost.drain_ns)
                self._finish(idx, env.now)
            else:
                self._finish(idx, end)
            free = self.end[idx]

    def run(self) -> StepOutcome:
        env = self.env
        streams: dict[tuple[int, str], list] = {}
        for op in self.graph.ops:
            streams.setdefault((op.stage, op.stream), []).append(op)
        env.process(self.issue_kernels())
        for ops in streams.values():
            env.process(self.run_stream(ops))
        env.run()
        unfinished = [op.name for op in self.graph.ops if self.end[op.idx] is None]
        if unfinished:
            raise RuntimeError(f"deadlock: ops never ran: {unfinished[:5]}")
        end = max((t.end for t in self.timings), default=0.0)
        return StepOutcome(self.graph.step, max(end, env.now), self.timings, self.log or [],
                           _event_count(env), self.host_sync_ns)


def _specs(cost: OpCost) -> Merged:
    """The flows of an op's body (memory and compute), merged once per OpCost."""
    specs = _SPECS.get(id(cost))
    if specs is not None and specs[0] is cost:
        return specs[1]
    specs = [(f.link, f.bytes, f.weight, f.cap, f.tile_cap, ("write" if f.write else "read") + ":" + f.category)
             for f in cost.flows]
    if cost.compute_ns > 0:
        share = cost.tiles_share
        specs.append((COMPUTE, cost.compute_ns * share, 1.0, share, math.inf, "tile.compute"))
    specs = merge(specs)
    if len(_SPECS) > 4096:
        _SPECS.clear()
    _SPECS[id(cost)] = (cost, specs)
    return specs


_SPECS: dict[int, tuple] = {}


def _event_count(env: simpy.Environment) -> int:
    return next(env._eid)  # SimPy's own counter of scheduled events (itertools.count)
