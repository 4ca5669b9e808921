"""One decode step in simulated time.

Components (nouns): a ``FlowNetwork`` per pipeline stage whose memory levels, on-chip
network, chip links, host link and compute tiles are shared by more than one stream, and
the host. Processes (verbs): ``issue_kernels`` on the host, and one stream per (stage,
stream) that executes its ops in order, as a GPU stream does:

1. wait for the op's dependencies and for the host to have issued it;
2. the kernel gap, then the fill latency (paid before the transfer, as in SimGrid);
3. the body: the op's memory flows and its compute flow, sharing links with whatever else
   runs; the op's tiles overlap loads with compute (double buffering);
4. the drain (the last chunk's compute).

Events only where something is shared. When no stage has more than one stream, nothing can
overlap on any link: the step is the step timer's closed form (sim.engine.timer.timeline),
with no environment, process or event. Where some stage has several streams
(``SharedStream``), their ops' bodies are flows that share bandwidth through the stage's
flow network (weighted max-min, sim.engine.flows); a stage with a single stream beside them
(``LoneStream``) is timed by a loop over its ops' uncontended durations (gap + fill + body +
drain), with events only where it waits for another stream or the host.

The host issues kernels in program order: ``launch_ns`` per kernel in eager mode, one
``graph_launch_ns`` per captured segment in graph mode. An op with ``host_sync`` makes the
host wait for it and pay ``sync_ns`` plus the op's own host work; a graph cannot span a
sync, so each sync starts a new segment. The step ends when the host holds the step's
tokens. The engine reads no configuration: it gets the graph, the op costs, the link
capacities and the host's times, and counts the events it schedules itself.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate

import simpy

from sim.costs import COMPUTE, HostTimes, OpCost
from sim.engine.flows import FlowNetwork
from sim.engine.records import Span, StepOutcome
from sim.engine.timer import after_sync, issue, segments, timeline
from sim.lowering.graph import OpGraph


class Simulation:
    """Declare (graph, costs, capacities, host), build the processes, ``run()``."""

    def __init__(self, graph: OpGraph, op_costs: list[OpCost], capacity: dict[str, float], host: HostTimes,
                 graph_mode: bool, log: bool = False, durations: list[float] | None = None, moments: bool = True):
        self.graph = graph
        self.moments = moments or log  # per-op moments of a closed-form step (an op table or a log reads them)
        self.op_costs = op_costs
        self.graph_mode = graph_mode
        self.host = host
        self.capacity = capacity
        self.log: list[Span] | None = [] if log else None
        streams_per_stage: dict[int, int] = {}
        for stage, _stream in graph.streams:
            streams_per_stage[stage] = streams_per_stage.get(stage, 0) + 1
        shared = [stage for stage, n in streams_per_stage.items() if n > 1]
        # events only where something is shared: no environment for a step without a shared stage
        self.env = simpy.Environment() if shared else None
        self.networks = {stage: FlowNetwork(self.env, capacity, self.log, (stage,)) for stage in shared}
        # each op alone: gap + fill + body + drain (the runner keeps them between steps)
        self.durations = durations if durations is not None else [c.total_ns for c in op_costs]
        if shared:  # the closed form (``run`` without a shared stage) keeps its own moments
            self._build(len(graph.ops))

    def _build(self, n: int) -> None:
        """The engine's state for ``n`` ops: their moments, the events waited on, the totals."""
        graph = self.graph
        self.ready = [0.0] * n
        self.start = [0.0] * n
        self.end: list[float | None] = [None] * n
        self.bodies: dict[int, tuple[float, float]] = {}  # body (start, end) of ops that shared links
        self._waiters: dict[int, simpy.Event] = {}
        self.watched = graph.watched  # ops another process waits for: cross-stream dependents, host syncs
        self.issue_time: list[float | None] = [None] * n
        self.published = self.env.event()
        self.host_sync_ns = 0.0
        self.wait_ns = 0.0
        self.contended: dict[int, float] = {}
        self.events = 0

    # -- host -------------------------------------------------------------------------------
    def issue_kernels(self):
        """Issue the ops segment by segment (sim.engine.timer); a segment ends at an op the
        host waits for."""
        env, ops, host, issue_time = self.env, self.graph.ops, self.host, self.issue_time
        t = env.now
        for first, last in segments(self.graph):
            t = issue(first, last, t, self.op_costs, host, self.graph_mode, issue_time)
            if self.log is not None:
                self._log_issue(first, last, t, issue_time)
            op = ops[last]
            if op.host_sync:
                self._publish()
                if self.end[op.idx] is None:
                    yield self.wait_for(op.idx)
                if self.end[op.idx] > env.now:  # a lone stream knows its ends ahead of simulated time
                    self.events += 1
                    yield env.timeout(self.end[op.idx] - env.now)
                t = after_sync(t, env.now, host, self.op_costs[op.idx])
                self.host_sync_ns += t - env.now
                self._log_host(op, "host.sync", env.now, t)
                if t > env.now:
                    self.events += 1
                    yield env.timeout(t - env.now)
        self._publish()

    def _log_issue(self, first: int, last: int, t: float, issue_time) -> None:
        ops = self.graph.ops
        if self.graph_mode:
            self._log_host(ops[first], "host.graph_launch", t - self.host.graph_launch_ns, t)
            return
        for idx in range(first, last + 1):
            dispatch = self.op_costs[idx].dispatch_ns
            if dispatch > 0:
                self._log_host(ops[idx], "host.dispatch", issue_time[idx] - dispatch, issue_time[idx])

    def _publish(self):
        event, self.published = self.published, self.env.event()
        event.succeed()

    def _log_host(self, op, kind, t0, t1):
        if self.log is not None:
            self.log.append(Span(self.graph.step, op.layer, op.name, "host", kind, t0, t1, 0, 0))

    # -- shared state of the streams ----------------------------------------------------------
    def wait_for(self, idx: int) -> simpy.Event:
        """An event that fires when op ``idx`` ends."""
        event = self._waiters.get(idx)
        if event is None:
            self.events += 1
            event = self._waiters[idx] = self.env.event()
        return event

    def finish(self, idx: int, end: float) -> None:
        self.end[idx] = end
        if self._waiters:
            event = self._waiters.pop(idx, None)
            if event is not None:
                event.succeed()

    def log_kernels(self, op, cost: OpCost, start: float, end: float) -> None:
        """One ``kernels`` span per kernel the op runs (``<op>/<kernel>``, kind = its class), in
        order over [start, end]: each its start-up and body alone, scaled to the op's time."""
        kernels = cost.kernels
        if not kernels:
            return
        alone = [k.startup_ns + k.body_ns for k in kernels]
        total = sum(alone)
        scale = (end - start) / total if total > 0 else 0.0
        t = start
        for k, span in zip(kernels, alone, strict=True):
            t1 = t + span * scale
            self.log.append(Span(self.graph.step, op.layer, f"{op.name}/{k.name}", "kernels", k.kclass, t, t1, 0, 0))
            t = t1

    def log_alone(self, op, cost: OpCost, body_start: float) -> None:
        """The spans the flow network would log for an op alone on its links."""
        self.log_kernels(op, cost, body_start - cost.gap_ns - cost.fill_ns, body_start + cost.ideal_body_ns
                         + cost.drain_ns)
        step, flops = self.graph.step, op.work.matrix_flops + op.work.vector_ops
        for link, weight, cap, size, parts in cost.merged:
            end = body_start + size / min(cap, self.capacity[link] / weight)
            for kind, part in parts:
                if link == COMPUTE:
                    self.log.append(Span(step, op.layer, op.name, link, kind, body_start, end, 0, flops))
                else:
                    self.log.append(Span(step, op.layer, op.name, link, kind, body_start, end, part, 0))

    # -- the step -------------------------------------------------------------------------------
    def run(self) -> StepOutcome:
        if not self.networks:  # no stage's streams share anything: the step is the timer's closed form
            outcome = timeline(self.graph, self.op_costs, self.host, self.graph_mode, self.durations, self.moments)
            if self.log is not None:
                outcome.log = self._log_timeline(outcome)
            return outcome
        env, ops = self.env, self.graph.ops
        env.process(self.issue_kernels())
        for lane in self.graph.lanes:
            network = self.networks.get(lane.stage)
            if network is None:
                LoneStream(self, lane).begin()
            else:
                env.process(SharedStream(self, [ops[i] for i in lane.ops], network).run())
        env.run()
        if None in self.end:
            unfinished = [op.name for op in self.graph.ops if self.end[op.idx] is None]
            raise RuntimeError(f"deadlock: ops never ran: {unfinished[:5]}")
        last_end = max(self.end, default=0.0)
        events = self.events + sum(n.events for n in self.networks.values())
        return StepOutcome(self.graph.step, max(last_end, env.now), self.log or [], events, self.host_sync_ns,
                           self.wait_ns, sum(self.contended.values()), self.contended, last_end,
                           moments=(self.ready, self.issue_time, self.start, self.end, self.op_costs, self.bodies))


    def _log_timeline(self, outcome: StepOutcome) -> list[Span]:
        """The spans of a closed-form step, as the events would have logged them: per segment,
        the host's launches, then its ops alone on their links, then the host's wait."""
        _ready, issued, start, end, costs, _bodies = outcome.moments
        ops = self.graph.ops
        for first, last in segments(self.graph):
            t = issued[last]
            self._log_issue(first, last, t, issued)
            for idx in range(first, last + 1):
                cost = costs[idx]
                self.log_alone(ops[idx], cost, start[idx] + cost.gap_ns + cost.fill_ns)
            if ops[last].host_sync:
                waited = max(t, end[last])
                t = after_sync(t, end[last], self.host, costs[last])
                self._log_host(ops[last], "host.sync", waited, t)
        return self.log


class LoneStream:
    """A stream alone on its stage: nothing it does shares a resource with another stream, so
    its ops' times follow from their dependencies and issue times alone, and it is timed by a
    tight loop over their precomputed durations, with no event per op.

    ``advance`` runs ops until one depends on an op of another stream whose end is not known
    yet, or the host has not issued it (it waits on that event and returns). An op's end is
    recorded as soon as it is known, ahead of simulated time: whoever reads it (another
    stream, the host) starts at the later of that end and its own clock, which is what it
    would have done had it waited for the end to happen (the host advances to it first).
    A run of ops that each wait only for the op before them (``OpGraph.chains``) and are all
    issued by the time the first is ready is timed in one pass (``_chain``)."""

    def __init__(self, sim: Simulation, lane):
        self.sim = sim
        self.ops = lane.ops  # op indices in program order
        self.external = lane.external  # per op: its dependencies other than the op before it
        self.i = 0
        self.free = sim.env.now
        self.callback = self.advance  # one bound method for every event

    def begin(self) -> None:
        """Start after the processes created before it (the host) have run at time 0."""
        event = self.sim.env.event()
        event.callbacks.append(self.advance)
        event.succeed()
        self.sim.events += 1

    def advance(self, _event) -> None:
        sim = self.sim
        end_of, watched = sim.end, sim.watched
        now = sim.env.now
        ops, external, durations, issue_time = self.ops, self.external, sim.durations, sim.issue_time
        ready_of, start_of, log, chains = sim.ready, sim.start, sim.log, sim.graph.chains
        i, free, n = self.i, self.free, len(ops)
        while i < n:
            idx = ops[i]
            ready = free
            for dep in external[i]:
                end = end_of[dep]
                if end is None:
                    self.i, self.free = i, free
                    sim.wait_for(dep).callbacks.append(self.callback)
                    return
                if end > ready:
                    ready = end
            issued = issue_time[idx]
            if issued is None:
                self.i, self.free = i, free
                sim.published.callbacks.append(self.callback)
                return
            start = ready if ready >= issued else issued
            if now > start:
                start = now
            if start > ready:
                sim.wait_ns += start - ready
            ready_of[idx] = ready
            start_of[idx] = start
            if log is not None:
                cost = sim.op_costs[idx]
                sim.log_alone(sim.graph.ops[idx], cost, start + cost.gap_ns + cost.fill_ns)
            end = start + durations[idx]
            i += 1
            free = end
            if watched[idx]:
                sim.finish(idx, end)
            else:
                end_of[idx] = end
            last = chains[idx] - 1  # ops idx+1 .. last wait only for the op before them
            if last > idx and log is None:
                issued = issue_time[last]
                if issued is not None and issued <= free:  # all issued before they are ready: a chain
                    free = self._chain(idx + 1, last + 1, free)
                    i += last - idx

        self.i, self.free = i, free

    def _chain(self, a: int, b: int, free: float) -> float:
        """Time ops ``a .. b-1``, each starting when the one before it ends (from ``free``), and
        return the last one's end: the same additions, in the same order, as one op at a time."""
        sim = self.sim
        ends = list(accumulate(sim.durations[a:b], initial=free))
        starts = ends[:-1]
        sim.ready[a:b] = starts
        sim.start[a:b] = starts
        sim.end[a:b] = ends[1:]
        watched = sim.graph.watched_ops
        for k in range(bisect_left(watched, a), bisect_left(watched, b)):
            idx = watched[k]
            sim.finish(idx, sim.end[idx])
        return ends[-1]


class SharedStream:
    """A stream sharing its stage's links with other streams: bodies are flows on the network."""

    def __init__(self, sim: Simulation, ops: list, network: FlowNetwork):
        self.sim = sim
        self.ops = ops
        self.network = network
        self.free = sim.env.now

    def run(self):
        sim = self.sim
        env, costs = sim.env, sim.op_costs
        for op in self.ops:
            idx = op.idx
            ready = self.free
            for dep in op.deps:
                if sim.end[dep] is None:
                    yield sim.wait_for(dep)
                ready = max(ready, sim.end[dep])
            while sim.issue_time[idx] is None:
                yield sim.published
            issued = sim.issue_time[idx]
            start = max(ready, issued, env.now)
            if start > ready:
                sim.wait_ns += start - ready
            sim.ready[idx], sim.start[idx] = ready, start
            cost = costs[idx]
            body_start = start + cost.gap_ns + cost.fill_ns
            if body_start > env.now:
                sim.events += 1
                yield env.timeout(body_start - env.now)
            body_start = env.now
            if cost.merged:
                yield self.network.transfer(cost.merged, (sim.graph.step, op.layer, op.name,
                                                          op.work.matrix_flops + op.work.vector_ops))
            body_end = env.now
            sim.bodies[idx] = (body_start, body_end)
            if sim.log is not None:
                sim.log_kernels(op, cost, start, body_end + cost.drain_ns)
            extra = (body_end - body_start) - cost.ideal_body_ns
            if extra > 1e-9 * max(1.0, cost.ideal_body_ns):
                sim.contended[idx] = extra
            end = body_end + cost.drain_ns
            if sim.watched[idx] and cost.drain_ns > 0:
                sim.events += 1
                yield env.timeout(cost.drain_ns)
            sim.finish(idx, end)
            self.free = end
