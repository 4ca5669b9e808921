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

_EPS = 1e-9


class _Flow:
    __slots__ = ("link", "remaining", "size", "weight", "cap", "rate", "group", "start", "meta")

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


class _Group:
    __slots__ = ("pending", "event")

    def __init__(self, env, pending):
        self.pending = pending
        self.event = env.event()


class FlowNetwork:
    def __init__(self, env: simpy.Environment, capacity: dict[str, float], log: list | None = None,
                 label: tuple = ()):
        self.env = env
        self.capacity = capacity
        self.flows: dict[str, list[_Flow]] = {}
        self.log = log
        self.label = label
        self._generation = 0
        self._updated = 0.0
        self.moved: dict[str, float] = {}

    def transfer(self, specs, meta) -> simpy.Event:
        """Start flows ``specs`` = [(link, bytes, weight, cap, kind), ...]; the returned
        event fires when all of them have finished."""
        specs = [s for s in specs if s[1] > 0]
        group = _Group(self.env, len(specs))
        if not specs:
            group.event.succeed()
            return group.event
        self._advance()
        now = self.env.now
        dirty = set()
        for link, size, weight, cap, kind in specs:
            if link not in self.capacity:
                raise KeyError(f"no link {link!r}")
            self.flows.setdefault(link, []).append(_Flow(link, size, weight, cap, group, now, (meta, kind)))
            dirty.add(link)
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
        capacity = self.capacity[link]
        if len(flows) == 1:
            f = flows[0]
            f.rate = min(f.cap, capacity / f.weight)
            return
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

    def _schedule(self) -> None:
        soonest = math.inf
        for flows in self.flows.values():
            for f in flows:
                if f.rate > 0:
                    soonest = min(soonest, f.remaining / f.rate)
        self._generation += 1
        if soonest < math.inf:
            generation = self._generation
            wake = self.env.timeout(max(0.0, soonest))
            wake.callbacks.append(lambda _e: self._wake(generation))

    def _wake(self, generation: int) -> None:
        if generation != self._generation:
            return
        self._advance()
        now = self.env.now
        for link in list(self.flows):
            flows = self.flows[link]
            done = [f for f in flows if f.remaining <= _EPS * max(1.0, f.size) or
                    (f.rate > 0 and f.remaining / f.rate <= _EPS * max(1.0, now))]
            if not done:
                continue
            self.flows[link] = [f for f in flows if f not in done]
            for f in done:
                self._finish(f, now)
            self._allocate(link)
        self._schedule()

    def _finish(self, f: _Flow, now: float) -> None:
        self.moved[f.link] = self.moved.get(f.link, 0.0) + f.size
        if self.log is not None:
            (step, layer, op, flops), kind = f.meta
            if f.link == "compute":
                self.log.append((step, layer, op, f.link, kind, f.start, now, 0, flops))
            else:
                self.log.append((step, layer, op, f.link, kind, f.start, now, f.size, 0))
        f.group.pending -= 1
        if f.group.pending == 0:
            f.group.event.succeed()
