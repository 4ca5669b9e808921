"""The runner: one model on one hardware profile over one decode trace.

``simulate(spec)`` resolves the spec into a sealed RunSetup (sim.setup), checks that
it fits, then times every step through a ``Stepper`` (the one runner API that serving and
other callers share: it lowers the op graph through a ``GraphCache``, so only what changed is
lowered again, looks up each op's cost and runs the engine or the analytic model) and turns
the outcome into a step row. Work per step is proportional to the ops
that changed: unchanged ops keep their costs, and the breakdown and byte totals are sums
over the graph's distinct ops, kept between steps.

Returns a ``RunResult`` with the summary, the per-step table and, when asked, the per-op
table and the event log.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from operator import attrgetter
from typing import NamedTuple

from sim.analytic import analyse
from sim.config.hardware import kernel_costs_origin
from sim.config.loader import validate
from sim.config.spec import RUN_FIELDS, RunSpec, apply_run_overrides
from sim.costs import CostModel, OpCost, cost_model
from sim.decode_trace import length_counts
from sim.energy import EnergyModel, summarize
from sim.engine.records import LOG_COLUMNS, Span
from sim.engine.simulation import Simulation
from sim.errors import SimulationError
from sim.lowering.cache import GraphCache, ReworkedOps, attention_kinds
from sim.lowering.graph import OpGraph
from sim.lowering.decode import StageWeights, largest_staged_reads, lower_step, stage_weight_bytes
from sim.lowering.placement import plan_of, staging_limit
from sim.results import Ledger, bound_of, op_key, percentile
from sim.setup import RunSetup, resolve
from sim.units import GB, MB, MS_PER_S, ns_to_ms

__all__ = ["RunSpec", "RunResult", "RUN_FIELDS", "simulate", "Stepper", "Timed", "ChainSteps", "chain_close",
           "resolve", "capacity", "kv_bytes", "kv_layer_bytes",
           "kv_pool_bytes", "apply_run_overrides"]


# -- capacity --------------------------------------------------------------------------------


def capacity(setup: RunSetup) -> dict:
    """Bytes one chip must hold in each tier, for the fullest stage, against what the tier
    offers: weights, MoE expert weights and the KV cache where the placement puts them
    (streamed weights: the whole copy in the tier they come from, two staging buffers of the
    largest op's weights in the on-chip buffer), activations in the home tier. ``fits`` when every
    tier does; ``needed_bytes`` / ``available_bytes`` are those of the tier that overflows most
    (the home tier when all fit)."""
    model, hw = setup.model, setup.hardware
    per_layer_kv = max(sum(n * kv_layer_bytes(setup, c) for c, n in length_counts(step.contexts))
                       for step in setup.steps)
    batch = max(step.batch for step in setup.steps)
    activations = batch * (4 * model.hidden + 2 * model.ffn // setup.tp + setup.vocab) * 4
    tiers: dict[str, dict] = {}
    worst_stage: dict[str, int] = {}
    weights = 0  # the fullest stage's weights on one chip
    for stage in range(setup.pp):
        held = stage_weight_bytes(setup, stage)
        weights = max(weights, held.dense + held.experts)
        for tier, parts in _stage_needs(setup, stage, batch, per_layer_kv, activations, held).items():
            total = sum(parts.values())
            if tier not in tiers or total > tiers[tier]["needed_bytes"]:
                tiers[tier] = {"needed_bytes": total, "available_bytes": _available(hw, tier), "holds": parts}
                worst_stage[tier] = stage
    for tier, row in tiers.items():
        row["fits"] = row["needed_bytes"] <= row["available_bytes"]
        row["stage"] = worst_stage[tier]
    over = sorted((t for t in tiers.values() if not t["fits"]), key=lambda t: t["available_bytes"] - t["needed_bytes"])
    worst = over[0] if over else tiers.get(setup.store, {"needed_bytes": 0, "available_bytes": _available(hw, setup.store)})
    return {"weights_bytes": weights, "kv_bytes": per_layer_kv * setup.layers_per_stage,
            "activation_bytes": activations, "needed_bytes": worst["needed_bytes"],
            "available_bytes": worst["available_bytes"], "fits": not over, "tiers": tiers}


def _stage_needs(setup: RunSetup, stage: int, batch: int, per_layer_kv: int, activations: int,
                 held: StageWeights) -> dict[str, dict[str, int]]:
    """What one chip of ``stage`` holds, by tier and by what it is (``held``: its weight bytes,
    sim.lowering.decode.stage_weight_bytes)."""
    hw = setup.hardware
    weights_place, experts_place, kv_place = hw.place("weights"), hw.place("experts"), hw.place("kv")
    attn_units = sum(1 for _, part in setup.stage_units(stage) if part == "attn")
    need: dict[str, dict[str, int]] = {}

    def hold(tier: str, what: str, size: int) -> None:
        if size:
            need.setdefault(tier, {})[what] = need.get(tier, {}).get(what, 0) + size

    hold(weights_place.tier, "weights", held.dense)
    if weights_place.mode == "streamed":
        staged = [size for size in largest_staged_reads(setup, stage) if size <= staging_limit(setup)]
        hold(weights_place.buffer, "weight staging buffers", 2 * max(staged, default=0))
    hold(experts_place.tier, "expert weights", held.experts)
    if experts_place.mode == "streamed" and setup.moe is not None:
        per_op = _expert_staging_bytes(setup, batch, held.largest_experts)
        if per_op <= staging_limit(setup):  # larger expert sets stream through (sim.lowering.placement)
            hold(experts_place.buffer, "expert staging buffers", 2 * per_op)
    hold(kv_place.tier, "kv cache", per_layer_kv * attn_units)
    if setup.moe is not None and setup.moe.pinned_bytes:  # experts the MoE plan pins in on-chip SRAM
        stage_moe = sum(1 for layer, part in setup.stage_units(stage) if part == "ffn" and setup.is_moe_layer(layer))
        hold(setup.moe.sram_level, "pinned experts", setup.moe.pinned_bytes * stage_moe // len(setup.moe.moe_index))
    hold(setup.store, "activations", activations)
    return need


def _expert_staging_bytes(setup: RunSetup, batch: int, largest: int) -> int:
    """The expert weights one MoE op of the stage stages: its share of the active experts
    (``largest``: the most expert weight bytes of one of the stage's units)."""
    moe = setup.model.moe
    active = min(moe.experts, batch * moe.top_k)
    return math.ceil(largest * active / moe.experts)


def kv_layer_bytes(setup: RunSetup, tokens: int) -> int:
    """KV-cache bytes one sequence of ``tokens`` tokens holds in one layer on one chip: its
    format's footprint (sim.formats). The one KV footprint of capacity, serving and reports."""
    return setup.kv.kv_footprint(tokens, setup.k_width, setup.v_width)


def kv_bytes(setup: RunSetup, tokens: int) -> int:
    """KV-cache bytes one sequence of ``tokens`` tokens holds on the fullest chip: its
    format's footprint per layer times the layers whose attention that chip's stage holds."""
    return kv_layer_bytes(setup, tokens) * setup.layers_per_stage


def kv_pool_bytes(setup: RunSetup, cap: dict) -> int:
    """Bytes the KV cache's tier has left for it on the fullest chip once everything else the
    placement puts there is held (``cap`` from ``capacity``)."""
    row = cap["tiers"].get(setup.hardware.place("kv").tier)
    if row is None:
        return 0
    other = sum(size for what, size in row["holds"].items() if what != "kv cache")
    return int(row["available_bytes"] - other)


def no_kv_room(setup: RunSetup, cap: dict) -> str:
    """Why ``kv_pool_bytes`` leaves the KV cache nothing: what the KV cache's tier holds per
    chip and what the placement already puts there (``cap`` from ``capacity``)."""
    tier = setup.hardware.place("kv").tier
    row = cap["tiers"].get(tier)
    if row is None:
        return f"no memory is left for the KV cache: the placement gives it no {tier} on this machine"
    held = {what: size for what, size in row["holds"].items() if what != "kv cache"}
    stage = f" (pipeline stage {row['stage']})" if setup.pp > 1 else ""
    return (f"no memory is left for the KV cache: {tier} holds {_size(row['available_bytes'])} per chip{stage} "
            f"and {' + '.join(f'{what} {_size(size)}' for what, size in held.items())} already take "
            f"{_size(sum(held.values()))} ({setup.model.name} on {setup.hardware.name}, tp {setup.tp} x pp {setup.pp})")


def _available(hw, tier: str) -> float:
    """What a tier offers one chip: the whole of an off-chip tier or of the home tier, the
    resident share of an on-chip SRAM level."""
    level = hw.level(tier)
    if level is hw.store or not hasattr(level, "resident_bytes"):
        return level.capacity_bytes
    return level.resident_bytes


# -- simulation ------------------------------------------------------------------------------


@dataclass
class RunResult:
    summary: dict
    steps: list[dict] = field(default_factory=list)
    ops: list[dict] = field(default_factory=list)
    log: list[Span] = field(default_factory=list)
    resolved: RunSetup | None = None

    def tables(self):
        """(per-step, per-op, event log) as pandas DataFrames."""
        import pandas as pd

        return pd.DataFrame(self.steps), pd.DataFrame(self.ops), pd.DataFrame(self.log, columns=list(LOG_COLUMNS))


class _Step:
    """The runner's state between steps: the last graph, its op costs, their durations alone
    (``total_ns``) and the op counts."""

    __slots__ = ("graph", "costs", "durations", "keys")

    def __init__(self, graph, costs, durations, keys):
        self.graph, self.costs, self.durations, self.keys = graph, costs, durations, keys


def simulate(spec: RunSpec | dict | None = None, *, keep_ops: bool = False, keep_log: bool = False,
             check_capacity: bool = True, **fields) -> RunResult:
    """Run a spec (or keyword fields of one) and return its RunResult. With
    ``check_capacity=False`` a setup that does not fit is simulated anyway (for speed
    benchmarks and what-ifs); its summary still carries the capacity figures."""
    if spec is None:
        spec = validate(RunSpec, fields, "simulate()")
    elif isinstance(spec, dict):
        spec = validate(RunSpec, spec, "spec")
    wall = time.perf_counter()
    setup = resolve(spec)
    cap = capacity(setup)
    base = _identity(setup, cap)
    if not cap["fits"] and check_capacity:
        base.update(_does_not_fit(setup, cap), wall_s=time.perf_counter() - wall)
        return RunResult(base, resolved=setup)

    stepper = Stepper(setup, keep_log=keep_log, moments=keep_ops)
    costs = stepper.costs
    ledger = Ledger(costs)
    step_rows, op_rows, log = [], [], []
    events = 0
    joules = EnergyModel(setup.hardware, setup.tp, setup.pp) if setup.hardware.energy is not None else None
    step_joules = []
    for position, step in enumerate(setup.steps):
        graph, state, outcome = stepper.step(step.contexts, step.index, position)
        if position == 0 and not stepper.des:
            base.update(_analytic_note(graph))
        events += outcome.events
        sums = ledger.graph_sums_from(state.keys, state.costs)
        breakdown = ledger.step_breakdown(sums, outcome)
        step_rows.append(_step_row(setup, step, graph, outcome, sums, breakdown))
        if joules is not None:
            step_joules.append(joules.step(state.keys, state.costs, breakdown, outcome.time_ns, step.batch))
            step_rows[-1]["energy_J"] = step_joules[-1].total_J
        if keep_ops:
            op_rows.extend(ledger.op_table(graph, state.costs, outcome))
        if keep_log:
            log.extend(outcome.log)
    base.update(_summary(setup, step_rows, events, time.perf_counter() - wall))
    if joules is not None:
        base["energy"] = summarize(step_joules, joules.power_limit_W)
    return RunResult(base, step_rows, op_rows, log, setup)


class Timed(NamedTuple):
    """One step as a ``Stepper`` timed it: its graph, the op costs and counts (``_Step``; the
    stepper's own, updated in place by its next step) and the engine's outcome."""

    graph: OpGraph
    state: _Step
    outcome: object


class Stepper:
    """The one runner API: times the steps of one configuration (a sealed RunSetup) one after
    another. The op graph is lowered and costed once; each step lowers and costs again only
    what changed (``GraphCache``: attention through the contexts, each MoE layer's block
    through its expert loads; ``_advance``: only the changed ops' costs and counts), then runs
    the DES or the analytic model (``setup.spec.engine``). ``incremental=False`` lowers and
    costs every step in full: the reference the incremental path equals step by step."""

    def __init__(self, setup: RunSetup, costs: CostModel | None = None, *, incremental: bool = True,
                 keep_log: bool = False, moments: bool = False):
        self.setup = setup
        self.costs = costs if costs is not None else cost_model(setup.hardware, setup.stack)
        self.graphs = GraphCache(setup, incremental)
        self.incremental = incremental
        self.des = setup.spec.engine == "des"
        self.keep_log, self.moments = keep_log, moments
        self.state: _Step | None = None

    def step(self, contexts: tuple[int, ...], index: int = 0, position: int = 0,
             prefill: tuple[tuple[int, int], ...] = (), counts: tuple[tuple, ...] | None = None) -> Timed:
        """Time the step that decodes a token for each sequence of ``contexts`` (its cache
        length once this step's token is appended) and processes a prompt chunk for each
        ``(chunk tokens, tokens cached before it)`` of ``prefill``; ``index``: the step's number,
        ``position``: its place in the run (the MoE routing row); ``counts``: per MoE layer in
        program order, its expert loads where the caller has them (``setup.moe.counts``'s tuples)."""
        graph = self.graphs.lower(contexts, index, position, prefill, counts)
        state = self.state = _advance(self.state, graph, self.costs, self.graphs.changed)
        costs, setup = self.costs, self.setup
        if self.des:
            outcome = Simulation(graph, state.costs, costs.capacity, costs.host, setup.graph, log=self.keep_log,
                                 durations=state.durations, moments=self.moments).run()
        else:
            outcome = analyse(graph, state.costs, costs.host, setup.graph, state.durations, moments=self.moments)
        return Timed(graph, state, outcome)


TAIL_OPS = frozenset({"final_norm", "lm_head", "logit_softcap", "argmax", "gather_tokens"})  # ops at M = logit rows
ATTENTION_OPS = frozenset({"attention", "attention_prefill"})
CHAIN_TOLERANCE = 1e-9  # relative: a chain's parts (or the fast path) against its analysed time


class ChainSteps:
    """Step times without a step's graph, for a configuration whose step is one chain of ops
    (a captured graph, one stream per stage, nothing staged on a second stream; a serving
    replay's ~10^5-10^6 steps an hour, a search's screen). Its time under the analytic model
    is then the graph launch and final sync plus the sum of its ops' times, so

        step_ns = fixed + body(rows) + tail(logit rows) + sum over attention kinds of
                  (its layers x decode attention(contexts) [+ prefill attention(chunks)])
                  + sum over MoE layers of the layer's block(rows, its counts)

    where the body is every op but attention, the LM head's tail and the MoE blocks, and
    depends only on the token rows (decode rows + prompt-chunk tokens); the tail only on the
    rows that produce logits. ``body`` and ``tail`` are learned, per row count, from one
    lowering and analysis of that many decodes (``learn``); attention is lowered per step
    through the ``Stepper``'s GraphCache (one op per kind) and costed without the cost memo (a
    step's contexts seldom recur); an MoE layer's block is lowered once per (stage, rows,
    counts) and its ops' times summed (memoized). Exact up to float rounding (the sum's
    order); ``chain`` says why a configuration is not one chain (None when it is), and the
    first learning checks the decomposition against the analysed time."""

    def __init__(self, stepper: Stepper):
        self.stepper = stepper
        self.setup = setup = stepper.setup
        self.costs = stepper.costs
        self.graphs = stepper.graphs
        self.chain = _not_a_chain(setup)
        self._fixed: float | None = None
        self._body: dict[int, float] = {}
        self._tail: dict[int, float] = {}
        self._kinds: tuple[tuple[int, int], ...] = ()  # per attention kind: (a layer of it, its op count)
        # MoE layers in program order: (layer, stage)
        self._moe = tuple(sorted(self.graphs.moe_stages.items(), key=lambda item: (item[1], item[0])))
        self._blocks: dict[tuple, float] = {}  # (stage, rows, counts) -> the block's time
        self.learned = 0

    def time_ns(self, decode_contexts: tuple[int, ...], prefill: tuple[tuple[int, int], ...] = (),
                counts: tuple[tuple, ...] | None = None) -> float:
        """The step's time (see the class docstring); ``counts``: per MoE layer (in program
        order) its expert loads as ``setup.moe.counts`` gives them (default: the plan's at
        position 0)."""
        rows = len(decode_contexts) + sum(chunk for chunk, _ in prefill)
        logits = len(decode_contexts) + len(prefill)
        body, tail = self._body.get(rows), self._tail.get(logits)
        if body is None or tail is None:
            self.learn(rows, logits)
            body, tail = self._body[rows], self._tail[logits]
        total = self._fixed + body + tail + self.attention_ns(decode_contexts, prefill)
        if self._moe:
            total += self.moe_ns(rows, counts)
        return total

    def attention_ns(self, decode_contexts: tuple[int, ...], prefill: tuple[tuple[int, int], ...] = ()) -> float:
        """All the attention ops of a step (every layer), without its other ops."""
        if not self._kinds:
            self.learn(1, 1)
        cost, graphs, total = self.costs.cost_once, self.graphs, 0.0
        prefill_ns = cost(graphs.prefill_attention(prefill).work).total_ns if prefill else 0.0
        for layer, n in self._kinds:
            if decode_contexts:
                total += n * cost(graphs.attention(decode_contexts, layer).work).total_ns
            total += n * prefill_ns
        return total

    def moe_ns(self, rows: int, counts: tuple[tuple, ...] | None = None) -> float:
        """The MoE blocks of a step of ``rows`` token rows, each layer at its ``counts``."""
        blocks, total = self._blocks, 0.0
        if counts is None:
            counts = tuple(self.setup.moe.counts(0, layer) for layer, _stage in self._moe)
        for (layer, stage), n in zip(self._moe, counts, strict=True):
            key = (stage, rows, n)
            t = blocks.get(key)
            if t is None:
                if len(blocks) >= MOE_BLOCK_TIMES:
                    blocks.clear()
                block = self.graphs.block(stage, layer, rows, 0, n)
                t = blocks[key] = sum([self.costs.cost(asked.work).total_ns for asked in block.asked])
            total += t
        return total

    def parts_ns(self, rows: int) -> tuple[float, float, float]:
        """(fixed, body, tail) of a step of ``rows`` token rows that all produce logits."""
        if rows not in self._body or rows not in self._tail:
            self.learn(rows, rows)
        return self._fixed, self._body[rows], self._tail[rows]

    def learn(self, rows: int, logits: int) -> None:
        """Body of ``rows`` and tail of ``logits`` token rows from lowerings of that many
        decodes (at context 1, step position 0) and their analysis; the first also gives the
        fixed part, the attention kinds and the MoE layers. Raises ``SimulationError`` where
        the analysed time is not the sum of the parts (not one chain)."""
        self.learned += 1
        for n in dict.fromkeys((rows, logits)):
            if n in self._body and n in self._tail:
                continue
            graph = lower_step(self.setup, (1,) * n)
            if len(graph.lanes) != graph.stages:
                raise SimulationError(f"{self.setup.model.name}'s step has {len(graph.lanes)} streams on "
                                      f"{graph.stages} stage(s): it is not one chain of ops")
            by_work: dict[int, OpCost] = {}
            op_costs = [by_work.get(id(op.work)) or by_work.setdefault(id(op.work), self.costs.cost(op.work))
                        for op in graph.ops]
            outcome = analyse(graph, op_costs, self.costs.host, self.setup.graph, moments=False)
            if self._fixed is None:
                self._first(graph)
            body, tail, attention, moe = self._parts(graph, op_costs, n)
            fixed = outcome.time_ns - (body + tail + attention + moe)
            if self._fixed is None:
                self._fixed = fixed
            elif not chain_close(fixed, self._fixed):
                raise SimulationError(f"{self.setup.model.name}'s step is not one chain of ops: its time is not "
                                      "the sum of its ops' times")
            self._body[n], self._tail[n] = body, tail

    def _first(self, graph: OpGraph) -> None:
        """The attention kinds of ``graph``: a layer of each and its op count."""
        self._kinds = tuple((kind.layer, len(kind.places)) for kind in attention_kinds(graph, self.setup.model.window))

    def _parts(self, graph: OpGraph, op_costs: list[OpCost], rows: int) -> tuple[float, float, float, float]:
        """(body, tail, attention, MoE blocks) of a lowered decode step of ``rows`` rows."""
        moe_ops = {(layer, name) for layer, stage in self._moe
                   for name in self.graphs.block(stage, layer, rows, 0).names}
        body = tail = attention = moe = 0.0
        for op, cost in zip(graph.ops, op_costs, strict=True):
            t = cost.total_ns
            if op.name in ATTENTION_OPS:
                attention += t
            elif op.layer == -1 and op.name in TAIL_OPS:
                tail += t
            elif (op.layer, op.name) in moe_ops:
                moe += t
            else:
                body += t
        return body, tail, attention, moe


MOE_BLOCK_TIMES = 1 << 16  # MoE block times kept per ChainSteps


def _not_a_chain(setup: RunSetup) -> str | None:
    """Why a step of ``setup`` is not one chain of ops under the analytic model (None: it is)."""
    if not setup.graph:
        return "eager launch: the host's issue times, not only the ops, decide the step time"
    if setup.spec.microbatches > 1:
        return "micro-batches: the step is several chains of ops"
    if plan_of(setup).staged:
        return "weights staged into SRAM on a second stream: the step is not one chain of ops"
    return None


def chain_close(a: float, b: float) -> bool:
    """Whether two step times agree within ``CHAIN_TOLERANCE`` (float rounding of a sum's order)."""
    return math.isclose(a, b, rel_tol=CHAIN_TOLERANCE, abs_tol=CHAIN_TOLERANCE * max(abs(a), abs(b), 1.0))


def _advance(state: _Step | None, graph, costs: CostModel, changed) -> _Step:
    """The op costs and distinct-op counts of ``graph``: the previous step's updated (in place)
    where the graph cache says which ops changed (``changed``: sim.lowering.cache.Change
    records), else afresh."""
    if state is None or changed is None:
        return _afresh(graph, costs)
    ops = graph.ops
    # the last step's lists, updated in place: nothing reads a step's costs once the next is timed
    op_costs, durations, keys = state.costs, state.durations, state.keys
    net: dict[tuple, int] = {}  # op key -> change in its count
    holder: dict[tuple, int] = {}  # op key -> an op of the new graph that has it
    for change in changed:
        # unchanged work keeps its cost; a new one (a step's attention) is not memoised
        cost = op_costs[change.places[0]] if change.work == change.before else costs.cost_once(change.work)
        total = cost.total_ns
        for idx in change.places:
            op_costs[idx] = cost
            durations[idx] = total
        old_key, new_key = (change.before, *change.rows), (change.work, *change.rows)
        net[old_key] = net.get(old_key, 0) - len(change.places)
        net[new_key] = net.get(new_key, 0) + len(change.places)
        holder[new_key] = change.places[-1]
    for key, delta in net.items():
        if delta:
            _count(keys, key, ops, delta, holder.get(key))
    return _Step(graph, op_costs, durations, keys)


_TOTAL_NS = attrgetter("total_ns")


def _afresh(graph, costs: CostModel) -> _Step:
    """The op costs and distinct-op counts of ``graph`` from its ops (a run of copies,
    ``graph.repeats``, taken from the span it copies: its ops ask that span's works)."""
    ops = graph.ops
    if isinstance(ops, ReworkedOps):
        return _afresh_reworked(graph, costs)
    keys: dict[tuple, list] = {}  # in first-use order, each with its last op
    op_costs: list[OpCost] = []
    cost_of: dict[int, OpCost] = {}  # id of a Work -> its cost (the ops of a layer share their works)
    at = 0
    for repeat in graph.repeats:
        _tally(keys, op_costs, cost_of, costs, ops, at, repeat.start)
        moved = repeat.count * repeat.length  # the span's op in the last copy
        for op in ops[repeat.start - repeat.length:repeat.start]:
            entry = keys[op_key(op)]
            entry[0] += repeat.count
            entry[1] = ops[op.idx + moved]
        op_costs.extend(op_costs[repeat.start - repeat.length:repeat.start] * repeat.count)
        at = repeat.end
    _tally(keys, op_costs, cost_of, costs, ops, at, len(ops))
    return _Step(graph, op_costs, list(map(_TOTAL_NS, op_costs)), keys)


def _afresh_reworked(graph, costs: CostModel) -> _Step:
    """``_afresh`` of a re-lowered graph: the same costs and counts, in the same order, from its
    lowered ops and the works some ask instead (``ReworkedOps.parts``), building only the op
    each distinct key keeps."""
    ops = graph.ops
    base, changed = ops.parts()
    keys: dict[tuple, list] = {}  # in first-use order, each with its last op's index
    op_costs: list[OpCost] = []
    cost_of: dict[int, OpCost] = {}

    def key_of(i: int) -> tuple:
        op, new = base[i], changed.get(i)
        return (op.work if new is None else new[0], op.row, op.compute_row)

    def tally(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            key = key_of(i)
            entry = keys.get(key)
            if entry is None:
                keys[key] = [1, i]
            else:
                entry[0] += 1
                entry[1] = i
            work = key[0]
            cost = cost_of.get(id(work))
            if cost is None:
                cost = cost_of[id(work)] = costs.cost(work)
            op_costs.append(cost)

    at = 0
    for repeat in graph.repeats:
        tally(at, repeat.start)
        moved = repeat.count * repeat.length
        for i in range(repeat.start - repeat.length, repeat.start):
            entry = keys[key_of(i)]
            entry[0] += repeat.count
            entry[1] = i + moved
        op_costs.extend(op_costs[repeat.start - repeat.length:repeat.start] * repeat.count)
        at = repeat.end
    tally(at, len(ops))
    return _Step(graph, op_costs, list(map(_TOTAL_NS, op_costs)), {key: [n, ops[i]] for key, (n, i) in keys.items()})


def _tally(keys: dict, op_costs: list, cost_of: dict, costs: CostModel, ops, lo: int, hi: int) -> None:
    """Count ops ``lo .. hi-1`` into ``keys`` (op key -> [count, its last op]) and append their costs."""
    for i in range(lo, hi):
        op = ops[i]
        key = op_key(op)
        entry = keys.get(key)
        if entry is None:
            keys[key] = [1, op]
        else:
            entry[0] += 1
            entry[1] = op
        cost = cost_of.get(id(op.work))
        if cost is None:
            cost = cost_of[id(op.work)] = costs.cost(op.work)
        op_costs.append(cost)


def _count(keys: dict, key: tuple, ops, delta: int, idx: int | None = None) -> None:
    """Add ``delta`` ops of ``key`` (``idx``: an op that has it) to ``keys``: key -> [count, op]."""
    entry = keys.get(key)
    if entry is None:
        keys[key] = [delta, ops[idx]]
        return
    entry = keys[key] = [entry[0] + delta, entry[1] if idx is None else ops[idx]]
    if entry[0] == 0:
        del keys[key]


def _step_row(setup: RunSetup, step, graph, outcome, sums, breakdown) -> dict:
    by_category, by_level = sums.by_category, sums.by_level
    return {
        "step": step.index, "batch": step.batch, "mean_context": sum(step.contexts) / step.batch,
        "max_context": max(step.contexts), "time_ns": outcome.time_ns, "events": outcome.events,
        "store_bytes": by_level.get(setup.store, 0),
        "weight_bytes": by_category.get("weights", 0) + by_category.get("expert", 0),
        "kv_bytes": by_category.get("kv", 0), "outlier_bytes": by_category.get("outliers", 0),
        "link_bytes": by_level.get("link", 0), "flops": sums.flops, "kernels": sums.kernels,
        "ops": len(graph.ops), **{f"ms_{k}": ns_to_ms(v) for k, v in breakdown.items()},
    }


def _does_not_fit(setup: RunSetup, cap: dict) -> dict:
    floor_ms = ns_to_ms((cap["weights_bytes"] + cap["kv_bytes"]) / setup.hardware.store.peak_GBps)
    over = [(name, t) for name, t in cap["tiers"].items() if not t["fits"]]
    parts = []
    for name, t in over:
        holds = " + ".join(f"{what} {_size(size)}" for what, size in t["holds"].items())
        stage = f" (pipeline stage {t['stage']})" if setup.pp > 1 else ""
        parts.append(f"{name} overflows by {_size(t['needed_bytes'] - t['available_bytes'])} per chip{stage}: "
                     f"needs {_size(t['needed_bytes'])} ({holds}), holds {_size(t['available_bytes'])}")
    return dict(verdict="does-not-fit", meets_target=False, bound="capacity", byte_floor_ms=floor_ms,
                per_token_ms_p50=None, per_token_ms_p99=None, overflowing_tiers=[name for name, _ in over],
                reason="; ".join(parts) + f"; even if it fit, reading weights and KV once at peak bandwidth takes "
                f"{floor_ms:.3g} ms per step")


def _size(n: float) -> str:
    return f"{n / GB:.2f} GB" if n >= GB else f"{n / MB:.1f} MB"


def _identity(setup: RunSetup, cap: dict) -> dict:
    spec = setup.spec
    return {
        "hardware": setup.hardware.name, "model": setup.model.name, "weights": spec.weights, "kv": spec.kv,
        "batch": max(s.batch for s in setup.steps), "context": spec.context if not spec.trace else None,
        "trace": spec.trace, "steps": len(setup.steps), "engine": spec.engine, "graph": setup.graph,
        "tp": setup.tp, "pp": setup.pp, "chips": setup.hardware.chips, "software": spec.software if "software" in spec.model_fields_set else setup.software,
        "target_ms": spec.target_ms, "capacity": cap, "kernel_costs": kernel_costs_origin(setup.hardware),
        "placement": {what: dict(_dumped(setup.hardware.place(what))) for what in ("weights", "experts", "kv")},
        **_software_note(setup), **_moe_note(setup),
    }


@lru_cache(maxsize=64)
def _dumped(place) -> dict:
    """A Place as its fields (it is frozen, and the same few are asked by every run)."""
    return place.model_dump()


def _analytic_note(graph) -> dict:
    """A note when the analytic engine times streams that share a stage: it lets each use every
    link alone, so its time is the contention-free bound (bandwidth above peak is possible)."""
    per_stage = Counter(stage for stage, _stream in graph.streams)
    shared = sorted(stage for stage, n in per_stage.items() if n > 1)
    if not shared:
        return {}
    return {"engine_note": f"the analytic engine lets the {per_stage[shared[0]]} streams of stage {shared[0]} "
                           "(micro-batches or side streams) each use every link alone: its time is the "
                           "contention-free bound, not a prediction; --engine des shares the links"}


def _software_note(setup: RunSetup) -> dict:
    """A note when the run's stack is not the one the profile says its machine runs."""
    native = setup.hardware.software
    if native is None or native == setup.software:
        return {}
    return {"software_note": f"{setup.hardware.name} runs {native} programs; the {setup.software} stack's kernels "
                             f"are another machine's (pass --software {native})"}


MOE_FIELDS = ("dispatch", "placement", "routing", "routing_skew", "routing_locality", "sram_experts")  # RunSpec's MoE group
_MOE_DEFAULTS = tuple((name, RunSpec.model_fields[name].default) for name in MOE_FIELDS)  # read once: pydantic builds them


def _moe_note(setup: RunSetup) -> dict:
    """A note when a run asks for MoE dispatch or routing other than the defaults for a model
    without MoE layers (accepted, as a study sweeps them over dense and MoE models alike, but
    they change nothing there)."""
    spec = setup.spec
    given = [name for name, default in _MOE_DEFAULTS if getattr(spec, name) != default]
    if setup.model.moe is not None or not given:
        return {}
    verb = "changes" if len(given) == 1 else "change"
    return {"moe_note": f"{setup.model.name} has no Mixture-of-Experts layers: {', '.join(given)} {verb} nothing"}


def _summary(setup: RunSetup, rows: list[dict], events: int, wall_s: float) -> dict:
    # sums over the steps through lists, not generators (a run's rows are summed once each)
    times = [ns_to_ms(r["time_ns"]) for r in rows]
    p50, p99 = percentile(times, 50), percentile(times, 99)
    keys = sorted(k for k in set().union(*rows) if k.startswith("ms_"))
    breakdown = {k[3:]: sum([r.get(k, 0.0) for r in rows]) / len(rows) for k in keys}
    mean_time = sum(times) / len(times)
    tokens = sum([r["batch"] for r in rows])
    store_bytes = sum([r["store_bytes"] for r in rows])
    peak = setup.hardware.store.peak_GBps
    achieved = store_bytes / (sum([r["time_ns"] for r in rows]))  # bytes/ns == GB/s
    target = setup.spec.target_ms
    meets = p99 <= target
    return {
        "per_token_ms_p50": p50, "per_token_ms_p99": p99, "per_token_ms_mean": mean_time,
        "meets_target": meets, "verdict": "meets-target" if meets else "misses-target",
        "margin_ms": target - p99, "bound": bound_of(breakdown), "breakdown_ms": breakdown,
        "hbm_bytes_per_token": store_bytes / len(rows),  # per decode step: every sequence gets a token
        "weight_bytes_per_token": sum([r["weight_bytes"] for r in rows]) / len(rows),
        "kv_bytes_per_token": sum([r["kv_bytes"] for r in rows]) / len(rows),
        "hbm_achieved_GBps": achieved, "hbm_peak_GBps": peak, "hbm_fraction_of_peak": achieved / peak,
        "throughput_tokens_per_s": MS_PER_S * tokens / sum(times), "events": events, "wall_s": wall_s,
        "byte_floor_ms": ns_to_ms(store_bytes / len(rows) / peak),
        "batch_over_time": [r["batch"] for r in rows] if setup.spec.trace else None,
        **_moe_summary(setup),
    }


def _moe_summary(setup: RunSetup) -> dict:
    plan = setup.moe
    if plan is None:
        return {}
    pl = plan.placement
    return {"moe": {
        "dispatch": plan.dispatch, "placement": pl.policy, "routing": plan.trace.description,
        "expert_parallel": plan.ep, "sram_level": plan.sram_level, "sram_slots": pl.slots,
        "sram_hit_rate": pl.hit_rate, "active_experts_per_layer": float(pl.active.mean()),
        "resident_experts_per_layer": float(pl.resident.mean()),
    }}
