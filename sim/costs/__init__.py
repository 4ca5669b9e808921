"""Per-op costs on a hardware profile: the one place where an op meets the hardware numbers.

Both the discrete-event engine and the analytic model read an ``OpCost``; the engine
turns its flows into shared-bandwidth transfers, the analytic model adds them up in closed
form. All times in ns, rates in bytes/ns (= GB/s). The ``CostModel`` composes what each
part of the chip contributes, each in its own module:

* memory tiers and HBM striping (``memory``): what an access consumes and how fast it goes;
* links and topology (``links``): collectives' wire bytes and latency steps, NoC and host link;
* compute on the tiles (``compute``): matrix and vector time, rounded to the clock;
* kernel classes (``kernels``): measured start-up and stream rates, the stack's implementations.

``fill`` is paid before the body (first-byte latency of the slowest source, or the latency
steps of a collective, plus the NoC's latency for each hop and the host link's for each
message), ``drain`` after it, and ``gap`` (kernel boundaries) before everything.

Costs are keyed by the op's ``Work`` (sim.lowering.graph), so the op of every layer that
asks the same shares one ``OpCost``, and a kernel's by its ``KernelWork``; the memos belong
to the CostModel instance.
"""

from __future__ import annotations

from sim.config.hardware import HardwareProfile
from sim.costs.compute import Tiles
from sim.costs.kernels import KernelClasses, breakdown
from sim.costs.links import Links
from sim.costs.memory import Memory
from sim.costs.records import CATEGORY_ROW, COMPUTE, Flow, HostTimes, KernelCost, OpCost, loads, merge
from sim.kernel_classes import default_class
from sim.lowering.graph import KernelWork, Work

__all__ = ["CATEGORY_ROW", "COMPUTE", "MEMO_LIMIT", "CostModel", "Flow", "HostTimes", "KernelCost", "OpCost",
           "cost_model", "forget_cost_models", "merge"]

_new = tuple.__new__  # a KernelCost from its fields in order, without the named tuple's keyword handling
MEMO_LIMIT = 8192  # distinct works a CostModel keeps (a step graph has tens; more means works that do not recur)


class CostModel:
    """Costs of ops on one hardware profile under one software stack (None: the byte model's
    kernels, one per op unless the lowering says otherwise)."""

    def __init__(self, hw: HardwareProfile, stack=None):
        self.hw = hw
        self.stack = stack
        self.memory = Memory(hw)
        self.links = Links(hw)
        self.compute = Tiles(hw.compute)
        self.kernels = KernelClasses(hw, stack)
        self.capacity: dict[str, float] = {**self.memory.capacity(), COMPUTE: 1.0, **self.links.capacity()}
        host = hw.host
        self.host = HostTimes(host.launch_overhead_ns.value, host.graph_launch_ns.value,
                              host.sync_round_trip_ns.value)
        self._memo: dict[Work, OpCost] = {}
        self._kernel_memo: dict[tuple[KernelWork, bool], KernelCost] = {}  # (kernel, first of its op) -> cost
        # the profile's and the stack's figures every op reads, read once
        self._tiles = hw.compute.tiles.value
        self._gap_ns = host.kernel_gap_ns.value
        self._overlap = stack.overlap.value if stack is not None and stack.overlap is not None else 0.0
        self._host_launch_ns = self.kernels.dispatch_ns(default_class("matmul"), self.host.launch_ns)

    @property
    def tiles(self) -> int:
        """The chip's compute tiles."""
        return self._tiles

    @property
    def tile_m(self) -> int:
        """The rows the matrix unit pads M to."""
        return self.hw.compute.matrix_tile_m.value

    def flows(self, op: Work, k: KernelWork, tiles: float) -> list[Flow]:
        """Kernel ``k``'s accesses as flows from ``tiles`` tiles: on a link by their wire bytes, on a
        memory level by its efficiency and striping, held together to the tiles' load bandwidth
        and on the backing store to the kernel class's rate, scaled by its implementation."""
        memory, links = self.memory, self.links
        levels, store = memory.levels, memory.store.name
        level_cap, store_cap = memory.tile_caps(tiles, self.kernels.store_cap(k))
        store_cap = self.kernels.scaled(k, store_cap)
        return [links.flow(op, a) if a.level not in levels  # link, scaleout, pcie, noc
                else memory.flow(a, store_cap if a.level == store else level_cap) for a in k.accesses]

    # -- the op ---------------------------------------------------------------------------
    def cost(self, work: Work) -> OpCost:
        """The cost of ``work``; ops that ask the same of the hardware (the same op in every
        layer) share one OpCost."""
        cost = self._memo.get(work)
        if cost is None:
            cost = _keep(self._memo, work, self._cost(work, self.kernel_cost))
        return cost

    def cost_once(self, work: Work) -> OpCost:
        """The cost of ``work`` from the memo if it is there, else computed and not kept, nor
        its kernels' costs (for works that will not come again, such as one step's attention:
        its kernels change with the contexts too)."""
        cost = self._memo.get(work)
        return cost if cost is not None else self._cost(work, self._kernel_cost)

    def _cost(self, op: Work, kernel_cost) -> OpCost:
        """``op``'s cost from its kernels'. ``kernel_cost``: how each kernel of an op of several
        is costed (through the kernels' memo, where another op may share one, or not); the one
        kernel of an op is costed with it, as the op's memo keeps it."""
        kernels = op.kernels_run or (_byte_model_kernel(op),)
        if len(kernels) == 1:  # most ops: their one kernel's figures are the op's
            return self._one_kernel_cost(op, kernels[0])
        costs = [kernel_cost(op, k, i == 0) for i, k in enumerate(kernels)]
        overlap = self._overlap
        # sums over the kernels, each in kernel order (a start-up after the first overlaps the kernel before)
        startup = dispatch = compute = matrix = vector = dequant = body = 0
        flows: tuple = ()
        for i, (c, k) in enumerate(zip(costs, kernels, strict=True)):
            startup += c.startup_ns * (1.0 if i == 0 else 1.0 - overlap)
            if k.dispatched:
                dispatch += c.launches * (self.kernels.dispatch_ns(c.kclass) + k.host_ns)
            flows += c.flows
            compute += c.compute_ns
            matrix += c.matrix_ns
            vector += c.vector_ns
            dequant += c.dequant_ns
            body += c.body_ns
        return OpCost(flows, compute, max(c.tiles for c in costs) / self._tiles, matrix, vector, dequant,
                      self.links.fill_ns(op), 0.0, startup, ideal_body_ns=body,
                      host_ns=op.host_ns + op.host_launches * self._host_launch_ns + op.host_syncs * self.host.sync_ns,
                      kernels=tuple(costs), rows=_summed_rows(costs), dispatch_ns=dispatch)

    def _one_kernel_cost(self, op: Work, k: KernelWork) -> OpCost:
        """``_cost`` of an op run as one kernel: the sums over its kernels are that kernel's figures."""
        c = self._kernel_cost(op, k, True)
        dispatch = c.launches * (self.kernels.dispatch_ns(c.kclass) + k.host_ns) if k.dispatched else 0
        return OpCost(c.flows, c.compute_ns, c.tiles / self._tiles, c.matrix_ns, c.vector_ns, c.dequant_ns,
                      self.links.fill_ns(op), 0.0, c.startup_ns, ideal_body_ns=c.body_ns,
                      host_ns=op.host_ns + op.host_launches * self._host_launch_ns + op.host_syncs * self.host.sync_ns,
                      kernels=(c,), rows=c.rows, dispatch_ns=dispatch)

    def kernel_cost(self, op: Work, k: KernelWork, first: bool) -> KernelCost:
        """One kernel alone on the chip: start-up, then the slowest of its loads and its compute.
        Kernels of ops of several kernels that are no collective (whose cost depends on nothing
        else of the op) share one KernelCost where another op runs the same kernel."""
        if op.collective is not None:
            return self._kernel_cost(op, k, first)
        cost = self._kernel_memo.get((k, first))
        if cost is None:
            cost = _keep(self._kernel_memo, (k, first), self._kernel_cost(op, k, first))
        return cost

    def _kernel_cost(self, op: Work, k: KernelWork, first: bool) -> KernelCost:
        chip = self.compute
        tiles = chip.tiles_for(k)
        matrix = chip.matrix_ns(k, tiles)
        dequant = chip.vector_ns(k.dequant_ops, tiles)
        vector, dequant = self.kernels.implemented(k, chip.vector_ns(k.vector_ops, tiles), dequant)
        flows = self.flows(op, k, tiles)
        compute = chip.to_cycles(matrix + vector)
        loaded, by_row = loads(flows, self.capacity)
        body = max(compute, loaded)
        rows = breakdown(by_row, body, compute, matrix, vector, dequant)
        return _new(KernelCost, (k.name, k.kclass, self._startup_ns(op, k, flows, first) * k.launches, body,  # in order
                                 tuple(flows), compute, tiles, matrix, vector, dequant, k.launches, tuple(rows)))

    def _startup_ns(self, op: Work, k: KernelWork, flows, first: bool) -> float:
        """One launch's start-up: a collective's latency steps, else the measured class's
        start-up, else (the byte model) the kernel gap and the first-byte latency."""
        gap = self._gap_ns
        if op.collective is not None:
            return gap + self.links.collective_latency_ns(op)
        measured = self.kernels.startup_ns(k)
        if measured is not None:
            return measured
        return gap + self.memory.first_byte_ns(flows, first)


_SHARED: dict[tuple[int, int], CostModel] = {}  # (id of a profile, id of a stack) -> its cost model
SHARED_LIMIT = 16  # machines whose cost models a process keeps


def cost_model(hw: HardwareProfile, stack=None) -> CostModel:
    """The CostModel of ``hw`` under ``stack``, shared by the runs of one process on the same
    profile and stack objects (a file's profile is loaded once per version, so the runs of a
    sweep over batch or context on one machine share one, with its memos): a cost is a pure
    function of the work, the profile and the stack. Bounded; an entry keeps its profile and
    stack alive, so their ids are not reused while it is kept."""
    key = (id(hw), id(stack))
    model = _SHARED.get(key)
    if model is None or model.hw is not hw or model.stack is not stack:
        if len(_SHARED) >= SHARED_LIMIT:
            _SHARED.clear()
        model = _SHARED[key] = CostModel(hw, stack)
    return model


def forget_cost_models() -> None:
    """Drop the shared cost models and their memos (a benchmark timing what a run in a new
    process pays)."""
    _SHARED.clear()


def _keep(memo: dict, key, value):
    """``value``, kept in ``memo`` under ``key``; bounded: a long run's memory does not grow with its steps."""
    if len(memo) >= MEMO_LIMIT:
        memo.clear()
    memo[key] = value
    return value


def _summed_rows(costs) -> tuple[tuple[str, float], ...]:
    """The breakdown rows of an op's kernels, summed by row in the order they first appear."""
    rows: dict[str, float] = {}
    for c in costs:
        for row, t in c.rows:
            rows[row] = rows.get(row, 0.0) + t
    return tuple(rows.items())


def _byte_model_kernel(op: Work) -> KernelWork:
    """An op the stack does not expand: one kernel of its default class that does all its work."""
    return KernelWork(name=op.kind, kclass=default_class(op.kind), accesses=op.accesses,
                      matrix_flops=op.matrix_flops, matrix_m=op.matrix_m, vector_ops=op.vector_ops,
                      dequant_ops=op.dequant_ops, dtype=op.dtype, parallelism=op.parallelism, launches=op.kernels)
