"""Step times for the serving replay: the ``StepModel`` protocol and the simulator's model.

The replay (sim.serve.replay) asks one question per step: how long does a forward pass take
that decodes one token for each sequence in ``decode_contexts`` (its cache length once this
step's token is appended, as ``sim.lowering.decode.lower_step`` counts it) and processes one
prompt chunk for each ``(chunk_tokens, context_before_chunk)`` entry of ``prefill``? Any
object with that ``step_ns`` method will do (tests use fakes); ``SimulatorStepModel`` answers
with the project's lowering, kernel costs and analytic model (``sim.analytic.analyse``).

Prefill (a stand-in until the lowering has it): ``lower_mixed_step`` builds the op graph of a
mixed step from the current decode lowering. It is the one function to replace when the
lowering learns mixed decode + prefill steps; see its docstring for what it assumes.

Speed (an hour of traffic is ~10^5-10^6 steps; a full lowering + analysis costs ~1-3 ms):
the analytic step time of a graph whose ops run one after another on one stream in one
captured graph is ``launch + sync + sum of op durations``, each op's duration being
``gap + fill + body + drain`` (sim.analytic). In the current lowering only the attention ops
depend on the contexts, the layer ops and the embedding depend only on the number of token
rows (decode rows + prefill tokens), and the final norm, LM head and argmax only on the
number of rows that produce logits. So

    step_ns = constant + body(rows) + tail(logit rows) + attention ops x attention(aggregates)

where ``aggregates`` are the exact integer sums the lowering's ``_kv_traffic`` forms over the
sequences (stream, gather and dequantization work of each cache read, total context, KV
splits) and are read from per-context tables instead of calling the format once per sequence.
``body`` and ``tail`` are memoized by row count, the attention op's duration by its exact
aggregate key. (For fp16 KV with every context >= 256 tokens the key reduces to
(batch, total context): the attention cost is then linear in the total context.) The
decomposition is exact up to float rounding; it is checked against a full lowering and
analysis the first time each row count appears and every ``check_every`` steps, and the
model falls back to exact evaluation of every step if a check fails or the graph is not
one sequential chain (eager launch, several streams, MoE). Tests hold both paths equal.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol

import numpy as np

from sim.analytic import analyse
from sim.costs import CostModel
from sim.errors import ConfigError
from sim.lowering.decode import Plan, _kv_traffic, attention, lower_step
from sim.lowering.graph import Builder, Op, OpGraph
from sim.run import Resolved, RunSpec, resolve

TAIL_OPS = frozenset({"final_norm", "lm_head", "argmax", "gather_tokens"})  # ops at M = logit rows
SPLIT_TOKENS = 256  # the lowering splits each cache into blocks of this many tokens (FlashDecoding)
REL_TOLERANCE = 1e-9  # fast path against exact evaluation
_PYTHON_LOOP_LIMIT = 48  # sequences up to which a Python loop beats numpy for the aggregates
_ATTENTION_MEMO_LIMIT = 200_000  # entries before the attention memo is cleared (bounds memory)


class StepModel(Protocol):
    """How long one serving step takes, in nanoseconds."""

    def step_ns(self, decode_contexts: tuple[int, ...], prefill: tuple[tuple[int, int], ...]) -> float: ...


# -- the stand-in for prefill in the lowering -------------------------------------------------


def lower_mixed_step(plan: Plan, decode_contexts: tuple[int, ...], prefill: tuple[tuple[int, int], ...],
                     step: int = 0) -> OpGraph:
    """The op graph of one step that decodes ``decode_contexts`` and runs the prompt chunks
    ``prefill`` ((chunk_tokens, context_before_chunk) each).

    STAND-IN, TO BE REPLACED: the lead is adding mixed decode + prefill steps to the lowering
    (each sequence carrying ``new_tokens``: 1 for decode, the chunk size for prefill; matmuls
    at M = total new tokens; attention per sequence over its context). When that lands, this
    function becomes a call to it, and ``SimulatorStepModel._attention_ns`` must build the
    same attention op (its self-check against this function fails loudly otherwise). Until
    then, built from the decode-only lowering:

    * every op outside attention is lowered at ``rows`` = decode sequences + prefill tokens
      (matmuls, norms, RoPE + KV append at M = rows);
    * the attention op (one per layer) reads each sequence's cache once: a decode sequence
      over its context, a prefill chunk over ``context_before + chunk`` tokens (the chunk's
      own K/V counted as read too), with FLOPs and softmax over the causal total
      ``chunk x context_before + chunk x (chunk + 1) / 2`` and the matrix unit's M set to
      the GQA group x the largest chunk (prefill queries share each KV row);
    * the final norm, LM head and argmax run at one row per sequence (a prefill chunk yields
      at most one token's logits), not one row per prefill token.

    A decode-only step is exactly ``lower_step(plan, decode_contexts)``.
    """
    decode_contexts = tuple(decode_contexts)
    if not prefill:
        return _with_final_sync(lower_step(plan, decode_contexts, step))
    rows = len(decode_contexts) + sum(chunk for chunk, _ in prefill)
    body = _lower_rows(plan, rows, step)
    tail = _tail_ops(plan, len(decode_contexts) + len(prefill), step)
    mixed = mixed_attention(plan, decode_contexts, prefill, _kv_traffic(plan, _sequence_contexts(
        decode_contexts, prefill)))
    ops, tail_at = [], iter(tail)
    for op in body.ops:
        if op.kind == "attention":
            op = _moved(mixed, op)
        elif op.layer == -1 and op.name in TAIL_OPS:
            op = _moved(next(tail_at), op)
        ops.append(op)
    graph = OpGraph(ops, step=step, batch=len(decode_contexts) + len(prefill),
                    contexts=_sequence_contexts(decode_contexts, prefill), stages=plan.pp)
    return _with_final_sync(graph)


def mixed_attention(plan: Plan, decode_contexts: tuple[int, ...], prefill: tuple[tuple[int, int], ...],
                    traffic: tuple) -> Op:
    """The attention op of a mixed step, from the lowering's own ``attention`` given the KV
    traffic tuple ``(stream, gather, granule, dequant, total_context, splits)`` of reading
    each sequence's cache once (``_kv_traffic`` over the sequence contexts). The prefill
    chunks' causal work replaces their context in ``total_context``. Part of the stand-in."""
    stream, gather, granule, dequant, total, splits = traffic
    causal = sum(chunk * before + chunk * (chunk + 1) // 2 for chunk, before in prefill)
    total = total - sum(chunk + before for chunk, before in prefill) + causal
    contexts = _sequence_contexts(decode_contexts, prefill)
    plan.extra["kv_traffic"] = (contexts, (stream, gather, granule, dequant, total, splits))  # read at once
    op = attention(plan, Builder(), 0, contexts)
    del plan.extra["kv_traffic"]
    if not prefill:
        return op
    group = plan.model.heads // plan.model.kv_heads
    return dataclasses.replace(op, matrix_m=group * max(chunk for chunk, _ in prefill))


def _lower_rows(plan: Plan, rows: int, step: int) -> OpGraph:
    """``lower_step`` at ``rows`` token rows, for its ops other than attention (which the
    caller replaces): the attention's KV traffic is preset to nothing rather than computed
    over every row."""
    contexts = (1,) * rows
    plan.extra["kv_traffic"] = (contexts, (0, 0, 0, 0, rows, float(rows)))
    graph = lower_step(plan, contexts, step)
    del plan.extra["kv_traffic"]
    return graph


def _tail_ops(plan: Plan, logit_rows: int, step: int) -> list[Op]:
    """The final norm, LM head and argmax (and token gather) at ``logit_rows`` rows, kept in
    ``plan.extra`` per row count (as the lowering keeps its step graph there)."""
    tails = plan.extra.setdefault("serve_tail_ops", {})
    if logit_rows not in tails:
        graph = _lower_rows(plan, logit_rows, step)
        tails[logit_rows] = [op for op in graph.ops if op.layer == -1 and op.name in TAIL_OPS]
    return tails[logit_rows]


def _sequence_contexts(decode_contexts, prefill) -> tuple[int, ...]:
    """Each sequence's cache length after the step: the context each attention read covers."""
    return tuple(decode_contexts) + tuple(before + chunk for chunk, before in prefill)


def _moved(op: Op, place: Op) -> Op:
    """``op``'s work at ``place``'s position in the graph (index, layer, dependencies)."""
    return dataclasses.replace(op, idx=place.idx, name=place.name, layer=place.layer, deps=place.deps,
                               stream=place.stream, stage=place.stage, host_sync=place.host_sync,
                               host_ns=place.host_ns, tags=dict(op.tags))


def _with_final_sync(graph: OpGraph) -> OpGraph:
    """The host waits for the step's last op (it needs the tokens), as sim.run does."""
    ops = list(graph.ops)
    ops[-1] = dataclasses.replace(ops[-1], host_sync=True)
    return OpGraph(ops, step=graph.step, batch=graph.batch, contexts=graph.contexts, stages=graph.stages,
                   meta=graph.meta)


# -- the simulator's step model ---------------------------------------------------------------


def serve_resolved(spec: RunSpec) -> Resolved:
    """``sim.run.resolve`` for serving: a dense model (MoE routing per step is not modelled
    in serving yet) under the analytic engine."""
    res = resolve(spec)
    if res.model.moe is not None:
        raise ConfigError(res.model_file, "moe", "serving replay supports dense models only for now "
                          "(per-step expert routing is not modelled in `decodesim serve`)")
    return res


class SimulatorStepModel:
    """Step times from the lowering, the kernel cost model and the analytic model.

    ``exact=True`` evaluates every step by a full lowering and analysis (slow: ~1-3 ms per
    step); the default uses the exact decomposition of the module docstring, checked against
    full evaluation on every new row count and every ``check_every`` steps."""

    def __init__(self, res: Resolved, *, exact: bool = False, check_every: int = 4999):
        self.res = res
        self.plan = res.plan
        self.costs = CostModel(res.hardware)
        self.graph_mode = res.spec.graph
        self.exact = exact
        self.check_every = check_every
        self.fallback_reason: str | None = None
        if not self.graph_mode:
            self._fall_back("eager launch: the host's issue times, not only the ops, decide the step time")
        self.stats = {"steps": 0, "exact_evaluations": 0, "checks": 0, "attention_hits": 0}
        self._constant_ns: float | None = None
        self._body: dict[int, float] = {}
        self._tail: dict[int, float] = {}
        self._attention: dict[tuple, float] = {}
        self._attention_costs = CostModel(res.hardware)
        self._attention_misses = 0
        self._layers = sum(1 for op in lower_mixed_step(self.plan, (1,), ()).ops if op.kind == "attention")
        self._table = np.zeros((0, 3), dtype=np.int64)  # per context: stream, gather, dequant bytes/ops
        self._rows: list[list[int]] = []
        self._granule = 0

    # -- the protocol ---------------------------------------------------------------------
    def step_ns(self, decode_contexts: tuple[int, ...], prefill: tuple[tuple[int, int], ...] = ()) -> float:
        self.stats["steps"] += 1
        if self.exact:
            return self.exact_ns(decode_contexts, prefill)
        rows = len(decode_contexts) + sum(chunk for chunk, _ in prefill)
        logit_rows = len(decode_contexts) + len(prefill)
        if rows not in self._body or logit_rows not in self._tail:
            return self._learn(decode_contexts, prefill)
        fast = (self._constant_ns + self._body[rows] + self._tail[logit_rows]
                + self._layers * self._attention_ns(decode_contexts, prefill))
        if self.stats["steps"] % self.check_every == 0:
            self._check(decode_contexts, prefill, fast)
            if self.exact:
                return self.exact_ns(decode_contexts, prefill)
        return fast

    def exact_ns(self, decode_contexts, prefill=()) -> float:
        """A full lowering and analysis of the step (the reference)."""
        return self._evaluate(decode_contexts, prefill)[0].time_ns

    # -- exact evaluation and learning the memo ---------------------------------------------
    def _evaluate(self, decode_contexts, prefill):
        self.stats["exact_evaluations"] += 1
        graph = lower_mixed_step(self.plan, tuple(decode_contexts), tuple(prefill))
        op_costs = [self.costs.cost(op) for op in graph.ops]
        outcome = analyse(self.costs, graph, op_costs, self.graph_mode)
        return outcome, graph, op_costs

    def _learn(self, decode_contexts, prefill) -> float:
        """Evaluate the step exactly and record its body, tail and constant parts."""
        outcome, graph, op_costs = self._evaluate(decode_contexts, prefill)
        time_ns = outcome.time_ns
        timings = outcome.timings
        if any(not _close(timings[i].start, timings[i - 1].end, time_ns) for i in range(1, len(timings))):
            self._fall_back("the step's ops do not run back to back (several streams, overlap or host waits)")
        parts = {"body": 0.0, "tail": 0.0, "attention": 0.0}
        attention_ns = None
        for op, cost in zip(graph.ops, op_costs, strict=True):
            ns = cost.gap_ns + cost.fill_ns + cost.ideal_body_ns + cost.drain_ns
            part = "attention" if op.kind == "attention" else "tail" if op.layer == -1 and op.name in TAIL_OPS \
                else "body"
            parts[part] += ns
            if part == "attention":
                if attention_ns is not None and ns != attention_ns:
                    self._fall_back("the attention ops of one step differ between layers")
                attention_ns = ns
        constant = time_ns - sum(parts.values())
        if self._constant_ns is None:
            self._constant_ns = constant
        elif not _close(constant, self._constant_ns, time_ns):
            self._fall_back("the step is not one sequential chain of ops (launch-bound, several streams "
                            "or overlapping ops): its time is not the sum of its ops")
        rows = len(decode_contexts) + sum(chunk for chunk, _ in prefill)
        self._body[rows] = parts["body"]
        self._tail[len(decode_contexts) + len(prefill)] = parts["tail"]
        if not self.exact and attention_ns is not None:
            self._check_attention(decode_contexts, prefill, attention_ns)
        return time_ns

    def _check(self, decode_contexts, prefill, fast: float) -> None:
        self.stats["checks"] += 1
        exact = self.exact_ns(decode_contexts, prefill)
        if not _close(fast, exact, exact):
            self._fall_back(f"fast step time {fast:.3f} ns differs from the full lowering's {exact:.3f} ns")

    def _check_attention(self, decode_contexts, prefill, attention_ns: float) -> None:
        fast = self._attention_ns(decode_contexts, prefill)
        if not _close(fast, attention_ns, attention_ns):
            self._fall_back(f"attention from aggregates {fast:.3f} ns differs from the lowering's "
                            f"{attention_ns:.3f} ns")

    def _fall_back(self, reason: str) -> None:
        if not self.exact:
            self.exact = True
            self.fallback_reason = reason

    # -- attention from per-context tables -------------------------------------------------
    def _attention_ns(self, decode_contexts, prefill) -> float:
        traffic = self._traffic(decode_contexts, prefill)
        key = (len(decode_contexts), len(prefill), traffic,
               sum(c * b + c * (c + 1) // 2 for c, b in prefill), max((c for c, _ in prefill), default=0))
        ns = self._attention.get(key)
        if ns is not None:
            self.stats["attention_hits"] += 1
            return ns
        op = mixed_attention(self.plan, decode_contexts, prefill, traffic)
        self._attention_misses += 1
        if self._attention_misses % 50_000 == 0:  # the cost model memoizes every op it sees
            self._attention_costs = CostModel(self.res.hardware)
        cost = self._attention_costs.cost(op)
        ns = cost.gap_ns + cost.fill_ns + cost.ideal_body_ns + cost.drain_ns
        if len(self._attention) >= _ATTENTION_MEMO_LIMIT:
            self._attention.clear()
        self._attention[key] = ns
        return ns

    def _traffic(self, decode_contexts, prefill) -> tuple:
        """``_kv_traffic``'s tuple over the sequence contexts, from integer tables (a Python
        loop for small batches, numpy for large ones; both exact)."""
        contexts = _sequence_contexts(decode_contexts, prefill)
        self._table_upto(max(contexts))
        if len(contexts) <= _PYTHON_LOOP_LIMIT:
            rows = self._rows
            stream = gather = dequant = splits = 0
            for ctx in contexts:
                s, g, d = rows[ctx]
                stream += s
                gather += g
                dequant += d
                splits += ctx if ctx > SPLIT_TOKENS else SPLIT_TOKENS
            total = sum(contexts)
        else:
            array = np.asarray(contexts, dtype=np.int64)
            stream, gather, dequant = (int(v) for v in self._table[array].sum(axis=0))
            total = int(array.sum())
            splits = int(np.maximum(array, SPLIT_TOKENS).sum())
        return (stream, gather, self._granule if gather else 0, dequant, total, splits / SPLIT_TOKENS)

    def _table_upto(self, context: int) -> np.ndarray:
        if context < len(self._table):
            return self._table
        size = max(2 * len(self._table), context + 1, 4096)
        kv, plan = self.plan.kv, self.plan
        rows = np.zeros((size, 3), dtype=np.int64)
        rows[: len(self._table)] = self._table
        for ctx in range(max(1, len(self._table)), size):
            t = kv.kv_read(ctx, plan.k_width, plan.v_width)
            rows[ctx] = (t.stream_bytes, t.gather_bytes, t.dequant_ops)
            if t.gather_granule_bytes:
                if self._granule and t.gather_granule_bytes != self._granule:
                    self._fall_back("the KV format's gather granule changes with the context")
                self._granule = t.gather_granule_bytes
        self._table = rows
        self._rows = rows.tolist()
        return rows


def _close(a: float, b: float, scale: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOLERANCE, abs_tol=REL_TOLERANCE * abs(scale))


__all__ = ["StepModel", "SimulatorStepModel", "lower_mixed_step", "mixed_attention", "serve_resolved"]
