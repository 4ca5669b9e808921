"""Graph reuse between steps, owned by the runner.

Only attention depends on the sequences' contexts, and only the MoE blocks on the step's
expert loads: a step of the same shape (decode rows, token rows, logit rows, prompt chunks or
not) as one lowered before has the same ops except those. ``GraphCache`` keeps a fully lowered
graph per shape (the last ``BASES_LIMIT``) and re-lowers only the attention work, once per kind
of attention layer (decode or prompt-chunk attention; a sliding-window layer reads less than a
global one) that every layer of that kind shares, and each MoE layer's count-dependent ops
(``MoEBlock``: the ops ``lower_moe`` makes, placed, with their staging copies), memoized by
what they depend on: the layer's stage, the token rows and what ``setup.moe.counts(position,
layer)`` returns (an opaque tuple) or the caller gives (a serving replay's live routing). A
block whose ops differ in name from those of the lowered graph (an experts op that vanishes
when no token is routed, a staging copy that no longer fits) lowers the step afresh.

The re-lowered graph's ops are a view of the lowered ones (``ReworkedOps``) that builds a
changed op only when something reads it, and ``changed`` says what differs from the step
before (``Change`` records), so the runner updates its costs and counts without reading the
ops. The steps of a model with MoE layers report ``changed`` None: the runner costs them
afresh (every cost from the cost model's memo) so that a step's sums add its distinct ops in
program order, bit-identical to a full lowering. Tests check all of this equals a full
lowering step by step. It holds state, so it belongs to one run; the lowering functions
themselves stay pure.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from sim.lowering.decode import lower_step
from sim.lowering.graph import LazyOps, Op, OpGraph, Program, Work, live, make_work
from sim.lowering.moe import lower_moe
from sim.lowering.ops import Ask, attention_ask, builder, op_expander, prefill_attention_ask
from sim.lowering.placement import place_ops
from sim.moe.live import fixed_plan
from sim.setup import RunSetup

BASES_LIMIT = 64  # step shapes whose full lowering a cache keeps
BLOCKS_LIMIT = 4096  # MoE blocks kept per cache (distinct (stage, batch, counts)); a long run's memory stays bounded


class Change(NamedTuple):
    """Ops of a re-lowered step that ask ``work`` instead of ``before``: at ``places``, all
    with the breakdown rows ``rows`` (row, compute_row)."""

    rows: tuple[str, str]
    places: tuple[int, ...]
    before: Work
    work: Work


class ReworkedOps(LazyOps):
    """The ops of a lowered graph with some asking other work (``changed``: op index ->
    (work, tags)): a read-only sequence that builds a changed op the first time it is read."""

    __slots__ = ("_base", "_changed", "_made")

    def __init__(self, base: tuple[Op, ...], changed: dict[int, tuple[Work, tuple]]):
        self._base, self._changed = base, changed
        self._made: dict[int, Op] = {}

    def __len__(self) -> int:
        return len(self._base)

    def parts(self) -> tuple[tuple[Op, ...], dict[int, tuple[Work, tuple]]]:
        """(the lowered ops, op index -> the (work, tags) it asks instead): to read the ops'
        works without building the changed ones."""
        return self._base, self._changed

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
    prefill: bool = False  # the attention of the step's prompt chunks


def attention_kinds(graph: OpGraph, window) -> tuple[_Kind, ...]:
    """The graph's attention ops grouped by kind (decode or prompt-chunk attention; ``window``:
    a layer -> its attention window; with the breakdown rows), each kind's indices in program
    order and the kinds in the order
    they first appear. The copies of a run (``Repeat``) ask the very Work of the span op they
    copy, so they are of its kind: their indices are counted from the span without reading
    the copies."""
    ops = graph.ops
    found: dict[tuple, list] = {}  # kind -> [its first layer, its indices]

    def note(op: Op, places) -> None:
        entry = found.get(key := (op.name == "attention_prefill", window(op.layer), op.row, op.compute_row))
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
    return tuple(_Kind(layer, (row, compute_row), tuple(sorted(places)), prefill)
                 for (prefill, _window, row, compute_row), (layer, places) in found.items())


class MoEBlock(NamedTuple):
    """One MoE layer's count-dependent ops, lowered and placed alone: their names in program
    order (the expert staging copy ``stage_experts`` included, the dense weights' copies not)
    and what each asks."""

    names: tuple[str, ...]
    asked: tuple[Asked, ...]


class _Layer(NamedTuple):
    """An MoE layer of the lowered graph: its stage, its block's op names and their indices in
    the graph."""

    layer: int
    stage: int
    names: tuple[str, ...]
    places: tuple[int, ...]


class _Base(NamedTuple):
    """A graph lowered in full and what re-lowering it needs: the step position it was lowered
    at, its attention kinds, and (once mapped) its MoE layers; ``works``: per attention kind,
    the work of the last graph returned from it."""

    graph: OpGraph
    position: int
    counts: tuple[tuple, ...] | None  # the expert loads it was lowered with (None: the plan's at ``position``)
    kinds: tuple[_Kind, ...]
    works: list[Work]
    moe: list  # [tuple of _Layer] once mapped, [] before


class GraphCache:
    """Lowers the steps of one run, reusing a lowered graph of the step's shape (decode rows,
    token rows, logit rows, prompt chunks or not; the last ``BASES_LIMIT`` shapes) where only
    attention and the MoE blocks change (``incremental=False``: every step lowered in full,
    the reference)."""

    def __init__(self, setup: RunSetup, incremental: bool = True):
        self.setup = setup
        self.incremental = incremental and setup.spec.microbatches == 1
        self._expand = op_expander(setup)
        self._bases: dict[tuple, _Base] = {}  # step shape -> its graph lowered in full
        self._current: _Base | None = None  # the base of the last graph returned
        self._blocks: dict[tuple, MoEBlock] = {}  # (stage, batch, counts) -> the block
        self._interned: dict[Work, Work] = {}  # each distinct block work, by value (equal works are one object)
        self._stage_of = {layer: stage for stage in range(setup.pp) for layer, part in setup.stage_units(stage)
                          if part == "ffn" and layer >= 0 and setup.is_moe_layer(layer)} if setup.moe else {}
        self.reused = 0
        self.changed: tuple[Change, ...] | None = None  # how the last graph differs from the one before (None: afresh)

    def lower(self, contexts: tuple[int, ...], step: int = 0, position: int = 0,
              prefill: tuple[tuple[int, int], ...] = (), counts: tuple[tuple, ...] | None = None) -> OpGraph:
        """The graph of a step (as ``lower_step``): ``counts``, per MoE layer in program order,
        its expert loads where the caller has them (a serving replay's live routing; by default
        the plan's at ``position``)."""
        contexts, prefill = tuple(contexts), tuple(prefill)
        rows = len(contexts) + sum(chunk for chunk, _ in prefill)
        shape = (len(contexts), rows, len(contexts) + len(prefill), bool(prefill))
        base = self._bases.get(shape) if self.incremental else None
        if base is not None:
            blocks = self._moe_blocks(base, position, rows, counts)
            if blocks is not None:
                self.reused += 1
                graph = self._relower(base, contexts, prefill, step, blocks)
                if base is not self._current:  # the step before came from another base: cost afresh
                    self.changed, self._current = None, base
                return graph
        if counts is None:
            graph = lower_step(self.setup, contexts, step, position, prefill)
        else:  # lowered under a plan that holds the step's loads
            graph = lower_step(replace(self.setup, moe=fixed_plan(self.setup.moe, counts)), contexts, step, 0, prefill)
        kinds = attention_kinds(graph, self.setup.model.window)
        base = _Base(graph, position, counts, kinds, [graph.ops[kind.places[0]].work for kind in kinds], [])
        self.changed, self._current = None, base
        if self.incremental and (kinds or self._stage_of):
            if len(self._bases) >= BASES_LIMIT:
                self._bases.pop(next(iter(self._bases)))
            self._bases[shape] = base
        return graph

    def _relower(self, base: _Base, contexts: tuple[int, ...], prefill: tuple[tuple[int, int], ...], step: int,
                 blocks: tuple[MoEBlock, ...]) -> OpGraph:
        changes, changed = [], {}
        fresh: dict[tuple, Asked] = {}  # (prompt chunks?, window) -> the attention over these contexts
        window = self.setup.model.window
        for i, kind in enumerate(base.kinds):
            key = (kind.prefill, window(kind.layer))
            asked = fresh.get(key)
            if asked is None:
                asked = fresh[key] = (self.prefill_attention(prefill) if kind.prefill
                                      else self.attention(contexts, kind.layer))
            changes.append(Change(kind.rows, kind.places, base.works[i], asked.work))
            base.works[i] = asked.work
            changed.update(dict.fromkeys(kind.places, asked))
        for layer, block in zip(base.moe[0] if blocks else (), blocks, strict=True):
            changed.update(zip(layer.places, block.asked, strict=True))
        # a model with MoE layers: every step costed afresh (its costs from the memo), so that its
        # sums add its distinct ops in program order, as a full lowering's do (bit-identical)
        self.changed = None if self._stage_of else tuple(changes)
        return base.graph.with_ops(ReworkedOps(base.graph.ops, changed), step=step, contexts=contexts)

    # -- MoE blocks ------------------------------------------------------------------------------
    def _moe_blocks(self, base: _Base, position: int, batch: int,
                    counts: tuple[tuple, ...] | None = None) -> tuple[MoEBlock, ...] | None:
        """Each MoE layer's block at ``position`` (or at ``counts``), in program order; None where
        one's ops differ in name from the base graph's (the step is lowered afresh) or the
        graph's MoE ops are not what a block lowered alone gives (then never again: every step
        is lowered afresh)."""
        if not self._stage_of:
            return ()
        if not base.moe and not self._map_moe(base, batch):
            return None
        layers = base.moe[0]
        if counts is None:
            blocks = tuple(self.block(m.stage, m.layer, batch, position) for m in layers)
        else:
            blocks = tuple(self.block(m.stage, m.layer, batch, position, n)
                           for m, n in zip(layers, counts, strict=True))
        if any(block.names != m.names for block, m in zip(blocks, layers, strict=True)):
            return None
        return blocks

    @property
    def moe_stages(self) -> dict[int, int]:
        """The MoE layers and the pipeline stage of each (their FFN's)."""
        return dict(self._stage_of)

    def block(self, stage: int, layer: int, batch: int, position: int, counts: tuple | None = None) -> MoEBlock:
        """The count-dependent ops of MoE ``layer`` (on ``stage``) at step ``position`` over
        ``batch`` token rows, lowered and placed alone the first time their counts appear
        (``counts``: the layer's expert loads where the caller has them, as ``setup.moe.counts``
        gives them; by default the plan's at ``position``)."""
        if counts is None:
            counts = self.setup.moe.counts(position, layer)
        key = (stage, batch, counts)
        block = self._blocks.get(key)
        if block is None:
            if len(self._blocks) >= BLOCKS_LIMIT:
                self._blocks.clear()
            b = builder(self.setup, Program(), stage, expand=self._expand)
            lower_moe(self.setup, b, layer, batch, position, counts)
            ops = [op for op in place_ops(self.setup, list(b.ops)) if op.name != "stage_weights"]
            intern = self._interned.setdefault
            block = self._blocks[key] = MoEBlock(tuple(op.name for op in ops),
                                                 tuple(Asked(intern(op.work, op.work), op.tags) for op in ops))
        return block

    def _map_moe(self, base: _Base, batch: int) -> bool:
        """Find each MoE layer's block ops in ``base``'s graph and check that they ask what its
        block asks; False (and no reuse from then on) if not."""
        graph, position = base.graph, base.position
        wanted: dict[tuple[int, str], int | None] = {}
        blocks = {}
        for i, (layer, stage) in enumerate(self._stage_of.items()):
            blocks[layer] = self.block(stage, layer, batch, position, None if base.counts is None else base.counts[i])
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
            mapped.append(_Layer(layer, self._stage_of[layer], block.names, places))
        base.moe.append(tuple(sorted(mapped, key=lambda m: m.places[0])))
        return True

    def attention(self, contexts: tuple[int, ...], layer: int = 0) -> Asked:
        """The work and tags of decode attention over ``contexts``, as every layer of ``layer``'s kind asks it."""
        return self._asked("attention", attention_ask(self.setup, layer, contexts))

    def prefill_attention(self, prefill: tuple[tuple[int, int], ...]) -> Asked:
        """The work and tags of the attention of a step's prompt chunks, as every layer asks it."""
        return self._asked("attention_prefill", prefill_attention_ask(self.setup, prefill))

    def _asked(self, name: str, ask: Ask) -> Asked:
        return Asked(make_work(self._expand, name, "attention", live(ask.accesses), ask.fields), ask.tags)
