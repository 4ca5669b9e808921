"""Step times for pipeline-parallel replays: the serving step model's decomposition over stages.

``sim.serve.stepmodel.SimulatorStepModel`` times a step as ``launch + sync + body(rows) +
tail(logit rows) + layers x attention`` when the step is one chain of ops, and evaluates
every step in full otherwise; with pipeline stages (``pp > 1``) it always does the latter
(about 8 ms per step for llama-3-70b, so a one-minute replay takes half a minute). Under the
analytic model a ``pp``-stage step without micro-batches is still one chain: each stage's
ops wait for the previous stage's (measured here: step time minus the sum of its op times
is the same 9,692 ns for three different mixes of llama-3-70b at tp 2 x pp 4). So this
model applies the same decomposition with the attention ops counted over the whole graph
(``model.layers`` of them, whatever the stage), and *checks* it exactly as the serving model
does: every time it learns a row count it compares the parts with a full lowering and
analysis (the fixed part must not change, the attention ops must all cost the same), and
every ``check_every`` steps it compares a fast step with a full one; any mismatch switches it
to full evaluation of every step, with the reason kept in ``fallback_reason``.

It uses only public functions: ``lower_step`` (sim.lowering.decode), the software stack's
kernel costs (sim.costs.CostModel), ``analyse`` (sim.analytic), and the single-op builders
``attention`` / ``prefill_attention`` (sim.lowering.ops). The search uses it only where the
serving model would fall back for the pipeline; the lead may prefer to lift the ``pp > 1``
fallback in sim.serve.stepmodel itself.
"""

from __future__ import annotations

import math

from sim.analytic import analyse
from sim.config.setup import Setup
from sim.costs import CostModel
from sim.lowering.decode import lower_step
from sim.lowering.ops import attention, builder, prefill_attention
from sim.serve.stepmodel import ATTENTION_OPS, TAIL_OPS

REL_TOLERANCE = 1e-9


class ChainStepModel:
    """The step-model protocol (``step_ns``) for a chain of stages (module docstring)."""

    def __init__(self, setup: Setup, *, check_every: int = 4999):
        self.setup = setup
        self.costs = CostModel(setup.hardware, setup.stack)
        self.check_every = check_every
        self.exact = not setup.graph
        self.fallback_reason = "eager launch: the host's issue times decide the step" if self.exact else None
        self.stats = {"steps": 0, "exact_evaluations": 0, "checks": 0}
        self._body: dict[int, float] = {}
        self._tail: dict[int, float] = {}
        self._fixed: float | None = None
        self._counts: tuple[int, int] | None = None  # decode and prefill attention ops per step

    def step_ns(self, decode_contexts, prefill=()) -> float:
        self.stats["steps"] += 1
        decode_contexts, prefill = tuple(decode_contexts), tuple(prefill)
        if self.exact:
            return self.exact_ns(decode_contexts, prefill)
        rows = len(decode_contexts) + sum(c for c, _ in prefill)
        logits = len(decode_contexts) + len(prefill)
        if rows not in self._body or logits not in self._tail:
            return self._learn(decode_contexts, prefill)
        fast = self._fixed + self._body[rows] + self._tail[logits] + self._attention(decode_contexts, prefill)
        if self.stats["steps"] % self.check_every == 0:
            self.stats["checks"] += 1
            exact = self.exact_ns(decode_contexts, prefill)
            if not _close(fast, exact):
                self._fall_back(f"fast step time {fast:.3f} ns differs from the full lowering's {exact:.3f} ns")
                return exact
        return fast

    def exact_ns(self, decode_contexts, prefill=()) -> float:
        return self._evaluate(tuple(decode_contexts), tuple(prefill))[0].time_ns

    def _evaluate(self, decode_contexts, prefill):
        self.stats["exact_evaluations"] += 1
        graph = lower_step(self.setup, decode_contexts, prefill=prefill)
        by_work: dict[int, object] = {}
        op_costs = []
        for op in graph.ops:
            cost = by_work.get(id(op.work))
            if cost is None:
                cost = by_work[id(op.work)] = self.costs.cost(op.work)
            op_costs.append(cost)
        return analyse(graph, op_costs, self.costs.host, self.setup.graph), graph, op_costs

    def _learn(self, decode_contexts, prefill) -> float:
        outcome, graph, op_costs = self._evaluate(decode_contexts, prefill)
        parts = {"body": 0.0, "tail": 0.0, "attention": 0.0}
        counts = {"attention": 0, "attention_prefill": 0}
        for op, cost in zip(graph.ops, op_costs, strict=True):
            if op.name in ATTENTION_OPS:
                parts["attention"] += cost.total_ns
                counts[op.name] += 1
            else:
                parts["tail" if op.layer == -1 and op.name in TAIL_OPS else "body"] += cost.total_ns
        fixed = outcome.time_ns - sum(parts.values())
        if self._fixed is None:
            self._fixed = fixed
        elif not _close(fixed, self._fixed):
            self._fall_back("the step is not one chain of ops: its time is not the sum of its ops")
        if decode_contexts and prefill:  # counts per kind are only visible when both kinds are present
            self._counts = (counts["attention"], counts["attention_prefill"])
        elif self._counts is None:
            self._counts = (counts["attention"] or counts["attention_prefill"],) * 2
        rows = len(decode_contexts) + sum(c for c, _ in prefill)
        self._body[rows] = parts["body"]
        self._tail[len(decode_contexts) + len(prefill)] = parts["tail"]
        if not self.exact and not _close(self._attention(decode_contexts, prefill), parts["attention"]):
            self._fall_back("the attention ops of one step differ between layers")
        return outcome.time_ns

    def _attention(self, decode_contexts, prefill) -> float:
        b = builder(self.setup)
        n_decode, n_prefill = self._counts
        total = 0.0
        if decode_contexts:
            total += n_decode * self.costs.cost_once(attention(self.setup, b, 0, decode_contexts).work).total_ns
        if prefill:
            total += n_prefill * self.costs.cost_once(prefill_attention(self.setup, b, 0, prefill).work).total_ns
        return total

    # -- the parts, for the screen (sim.search.screen) ------------------------------------------
    def parts_ns(self, rows: int) -> tuple[float, float, float]:
        """(fixed, body, tail) of a step of ``rows`` token rows that all produce logits, learned
        by one full lowering of ``rows`` decodes at context 1 the first time. Only meaningful
        while ``exact`` is False (the decomposition holds)."""
        if rows not in self._body or rows not in self._tail:
            self.stats["steps"] += 1
            self._learn((1,) * rows, ())
        return self._fixed, self._body[rows], self._tail[rows]

    def attention_ns(self, decode_contexts, prefill=()) -> float:
        """All attention ops of a step (every layer), without the step's other ops."""
        if self._counts is None:
            self.parts_ns(1)
        return self._attention(tuple(decode_contexts), tuple(prefill))

    def _fall_back(self, reason: str) -> None:
        if not self.exact:
            self.exact = True
            self.fallback_reason = reason


def step_model_for(setup: Setup):
    """The serving step model, or this chain model where that one would evaluate every step
    in full only because of pipeline stages."""
    from sim.serve.stepmodel import SimulatorStepModel

    if setup.pp > 1 and setup.graph:
        return ChainStepModel(setup)
    return SimulatorStepModel(setup)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOLERANCE, abs_tol=REL_TOLERANCE * max(abs(a), abs(b), 1.0))


__all__ = ["ChainStepModel", "step_model_for"]
