"""What the engine (and the analytic model) hand to the results stage: typed records.

``Span`` is one row of the event log: a resource busy with part of an op (``hbm`` reading
weights, ``compute`` running tiles, ``host`` launching a graph or waiting on a sync).
``OpTiming`` holds one op's moments; ``StepOutcome`` one step's. Times are ns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

LOG_COLUMNS = ("step", "layer", "op", "resource", "kind", "t_start_ns", "t_end_ns", "bytes", "flops")


class Span(NamedTuple):
    """A resource busy with (part of) an op from ``t_start_ns`` to ``t_end_ns``."""

    step: int
    layer: int
    op: str
    resource: str  # a memory level, "link", "pcie", "noc", "compute" or "host"
    kind: str  # e.g. "read:weights", "write:act", "tile.compute", "host.sync"
    t_start_ns: float
    t_end_ns: float
    bytes: int
    flops: int


class OpTiming(NamedTuple):
    """One op's moments in a step."""

    ready: float = 0.0  # dependencies done
    issued: float = 0.0  # the host has issued it
    start: float = 0.0  # its kernel gap starts
    body_start: float = 0.0
    body_end: float = 0.0
    end: float = 0.0


@dataclass
class StepOutcome:
    """One simulated step: its time, the log (when kept) and the totals the breakdown needs
    without walking the ops again. Per-op ``timings`` are built on first use from the raw
    moments the engine (or the analytic model) kept (``moments``: ready, issued, start, end
    lists, the op costs and the bodies of ops that shared links)."""

    step: int
    time_ns: float
    log: list[Span] = field(default_factory=list)
    events: int = 0
    host_sync_ns: float = 0.0
    wait_ns: float = 0.0  # sum over ops of (start - ready): waiting for the host
    contention_ns: float = 0.0  # sum over ops of body time beyond the uncontended body
    contended: dict[int, float] = field(default_factory=dict)  # op index -> its extra body time
    last_end: float = 0.0  # when the last op ended
    moments: tuple | None = None
    _timings: list[OpTiming] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def timings(self) -> list[OpTiming]:
        if self._timings is None:
            if self.moments is None:
                raise ValueError(f"step {self.step} was timed without its per-op moments (timeline's moments=False)")
            ready, issued, start, end, costs, bodies = self.moments
            out = []
            for idx, cost in enumerate(costs):
                body = bodies.get(idx)
                if body is None:
                    body_start = start[idx] + cost.gap_ns + cost.fill_ns
                    body = (body_start, body_start + cost.ideal_body_ns)
                out.append(OpTiming(ready[idx], issued[idx], start[idx], body[0], body[1], end[idx]))
            self._timings = out
        return self._timings
