"""The Mixture-of-Experts FFN block: router, dispatch, experts, combine, per dispatch path.

A strategy for ``Plan.ffn`` (the ``FFNBlock`` protocol of sim.lowering.decode). Per MoE
layer and per step it reads the routing trace and the placement (sim.moe) for the critical
chip and lowers one op sequence. Dense layers (``moe.first_k_dense`` / ``dense_layers``)
use ``DenseFFN``.

Dispatch paths (``dispatch``):

* ``host_sync``: router on the device; its top-k ids and gates cross PCIe to the host
  (``host_sync``: the host waits, pays the sync round trip, builds the dispatch and launches
  one kernel per active expert, each at the launch overhead, since the shapes depend on
  the routing); tokens are scattered into per-expert buffers in the backing store (HBM),
  the experts read them from there and write their outputs back; the combine reads them.
* ``device``: router and dispatch on the device (one grouped-GEMM kernel for all experts,
  no host sync); activations still go through the backing store.
* ``sram_zero_copy``: on-chip router; the activations of tokens routed to SRAM-resident
  experts stream tile to tile over the on-chip network (``noc``), and their outputs come
  back the same way: no HBM round trip. Pairs routed to non-resident experts fall back to
  the device path (their activations through the store, their weights from the store).
  With nothing resident the ops are exactly the device path's.

Expert weights: resident experts are read from the SRAM level that holds them, the rest
from the backing store (category ``expert``); cache policies (lru, lfu) also write each
missed expert into SRAM. Without expert parallelism every chip holds a 1/tp shard of every
expert (tensor parallel, like the dense FFN) and the existing all-reduce combines them.
With ``placement: spread`` (expert parallelism over the tp chips) whole experts live on
one chip each: the tokens a chip owns (batch / tp) go out in an all-to-all before the
experts and come back in a second one after; the engine simulates one representative chip,
so the expert op is that of the most loaded chip (the step waits for it). The dense
lowering's all-reduce after the FFN stays: it restores the replicated activations that
tensor-parallel attention needs (an all-gather would do, so links are slightly
overstated under EP).

Under expert parallelism with ``sram_zero_copy``, rows received for resident experts go
from the link to the experts' tiles over the on-chip network.

Events: a constant number of ops per MoE layer (4, +1 host_sync, +2 with EP, +1 with shared
experts) whatever the batch, the expert count or the routing: one grouped expert op per
layer (its ``kernels`` is the number of launches it costs).

Host figures below are estimates (no measurement in this repository yet).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sim.errors import SimulationError
from sim.lowering.decode import ACT_BYTES, VEC_OPS, DenseFFN, Plan
from sim.lowering.graph import Access, Builder
from sim.moe.placement import Placement
from sim.moe.routing import RoutingTrace
from sim.units import MB

DISPATCHES = ("host_sync", "device", "sram_zero_copy")

# Host work to read back the routing and bucket tokens by expert (sort, bincount, index
# lists) before launching the experts. estimate: a few microseconds of framework code on
# the host (the same order as one eager launch, hardware_facts.md 8), not measured here.
HOST_DISPATCH_NS = 3000.0
ROUTING_BYTES_PER_PAIR = 8  # an int32 expert id and an fp32 gate per (token, expert)
ROUTER_VEC_OPS = 5 + 3  # per (token, expert) score: softmax or sigmoid (5) + top-k compare/select (3)
INDEX_OPS = 4  # per (token, expert) pair: histogram, prefix sum, scatter index, gate
# Work unit of the MoE matmuls (router, experts, shared expert): a 64 x 1024 block of weights,
# so that a skinny decode GEMV (an expert shard with few output columns) can still be split
# over the reduction dimension and spread over the tiles (split-K). estimate.
WEIGHT_TILE_ELEMS = 64 * 1024


def _work_units(rows: int, cols: int) -> int:
    return max(1, math.ceil(rows * cols / WEIGHT_TILE_ELEMS))


@dataclass
class MoEFFN:
    """The MoE FFN of one run. ``trace`` and ``placement`` are indexed by the MoE layer
    (0 .. number of MoE layers - 1) and by the step's position in the run."""

    dispatch: str
    trace: RoutingTrace
    placement: Placement
    ep: int  # chips the experts are spread over (1: every chip holds a shard of each)
    sram_level: str | None  # where resident experts live
    graph_mode: bool = True
    moe_index: dict[int, int] = field(default_factory=dict)
    dense: DenseFFN = field(default_factory=DenseFFN)

    # -- sizes ----------------------------------------------------------------------------
    @staticmethod
    def expert_ffn_per_chip(plan: Plan, ep: int) -> int:
        ffn = plan.model.moe.expert_ffn
        return ffn if ep > 1 else math.ceil(ffn / plan.tp)

    @staticmethod
    def expert_bytes(plan: Plan, ep: int) -> int:
        """Weight bytes of one expert (or one chip's shard of it)."""
        m, w = plan.model, plan.weights
        ffn = MoEFFN.expert_ffn_per_chip(plan, ep)
        return w.weight_bytes((m.ffn_matrices - 1) * ffn, m.hidden) + w.weight_bytes(m.hidden, ffn)

    @staticmethod
    def experts_per_chip(plan: Plan, ep: int) -> int:
        return math.ceil(plan.model.moe.experts / ep)

    def router_bytes(self, plan: Plan) -> int:
        return plan.weights.weight_bytes(plan.model.moe.experts, plan.model.hidden)

    def shared_ffn(self, plan: Plan) -> int:
        moe = plan.model.moe
        return math.ceil(moe.shared_experts * moe.shared_ffn / plan.tp)

    def weight_bytes_per_chip(self, plan: Plan, layer: int) -> int:
        if layer not in self.moe_index:
            return self.dense.weight_bytes_per_chip(plan, layer)
        m, w = plan.model, plan.weights
        total = self.router_bytes(plan) + self.experts_per_chip(plan, self.ep) * self.expert_bytes(plan, self.ep)
        shared = self.shared_ffn(plan)
        if shared:
            total += w.weight_bytes((m.ffn_matrices - 1) * shared, m.hidden) + w.weight_bytes(m.hidden, shared)
        return total

    # -- lowering -------------------------------------------------------------------------
    def lower(self, plan: Plan, b: Builder, layer: int, batch: int) -> None:
        start = len(b.ops)
        self._lower(plan, b, layer, batch)
        # Every layer of an MoE model routes differently, so its ops carry their layer: the
        # dense lowering copies layers 2.. from layer 1 when layers 0 and 1 lower to the same
        # ops, which two dense leading layers (DeepSeek) or two equal routing counts would
        # otherwise trigger.
        for op in b.ops[start:]:
            op.tags = {**op.tags, "ffn_layer": layer}

    def _lower(self, plan: Plan, b: Builder, layer: int, batch: int) -> None:
        if layer not in self.moe_index:
            self.dense.lower(plan, b, layer, batch)
            return
        i = self.moe_index[layer]
        s = plan.extra.get("moe_step", 0)
        pl = self.placement
        if s >= pl.active.shape[0]:
            raise SimulationError(f"the MoE placement covers {pl.active.shape[0]} steps; step {s} asked for")
        active, resident = int(pl.active[s, i]), int(pl.resident[s, i])
        fetched, pairs, rpairs = int(pl.fetched[s, i]), int(pl.pairs[s, i]), int(pl.resident_pairs[s, i])
        m, moe = plan.model, plan.model.moe
        h, k = m.hidden, moe.top_k
        store, act, sram = plan.store, plan.act_level, self.sram_level or plan.store
        zero_copy = self.dispatch == "sram_zero_copy"
        noc_pairs = rpairs if zero_copy else 0  # pairs whose activations never touch the store
        store_pairs = pairs - noc_pairs
        row = h * ACT_BYTES

        self._shared_expert(plan, b, layer, batch)
        # router: scores for every expert, top-k, and (on device) the dispatch indices
        router = plan.weights.weight_read(moe.experts, h)
        b.add("router", layer, "matmul", [
            Access(store, router.stream_bytes, "weights"),
            Access(act, batch * row, "act"),
            Access(act, batch * k * ROUTING_BYTES_PER_PAIR, "act", write=True),
        ], matrix_flops=2 * batch * h * moe.experts, matrix_m=batch,
            vector_ops=batch * moe.experts * ROUTER_VEC_OPS + router.dequant_ops
            + (0 if self.dispatch == "host_sync" else batch * k * INDEX_OPS),
            dequant_ops=router.dequant_ops, dtype=plan.weights.matmul_dtype,
            parallelism=_work_units(moe.experts, h), kernels=1, tags={"phase": "router"})
        if self.dispatch == "host_sync":
            launches = active if self.graph_mode else 0  # eager mode charges them at issue
            b.add("routing_to_host", layer, "host", [Access("pcie", batch * k * ROUTING_BYTES_PER_PAIR, "pcie")],
                  host_sync=True, host_ns=HOST_DISPATCH_NS + launches * plan.hardware.host.launch_overhead_ns.value,
                  kernels=1, tags={"phase": "dispatch"})
        # dispatch: scatter each token's row to its experts' input buffers
        local = math.ceil(batch / self.ep) if self.ep > 1 else batch  # tokens this chip dispatches
        b.add("dispatch", layer, "vector", [
            Access(act, local * row + batch * k * ROUTING_BYTES_PER_PAIR, "act"),
            Access(store, (store_pairs if self.ep == 1 else local * k) * row, "act", write=True),
            Access("noc", (noc_pairs if self.ep == 1 else 0) * row, "act"),
        ], vector_ops=local * k * h + (batch * k * INDEX_OPS if self.dispatch == "host_sync" else 0),
            parallelism=max(1, local * k), kernels=1, tags={"phase": "dispatch"})
        a2a_size = local * k * row
        if self.ep > 1:
            # the rows this chip receives land in its experts' input buffers (the store), or,
            # with zero-copy, in the tiles of its resident experts
            b.add("dispatch_all_to_all", layer, "collective", [
                Access("link", a2a_size, "link"),
                Access(store, store_pairs * row, "act", write=True),
                Access("noc", noc_pairs * row, "act"),
            ], collective=("alltoall", a2a_size, self.ep), parallelism=self.ep, kernels=1)
        self._experts(plan, b, layer, active, resident, fetched, pairs, noc_pairs, store, act, sram)
        if self.ep > 1:
            b.add("combine_all_to_all", layer, "collective", [
                Access("link", a2a_size, "link"),
                Access(store, local * k * row, "act", write=True),  # each token's k outputs, for the combine
            ], collective=("alltoall", a2a_size, self.ep), parallelism=self.ep, kernels=1)
        # combine: gate-weighted sum of each token's k expert outputs, plus the residual
        combine_store = store_pairs if self.ep == 1 else local * k
        combine_act = noc_pairs if self.ep == 1 else 0
        b.add("combine", layer, "vector", [
            Access(store, combine_store * row, "act"),
            Access(act, (combine_act + local) * row + local * k * ROUTING_BYTES_PER_PAIR, "act"),
            Access(act, local * row, "act", write=True),
        ], vector_ops=2 * local * k * h + local * h, parallelism=max(1, local), kernels=1,
            tags={"phase": "combine"})

    def _experts(self, plan, b, layer, active, resident, fetched, pairs, noc_pairs, store, act, sram):
        m = plan.model
        h = m.hidden
        ffn = self.expert_ffn_per_chip(plan, self.ep)
        up_rows = (m.ffn_matrices - 1) * ffn
        w = plan.weights
        up, down = w.weight_read(up_rows, h), w.weight_read(h, ffn)
        per_expert = up.total_bytes + down.total_bytes
        row = h * ACT_BYTES
        if pairs == 0:
            return
        store_pairs = pairs - noc_pairs
        accesses = [
            Access(store, (active - resident) * per_expert, "expert"),
            Access(sram, resident * per_expert, "expert"),
            Access(sram, fetched * per_expert, "expert", write=True),
            Access(store, store_pairs * row, "act"),
            Access(act, pairs * (up_rows + ffn) * ACT_BYTES, "act"),
            Access(act, pairs * (up_rows + ffn) * ACT_BYTES, "act", write=True),
            Access(store, store_pairs * row, "act", write=True),
            Access("noc", noc_pairs * row, "act"),
        ]
        b.add("experts", layer, "matmul", accesses,
              matrix_flops=2 * pairs * h * (up_rows + ffn), matrix_m=max(1, round(pairs / max(1, active))),
              vector_ops=pairs * ffn * VEC_OPS["silu_mul"] + active * (up.dequant_ops + down.dequant_ops),
              dequant_ops=active * (up.dequant_ops + down.dequant_ops), dtype=w.matmul_dtype,
              parallelism=active * _work_units(up_rows + ffn, h),
              kernels=active if self.dispatch == "host_sync" else 1,
              tags={"compute_row": "expert_compute", "active_experts": active, "resident_experts": resident})

    def _shared_expert(self, plan: Plan, b: Builder, layer: int, batch: int) -> None:
        ffn = self.shared_ffn(plan)
        if not ffn:
            return
        m, w = plan.model, plan.weights
        h = m.hidden
        up_rows = (m.ffn_matrices - 1) * ffn
        up, down = w.weight_read(up_rows, h), w.weight_read(h, ffn)
        b.add("shared_expert", layer, "matmul", [
            Access(plan.store, up.stream_bytes + down.stream_bytes, "weights"),
            Access(plan.act_level, batch * h * ACT_BYTES + 2 * batch * (up_rows + ffn) * ACT_BYTES, "act"),
            Access(plan.act_level, batch * h * ACT_BYTES + batch * (up_rows + ffn) * ACT_BYTES, "act", write=True),
        ], matrix_flops=2 * batch * h * (up_rows + ffn), matrix_m=batch,
            vector_ops=batch * ffn * VEC_OPS["silu_mul"] + up.dequant_ops + down.dequant_ops,
            dequant_ops=up.dequant_ops + down.dequant_ops, dtype=w.matmul_dtype,
            parallelism=_work_units(up_rows + ffn, h), kernels=1, tags={"compute_row": "expert_compute"})


# -- building the block for a run ----------------------------------------------------------


def sram_budget(plan: Plan) -> tuple[str | None, float]:
    """(level, bytes) where experts can be pinned on one chip. On an SRAM-store chip the
    store itself (every expert on the chip is resident: the capacity check of the run covers
    it); otherwise the on-chip level with the most software-pinnable bytes
    (capacity x count x resident_fraction)."""
    hw = plan.hardware
    if hw.store.kind == "sram":
        return hw.store.name, math.inf
    levels = [level for level in hw.on_chip if level.resident_bytes > 0]
    if not levels:
        return None, 0.0
    best = max(levels, key=lambda level: level.resident_bytes)
    return best.name, best.resident_bytes


def build(plan: Plan, *, dispatch: str, placement_policy: str, trace: RoutingTrace, batches: list[int],
          graph_mode: bool, sram_experts: int | None = None) -> MoEFFN:
    """The MoE block of a run: sizes the SRAM slots, checks a requested pin count against
    the SRAM that exists, and runs the placement over the run's steps."""
    from sim.moe.placement import place

    moe = plan.model.moe
    ep = plan.tp if placement_policy == "spread" and plan.tp > 1 else 1
    level, budget = sram_budget(plan)
    unit = MoEFFN.expert_bytes(plan, ep)
    on_chip = MoEFFN.experts_per_chip(plan, ep) * trace.layers
    if sram_experts is not None:
        if placement_policy == "all-hbm" and sram_experts:
            raise SimulationError("placement all-hbm pins no experts; drop sram_experts or pick another policy")
        need = sram_experts * unit
        if need > budget:
            where = f"{level} holds {budget / MB:.1f} MB for resident data" if level else "no on-chip SRAM can hold resident data"
            raise SimulationError(f"placement {placement_policy} asks for {sram_experts} experts x "
                                  f"{unit / MB:.1f} MB = {need / MB:.1f} MB of SRAM per chip; {where}")
        slots = sram_experts
    else:
        slots = on_chip if math.isinf(budget) else int(budget // unit) if unit else 0
    slots = min(slots, on_chip)
    pl = place(trace, placement_policy, slots, batches, chips=ep)
    layers = [layer for layer in range(plan.model.layers) if not moe.is_dense(layer)]
    return MoEFFN(dispatch, trace, pl, ep, level if slots else None, graph_mode,
                  {layer: i for i, layer in enumerate(layers)})
