"""Flow-level bandwidth sharing (as in SimGrid's fluid model and ns-3's flow completion).

A ``FlowNetwork`` owns named links with a capacity in bytes/ns. A flow moves a number of
useful bytes over one link, consuming ``weight`` units of capacity per byte (1/efficiency)
and never faster than its own ``cap``. Rates are the weighted max-min fair share on each
link (water-filling with caps), recomputed only when a flow starts or finishes; one wake-up
is scheduled for the earliest completion and a generation counter voids stale ones. The
event count therefore grows with the number of flows, never with bytes.

Compute is a link too: the ``compute`` link has capacity 1 (the whole chip's tiles) and an
op's compute is a flow of ``compute_ns x share`` units capped at its tile ``share``.
"""

from __future__ import annotations

import math

import simpy

from sim.engine.records import Span

_EPS = 1e-9


class _Flow:
    __slots__ = ("link", "remaining", "size", "weight", "cap", "rate", "group", "start", "meta", "t_end")

    def __init__(self, link, size, weight, cap, group, start, meta):
        self.link = link
        self.size = size
        self.remaining = float(size)
        self.weight = weight
        self.cap = cap
        self.rate = 0.0
        self.group = group
        self.start = start
        self.meta = meta
        self.t_end = math.inf


class _Group:
    __slots__ = ("pending", "event", "flows")

    def __init__(self, env, pending):
        self.pending = pending
        self.event = env.event()
        self.flows: list[_Flow] = []


class FlowNetwork:
    def __init__(self, env: simpy.Environment, capacity: dict[str, float], log: list | None = None,
                 label: tuple = ()):
        self.env = env
        self.capacity = capacity
        self.flows: dict[str, list[_Flow]] = {}
        self.groups: list[_Group] = []
        self.log = log
        self.label = label
        self._generation = 0
        self._updated = 0.0
        self.moved: dict[str, float] = {}
        self.events = 0  # wake-ups this network scheduled

    def transfer(self, merged: tuple, meta) -> simpy.Event:
        """Start an op's body flows ``merged`` = ((link, weight, cap, bytes, parts), ...) (as
        sim.costs.merge builds them); the returned event fires when all have finished. The
        log keeps each part's kind and bytes."""
        env = self.env
        group = _Group(env, len(merged))
        if not merged:
            group.event.succeed()
            return group.event
        now = env.now
        capacity = self.capacity
        if not self.flows and len({f[0] for f in merged}) == len(merged):
            # an idle network: every flow is alone on its link, rates need no sharing
            self._updated = now
            last = now
            for link, weight, cap, size, parts in merged:
                flow = _Flow(link, size, weight, cap, group, now, (meta, parts))
                flow.rate = rate = min(cap, capacity[link] / weight)
                flow.t_end = end = now + size / rate
                last = end if end > last else last
                self.flows[link] = [flow]
                group.flows.append(flow)
            self.groups.append(group)
            self._generation += 1
            generation = self._generation
            self.events += 1
            wake = env.timeout(last - now)
            wake.callbacks.append(lambda _e: self._wake(generation))
            return group.event
        self._advance()
        dirty = set()
        for link, weight, cap, size, parts in merged:
            flow = _Flow(link, size, weight, cap, group, now, (meta, parts))
            self.flows.setdefault(link, []).append(flow)
            group.flows.append(flow)
            dirty.add(link)
        self.groups.append(group)
        for link in dirty:
            self._allocate(link)
        self._schedule()
        return group.event

    # -- internals ------------------------------------------------------------------------
    def _advance(self) -> None:
        dt = self.env.now - self._updated
        if dt > 0:
            for flows in self.flows.values():
                for f in flows:
                    f.remaining -= f.rate * dt
        self._updated = self.env.now

    def _allocate(self, link: str) -> None:
        flows = self.flows.get(link)
        if not flows:
            return
        now = self.env.now
        capacity = self.capacity[link]
        if len(flows) == 1:
            f = flows[0]
            f.rate = min(f.cap, capacity / f.weight)
        else:
            # water-filling: equal rates, except flows held below the share by their own cap
            order = sorted(flows, key=lambda f: f.cap)
            weights = sum(f.weight for f in order)
            for i, f in enumerate(order):
                share = capacity / weights
                if f.cap <= share:
                    f.rate = f.cap
                    capacity -= f.cap * f.weight
                    weights -= f.weight
                else:
                    for g in order[i:]:
                        g.rate = share
                    break
        for f in flows:
            f.t_end = now + max(0.0, f.remaining) / f.rate if f.rate > 0 else math.inf

    def _schedule(self) -> None:
        """One wake-up at the earliest moment anything changes: a flow that shares its link
        finishes (the others speed up), or a group's last flow finishes. A flow alone on
        its link keeps its rate until another flow joins, which re-plans anyway."""
        soonest = math.inf
        for flows in self.flows.values():
            if len(flows) > 1:
                for f in flows:
                    soonest = min(soonest, f.t_end)
        for group in self.groups:
            soonest = min(soonest, max(f.t_end for f in group.flows if f.remaining > -1))
        self._generation += 1
        if soonest < math.inf:
            generation = self._generation
            self.events += 1
            wake = self.env.timeout(max(0.0, soonest - self.env.now))
            wake.callbacks.append(lambda _e: self._wake(generation))

    def _wake(self, generation: int) -> None:
        if generation != self._generation:
            return
        now = self.env.now
        horizon = now + _EPS * max(1.0, now)
        groups = self.groups
        if len(groups) == 1 and all(f.t_end <= horizon for f in groups[0].flows):
            # the common case: one op alone in the network, all of its flows done
            self.flows.clear()
            self._updated = now
            for f in sorted(groups[0].flows, key=lambda f: f.t_end):
                self._finish(f)
            self._generation += 1
            return
        self._advance()
        for link in list(self.flows):
            flows = self.flows[link]
            done = [f for f in flows if f.t_end <= horizon]
            if not done:
                continue
            keep = [f for f in flows if f.t_end > horizon]
            if keep:
                self.flows[link] = keep
            else:
                del self.flows[link]
            for f in sorted(done, key=lambda f: f.t_end):
                self._finish(f)
            self._allocate(link)
        self._schedule()

    def _finish(self, f: _Flow) -> None:
        end = f.t_end
        self.moved[f.link] = self.moved.get(f.link, 0.0) + f.size
        if self.log is not None:
            (step, layer, op, flops), parts = f.meta
            for kind, size in parts:
                if f.link == "compute":
                    self.log.append(Span(step, layer, op, f.link, kind, f.start, end, 0, flops))
                else:
                    self.log.append(Span(step, layer, op, f.link, kind, f.start, end, size, 0))
        f.remaining = -2.0  # finished
        group = f.group
        group.pending -= 1
        if group.pending == 0:
            self.groups.remove(group)
            group.event.succeed()
