"""The Mixture-of-Experts FFN block: router, dispatch, experts, combine, per dispatch path.

Per MoE layer and per step (``position``) it reads the run's MoE plan (sim.moe.plan: the
routing trace and the placement for the critical chip) from the sealed RunSetup and lowers
one op sequence. Dense layers (``moe.first_k_dense`` / ``dense_layers``)
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
With ``placement: spread`` (expert parallelism over the tp chips, times ``attention_dp``
groups: sim.moe.plan.ep_degree) whole experts live on one chip each: the tokens a chip owns
(its group's batch / tp) go out in an all-to-all before the experts and come back in a
second one after. The engine simulates one representative chip: under the DES the hottest EP
rank (the step waits for it: its expert op, and all-to-alls that move the larger of the rows it
sends and the rows it receives), under the analytic model the balanced rank (each rank's
counts summed, over ep, rounded up), the contention-free bound, so DES - analytic is the
straggler (sim.costs.straggler). Ranks that span groups of chips (nodes) send the rows for
their own group over the chip links and the rest over the scale-out links
(``all_to_all_links``). The dense lowering's all-reduce after the FFN stays: it restores the
replicated activations that tensor-parallel attention needs (an all-gather would do, so links
are slightly overstated under EP).

Under expert parallelism with ``sram_zero_copy``, rows received for resident experts go
from the link to the experts' tiles over the on-chip network.

How the routed experts execute is the software stack's ``moe`` (sim.config.software): a loop of
kernels per touched expert, a Triton fused MoE (``grouped``), PyTorch's grouped GEMM with
device-side offsets (``grouped_mm``), or every expert densely (``dense_all``); each names its
kernels in ``experts@<moe>`` (and ``dispatch@<moe>``). Only ``dense_all`` changes what the op
reads (every expert's weights, every token); the others read the touched experts once.

Events: a constant number of ops per MoE layer (4, +1 host_sync, +2 with EP, +1 with shared
experts) whatever the batch, the expert count or the routing: one grouped expert op per
layer (its ``kernels`` is the number of launches it costs).

The routing read back to the host pays the host link's latency (``pcie_messages``) and the
zero-copy hand-off the on-chip network's latency (``noc_hops``); costs.py turns both into
time. Host figures below are estimates (no measurement in this repository yet).
"""

from __future__ import annotations

import math

from sim.config.defaults import DISPATCHES as DISPATCH_PATHS
from sim.lowering.graph import Builder, Work, read, write
from sim.lowering.ops import VEC_OPS, builder
from sim.lowering.placement import placed_op, plan_of
from sim.moe.plan import MoECounts
from sim.moe.sizes import expert_bytes, expert_ffn_per_chip, experts_per_chip
from sim.setup import ACT_BYTES, RunSetup

DISPATCHES = DISPATCH_PATHS  # declared once in sim.config.defaults

# Host work to read back the routing and bucket tokens by expert (sort, bincount, index
# lists) before launching the experts. estimate: a few microseconds of framework code on
# the host (the same order as one eager launch, sources.md 8), not measured here.
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


def router_bytes(setup: RunSetup) -> int:
    return setup.weights.weight_bytes(setup.model.moe.experts, setup.model.hidden)


def shared_ffn(setup: RunSetup) -> int:
    moe = setup.model.moe
    return math.ceil(moe.shared_experts * moe.shared_ffn / setup.tp)


def moe_weight_bytes_per_chip(setup: RunSetup) -> int:
    """Weights of one MoE layer on one chip: router, its experts (or shards), shared experts."""
    m, w, ep = setup.model, setup.weights, setup.moe.ep
    total = router_bytes(setup) + experts_per_chip(m, ep, setup.moe.redundant) * expert_bytes(m, w, setup.tp, ep)
    shared = shared_ffn(setup)
    if shared:
        total += w.weight_bytes((m.ffn_matrices - 1) * shared, m.hidden) + w.weight_bytes(m.hidden, shared)
    return total


def rank_counts(setup: RunSetup, counts) -> tuple[int, int, int, int, int]:
    """(active, resident, fetched, pairs, resident_pairs) of the EP rank a step is timed on: the
    DES times the hottest rank (the step waits for it), the analytic model the balanced rank (even
    load: the contention-free bound, so that the difference is the straggler). A live routing's
    counts (sim.moe.live) give the five of one rank alone."""
    if not isinstance(counts, MoECounts):
        return counts
    balanced = setup.moe.ep > 1 and setup.spec.engine == "analytic"
    return counts.balanced() if balanced else counts.hottest()


def lower_moe(setup: RunSetup, b: Builder, layer: int, batch: int, position: int, counts: tuple | None = None) -> None:
    """The MoE FFN of ``layer`` at step ``position``: shared expert, router, dispatch,
    experts, combine (and the all-to-alls under expert parallelism). ``counts``: the layer's
    expert loads as ``plan.counts`` gives them, when the caller has them from elsewhere (a
    serving replay's live routing); by default the plan's at ``position``."""
    plan = setup.moe
    active, resident, fetched, pairs, rpairs = rank_counts(setup, plan.counts(position, layer) if counts is None else counts)
    received = pairs  # the token rows this rank's experts get (routed pairs, whatever the execution)
    if setup.stack.moe == "dense_all":  # every expert runs densely; routing only weights the outputs
        active, resident, fetched = setup.model.moe.experts, 0, 0
        pairs, rpairs = batch * setup.model.moe.experts, 0
    m, moe = setup.model, setup.model.moe
    h, k = m.hidden, moe.top_k
    store, act = setup.store, setup.act_level
    zero_copy = plan.dispatch == "sram_zero_copy"
    noc_pairs = rpairs if zero_copy else 0  # pairs whose activations never touch the store
    store_pairs = pairs - noc_pairs
    row = h * ACT_BYTES
    ep = plan.ep

    _shared_expert(setup, b, layer, batch)
    # router: scores for every expert, top-k, and (on device) the dispatch indices
    router = setup.weights.weight_read(moe.experts, h)
    b.add("router", layer, "matmul", [
        read(store, router.stream_bytes, "weights", "w"),
        read(act, batch * row, "act", "x"),
        write(act, batch * k * ROUTING_BYTES_PER_PAIR, "act", "idx"),
    ], matrix_flops=2 * batch * h * moe.experts, matrix_m=batch,
        vector_ops=batch * moe.experts * ROUTER_VEC_OPS + router.dequant_ops
        + (0 if plan.dispatch == "host_sync" else batch * k * INDEX_OPS),
        dequant_ops=router.dequant_ops, dtype=setup.weights.matmul_dtype,
        parallelism=_work_units(moe.experts, h), row="router")
    if plan.dispatch == "host_sync":
        host = setup.stack.moe_host
        b.add("routing_to_host", layer, "host", [read("pcie", batch * k * ROUTING_BYTES_PER_PAIR, "pcie", "pcie")],
              host_sync=True, host_ns=host.grouping_ns.value if host else HOST_DISPATCH_NS,
              host_syncs=host.syncs_per_expert * active if host else 0,
              host_launches=active if plan.graph_mode else 0,
              pcie_messages=1, row="dispatch")
    # dispatch: scatter each token's row to its experts' input buffers
    local = math.ceil(batch / setup.tp) if ep > 1 else batch  # tokens this chip dispatches (of its group's)
    noc_rows = noc_pairs if ep == 1 else 0
    b.add("dispatch", layer, "vector", [
        read(act, local * row, "act", "x"),
        read(act, batch * k * ROUTING_BYTES_PER_PAIR, "act", "idx"),
        write(store, (store_pairs if ep == 1 else local * k) * row, "act", "y"),
        read("noc", noc_rows * row, "act", "noc"),
    ], vector_ops=local * k * h + (batch * k * INDEX_OPS if plan.dispatch == "host_sync" else 0),
        parallelism=max(1, local * k), noc_hops=1 if noc_rows else 0, row="dispatch")
    # a rank sends its tokens' k rows and receives the rows of its experts' pairs: the larger
    # of the two crosses its links (the hottest rank receives more than it sends)
    a2a_size = max(local * k, received) * row
    links, collective = all_to_all_links(setup, a2a_size, ep)
    if ep > 1:
        # the rows this chip receives land in its experts' input buffers (the store), or,
        # with zero-copy, in the tiles of its resident experts
        b.add("dispatch_all_to_all", layer, "collective", [
            *links,
            write(store, store_pairs * row, "act", "y"),
            read("noc", noc_pairs * row, "act", "noc"),
        ], collective=collective, parallelism=ep, noc_hops=1 if noc_pairs else 0)
    _experts(setup, b, layer, active, resident, fetched, pairs, noc_pairs)
    if ep > 1:
        b.add("combine_all_to_all", layer, "collective", [
            *links,
            write(store, local * k * row, "act", "y"),  # each token's k outputs, for the combine
        ], collective=collective, parallelism=ep)
    # combine: gate-weighted sum of each token's k expert outputs, plus the residual
    combine_store = store_pairs if ep == 1 else local * k
    combine_act = noc_pairs if ep == 1 else 0
    b.add("combine", layer, "vector", [
        read(store, combine_store * row, "act", "x"),
        read(act, combine_act * row, "act", "x"),
        read(act, local * row, "act", "res"),
        read(act, local * k * ROUTING_BYTES_PER_PAIR, "act", "idx"),
        write(act, local * row, "act", "y"),
    ], vector_ops=2 * local * k * h + local * h, parallelism=max(1, local), row="combine")


def all_to_all_links(setup: RunSetup, size: int, ep: int) -> tuple[list, tuple]:
    """The link accesses and the collective of an all-to-all of ``size`` bytes per rank over the
    ``ep`` EP ranks. Inside one group of chips (a node) it is one ``alltoall`` over the chip
    links. Where the ranks span groups (``system.scaleout``, ``chips_per_group`` g a group), a
    rank's rows for the g - 1 peers of its own group cross the chip links (NVLink) and those for
    the ep - g ranks of other groups the scale-out links (RDMA), both at once:
    ``alltoall_by_link``, whose accesses carry their wire bytes per link."""
    scaleout = setup.hardware.system.scaleout
    group = scaleout.chips_per_group.value if scaleout is not None else ep
    if ep <= group:
        return [read("link", size, "link", "link")], ("alltoall", size, ep)
    inside, outside = math.ceil((group - 1) * size / ep), math.ceil((ep - group) * size / ep)
    return ([read("link", inside, "link", "link"), read("scaleout", outside, "link", "link")],
            ("alltoall_by_link", size, ep))


def _experts(setup: RunSetup, b: Builder, layer: int, active: int, resident: int, fetched: int, pairs: int,
             noc_pairs: int) -> None:
    if pairs == 0:
        return
    plan, m, w = setup.moe, setup.model, setup.weights
    h = m.hidden
    store, act = setup.store, setup.act_level
    sram = plan.sram_level or store
    ffn = expert_ffn_per_chip(m, setup.tp, plan.ep)
    up_rows = (m.ffn_matrices - 1) * ffn
    up, down = w.weight_read(up_rows, h), w.weight_read(h, ffn)
    per_expert = up.total_bytes + down.total_bytes
    row = h * ACT_BYTES
    store_pairs = pairs - noc_pairs
    accesses = [
        read(store, (active - resident) * per_expert, "expert", "w"),
        read(sram, resident * per_expert, "expert", "w"),
        write(sram, fetched * per_expert, "expert", "fetch"),
        read(store, store_pairs * row, "act", "x"),
        read(act, pairs * (up_rows + ffn) * ACT_BYTES, "act", "res"),  # the up/gate outputs, read back
        write(act, pairs * (up_rows + ffn) * ACT_BYTES, "act", "cache"),  # written once
        write(store, store_pairs * row, "act", "y"),
        read("noc", noc_pairs * row, "act", "noc"),
    ]
    b.add("experts", layer, "matmul", accesses,
          matrix_flops=2 * pairs * h * (up_rows + ffn), matrix_m=max(1, round(pairs / max(1, active))),
          vector_ops=pairs * ffn * VEC_OPS["silu_mul"] + active * (up.dequant_ops + down.dequant_ops),
          dequant_ops=active * (up.dequant_ops + down.dequant_ops), dtype=w.matmul_dtype,
          parallelism=active * _work_units(up_rows + ffn, h),
          noc_hops=1 if noc_pairs else 0, active=active,
          compute_row="expert_compute", tags=(("active_experts", active), ("resident_experts", resident)))


def expert_work(setup: RunSetup, layer: int, counts: tuple[int, int, int, int, int]) -> Work | None:
    """The ``experts`` op's Work of ``layer`` for one rank's (active, resident, fetched, pairs,
    resident_pairs), placed on the tiers as a step's are: what the hottest and the balanced
    rank's expert op cost is compared on (sim.costs.straggler). None where no expert runs, or
    every expert runs densely (``dense_all``: every rank the same)."""
    if setup.stack.moe == "dense_all" or counts[3] == 0:
        return None
    active, resident, fetched, pairs, rpairs = counts
    b = builder(setup)
    _experts(setup, b, layer, active, resident, fetched, pairs,
             rpairs if setup.moe.dispatch == "sram_zero_copy" else 0)
    return placed_op(b.ops[-1], plan_of(setup)).work


def _shared_expert(setup: RunSetup, b: Builder, layer: int, batch: int) -> None:
    ffn = shared_ffn(setup)
    if not ffn:
        return
    m, w = setup.model, setup.weights
    h = m.hidden
    up_rows = (m.ffn_matrices - 1) * ffn
    up, down = w.weight_read(up_rows, h), w.weight_read(h, ffn)
    b.add("shared_expert", layer, "matmul", [
        read(setup.store, up.stream_bytes + down.stream_bytes, "weights", "w"),
        read(setup.act_level, batch * h * ACT_BYTES, "act", "x"),
        read(setup.act_level, 2 * batch * (up_rows + ffn) * ACT_BYTES, "act", "res"),
        write(setup.act_level, batch * (up_rows + ffn) * ACT_BYTES, "act", "cache"),
        write(setup.act_level, batch * h * ACT_BYTES, "act", "y"),
    ], matrix_flops=2 * batch * h * (up_rows + ffn), matrix_m=batch,
        vector_ops=batch * ffn * VEC_OPS["silu_mul"] + up.dequant_ops + down.dequant_ops,
        dequant_ops=up.dequant_ops + down.dequant_ops, dtype=w.matmul_dtype,
        parallelism=_work_units(up_rows + ffn, h), compute_row="expert_compute")
