"""What the costs hand the engine and the analytic model: flows, kernel costs and op costs.

A ``Flow`` is one access of a kernel as a transfer on one link (a memory level, a chip link,
the NoC, the host link, or ``compute`` for the op's tile time); an ``OpCost`` is one op alone
on the chip: its start-up (``gap``), ``fill`` before the body, the body's flows and compute,
and ``drain`` after. Times in ns, rates in bytes/ns (= GB/s). Records are frozen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

COMPUTE = "compute"
CATEGORY_ROW = {"weights": "weights", "kv": "kv", "act": "activations", "outliers": "outliers",
                "expert": "expert_weights", "staged": "staged_weights", "link": "links", "pcie": "host_link", "noc": "activations"}


class Flow(NamedTuple):
    """One access as a transfer: its useful bytes on ``link``, the link capacity each byte
    consumes (1 / efficiency) and the rates that cap it alone and with the op's other accesses."""

    link: str
    bytes: int  # useful bytes moved
    weight: float  # link capacity consumed per useful byte (1 / efficiency)
    cap: float  # max rate of this access alone (the channels its addresses cover), bytes/ns
    category: str
    write: bool
    tile_cap: float = math.inf  # max rate of all the op's accesses to this level together (its tiles)

    @property
    def rate_limit(self) -> float:
        return min(self.cap, self.tile_cap)


def merged_limit(tile_cap: float, caps: float) -> float:
    """The rate limit of an op's accesses to one level at one efficiency, moving together:
    their tiles' load bandwidth (the least ``tile_cap`` of theirs), or the sum of what each
    access's channels allow (``caps``)."""
    return min(tile_cap, caps)


class KernelCost(NamedTuple):
    """One kernel alone on the chip: its start-up (all launches), its body, and the rows of
    the breakdown the body belongs to."""

    name: str
    kclass: str
    startup_ns: float
    body_ns: float
    flows: tuple
    compute_ns: float
    tiles: float
    matrix_ns: float
    vector_ns: float
    dequant_ns: float
    launches: int
    rows: tuple


class HostTimes(NamedTuple):
    """The host's costs the engine charges: per eager kernel launch, per graph launch, per sync."""

    launch_ns: float
    graph_launch_ns: float
    sync_ns: float


_SET = object.__setattr__  # how OpCost's own __init__ sets its fields


@dataclass(frozen=True, slots=True)
class OpCost:
    """One op alone on the chip: its kernels' flows and compute, and the times around the body."""

    flows: tuple[Flow, ...]
    compute_ns: float  # with the op's tiles, uncontended
    tiles_share: float  # fraction of the chip's tiles it uses
    matrix_ns: float
    vector_ns: float
    dequant_ns: float
    fill_ns: float
    drain_ns: float
    gap_ns: float
    ideal_body_ns: float = 0.0  # body_ns(capacity) of the cost model that made it
    host_ns: float = 0.0  # host work after the op when the host waits for it (sync dispatch)
    kernels: tuple = ()  # KernelCost of each kernel, in order
    rows: tuple = ()  # (breakdown row, ns) of the body when alone
    dispatch_ns: float = 0.0  # host time to launch the op's kernels eagerly
    # the op's time alone on the chip: gap, fill, body and drain (set once, at construction)
    total_ns: float = field(default=0.0, init=False, compare=False)
    _merged: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def __init__(self, flows: tuple[Flow, ...], compute_ns: float, tiles_share: float, matrix_ns: float,
                 vector_ns: float, dequant_ns: float, fill_ns: float, drain_ns: float, gap_ns: float,
                 ideal_body_ns: float = 0.0, host_ns: float = 0.0, kernels: tuple = (), rows: tuple = (),
                 dispatch_ns: float = 0.0):
        # the dataclass's frozen __init__, written out: each field set once through a local
        # object.__setattr__ (the generated one looks it up per field; a cost is made per op)
        put = _SET
        put(self, "flows", flows)
        put(self, "compute_ns", compute_ns)
        put(self, "tiles_share", tiles_share)
        put(self, "matrix_ns", matrix_ns)
        put(self, "vector_ns", vector_ns)
        put(self, "dequant_ns", dequant_ns)
        put(self, "fill_ns", fill_ns)
        put(self, "drain_ns", drain_ns)
        put(self, "gap_ns", gap_ns)
        put(self, "ideal_body_ns", ideal_body_ns)
        put(self, "host_ns", host_ns)
        put(self, "kernels", kernels)
        put(self, "rows", rows)
        put(self, "dispatch_ns", dispatch_ns)
        put(self, "total_ns", gap_ns + fill_ns + ideal_body_ns + drain_ns)
        put(self, "_merged", None)

    @property
    def merged(self) -> tuple:
        """The body's flows merged by (link, weight) (see ``merge``): built when an engine first
        needs them (the analytic model never does), then kept."""
        made = self._merged
        if made is None:
            made = merge(self)
            object.__setattr__(self, "_merged", made)
        return made

    def body_ns(self, capacity: dict[str, float]) -> float:
        """Uncontended body time: the slowest of the flows and the compute. Flows of one op
        on the same link with the same efficiency and cap move as one (as the engine does)."""
        return max(self.compute_ns, loads_ns(self.flows, capacity))


def loads_ns(flows, capacity: dict[str, float]) -> float:
    """How long ``flows`` take together, uncontended (see ``loads``)."""
    return loads(flows, capacity)[0]


def loads(flows, capacity: dict[str, float]) -> tuple[float, dict[str, float]]:
    """(how long ``flows`` take together, uncontended; each breakdown row's load time), in one
    pass. Together: the busiest link, or the slowest group of accesses to one link at one
    efficiency held to their merged rate limit. A row's time: its flows' each alone, on its link
    or at its rate limit, whichever is longer."""
    per_link: dict[str, float] = {}
    together: dict[tuple, list] = {}  # (link, weight) -> [bytes, least tile cap, summed caps]
    by_row: dict[str, float] = {}
    for link, size, weight, cap, category, _write, tile_cap in flows:
        t = size * weight / capacity[link]
        per_link[link] = per_link.get(link, 0.0) + t
        key = (link, weight)
        group = together.get(key)
        if group is None:
            together[key] = [size, tile_cap, cap]
        else:
            group[0] += size
            if tile_cap < group[1]:
                group[1] = tile_cap
            group[2] += cap
        row = CATEGORY_ROW.get(category, category)
        limited = size / (cap if cap < tile_cap else tile_cap)
        by_row[row] = by_row.get(row, 0.0) + (t if t >= limited else limited)
    slowest = max(per_link.values(), default=0.0)
    for size, tile_cap, caps in together.values():  # each group at its merged rate limit (merged_limit)
        t = size / (tile_cap if tile_cap <= caps else caps)
        if t > slowest:
            slowest = t
    return slowest, by_row


def merge(cost: OpCost) -> tuple:
    """The body of ``cost`` as flows ``(link, weight, cap, bytes, parts)``: accesses on the same
    link at the same efficiency move as one flow, at most min(tile cap, sum of caps); the
    compute is a flow on the ``compute`` link of ``compute_ns x share`` units capped at its
    tile share. ``parts`` keeps each access's log kind and bytes."""
    specs = [(f.link, f.bytes, f.weight, f.cap, f.tile_cap, ("write" if f.write else "read") + ":" + f.category)
             for f in cost.flows]
    if cost.compute_ns > 0:
        share = cost.tiles_share
        specs.append((COMPUTE, cost.compute_ns * share, 1.0, share, math.inf, "tile.compute"))
    groups: dict[tuple, list] = {}
    for spec in specs:
        if spec[1] > 0:
            groups.setdefault((spec[0], spec[2]), []).append(spec)
    out = []
    for (link, weight), group in groups.items():
        size = sum(g[1] for g in group)
        cap = merged_limit(min(g[4] for g in group), sum(g[3] for g in group))
        if cost.ideal_body_ns > 0:  # the op's kernels run one after another: alone, it takes their summed body
            cap = min(cap, size / cost.ideal_body_ns)
        out.append((link, weight, cap, size, tuple((g[5], g[1]) for g in group)))
    return tuple(out)
