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


@dataclass(slots=True)
class OpTiming:
    """One op's moments in a step."""

    ready: float = 0.0  # dependencies done
    issued: float = 0.0  # the host has issued it
    start: float = 0.0  # its kernel gap starts
    body_start: float = 0.0
    body_end: float = 0.0
    end: float = 0.0


@dataclass
class StepOutcome:
    """One simulated step: its time, per-op timings, the log (when kept) and the totals the
    breakdown needs without walking the ops again."""

    step: int
    time_ns: float
    timings: list[OpTiming]
    log: list[Span] = field(default_factory=list)
    events: int = 0
    host_sync_ns: float = 0.0
    wait_ns: float = 0.0  # sum over ops of (start - ready): waiting for the host
    contention_ns: float = 0.0  # sum over ops of body time beyond the uncontended body
    contended: dict[int, float] = field(default_factory=dict)  # op index -> its extra body time
