"""Placement of a lowered step on its tiers and links: where each byte is read from.

The decode lowering writes every weight and KV access against the home tier (the profile's
first memory level). ``place_ops`` then applies the profile's placement (sim.config.hardware
``Placement``) and topology:

* weights, MoE expert weights and the KV cache ``resident`` in a tier are read from it;
* weights ``streamed`` from an off-chip tier are read from an on-chip staging buffer, and a
  ``stage_weights`` op on the stage's ``dma`` stream copies each weight-reading op's weights
  from the tier into that buffer ahead of use. Two buffers: copy ``m`` may start once the
  reader of copy ``m - 2`` is done, and reader ``m`` waits for copy ``m``. A copy therefore
  overlaps the op before its reader, and shares the tier's bandwidth with whatever else reads
  it then (the KV cache, in HBM): that is where the DES and the closed form part;
* an op whose weights (or experts) exceed a quarter of the buffer level's resident bytes (two
  buffers of it would take more than half the SRAM) is not staged whole: they stream through
  the SRAM in chunks as it runs, which costs what reading them from the tier costs, so it reads
  them from the tier directly (``staging_limit``);
* MoE expert weights ``streamed`` cannot be fetched ahead: which experts a layer needs is
  known only once its router has run, so ``stage_experts`` (its own stream) waits for the
  router and the experts op waits for it;
* chip links: the collectives of a tensor-parallel group that spans groups of chips (nodes,
  wafers) and the point-to-point transfers between stages in different groups run over the
  ``scaleout`` links.

Reads and writes of a staging buffer have the category ``staged`` (the breakdown row
``staged_weights``), so a step's weight bytes count each weight once, where it comes from.
The embedding gather reads its rows where the table lives (a gather is not staged). Works
are rewritten through a memo, so ops that shared a ``Work`` still share one.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import NamedTuple

from sim.lowering.graph import Access, KernelWork, Op, Work, read, write
from sim.setup import RunSetup

WEIGHT_CATEGORIES = ("weights", "expert")


class Plan(NamedTuple):
    """Where a step's data goes: per category (weights, expert, kv) the level its ops read
    from, and which categories are staged from which tier into which buffer."""

    store: str
    read_from: tuple[tuple[str, str], ...]  # (category, level the ops read it from)
    staged: tuple[tuple[str, str, str], ...]  # (category, tier it comes from, buffer level)
    limit: int  # the most weight bytes of one op that are staged whole (larger ones stream through)
    scaleout_collectives: tuple[int, ...]  # stages whose tensor-parallel group spans chip groups


def plan_of(setup: RunSetup) -> Plan:
    hw = setup.hardware
    read_from, staged = [], []
    for category, what in (("weights", "weights"), ("expert", "experts"), ("kv", "kv")):
        place = hw.place(what)
        if place.mode == "streamed":
            read_from.append((category, place.buffer))
            staged.append((category, place.tier, place.buffer))
        elif place.tier != setup.store:
            read_from.append((category, place.tier))
    system = hw.system
    spanning = tuple(s for s in range(setup.pp)
                     if system.group_of(s * setup.tp) != system.group_of((s + 1) * setup.tp - 1))
    return Plan(setup.store, tuple(read_from), tuple(staged), staging_limit(setup), spanning)


def staging_limit(setup: RunSetup) -> int:
    """The most bytes of one op that are staged whole: a quarter of the staging buffer level's
    resident bytes (two buffers take at most half of it)."""
    places = [setup.hardware.place(what) for what in ("weights", "experts")]
    buffers = [p.buffer for p in places if p.mode == "streamed"]
    if not buffers:
        return 0
    return int(setup.hardware.level(buffers[0]).resident_bytes // 4)


def place_ops(setup: RunSetup, ops: list[Op]) -> list[Op]:
    """``ops`` with each access moved to the tier or link its data uses and, for streamed
    weights, the staging ops added (indices and dependencies renumbered)."""
    plan = plan_of(setup)
    if not plan.read_from and not plan.staged and not plan.scaleout_collectives:
        return ops
    placed = [_placed_op(op, plan, _through(op, plan)) for op in ops]
    staged = dict((category, (tier, buffer)) for category, tier, buffer in plan.staged)
    if not staged:
        return placed
    return _with_staging(placed, ops, staged, plan.store, plan.limit)


def placed_op(op: Op, plan: Plan) -> Op:
    """``op`` alone with its accesses moved by ``plan`` as ``place_ops`` moves a step's (no
    staging ops added)."""
    return _placed_op(op, plan, _through(op, plan))


def _through(op: Op, plan: Plan) -> tuple[str, ...]:
    """The staged categories whose bytes ``op`` reads are too many to stage whole: they stream
    through from their tier as the op runs."""
    return tuple(category for category, _, _ in plan.staged if _staged_bytes(op, category, plan.store) > plan.limit)


def _placed_op(op: Op, plan: Plan, through: tuple[str, ...] = ()) -> Op:
    scaleout = op.stage in plan.scaleout_collectives and op.work.collective is not None
    work = placed_work(op.work, plan, scaleout, through)
    return op if work is op.work else op.with_work(work, op.tags)


@lru_cache(maxsize=16384)
def placed_work(work: Work, plan: Plan, scaleout: bool = False, through: tuple[str, ...] = ()) -> Work:
    """``work`` with its home-tier accesses moved by ``plan`` (and its link accesses onto the
    scale-out links when ``scaleout``); the categories in ``through`` stream through from their
    tier rather than from a staging buffer."""
    moves = dict(plan.read_from)
    buffered = set()  # categories these accesses read from a staging buffer
    for category, tier, _ in plan.staged:
        if category in through:
            moves[category] = tier
        else:
            buffered.add(category)

    def move(accesses: tuple[Access, ...]) -> tuple[Access, ...]:
        out = []
        for a in accesses:
            if a.level == plan.store and a.category in moves and not (a.category == "weights" and a.granule):
                a = a._replace(level=moves[a.category], category="staged" if a.category in buffered else a.category)
            elif scaleout and a.level == "link":
                a = a._replace(level="scaleout")
            out.append(a)
        return tuple(out)

    accesses = move(work.accesses)
    kernels = tuple(k._replace(accesses=move(k.accesses)) for k in work.kernels_run)
    if accesses == work.accesses and kernels == work.kernels_run:
        return work
    return replace(work, accesses=accesses, kernels_run=kernels)


def _staged_bytes(op: Op, category: str, store: str) -> int:
    """Bytes of ``category`` that ``op`` (as lowered, before placement) reads from the home tier
    and that staging must bring on chip (weights gathered by row stay where they are)."""
    return sum(a.bytes for a in op.work.accesses
               if a.level == store and a.category == category and not a.write
               and not (category == "weights" and a.granule))


def _with_staging(placed: list[Op], lowered: list[Op], staged: dict, store: str, limit: int) -> list[Op]:
    """Insert the staging copies. ``lowered`` (before placement) says which op reads how many
    home-tier weight bytes; ``placed`` is what the ops become.

    Dense weights are staged per op that reads them (a projection, a norm's gains), in program
    order per stage, into two buffers: copy ``m`` waits for the reader of copy ``m - 2`` and the
    reader of copy ``m`` waits for it, so copies run one reader ahead. Copies are placed at the
    start of their stage (the first two) or right after the reader whose buffer they reuse.
    Expert weights are staged per experts op, after that layer's router."""
    readers = _dense_readers(lowered, store, limit) if "weights" in staged else {}
    routers = _routers(lowered) if "expert" in staged else {}
    before, after = _copy_slots(lowered, readers, routers, store, limit)
    order: list[tuple] = []
    for op in lowered:
        order.extend(("copy", slot) for slot in before.get(op.idx, ()))
        order.append(("op", op.idx))
        order.extend(("copy", slot) for slot in after.get(op.idx, ()))
    return _emit(order, placed, lowered, staged, store, readers, routers)


def _dense_readers(lowered: list[Op], store: str, limit: int) -> dict[int, list[int]]:
    """Stage -> the ops reading staged dense weights, in program order."""
    readers: dict[int, list[int]] = {}
    for op in lowered:
        if 0 < _staged_bytes(op, "weights", store) <= limit:
            readers.setdefault(op.stage, []).append(op.idx)
    return readers


def _routers(lowered: list[Op]) -> dict[tuple[int, int], int]:
    """(stage, layer) -> the router op, after which that layer's experts are staged."""
    return {(op.stage, op.layer): op.idx for op in lowered if op.name == "router"}


def _copy_slots(lowered: list[Op], readers: dict[int, list[int]], routers: dict[tuple[int, int], int],
                store: str, limit: int) -> tuple[dict, dict]:
    """Where each copy goes: old op idx -> copies placed before it, and -> copies placed after it.
    A copy is (category, stage, copy number) for dense weights, (category, stage, reader) for experts."""
    first_of_stage: dict[int, int] = {}
    for op in lowered:
        first_of_stage.setdefault(op.stage, op.idx)
    after: dict[int, list[tuple[str, int, int]]] = {}
    before: dict[int, list[tuple[str, int, int]]] = {}
    for stage, ops in readers.items():
        for m in range(len(ops)):
            slot = ("weights", stage, m)
            if m < 2:
                before.setdefault(first_of_stage[stage], []).append(slot)
            else:
                after.setdefault(ops[m - 2], []).append(slot)
    if routers:
        for op in lowered:
            if 0 < _staged_bytes(op, "expert", store) <= limit and (op.stage, op.layer) in routers:
                after.setdefault(routers[(op.stage, op.layer)], []).append(("expert", op.stage, op.idx))
    return before, after


def _emit(order: list[tuple], placed: list[Op], lowered: list[Op], staged: dict, store: str,
          readers: dict[int, list[int]], routers: dict[tuple[int, int], int]) -> list[Op]:
    """The ops and copies in ``order``, renumbered, each waiting for what its buffer needs."""
    copy_of = {reader: (stage, m) for stage, ops in readers.items() for m, reader in enumerate(ops)}
    new_of = {ref: pos for pos, (what, ref) in enumerate(order) if what == "op"}
    copy_pos = {ref: pos for pos, (what, ref) in enumerate(order) if what == "copy"}
    expert_copy = {slot[2]: pos for slot, pos in copy_pos.items() if slot[0] == "expert"}
    expert_readers: dict[int, list[int]] = {}  # stage -> experts ops in order (for their double buffer)
    out: list[Op] = []
    last_on: dict[tuple[int, str], int] = {}
    for pos, (what, ref) in enumerate(order):
        if what == "op":
            op = placed[ref]
            deps = {new_of[d] for d in op.deps}
            if ref in copy_of:
                deps.add(copy_pos[("weights", *copy_of[ref])])
            if ref in expert_copy:
                deps.add(expert_copy[ref])
                expert_readers.setdefault(op.stage, []).append(ref)
            out.append(Op(idx=pos, name=op.name, layer=op.layer, work=op.work, deps=tuple(sorted(deps)),
                          stream=op.stream, stage=op.stage, host_sync=op.host_sync, row=op.row,
                          compute_row=op.compute_row, tags=op.tags))
            continue
        out.append(_staging_copy(pos, ref, staged, store, lowered, readers, routers, new_of, expert_readers, last_on))
    return out


def _staging_copy(pos: int, slot: tuple[str, int, int], staged: dict, store: str, lowered: list[Op],
                  readers: dict[int, list[int]], routers: dict[tuple[int, int], int], new_of: dict[int, int],
                  expert_readers: dict[int, list[int]], last_on: dict[tuple[int, str], int]) -> Op:
    """One staging copy at ``pos``: after the previous copy on its DMA stream and after the
    reader that last used the buffer it fills (``last_on`` is updated)."""
    category, stage, m = slot
    tier, buffer = staged[category]
    stream = "dma" if category == "weights" else "dma_experts"
    lane = (stage, stream)
    deps = {last_on[lane]} if lane in last_on else set()
    if category == "weights":
        reader = readers[stage][m]
        if m >= 2:  # the buffer it fills was last read by the reader two copies before
            deps.add(new_of[readers[stage][m - 2]])
        name = "stage_weights"
    else:
        reader = m
        deps.add(new_of[routers[(stage, lowered[m].layer)]])
        done = expert_readers.get(stage, [])
        if len(done) >= 2:
            deps.add(new_of[done[-2]])
        name = "stage_experts"
    size = _staged_bytes(lowered[reader], category, store)
    last_on[lane] = pos
    return Op(idx=pos, name=name, layer=lowered[reader].layer, work=_copy_work(tier, buffer, size, category),
              deps=tuple(sorted(deps)), stream=stream, stage=stage)


@lru_cache(maxsize=4096)
def _copy_work(tier: str, buffer: str, size: int, category: str) -> Work:
    """A staging copy: ``size`` bytes read from ``tier`` as one stream and written into
    ``buffer``, by one DMA kernel spread over the chip."""
    accesses = (read(tier, size, category, "w"), write(buffer, size, "staged", "fetch"))
    kernel = KernelWork(name="stage_copy", kclass="copy", accesses=accesses, parallelism=1e9)
    return Work(kind="vector", accesses=accesses, parallelism=1e9, kernels=1, kernels_run=(kernel,))
