"""Step times for the serving replay: the ``StepModel`` protocol and the simulator's model.

The replay (sim.serve.replay) asks one question per step: how long does a forward pass take
that decodes one token for each sequence in ``decode_contexts`` (its cache length once this
step's token is appended, as ``sim.lowering.decode.lower_step`` counts it) and processes one
prompt chunk for each ``(chunk_tokens, context_before_chunk)`` entry of ``prefill``? Any
object with that ``step_ns`` method will do (tests use fakes); ``SimulatorStepModel`` answers
with the project's lowering (mixed decode + prefill steps: ``lower_step(..., prefill=...)``),
the software stack's kernels and their costs, and the analytic model (``sim.analytic``).

Speed (an hour of traffic is ~10^5-10^6 steps; a full lowering + analysis costs ~1-3 ms).
Under a captured graph with one stream, a step is one chain of ops: its time is the graph
launch, plus the sum of the ops' times, plus the final sync. Only the attention ops depend on
the sequences' contexts; every other op of the layer stack depends only on the number of
token rows (decode rows + prefill tokens), and the final norm, LM head and argmax only on the
number of rows that produce logits. So

    step_ns = launch + sync + body(rows) + tail(logit rows)
              + n_decode x decode attention(contexts) + n_prefill x prefill attention(chunks)

where n_decode and n_prefill are the step's attention ops, counted over the whole graph: with
pipeline stages (``pp > 1``, no micro-batches) a step is still one chain under the analytic
model, each stage's ops waiting for the previous stage's, so the same decomposition holds
(measured while building the search: the fixed part is the same 9,692 ns for three mixes of
llama-3-70b at tp 2 x pp 4), and it is checked like every other case.

``body`` and ``tail`` are memoized by row count (learned from one full lowering the first
time a count appears); the attention ops are lowered per step (cheap: one op, contexts
grouped by value) and costed without the cost model's memo (a step's contexts almost never
recur: 3.6% of them in the first 300 s of azure-conv). The
decomposition is exact up to float rounding; it is checked against a full lowering and
analysis every ``check_every`` steps, and the model falls back to exact evaluation of every
step if a check fails or the stack launches eagerly (the host's issue times then decide).
"""

from __future__ import annotations

import math
from typing import Protocol

from sim.analytic import analyse
from sim.config.spec import RunSpec
from sim.costs import CostModel
from sim.errors import ConfigError
from sim.lowering.cache import GraphCache
from sim.lowering.decode import lower_step
from sim.lowering.placement import plan_of
from sim.setup import RunSetup, resolve

TAIL_OPS = frozenset({"final_norm", "lm_head", "argmax", "gather_tokens"})  # ops at M = logit rows
ATTENTION_OPS = frozenset({"attention", "attention_prefill"})
REL_TOLERANCE = 1e-9  # fast path against exact evaluation


class StepModel(Protocol):
    """Anything that can time a mixed decode + prefill step."""

    def step_ns(self, decode_contexts: tuple[int, ...], prefill: tuple[tuple[int, int], ...]) -> float: ...


def serve_resolved(spec: RunSpec) -> RunSetup:
    """The sealed setup for serving: a dense model (per-step expert routing is not modelled in
    serving) under the analytic engine."""
    setup = resolve(spec)
    if setup.model.moe is not None:
        raise ConfigError(setup.model_file, "moe", "serving replay supports dense models only for now "
                          "(per-step expert routing is not modelled in `decodesim serve`)")
    return setup


class SimulatorStepModel:
    """Step times from the lowering, the stack's kernel costs and the analytic model.

    ``exact=True`` evaluates every step by a full lowering and analysis; the default uses the
    exact decomposition of the module docstring, checked every ``check_every`` steps."""

    def __init__(self, setup: RunSetup, *, exact: bool = False, check_every: int = 4999):
        self.setup = setup
        self.costs = CostModel(setup.hardware, setup.stack)
        self.graphs = GraphCache(setup)
        self.exact = exact
        self.check_every = check_every
        self.fallback_reason: str | None = None
        self.stats = {"steps": 0, "exact_evaluations": 0, "checks": 0}
        self._body: dict[int, float] = {}
        self._tail: dict[int, float] = {}
        self._fixed: float | None = None  # graph launch + final sync (+ stage hand-offs' waits)
        self._counts: tuple[int, int] | None = None  # decode and prefill attention ops per step
        if not setup.graph:
            self._fall_back("eager launch: the host's issue times, not only the ops, decide the step time")
        if setup.spec.microbatches > 1:
            self._fall_back("micro-batches: the step is several chains of ops")
        if plan_of(setup).staged:
            self._fall_back("weights staged into SRAM on a second stream: the step is not one chain of ops")

    # -- the protocol -------------------------------------------------------------------------
    def step_ns(self, decode_contexts: tuple[int, ...], prefill: tuple[tuple[int, int], ...] = ()) -> float:
        self.stats["steps"] += 1
        decode_contexts, prefill = tuple(decode_contexts), tuple(prefill)
        if self.exact:
            return self.exact_ns(decode_contexts, prefill)
        rows = len(decode_contexts) + sum(chunk for chunk, _ in prefill)
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
        """A full lowering and analysis of the step (the reference)."""
        return self._evaluate(tuple(decode_contexts), tuple(prefill))[0].time_ns

    # -- learning the memo ----------------------------------------------------------------------
    def _evaluate(self, decode_contexts, prefill):
        self.stats["exact_evaluations"] += 1
        graph = lower_step(self.setup, decode_contexts, prefill=prefill)
        by_work: dict[int, object] = {}  # copied layers share Work objects: cost each object once
        op_costs = []
        for op in graph.ops:
            cost = by_work.get(id(op.work))
            if cost is None:
                cost = by_work[id(op.work)] = self.costs.cost(op.work)
            op_costs.append(cost)
        return analyse(graph, op_costs, self.costs.host, self.setup.graph, moments=False), graph, op_costs

    def _learn(self, decode_contexts, prefill) -> float:
        """Evaluate the step exactly and record its body, tail and fixed parts."""
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
        rows = len(decode_contexts) + sum(chunk for chunk, _ in prefill)
        self._body[rows] = parts["body"]
        self._tail[len(decode_contexts) + len(prefill)] = parts["tail"]
        if not self.exact and not _close(self._attention(decode_contexts, prefill), parts["attention"]):
            self._fall_back("the attention ops of one step differ between layers")
        return outcome.time_ns

    def _attention(self, decode_contexts, prefill) -> float:
        """The step's attention ops: one of each kind lowered and costed, times their count. Their
        works are costed without the memo: a step's contexts seldom repeat (in an hour of
        traffic, almost never), so keeping them would only give the garbage collector more to walk."""
        n_decode, n_prefill = self._counts
        total = 0.0
        if decode_contexts:
            total += n_decode * self.costs.cost_once(self.graphs.attention(decode_contexts).work).total_ns
        if prefill:
            total += n_prefill * self.costs.cost_once(self.graphs.prefill_attention(prefill).work).total_ns
        return total

    # -- the parts, for the search's screen (sim.search.screen) ---------------------------------
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


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOLERANCE, abs_tol=REL_TOLERANCE * max(abs(a), abs(b), 1.0))


__all__ = ["StepModel", "SimulatorStepModel", "serve_resolved"]
