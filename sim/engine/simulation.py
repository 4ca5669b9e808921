"""One decode step in simulated time.

Components (nouns): a ``FlowNetwork`` per pipeline stage whose memory levels, on-chip
network, chip links, host link and compute tiles are shared by more than one stream, and
the host. Processes (verbs): ``issue_kernels`` on the host, and one ``run_stream`` per
(stage, stream) that executes its ops in order, as a GPU stream does:

1. wait for the op's dependencies and for the host to have issued it;
2. the kernel gap, then the fill latency (paid before the transfer, as in SimGrid);
3. the body: the op's memory flows and its compute flow, sharing links with whatever else
   runs; the op's tiles overlap loads with compute (double buffering);
4. the drain (the last chunk's compute).

When a stage has a single stream, nothing on its links can overlap: each op is then one
scheduled event of its uncontended time (gap + fill + body + drain), and the flow network
is not built. Where a stage has several streams, their ops' flows share bandwidth through
the flow network (weighted max-min, sim.engine.flows).

The host issues kernels in program order: ``launch_ns`` per kernel in eager mode, one
``graph_launch_ns`` per captured segment in graph mode. An op with ``host_sync`` makes the
host wait for it and pay ``sync_ns`` plus the op's own host work; a graph cannot span a
sync, so each sync starts a new segment. The step ends when the host holds the step's
tokens. The engine reads no configuration: it gets the graph, the op costs, the link
capacities and the host's times.
"""

from __future__ import annotations

import simpy

from sim.costs import COMPUTE, HostTimes, OpCost
from sim.engine.flows import FlowNetwork
from sim.engine.records import OpTiming, Span, StepOutcome
from sim.lowering.graph import OpGraph


class Simulation:
    """Declare (graph, costs, capacities, host), build the processes, ``run()``."""

    def __init__(self, graph: OpGraph, op_costs: list[OpCost], capacity: dict[str, float], host: HostTimes,
                 graph_mode: bool, log: bool = False):
        self.graph = graph
        self.op_costs = op_costs
        self.graph_mode = graph_mode
        self.host = host
        self.capacity = capacity
        self.env = simpy.Environment()
        self.log: list[Span] | None = [] if log else None
        streams_per_stage: dict[int, int] = {}
        for stage, _stream in graph.streams:
            streams_per_stage[stage] = streams_per_stage.get(stage, 0) + 1
        self.networks = {stage: FlowNetwork(self.env, capacity, self.log, (stage,))
                         for stage, n in streams_per_stage.items() if n > 1}
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
        self.wait_ns = 0.0
        self.contended: dict[int, float] = {}
        self.events = 0

    # -- host -------------------------------------------------------------------------------
    def issue_kernels(self):
        env, ops, host = self.env, self.graph.ops, self.host
        t = env.now
        new_segment = True
        for op in ops:
            if self.graph_mode:
                if new_segment:
                    t += host.graph_launch_ns
                    self._log_host(op, "host.graph_launch", t - host.graph_launch_ns, t)
            else:
                t += host.launch_ns * op.work.kernels
            new_segment = False
            self.issue_time[op.idx] = t
            if op.host_sync:
                self._publish()
                if self.end[op.idx] is None:
                    yield self._wait_for(op.idx)
                start = max(t, env.now)
                t = start + host.sync_ns + self.op_costs[op.idx].host_ns
                self.host_sync_ns += t - env.now
                self._log_host(op, "host.sync", env.now, t)
                if t > env.now:
                    self.events += 1
                    yield env.timeout(t - env.now)
                new_segment = True
        self._publish()

    def _publish(self):
        event, self.published = self.published, self.env.event()
        event.succeed()

    def _log_host(self, op, kind, t0, t1):
        if self.log is not None:
            self.log.append(Span(self.graph.step, op.layer, op.name, "host", kind, t0, t1, 0, 0))

    # -- streams ------------------------------------------------------------------------------
    def _wait_for(self, idx: int) -> simpy.Event:
        event = self._waiters.get(idx)
        if event is None:
            self.events += 1
            event = self._waiters[idx] = self.env.event()
        return event

    def _finish(self, idx: int, end: float) -> None:
        self.end[idx] = end
        self.timings[idx].end = end
        event = self._waiters.pop(idx, None)
        if event is not None:
            event.succeed()

    def run(self) -> StepOutcome:
        env = self.env
        streams: dict[tuple[int, str], list] = {}
        for op in self.graph.ops:
            streams.setdefault((op.stage, op.stream), []).append(op)
        env.process(self.issue_kernels())
        for (stage, _stream), ops in streams.items():
            network = self.networks.get(stage)
            if network is None:
                env.process(_Stream(self).alone(ops))
            else:
                env.process(_Stream(self).shared(ops, network))
        env.run()
        unfinished = [op.name for op in self.graph.ops if self.end[op.idx] is None]
        if unfinished:
            raise RuntimeError(f"deadlock: ops never ran: {unfinished[:5]}")
        end = max((t.end for t in self.timings), default=0.0)
        events = self.events + sum(n.events for n in self.networks.values())
        return StepOutcome(self.graph.step, max(end, env.now), self.timings, self.log or [], events,
                           self.host_sync_ns, self.wait_ns, sum(self.contended.values()), self.contended)


class _Stream:
    """One (stage, stream): runs its ops in order; ``free`` is when its previous op ended."""

    def __init__(self, sim: Simulation):
        self.sim = sim
        self.free = sim.env.now

    def _start(self, op):
        """Wait for the op's dependencies and for the host to issue it; sets its timing."""
        sim = self.sim
        timing = sim.timings[op.idx]
        ready = self.free
        for dep in op.deps:
            if sim.end[dep] is None:
                yield sim._wait_for(dep)
            end = sim.end[dep]
            ready = end if end > ready else ready
        timing.ready = ready
        while sim.issue_time[op.idx] is None:
            yield sim.published
        issued = sim.issue_time[op.idx]
        timing.issued = issued
        start = max(ready, issued, sim.env.now)
        timing.start = start
        if start > ready:
            sim.wait_ns += start - ready

    def alone(self, ops):
        """Alone on its stage: each op is one event of its uncontended time."""
        sim = self.sim
        env, costs, timings, log = sim.env, sim.op_costs, sim.timings, sim.log
        for op in ops:
            yield from self._start(op)
            idx = op.idx
            timing = timings[idx]
            cost = costs[idx]
            body_start = timing.start + cost.gap_ns + cost.fill_ns
            timing.body_start = body_start
            timing.body_end = body_end = body_start + cost.ideal_body_ns
            end = body_end + cost.drain_ns
            if log is not None:
                self._log(op, cost, body_start)
            if end > env.now:
                sim.events += 1
                yield env.timeout(end - env.now)
            sim._finish(idx, end)
            self.free = end

    def _log(self, op, cost: OpCost, body_start: float) -> None:
        """The spans the flow network would log for an op alone on its links."""
        sim = self.sim
        step, flops = sim.graph.step, op.work.matrix_flops + op.work.vector_ops
        for link, weight, cap, size, parts in cost.merged:
            end = body_start + size / min(cap, sim.capacity[link] / weight)
            for kind, part in parts:
                if link == COMPUTE:
                    sim.log.append(Span(step, op.layer, op.name, link, kind, body_start, end, 0, flops))
                else:
                    sim.log.append(Span(step, op.layer, op.name, link, kind, body_start, end, part, 0))

    def shared(self, ops, network: FlowNetwork):
        """Sharing its stage's links with other streams: bodies are flows on the network."""
        sim = self.sim
        env, costs, timings = sim.env, sim.op_costs, sim.timings
        for op in ops:
            yield from self._start(op)
            idx = op.idx
            timing = timings[idx]
            cost = costs[idx]
            body_start = timing.start + cost.gap_ns + cost.fill_ns
            if body_start > env.now:
                sim.events += 1
                yield env.timeout(body_start - env.now)
            timing.body_start = env.now
            if cost.merged:
                yield network.transfer(cost.merged, (sim.graph.step, op.layer, op.name,
                                                     op.work.matrix_flops + op.work.vector_ops))
            timing.body_end = env.now
            extra = (timing.body_end - timing.body_start) - cost.ideal_body_ns
            if extra > 1e-9 * max(1.0, cost.ideal_body_ns):
                sim.contended[idx] = extra
            end = env.now + cost.drain_ns
            if sim.watched[idx] and cost.drain_ns > 0:
                sim.events += 1
                yield env.timeout(cost.drain_ns)
            sim._finish(idx, end)
            self.free = end
