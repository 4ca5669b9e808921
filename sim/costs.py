"""Per-op costs on a hardware profile: the one place where an op meets the hardware numbers.

Both the discrete-event engine and the analytic model read an ``OpCost``; the engine
turns its flows into shared-bandwidth transfers, the analytic model adds them up in closed
form. Conventions (all times in ns, rates in bytes/ns = GB/s):

* A memory access of ``b`` bytes is a flow on the link of its level. It consumes
  ``b / efficiency`` of the level's pin bandwidth (a gather of 32-byte pieces costs about
  three times a stream) and is capped by the tiles it runs on (``tile_load_GBps`` each) and
  by the channels its addresses cover (``interleave_bytes`` granules).
* Compute occupies the op's share of the tiles: matrix FLOPs on the matrix unit with M
  padded to ``matrix_tile_m``, or on the vector FMA lanes when that is faster (a GEMV at
  batch 1); vector operations (element-wise, softmax, dequantization) on the vector units.
  Dequantization therefore competes with the matrix work for the op's time.
* ``fill`` is paid before the body (first-byte latency of the slowest source, or the
  latency steps of a collective, plus the on-chip network's latency for each NoC hop and
  the host link's latency for each message to the host), ``drain`` after it (the last
  chunk's compute), and ``gap`` (kernel boundaries) before everything.

Costs are keyed by the op's ``Work`` (sim.lowering.graph), so the op of every layer that
asks the same shares one ``OpCost``; the memo belongs to the CostModel instance.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

from sim.config.hardware import HBM, HardwareProfile
from sim.lowering.graph import KernelWork, Work
from sim.lowering.kernels import DEFAULT_CLASS

COMPUTE = "compute"
MEMO_LIMIT = 8192  # distinct works a CostModel keeps (a step graph has tens; more means works that do not recur)
CATEGORY_ROW = {"weights": "weights", "kv": "kv", "act": "activations", "outliers": "outliers",
                "expert": "expert_weights", "staged": "staged_weights", "link": "links", "pcie": "host_link", "noc": "activations"}


@dataclass(frozen=True, slots=True)
class Flow:
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


def merged_limit(flows) -> float:
    """The rate limit of an op's accesses to one level at one efficiency, moving together:
    their tiles' load bandwidth, or the sum of what each access's channels allow."""
    return min(min(f.tile_cap for f in flows), sum(f.cap for f in flows))


@dataclass(frozen=True, slots=True)
class KernelCost:
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


@dataclass(frozen=True)
class OpCost:
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


    @functools.cached_property
    def merged(self) -> tuple:
        """The body's flows merged by (link, weight) (see ``merge``): built when an engine first
        needs them (the analytic model never does)."""
        return merge(self)

    @functools.cached_property
    def total_ns(self) -> float:
        """The op's time alone on the chip: gap, fill, body and drain."""
        return self.gap_ns + self.fill_ns + self.ideal_body_ns + self.drain_ns

    def body_ns(self, capacity: dict[str, float]) -> float:
        """Uncontended body time: the slowest of the flows and the compute. Flows of one op
        on the same link with the same efficiency and cap move as one (as the engine does)."""
        per_link: dict[str, float] = {}
        together: dict[tuple, list] = {}
        for f in self.flows:
            per_link[f.link] = per_link.get(f.link, 0.0) + f.bytes * f.weight / capacity[f.link]
            together.setdefault((f.link, f.weight), []).append(f)
        capped = [sum(f.bytes for f in group) / merged_limit(group) for group in together.values()]
        return max([self.compute_ns, *per_link.values(), *capped])


class CostModel:
    """Costs of ops on one hardware profile under one software stack (None: the byte model's
    kernels, one per op unless the lowering says otherwise)."""

    def __init__(self, hw: HardwareProfile, stack=None):
        self.hw = hw
        self.stack = stack
        self.store = hw.store.name
        self.store_rate = hw.store.sustained_GBps
        self.classes = hw.kernels.classes if hw.kernels is not None else None
        self.cta_bw = hw.kernels.cta_bandwidth_GBps.value if hw.kernels is not None else math.inf
        c = hw.compute
        self.tiles = c.tiles.value
        self.clock = c.clock_GHz.value
        self.tile_m = c.matrix_tile_m.value
        self.matrix_eff = c.matrix_efficiency.value
        self.vector_eff = c.vector_efficiency.value
        self.tile_load = c.tile_load_GBps.value
        self.vector_rate = c.vector_rate("fp32")
        self.levels = {level.name: level for level in hw.memory}
        tile_sram = hw.tile_sram
        self.buffer_bytes = tile_sram.capacity_MB.value * 1e6 / 2 if tile_sram else 256e3
        links = hw.system.links
        self.capacity: dict[str, float] = {name: level.peak_GBps for name, level in self.levels.items()}
        self.capacity[COMPUTE] = 1.0
        self.capacity["noc"] = hw.noc.bandwidth_GBps.value
        self.capacity["pcie"] = hw.host.pcie_bandwidth_GBps.value
        self.capacity["link"] = links.bandwidth_GBps.value if links else 1.0
        scaleout = hw.system.scaleout
        self.capacity["scaleout"] = scaleout.bandwidth_GBps.value if scaleout else self.capacity["link"]
        self.kernel_gap = hw.host.kernel_gap_ns.value
        self.noc_latency = hw.noc.latency_ns.value
        self.pcie_latency = hw.host.pcie_latency_ns.value
        host = hw.host
        self.host = HostTimes(host.launch_overhead_ns.value, host.graph_launch_ns.value,
                              host.sync_round_trip_ns.value)
        self._memo: dict[Work, OpCost] = {}
        # hardware figures the hot paths read, looked up once
        self._hbm = {name: (lv.channels, lv.interleave_bytes.value, lv.channel_bandwidth_GBps.value)
                     for name, lv in self.levels.items() if isinstance(lv, HBM)}
        self._efficiency: dict[tuple[str, int | None], float] = {}  # (level, granule) -> efficiency
        self._matrix_rate: dict[str, float] = {}  # dtype -> FLOPs per cycle per tile
        small = c.small_tile_m
        self._small = (small.value, c.small_tile_efficiency.value) if small is not None else None
        self._latency = {name: lv.latency_ns.value for name, lv in self.levels.items()}

    # -- compute ------------------------------------------------------------------------
    def tiles_for(self, op: Work) -> float:
        return max(1.0, min(self.tiles, op.parallelism))

    def matrix_ns(self, op: Work, tiles: int) -> float:
        if not op.matrix_flops:
            return 0.0
        m = max(1, op.matrix_m)
        padded = op.matrix_flops * (math.ceil(m / self.tile_m) * self.tile_m) / m
        per_tile = self._matrix_rate.get(op.dtype)
        if per_tile is None:
            per_tile = self._matrix_rate[op.dtype] = self.hw.compute.matrix_rate(op.dtype)
        rate = tiles * per_tile * self.clock * self.matrix_eff
        tensor = padded / rate
        if self._small is not None:
            small_m, small_eff = self._small
            narrow = op.matrix_flops * (math.ceil(m / small_m) * small_m) / m
            tensor = min(tensor, narrow / (rate * small_eff))
        lanes = op.matrix_flops / (tiles * self.vector_rate * self.clock * self.vector_eff)
        return min(tensor, lanes)

    def vector_ns(self, ops: int, tiles: int) -> float:
        return ops / (tiles * self.vector_rate * self.clock * self.vector_eff) if ops else 0.0

    # -- flows --------------------------------------------------------------------------
    def flow(self, op: Work, access, tiles: int, store_cap: float = math.inf) -> Flow:
        """An access as a flow; ``store_cap`` caps an access to the backing store (the kernel
        class's rate)."""
        name = access.level
        if name not in self.levels:  # link, pcie, noc
            return Flow(name, self._link_bytes(op, access), 1.0, math.inf, access.category, access.write)
        key = (name, access.granule)
        eff = self._efficiency.get(key)
        if eff is None:
            eff = self._efficiency[key] = self.levels[name].efficiency(access.granule)
        cap = math.inf
        hbm = self._hbm.get(name)
        if hbm is not None:
            channels, interleave, channel_bw = hbm
            covered = min(channels, math.ceil(access.bytes / interleave))
            cap = covered * channel_bw * eff
        tile_cap = tiles * self.tile_load
        if name == self.store and store_cap < tile_cap:
            tile_cap = store_cap
        return Flow(name, access.bytes, 1.0 / eff, cap, access.category, access.write, tile_cap)

    def _link_bytes(self, op: Work, access) -> int:
        if op.collective is None or access.level not in ("link", "scaleout"):
            return access.bytes
        kind, size, n = op.collective
        if kind == "allreduce":
            return math.ceil(2 * (n - 1) * size / n)
        if kind in ("allgather", "alltoall"):
            return math.ceil((n - 1) * size / n) if kind == "alltoall" else (n - 1) * size
        return size  # p2p

    def collective_latency_ns(self, op: Work) -> float:
        """Latency steps of a collective: per step one hop, by the topology's algorithm; over the
        scale-out links (a group that spans nodes or wafers) a ring of the groups' hops."""
        links = self.hw.system.links
        kind, _size, n = op.collective
        if links is None or n <= 1:
            return 0.0
        scaleout = self.hw.system.scaleout
        if scaleout is not None and any(a.level == "scaleout" for a in op.accesses):
            groups = max(2, math.ceil(n / scaleout.chips_per_group.value))
            steps = 1 if kind == "p2p" else (2 * (groups - 1) if kind == "allreduce" else groups - 1)
            inner = 0.0 if kind == "p2p" else links.latency_ns.value * (2 if kind == "allreduce" else 1)
            return scaleout.per_message_overhead_ns.value + steps * scaleout.latency_ns.value + inner
        if links.topology == "mesh":
            steps = 2 if kind == "allreduce" else 1
        elif links.topology == "torus2d":
            side = math.ceil(math.sqrt(n))
            steps = (4 if kind == "allreduce" else 2) * (side - 1)
        else:  # ring, or a switch running ring collectives
            steps = 2 * (n - 1) if kind == "allreduce" else (n - 1)
        if kind == "p2p":
            steps = 1
        return links.per_message_overhead_ns.value + steps * links.latency_ns.value

    def _to_cycles(self, ns: float) -> float:
        return math.ceil(ns * self.clock - 1e-9) / self.clock if ns > 0 else 0.0

    # -- the op ---------------------------------------------------------------------------
    def cost(self, work: Work) -> OpCost:
        """The cost of ``work``; ops that ask the same of the hardware (the same op in every
        layer) share one OpCost."""
        cost = self._memo.get(work)
        if cost is None:
            if len(self._memo) >= MEMO_LIMIT:  # bounded: a long run's memory does not grow with its steps
                self._memo.clear()
            cost = self._memo[work] = self._cost(work)
        return cost

    def cost_once(self, work: Work) -> OpCost:
        """The cost of ``work`` from the memo if it is there, else computed and not kept (for
        works that will not come again, such as one step's attention in a serving replay)."""
        cost = self._memo.get(work)
        return cost if cost is not None else self._cost(work)

    def _cost(self, op: Work) -> OpCost:
        kernels = op.kernels_run or (KernelWork(
            name=op.kind, kclass=DEFAULT_CLASS.get(op.kind, "elementwise"), accesses=op.accesses,
            matrix_flops=op.matrix_flops, matrix_m=op.matrix_m, vector_ops=op.vector_ops,
            dequant_ops=op.dequant_ops, dtype=op.dtype, parallelism=op.parallelism, launches=op.kernels),)
        costs = [self.kernel_cost(op, k, first=i == 0) for i, k in enumerate(kernels)]
        overlap = self.stack.overlap.value if self.stack is not None and self.stack.overlap is not None else 0.0
        startup = sum(c.startup_ns * (1.0 if i == 0 else 1.0 - overlap) for i, c in enumerate(costs))
        body = sum(c.body_ns for c in costs)
        flows = tuple(f for c in costs for f in c.flows)
        rows: dict[str, float] = {}
        for c in costs:
            for row, t in c.rows:
                rows[row] = rows.get(row, 0.0) + t
        fill = op.noc_hops * self.noc_latency + op.pcie_messages * self.pcie_latency
        compute = sum(c.compute_ns for c in costs)
        share = max((c.tiles for c in costs), default=1.0) / self.tiles
        dispatch = sum(c.launches * (self._dispatch(c.kclass) + k.host_ns)
                       for c, k in zip(costs, kernels, strict=True) if k.dispatched)
        cost = OpCost(flows, compute, share, sum(c.matrix_ns for c in costs), sum(c.vector_ns for c in costs),
                      sum(c.dequant_ns for c in costs), fill, 0.0, startup, ideal_body_ns=body,
                      host_ns=(op.host_ns + op.host_launches * self._dispatch("matrix", self.host.launch_ns)
                               + op.host_syncs * self.host.sync_ns),
                      kernels=tuple(costs), rows=tuple(rows.items()), dispatch_ns=dispatch)
        return cost

    def _dispatch(self, kclass: str, default: float | None = None) -> float:
        """Host time to launch one kernel of ``kclass`` eagerly: the stack's measured figure,
        else the profile's launch overhead."""
        if self.stack is not None:
            value = self.stack.dispatch(kclass)
            if value:
                return value
        return self.host.launch_ns if default is None else default

    def kernel_cost(self, op: Work, k: KernelWork, first: bool) -> KernelCost:
        """One kernel alone on the chip: start-up, then the slowest of its loads and its compute."""
        tiles = max(1.0, min(self.tiles, k.parallelism))
        klass = self.classes.get(k.kclass) if self.classes is not None else None
        store_cap = math.inf
        if klass is not None:
            store_cap = klass.stream_fraction.value * self.store_rate
            if klass.parallel == "rows":
                per_cta = klass.cta_bandwidth_GBps.value if klass.cta_bandwidth_GBps else self.cta_bw
                store_cap = min(store_cap, k.parallelism * per_cta)
        flows = [self.flow(op, a, tiles, store_cap) for a in k.accesses]
        matrix = self.matrix_ns(k, tiles)
        vector = self.vector_ns(k.vector_ops, tiles)
        dequant = self.vector_ns(k.dequant_ops, tiles)
        impl = self.stack.attention.get(k.impl) if self.stack is not None and k.impl else None
        if impl is not None and k.quant:
            measured = k.values * impl.ps_per_value(k.quant) / 1e3
            vector += measured - dequant
            dequant = measured
            flows = [dataclasses.replace(f, tile_cap=f.tile_cap * impl.efficiency.value) if f.link == self.store
                     else f for f in flows]
        compute = self._to_cycles(matrix + vector)
        per_link: dict[str, float] = {}
        by_row: dict[str, float] = {}
        together: dict[tuple, list] = {}
        for f in flows:
            t = f.bytes * f.weight / self.capacity[f.link]
            per_link[f.link] = per_link.get(f.link, 0.0) + t
            together.setdefault((f.link, f.weight), []).append(f)
            row = CATEGORY_ROW.get(f.category, f.category)
            by_row[row] = by_row.get(row, 0.0) + max(t, f.bytes / f.rate_limit)
        capped = [sum(f.bytes for f in group) / merged_limit(group) for group in together.values()]
        loads = max([*per_link.values(), *capped], default=0.0)
        body = max(compute, loads)
        if compute >= max(by_row.values(), default=0.0):
            total = matrix + vector
            rows = [("dequant", body * dequant / total)] if total and dequant else []
            rows.append(("compute", body * (1 - (dequant / total if total else 0.0))))
        else:
            total = sum(by_row.values())
            rows = [(row, body * t / total) for row, t in by_row.items()]
        if op.collective is not None:
            startup = self.kernel_gap + self.collective_latency_ns(op)
        elif klass is not None:
            startup = klass.startup_ns.value
        else:  # the byte model: the kernel gap and the first-byte latency of the nearest level
            latency = self._latency
            latencies = [latency[f.link] for f in flows if f.link in latency]
            reads = [latency[f.link] for f in flows if f.link in latency and not f.write]
            startup = self.kernel_gap + (max(reads, default=0.0) if first else min(latencies, default=0.0))
        return KernelCost(k.name, k.kclass, startup * k.launches, body, tuple(flows), compute, tiles, matrix, vector,
                          dequant, k.launches, tuple(rows))


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
        cap = min(min(g[4] for g in group), sum(g[3] for g in group))
        if cost.ideal_body_ns > 0:  # the op's kernels run one after another: alone, it takes their summed body
            cap = min(cap, size / cost.ideal_body_ns)
        out.append((link, weight, cap, size, tuple((g[5], g[1]) for g in group)))
    return tuple(out)
