"""Graph reuse between consecutive steps, owned by the runner.

Only attention depends on the sequences' contexts, and only the MoE blocks on the step's
expert loads: a step with the same batch as the previous one has the same ops except those.
``GraphCache`` keeps the last fully lowered graph and re-lowers only the attention work, once
per kind of attention layer (a sliding-window layer reads less than a global one) that every
layer of that kind shares, and each MoE layer's count-dependent ops (``MoEBlock``: the ops
``lower_moe`` makes, placed, with their staging copies), memoized by what they depend on: the
layer's stage, the batch and what ``setup.moe.counts(position, layer)`` returns (an opaque
tuple). A block whose ops differ in name from those of the lowered graph (an experts op that
vanishes when no token is routed, a staging copy that no longer fits) lowers the step afresh.
Tests check both equal a full lowering step by step. The re-lowered graph's ops are a
view of the lowered ones (``ReworkedOps``) that builds an attention op only when something
reads it, and ``changed`` says what differs from the step before (``Change`` records), so the
runner updates its costs and counts without reading the ops. The serving step model
(sim.serve.stepmodel) lowers its steps' attention through the same cache. It holds state, so
it belongs to one run; the lowering functions themselves stay pure.
"""

from __future__ import annotations

from typing import NamedTuple

from sim.lowering.decode import lower_step
from sim.lowering.graph import LazyOps, Op, OpGraph, Program, Work, live, make_work
from sim.lowering.moe import lower_moe
from sim.lowering.ops import Ask, attention_ask, builder, op_expander, prefill_attention_ask
from sim.lowering.placement import place_ops
from sim.setup import RunSetup

BLOCKS_LIMIT = 4096  # MoE blocks kept per cache (distinct (stage, batch, counts)); a long run's memory stays bounded


class Change(NamedTuple):
    """Ops of a re-lowered step that ask ``work`` instead of ``before``: at ``places``, all
    with the breakdown rows ``rows`` (row, compute_row). ``recurs``: the work is likely asked
    again (an MoE block's, memoized by its counts), so its cost is worth keeping. ``kept``: a
    re-lowered op that still asks ``before`` with these rows once the step's changes are made
    (None: none of them; other ops than those at ``places`` may still ask it)."""

    rows: tuple[str, str]
    places: tuple[int, ...]
    before: Work
    work: Work
    recurs: bool = False
    kept: int | None = None


class ReworkedOps(LazyOps):
    """The ops of a lowered graph with some asking other work (``changed``: op index ->
    (work, tags)): a read-only sequence that builds a changed op the first time it is read."""

    __slots__ = ("_base", "_changed", "_made")

    def __init__(self, base: tuple[Op, ...], changed: dict[int, tuple[Work, tuple]]):
        self._base, self._changed = base, changed
        self._made: dict[int, Op] = {}

    def __len__(self) -> int:
        return len(self._base)

    def _op(self, i: int) -> Op:
        op = self._base[i]
        new = self._changed.get(op.idx)
        if new is None:
            return op
        made = self._made.get(op.idx)
        if made is None:
            made = self._made[op.idx] = op.with_work(*new)
        return made


class Asked(NamedTuple):
    """An op's work and tags, outside any program."""

    work: Work
    tags: tuple[tuple[str, object], ...]


class _Kind(NamedTuple):
    """The attention ops of one kind in the lowered graph: a layer to re-lower them as, their
    breakdown rows and indices, and the work they asked last."""

    layer: int
    rows: tuple[str, str]
    places: tuple[int, ...]


def attention_kinds(graph: OpGraph, window) -> tuple[_Kind, ...]:
    """The graph's attention ops grouped by kind (``window``: a layer -> its attention window;
    with the breakdown rows), each kind's indices in program order and the kinds in the order
    they first appear. The copies of a run (``Repeat``) ask the very Work of the span op they
    copy, so they are of its kind: their indices are counted from the span without reading
    the copies."""
    ops = graph.ops
    found: dict[tuple, list] = {}  # kind -> [its first layer, its indices]

    def note(op: Op, places) -> None:
        entry = found.get(key := (window(op.layer), op.row, op.compute_row))
        if entry is None:
            found[key] = [op.layer, list(places)]
        else:
            entry[1].extend(places)

    at = 0
    for repeat in (*graph.repeats, None):
        stop = len(ops) if repeat is None else repeat.start
        for op in ops[at:stop]:
            if op.work.kind == "attention":
                note(op, (op.idx,))
        if repeat is None:
            break
        for op in ops[repeat.start - repeat.length:repeat.start]:
            if op.work.kind == "attention":
                note(op, range(op.idx + repeat.length, repeat.end, repeat.length))
        at = repeat.end
    # indices are noted in program order but for a span with two ops of one kind (each's copies in turn)
    return tuple(_Kind(layer, (row, compute_row), tuple(sorted(places)))
                 for (_window, row, compute_row), (layer, places) in found.items())


class MoEBlock(NamedTuple):
    """One MoE layer's count-dependent ops, lowered and placed alone: their names in program
    order (the expert staging copy ``stage_experts`` included, the dense weights' copies not)
    and what each asks."""

    names: tuple[str, ...]
    asked: tuple[Asked, ...]


class _Layer(NamedTuple):
    """An MoE layer of the lowered graph: its stage, its block's op names, their indices and
    breakdown rows in the graph."""

    layer: int
    stage: int
    names: tuple[str, ...]
    places: tuple[int, ...]
    rows: tuple[tuple[str, str], ...]


class GraphCache:
    """Lowers the steps of one run, reusing the last lowered graph where only attention and the
    MoE blocks changed (``incremental=False``: every step lowered in full, the reference)."""

    def __init__(self, setup: RunSetup, incremental: bool = True):
        self.setup = setup
        self.incremental = incremental and setup.spec.microbatches == 1
        self._expand = op_expander(setup)
        self._lowered: OpGraph | None = None  # the last graph lowered in full
        self._position = 0  # the step position it was lowered at
        self._kinds: tuple[_Kind, ...] = ()  # its attention ops by kind
        self._works: list[Work] = []  # per kind: the work of the last graph returned
        self._moe: tuple[_Layer, ...] | None = None  # its MoE layers (None: not mapped yet)
        self._moe_works: list[tuple[Work, ...]] = []  # per MoE layer: its block's works in the last graph returned
        self._blocks: dict[tuple, MoEBlock] = {}  # (stage, batch, counts) -> the block
        self._holders: dict[tuple, dict[int, None]] = {}  # (work, row, compute_row) -> the MoE places that ask it
        self._interned: dict[Work, Work] = {}  # each distinct block work, by value (equal works are one object)
        self._stage_of = {layer: stage for stage in range(setup.pp) for layer, part in setup.stage_units(stage)
                          if part == "ffn" and layer >= 0 and setup.is_moe_layer(layer)} if setup.moe else {}
        self.reused = 0
        self.changed: tuple[Change, ...] | None = None  # how the last graph differs from the one before (None: afresh)

    def lower(self, contexts: tuple[int, ...], step: int = 0, position: int = 0) -> OpGraph:
        contexts = tuple(contexts)
        lowered = self._lowered
        if self.incremental and lowered is not None and lowered.batch == len(contexts) and (self._kinds or self._stage_of):
            blocks = self._moe_blocks(position, len(contexts)) if self._stage_of else ()
            if blocks is not None:
                self.reused += 1
                return self._relower(lowered, contexts, step, blocks)
        graph = self._lowered = lower_step(self.setup, contexts, step, position)
        self._position = position
        self.changed = None
        self._kinds = attention_kinds(graph, self.setup.model.window)
        self._works = [graph.ops[kind.places[0]].work for kind in self._kinds]
        self._moe = None
        return graph

    def _relower(self, lowered: OpGraph, contexts: tuple[int, ...], step: int,
                 blocks: tuple[MoEBlock, ...]) -> OpGraph:
        changes, changed = [], {}
        fresh: dict[int | None, Asked] = {}  # window -> the attention over these contexts
        window = self.setup.model.window
        for i, kind in enumerate(self._kinds):
            key = window(kind.layer)
            asked = fresh.get(key)
            if asked is None:
                asked = fresh[key] = self.attention(contexts, kind.layer)
            changes.append(Change(kind.rows, kind.places, self._works[i], asked.work))
            self._works[i] = asked.work
            changed.update(dict.fromkeys(kind.places, asked))
        moved, holders = [], self._holders
        for i, block in enumerate(blocks):
            layer, before = self._moe[i], self._moe_works[i]
            for idx, rows, old, asked in zip(layer.places, layer.rows, before, block.asked, strict=True):
                changed[idx] = asked
                if asked.work is not old:
                    moved.append((rows, idx, old, asked.work))
                    holders[(old, *rows)].pop(idx)
                    holders.setdefault((asked.work, *rows), {})[idx] = None
            self._moe_works[i] = tuple([asked.work for asked in block.asked])
        for rows, idx, old, work in moved:
            left = holders.get(key := (old, *rows))
            if left is not None and not left:
                del holders[key]
                left = None
            changes.append(Change(rows, (idx,), old, work, True, next(iter(left)) if left else None))
        self.changed = tuple(changes)
        return lowered.with_ops(ReworkedOps(lowered.ops, changed), step=step, contexts=contexts)

    # -- MoE blocks ------------------------------------------------------------------------------
    def _moe_blocks(self, position: int, batch: int) -> tuple[MoEBlock, ...] | None:
        """Each MoE layer's block at ``position``, in program order; None where one's ops differ
        in name from the lowered graph's (the step is lowered afresh) or the graph's MoE ops are
        not what a block lowered alone gives (then never again: every step is lowered afresh)."""
        if self._moe is None and not self._map_moe(batch):
            return None
        blocks = tuple(self.block(layer.stage, layer.layer, batch, position) for layer in self._moe)
        if any(block.names != layer.names for block, layer in zip(blocks, self._moe, strict=True)):
            return None
        return blocks

    def block(self, stage: int, layer: int, batch: int, position: int) -> MoEBlock:
        """The count-dependent ops of MoE ``layer`` (on ``stage``) at step ``position`` over
        ``batch`` token rows, lowered and placed alone the first time their counts appear."""
        key = (stage, batch, self.setup.moe.counts(position, layer))
        block = self._blocks.get(key)
        if block is None:
            if len(self._blocks) >= BLOCKS_LIMIT:
                self._blocks.clear()
            b = builder(self.setup, Program(), stage, expand=self._expand)
            lower_moe(self.setup, b, layer, batch, position)
            ops = [op for op in place_ops(self.setup, list(b.ops)) if op.name != "stage_weights"]
            intern = self._interned.setdefault
            block = self._blocks[key] = MoEBlock(tuple(op.name for op in ops),
                                                 tuple(Asked(intern(op.work, op.work), op.tags) for op in ops))
        return block

    def _map_moe(self, batch: int) -> bool:
        """Find each MoE layer's block ops in the lowered graph (lowered at ``self._position``)
        and check that they ask what its block asks; False (and no reuse from then on) if not."""
        graph, position = self._lowered, self._position
        wanted: dict[tuple[int, str], int | None] = {}
        blocks = {}
        for layer, stage in self._stage_of.items():
            blocks[layer] = self.block(stage, layer, batch, position)
            wanted.update(dict.fromkeys(((layer, name) for name in blocks[layer].names), None))
        ops = graph.ops
        for op in ops:
            if (op.layer, op.name) in wanted:
                wanted[(op.layer, op.name)] = op.idx
        mapped = []
        for layer, block in blocks.items():
            places = tuple(wanted[(layer, name)] for name in block.names)
            if None in places or any(ops[idx].work != asked.work or ops[idx].tags != asked.tags
                                     for idx, asked in zip(places, block.asked, strict=True)):
                self.incremental = False
                return False
            mapped.append(_Layer(layer, self._stage_of[layer], block.names, places,
                                 tuple((ops[idx].row, ops[idx].compute_row) for idx in places)))
        self._moe = tuple(sorted(mapped, key=lambda m: m.places[0]))
        self._moe_works = [tuple([asked.work for asked in blocks[m.layer].asked]) for m in self._moe]  # equal to the graph's
        self._holders = {}
        for m, works in zip(self._moe, self._moe_works, strict=True):
            for idx, rows, work in zip(m.places, m.rows, works, strict=True):
                self._holders.setdefault((work, *rows), {})[idx] = None
        return True

    def attention(self, contexts: tuple[int, ...], layer: int = 0) -> Asked:
        """The work and tags of decode attention over ``contexts``, as every layer of ``layer``'s kind asks it."""
        return self._asked("attention", attention_ask(self.setup, layer, contexts))

    def prefill_attention(self, prefill: tuple[tuple[int, int], ...]) -> Asked:
        """The work and tags of the attention of a step's prompt chunks, as every layer asks it."""
        return self._asked("attention_prefill", prefill_attention_ask(self.setup, prefill))

    def _asked(self, name: str, ask: Ask) -> Asked:
        return Asked(make_work(self._expand, name, "attention", live(ask.accesses), ask.fields), ask.tags)
