"""Graph reuse between consecutive steps, owned by the runner.

In a model without MoE layers only attention depends on the sequences' contexts: a step
with the same batch as the previous one has the same ops except attention. ``GraphCache``
keeps the last fully lowered graph and re-lowers only the attention work, once per kind of
attention layer (a sliding-window layer reads less than a global one) that every layer of
that kind shares (tests check this equals a full lowering). The re-lowered graph's ops are a
view of the lowered ones (``ReworkedOps``) that builds an attention op only when something
reads it, and ``changed`` says what differs from the step before (``Change`` records), so the
runner updates its costs and counts without reading the ops. The serving step model
(sim.serve.stepmodel) lowers its steps' attention through the same cache. It holds state, so
it belongs to one run; the lowering functions themselves stay pure.
"""

from __future__ import annotations

from typing import NamedTuple

from sim.lowering.decode import lower_step
from sim.lowering.graph import LazyOps, Op, OpGraph, Work, live, make_work
from sim.lowering.ops import Ask, attention_ask, op_expander, prefill_attention_ask
from sim.setup import RunSetup


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


class GraphCache:
    """Lowers the steps of one run, reusing the last lowered graph where only attention changed."""

    def __init__(self, setup: RunSetup):
        self.setup = setup
        self._expand = op_expander(setup)
        self._lowered: OpGraph | None = None  # the last graph lowered in full
        self._kinds: tuple[_Kind, ...] = ()  # its attention ops by kind
        self._works: list[Work] = []  # per kind: the work of the last graph returned
        self.reused = 0
        self.changed: tuple[Change, ...] | None = None  # how the last graph differs from the one before (None: afresh)

    def lower(self, contexts: tuple[int, ...], step: int = 0, position: int = 0) -> OpGraph:
        contexts = tuple(contexts)
        lowered = self._lowered
        if (self.setup.moe is None and self.setup.spec.microbatches == 1 and lowered is not None
                and lowered.batch == len(contexts) and self._kinds):
            self.reused += 1
            return self._relower_attention(lowered, contexts, step)
        graph = self._lowered = lower_step(self.setup, contexts, step, position)
        self.changed = None
        self._kinds = attention_kinds(graph, self.setup.model.window)
        self._works = [graph.ops[kind.places[0]].work for kind in self._kinds]
        return graph

    def _relower_attention(self, lowered: OpGraph, contexts: tuple[int, ...], step: int) -> OpGraph:
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
        self.changed = tuple(changes)
        return lowered.with_ops(ReworkedOps(lowered.ops, changed), step=step, contexts=contexts)

    def attention(self, contexts: tuple[int, ...], layer: int = 0) -> Asked:
        """The work and tags of decode attention over ``contexts``, as every layer of ``layer``'s kind asks it."""
        return self._asked("attention", attention_ask(self.setup, layer, contexts))

    def prefill_attention(self, prefill: tuple[tuple[int, int], ...]) -> Asked:
        """The work and tags of the attention of a step's prompt chunks, as every layer asks it."""
        return self._asked("attention_prefill", prefill_attention_ask(self.setup, prefill))

    def _asked(self, name: str, ask: Ask) -> Asked:
        return Asked(make_work(self._expand, name, "attention", live(ask.accesses), ask.fields), ask.tags)
