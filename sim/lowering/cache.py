"""Graph reuse between consecutive steps, owned by the runner.

In a model without MoE layers only attention depends on the sequences' contexts: a step
with the same batch as the previous one has the same ops except attention. ``GraphCache``
keeps the previous graph and re-lowers only the attention work, which every layer shares
(tests check this equals a full lowering). It holds state, so it belongs to one run; the
lowering functions themselves stay pure.
"""

from __future__ import annotations

from sim.lowering.decode import lower_step
from sim.lowering.graph import OpGraph
from sim.lowering.ops import attention, builder
from sim.setup import RunSetup


class GraphCache:
    """Lowers the steps of one run, reusing the previous graph where only attention changed."""

    def __init__(self, setup: RunSetup):
        self.setup = setup
        self._previous: OpGraph | None = None
        self._attention: tuple[int, ...] = ()  # indices of the attention ops
        self.reused = 0
        self.changed: tuple[int, ...] | None = None  # ops of the last graph that differ from the one before

    def lower(self, contexts: tuple[int, ...], step: int = 0, position: int = 0) -> OpGraph:
        contexts = tuple(contexts)
        previous = self._previous
        if (self.setup.moe is None and self.setup.spec.microbatches == 1 and previous is not None
                and previous.batch == len(contexts)):
            self.reused += 1
            graph = self._relower_attention(previous, contexts, step)
            self.changed = self._attention
        else:
            graph = lower_step(self.setup, contexts, step, position)
            self.changed = None
            self._attention = tuple(op.idx for op in graph.ops if op.kind == "attention")
        self._previous = graph
        return graph

    def _relower_attention(self, previous: OpGraph, contexts: tuple[int, ...], step: int) -> OpGraph:
        fresh = attention(self.setup, builder(self.setup), 0, contexts)
        ops = list(previous.ops)
        work, tags = fresh.work, fresh.tags
        for idx in self._attention:
            ops[idx] = ops[idx].with_work(work, tags)
        return previous.with_ops(tuple(ops), step=step, contexts=contexts)
