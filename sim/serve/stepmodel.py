"""Step times for the serving replay: the ``StepModel`` protocol and the simulator's model.

The replay (sim.serve.replay) asks one question per step: how long does a forward pass take
that decodes one token for each sequence in ``decode_contexts`` (its cache length once this
step's token is appended, as ``sim.lowering.decode.lower_step`` counts it) and processes one
prompt chunk for each ``(chunk_tokens, context_before_chunk)`` entry of ``prefill``? Any
object with that ``step_ns`` method will do (tests use fakes); ``SimulatorStepModel`` answers
through the runner API (sim.run): ``ChainSteps`` where the step is one chain of ops (the
decomposition ``fixed + body(rows) + tail(logit rows) + attention + MoE blocks``, exact up to
float rounding and checked against the step's graph every ``check_every`` steps), else the
``Stepper`` (each step's graph re-lowered where it changed and analysed).

Mixture-of-Experts models route each step's token rows (decodes and prompt-chunk tokens) by a
live routing model (sim.moe.live.LiveRouting: the run's ``routing``, ``routing_skew``,
``routing_locality`` and ``seed``, given with ``--set``), whose loads per expert-parallel rank
(``--set placement=spread``) give each MoE layer's counts. The model keeps the expert load per
rank and, per step, the share of the MoE blocks' time that the most loaded rank adds over a
rank of the mean load (the straggler), summed over the replay (``moe_figures``). Serving reads
every expert from the home tier: SRAM pinning and expert caches (static with pinned experts,
lru, lfu) are ``run``'s, not modelled per live step.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np

from sim.config.spec import RunSpec
from sim.costs import CostModel
from sim.errors import ConfigError, SimulationError
from sim.lowering.cache import GraphCache
from sim.moe.live import LiveRouting, fixed_plan
from sim.moe.plan import read_routing
from sim.moe.routing import KINDS
from sim.run import ChainSteps, Stepper, chain_close
from sim.setup import RunSetup, resolve

SERVING_PLACEMENTS = ("all-hbm", "static", "spread")  # placements whose live steps are modelled (see the docstring)


class StepModel(Protocol):
    """Anything that can time a mixed decode + prefill step."""

    def step_ns(self, decode_contexts: tuple[int, ...], prefill: tuple[tuple[int, int], ...]) -> float: ...


def serve_resolved(spec: RunSpec) -> RunSetup:
    """The sealed setup for serving under the analytic engine; a Mixture-of-Experts model's
    placement must be one a live step models (``SERVING_PLACEMENTS``)."""
    setup = resolve(spec)
    if setup.moe is not None and setup.spec.placement not in SERVING_PLACEMENTS:
        raise ConfigError("--set", "placement", f"serving replays model placements {', '.join(SERVING_PLACEMENTS)} "
                          "(expert caches carry state across steps a live batch does not keep)",
                          setup.spec.placement)
    return setup


class SimulatorStepModel:
    """Step times from the runner API (sim.run.ChainSteps, else sim.run.Stepper).

    ``exact=True`` times every step through its graph (``Stepper``); the default uses the
    chain decomposition, checked every ``check_every`` steps."""

    def __init__(self, setup: RunSetup, *, exact: bool = False, check_every: int = 4999):
        self.live = _live_routing(setup)
        if self.live is not None:  # the plan's routing is never drawn: every step's loads are the live routing's
            setup = dataclasses.replace(setup, moe=fixed_plan(setup.moe, self.live.step(1).counts))
        self.setup = setup
        self.costs = CostModel(setup.hardware, setup.stack)
        self.stepper = Stepper(setup, self.costs)
        self.chain = ChainSteps(self.stepper)
        self.exact = exact
        self.check_every = check_every
        self.fallback_reason: str | None = None
        self.stats = {"steps": 0, "exact_evaluations": 0, "checks": 0}
        self._rank_pairs = None if self.live is None else np.zeros(self.live.ranks, dtype=np.int64)
        self._last_counts: tuple[tuple, ...] | None = None  # the expert loads of the step just timed
        self._graphs: GraphCache | None = None  # for ``graph``
        self._moe_ns = [0.0, 0.0]  # the MoE blocks' time summed over the steps: (the critical rank's, a mean rank's)
        if self.chain.chain:
            self._fall_back(self.chain.chain)
        elif not exact:
            self._probe()

    # -- the protocol -------------------------------------------------------------------------
    def step_ns(self, decode_contexts: tuple[int, ...], prefill: tuple[tuple[int, int], ...] = ()) -> float:
        self.stats["steps"] += 1
        decode_contexts, prefill = tuple(decode_contexts), tuple(prefill)
        counts = self._loads(len(decode_contexts) + sum(chunk for chunk, _ in prefill))
        if self.exact:
            return self.exact_ns(decode_contexts, prefill, counts)
        try:
            fast = self.chain.time_ns(decode_contexts, prefill, counts)
        except SimulationError as err:  # learning found the step is not one chain
            self._fall_back(str(err))
            return self.exact_ns(decode_contexts, prefill, counts)
        if self.stats["steps"] % self.check_every == 0:
            self.stats["checks"] += 1
            exact = self.exact_ns(decode_contexts, prefill, counts)
            if not chain_close(fast, exact):
                self._fall_back(f"fast step time {fast:.3f} ns differs from the step graph's {exact:.3f} ns")
                return exact
        return fast

    def exact_ns(self, decode_contexts, prefill=(), counts=None) -> float:
        """The step through its graph (re-lowered where it changed, analysed): the reference."""
        self.stats["exact_evaluations"] += 1
        if counts is None and self.live is not None:
            counts = self._loads(len(decode_contexts) + sum(chunk for chunk, _ in prefill))
        return self.stepper.step(tuple(decode_contexts), 0, 0, tuple(prefill), counts).outcome.time_ns

    def graph(self, decode_contexts, prefill=()):
        """The op graph of the step just timed (its expert loads; for an energy sample), lowered
        through a graph cache of its own (the stepper's follows the steps it times)."""
        if self._graphs is None:
            self._graphs = GraphCache(self.setup)
        return self._graphs.lower(tuple(decode_contexts), 0, 0, tuple(prefill), self._last_counts)

    # -- MoE --------------------------------------------------------------------------------------
    def _loads(self, rows: int) -> tuple[tuple, ...] | None:
        """The step's expert loads per MoE layer (None for a dense model), with the per-rank
        figures kept."""
        if self.live is None:
            return None
        loads = self.live.step(rows)
        self._last_counts = loads.counts
        self._rank_pairs += loads.rank_pairs.sum(axis=0)
        self._moe_ns[0] += self.chain.moe_ns(rows, loads.counts)
        if self.live.ranks > 1:
            self._moe_ns[1] += self.chain.moe_ns(rows, loads.mean_counts)
        return loads.counts

    def moe_figures(self, simulated_ns: float) -> dict | None:
        """The replay's expert load per rank (token-expert pairs, all MoE layers and steps), the
        hottest rank's over the mean, and the straggler's share of the simulated time (what the
        most loaded rank's MoE blocks took beyond a rank of the mean load's, their ops' times
        summed; None with one rank)."""
        if self.live is None:
            return None
        pairs = self._rank_pairs
        mean = float(pairs.mean()) if len(pairs) else 0.0
        extra = self._moe_ns[0] - self._moe_ns[1]
        return {"routing": self.live.description, "expert_parallel": self.live.ranks,
                "expert_pairs_per_rank": pairs.tolist(),
                "hottest_rank_over_mean": float(pairs.max()) / mean if mean else None,
                "straggler_share": extra / simulated_ns if simulated_ns and self.live.ranks > 1 else None,
                "moe_blocks_share": self._moe_ns[0] / simulated_ns if simulated_ns and self._moe_ns[0] else None}

    # -- the parts, for the search's screen (sim.search.screen) ---------------------------------
    def parts_ns(self, rows: int) -> tuple[float, float, float]:
        """(fixed, body, tail) of a step of ``rows`` token rows that all produce logits (the
        body with the MoE blocks at one live draw of ``rows`` tokens). Only meaningful while
        ``exact`` is False (the decomposition holds)."""
        self.stats["steps"] += 1
        fixed, body, tail = self.chain.parts_ns(rows)
        if self.live is not None:
            body += self.chain.moe_ns(rows, self.live.step(rows).counts)
        return fixed, body, tail

    def attention_ns(self, decode_contexts, prefill=()) -> float:
        """All attention ops of a step (every layer), without the step's other ops."""
        return self.chain.attention_ns(tuple(decode_contexts), tuple(prefill))

    def _probe(self) -> None:
        """Learn a one-row step's parts now, so that a step found not to be one chain of ops (a
        shared expert on a side stream, deepseek-v3's) makes the model exact before anyone (the
        search's screen) reads the decomposition."""
        try:
            self.chain.parts_ns(1)
        except SimulationError as err:
            self._fall_back(str(err))

    def _fall_back(self, reason: str) -> None:
        if not self.exact:
            self.exact = True
            self.fallback_reason = reason


def _live_routing(setup: RunSetup) -> LiveRouting | None:
    """The live routing of a serving setup's MoE model (None for a dense one): the run's
    routing model or routing file, over its expert-parallel ranks."""
    if setup.moe is None:
        return None
    spec, moe = setup.spec, setup.model.moe
    trace = None if spec.routing in KINDS else read_routing(spec, setup.model, [1])
    return LiveRouting(moe.experts, moe.top_k, len(setup.moe.moe_index),
                       kind=spec.routing if trace is None else "uniform", skew=spec.routing_skew, locality=spec.routing_locality, seed=spec.seed, ranks=setup.moe.ep,
                       trace=trace)


__all__ = ["StepModel", "SimulatorStepModel", "serve_resolved", "SERVING_PLACEMENTS"]
