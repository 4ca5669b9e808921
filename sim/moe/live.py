"""Routing of a live batch, step by step: expert loads for a serving replay.

A serving replay's batch changes every step and an hour is 10^5-10^6 steps, so the routing
trace a ``run`` draws up front (sim.moe.routing: every token of every step) does not fit it.
``LiveRouting`` answers per step, from the step's token rows alone: per MoE layer the tokens
each expert receives (``loads``), and from them, per expert-parallel rank (expert e on rank
e mod ranks, as ``placement: spread``), the distinct experts and token-expert pairs, the
critical (most loaded) rank's figures as the lowering's ``counts`` tuple, and a rank of the
mean load's (for the straggler's share of the step).

Routing models, all seeded and deterministic:

* ``uniform`` and ``zipf`` (skew s; per-layer hot experts, as sim.moe.routing generates
  them): each token picks k distinct experts by successive sampling without replacement
  (drawn with replacement, repeats drawn again: the same distribution as Gumbel top-k).
  Counts, not tokens: loads of 2^j tokens are kept as a pool of draws per power of two
  (``POOL_DRAWS`` each; exact draws up to ``EXACT_TOKENS`` tokens, above that the sum of two
  independent draws of half as many), and a step of T tokens sums one random draw per set
  bit of T, per layer. Every step's loads are thus a sum of independent exact draws, whose
  distribution is that of T tokens routed independently; draws are reused across steps (a
  pool, not fresh randomness), which narrows the spread of an hour's mean a little, not its
  expectation.
* ``locality`` (probability p): with probability p a layer keeps the previous step's loads
  when the step has as many tokens as the one before (consecutive tokens repeating experts,
  anchors.md B2). With placements that hold no state between steps (all-hbm, spread) this
  only correlates steps; each step's distribution is unchanged.
* a routing trace (``trace``, sim.moe.routing.RoutingTrace, read from a file): the step's
  tokens are the next T token slots of the trace, taken in order through its steps and
  layers (wrapping around).

What is ignored: routing that depends on the request (a sequence's own experts), capacity
factors and token dropping, caches of experts (lru/lfu) and static pinning in serving.

The ``counts`` tuple is the one ``sim.moe.plan.MoEPlan.counts`` returns and
``sim.lowering.moe.lower_moe`` reads: (active, resident, fetched, pairs, resident_pairs)
with nothing resident (experts read from the home tier every step).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from sim.moe.placement import Placement
from sim.moe.plan import MoEPlan
from sim.moe.routing import KINDS, RoutingTrace

POOL_DRAWS = 32  # draws of each power-of-two token count kept
EXACT_TOKENS = 64  # up to this many tokens a pool's draws route every token; above, sums of two halves


class StepLoads(NamedTuple):
    """One step's expert loads over the MoE layers (in layer order)."""

    counts: tuple[tuple[int, int, int, int, int], ...]  # per layer: the critical rank's counts
    mean_counts: tuple[tuple[int, int, int, int, int], ...]  # per layer: a rank of the mean load's
    rank_pairs: np.ndarray  # [layers, ranks] token-expert pairs each rank computes


class LiveRouting:
    """Per-step expert loads of a live batch (see the module docstring)."""

    def __init__(self, experts: int, top_k: int, layers: int, *, kind: str = "uniform", skew: float = 1.0,
                 locality: float = 0.0, seed: int = 0, ranks: int = 1, trace: RoutingTrace | None = None):
        if trace is None and kind not in KINDS:
            raise ValueError(f"routing kind {kind!r}: expected one of {', '.join(KINDS)} or a routing trace")
        self.experts, self.top_k, self.layers, self.ranks = experts, top_k, layers, ranks
        self.locality = locality
        self.trace = trace
        self.description = (f"trace {trace.description}" if trace is not None else kind
                            + (f" s={skew:g}" if kind == "zipf" else "")
                            + (f" locality={locality:g}" if locality else "")) + f", seed {seed}"
        self._seed = seed
        self._rng = np.random.default_rng([seed, 1])  # the per-step choices
        popularity = np.ones((layers, experts))
        if kind == "zipf" and trace is None:
            order = np.random.default_rng([seed, 2])
            ranked = 1.0 / np.arange(1, experts + 1, dtype=np.float64) ** skew
            popularity = np.stack([ranked[order.permutation(experts)] for _ in range(layers)])
        cdf = np.cumsum(popularity / popularity.sum(axis=1, keepdims=True), axis=1)
        cdf[:, -1] = 1.0
        self._cdf = (cdf + np.arange(layers)[:, None]).ravel()  # layer l's CDF shifted by l: one sorted array
        self._pools: dict[int, np.ndarray] = {}  # 2^j -> [POOL_DRAWS, layers, experts] loads
        self._stacked = np.zeros((0, POOL_DRAWS, layers, experts), dtype=np.int64)  # the pools 2^0, 2^1, ...
        self._layer_index = np.arange(layers)[None, :]
        self._cursor = 0  # the next token slot of the trace
        self._last: tuple[int, np.ndarray] | None = None  # (tokens, loads) of the step before

    # -- loads ----------------------------------------------------------------------------------
    def loads(self, tokens: int) -> np.ndarray:
        """[layers, experts] tokens routed to each expert in a step of ``tokens`` token rows."""
        if self.trace is not None:
            out = self._from_trace(tokens)
        else:
            bits = [bit for bit in range(tokens.bit_length()) if tokens >> bit & 1]
            if bits[-1] >= len(self._stacked):
                self._stack(bits[-1])
            draws = self._rng.integers(POOL_DRAWS, size=(len(bits), self.layers))
            out = self._stacked[np.asarray(bits)[:, None], draws, self._layer_index].sum(axis=0)
        last = self._last
        if self.locality > 0 and self.trace is None and last is not None and last[0] == tokens:
            keep = self._rng.random(self.layers) < self.locality
            out[keep] = last[1][keep]
        self._last = (tokens, out)
        return out

    def step(self, tokens: int) -> StepLoads:
        """The step's loads as the lowering's counts per layer, per rank (see ``StepLoads``)."""
        return _per_rank(self.loads(tokens), self.ranks)

    def _stack(self, top: int) -> None:
        """The pools of 2^0 .. 2^top tokens as one array [top + 1, POOL_DRAWS, layers, experts]."""
        self._stacked = np.stack([self._pool(1 << bit) for bit in range(top + 1)])

    def _pool(self, n: int) -> np.ndarray:
        """Draws of the loads of ``n`` tokens (a power of two), made the first time they are asked."""
        pool = self._pools.get(n)
        if pool is None:
            rng = np.random.default_rng([self._seed, 3, n])
            if n <= EXACT_TOKENS:
                pool = self._exact(rng, n)
            else:
                half = self._pool(n // 2)
                a, b = rng.integers(len(half), size=(2, POOL_DRAWS))
                pool = half[a] + half[b]
            self._pools[n] = pool
        return pool

    def _exact(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """[POOL_DRAWS, layers, experts] loads of ``n`` tokens, each token's k distinct experts
        drawn by successive sampling (repeats of an earlier pick drawn again)."""
        d, layers, k, e = POOL_DRAWS, self.layers, self.top_k, self.experts
        shift = np.arange(layers)[None, :, None]
        picks = np.empty((d, layers, n, k), dtype=np.int64)
        for j in range(k):
            col = self._draw(rng, (d, layers, n), shift)
            while True:
                repeat = (picks[..., :j] == col[..., None]).any(axis=-1)
                if not repeat.any():
                    break
                col[repeat] = self._draw(rng, (d, layers, n), shift)[repeat]
            picks[..., j] = col
        cell = (np.arange(d)[:, None] * layers + np.arange(layers)[None, :]) * e
        return np.bincount((picks + cell[:, :, None, None]).ravel(), minlength=d * layers * e).reshape(d, layers, e)

    def _draw(self, rng: np.random.Generator, shape: tuple, shift: np.ndarray) -> np.ndarray:
        """Experts drawn with replacement by each layer's popularity."""
        at = np.searchsorted(self._cdf, rng.random(shape) + shift, side="right")
        return np.minimum(at - shift * self.experts, self.experts - 1)

    def _from_trace(self, tokens: int) -> np.ndarray:
        """The loads of the trace's next ``tokens`` token slots (through its steps, wrapping)."""
        trace, e = self.trace, self.experts
        out = np.zeros((self.layers, e), dtype=np.int64)
        left = tokens
        while left:
            step, slot = divmod(self._cursor, trace.tokens)
            take = min(left, trace.tokens - slot)
            ids = trace.experts[step % trace.steps, :self.layers, slot:slot + take].reshape(self.layers, -1)
            out += np.bincount((ids + (np.arange(self.layers) * e)[:, None]).ravel(),
                               minlength=self.layers * e).reshape(self.layers, e)
            self._cursor += take
            left -= take
        return out


def fixed_plan(plan: MoEPlan, counts: tuple[tuple, ...]) -> MoEPlan:
    """``plan`` with the expert loads ``counts`` (per MoE layer in layer order, as
    ``plan.counts`` returns them) at step position 0 and no routing drawn: the plan a
    serving replay lowers its steps with (the live routing gives each step's loads)."""
    layers = len(plan.moe_index)
    if len(counts) != layers:
        raise ValueError(f"expert loads for {len(counts)} MoE layers given; the model has {layers}")
    arrays = np.asarray(counts, dtype=np.int64).T[:, None, :]  # [field, 1 step, layers]
    experts = int(arrays[0].max(initial=1))
    stub = RoutingTrace(np.zeros((1, layers, 1, 1), dtype=np.int32), np.ones((1, layers, 1, 1), dtype=np.float32),
                        max(1, experts), "live routing")
    # one rank's figures (the live routing's critical rank): the replay times the balanced rank itself
    placement = Placement("live", 1, 0, *arrays, hits=0, reads=int(arrays[0].sum()))
    return dataclasses.replace(plan, route=lambda: (stub, placement))


def _per_rank(loads: np.ndarray, ranks: int) -> StepLoads:
    """The counts of the critical rank (the first with the most distinct experts, then pairs:
    as sim.moe.placement picks it) and of a rank of the mean load, per layer."""
    layers, e = loads.shape
    if e % ranks:  # pad to whole rounds of ranks (expert e on rank e mod ranks)
        loads = np.concatenate([loads, np.zeros((layers, ranks - e % ranks), dtype=loads.dtype)], axis=1)
    by_rank = loads.reshape(layers, -1, ranks)
    active, pairs = (by_rank > 0).sum(axis=1), by_rank.sum(axis=1)
    if ranks == 1:
        hot_active, hot_pairs = active[:, 0].tolist(), pairs[:, 0].tolist()
        return StepLoads(_counts(hot_active, hot_pairs), _counts(hot_active, hot_pairs), pairs)
    best = np.argmax(active * (int(pairs.max(initial=0)) + 1) + pairs, axis=1)
    rows = np.arange(layers)
    hot_active, hot_pairs = active[rows, best].tolist(), pairs[rows, best].tolist()
    mean_pairs = (2 * pairs.sum(axis=1) + ranks) // (2 * ranks)  # rounded half up
    # a rank with pairs to compute touches at least one expert
    mean_active = np.maximum((2 * active.sum(axis=1) + ranks) // (2 * ranks), mean_pairs > 0).tolist()
    mean_pairs = mean_pairs.tolist()
    return StepLoads(_counts(hot_active, hot_pairs), _counts(mean_active, mean_pairs), pairs)


def _counts(active: list[int], pairs: list[int]) -> tuple[tuple[int, int, int, int, int], ...]:
    """Per layer, the lowering's counts tuple of a rank that touches ``active`` experts with
    ``pairs`` token-expert pairs, none resident."""
    return tuple([(a, 0, 0, n, 0) for a, n in zip(active, pairs)])


__all__ = ["LiveRouting", "StepLoads", "fixed_plan", "POOL_DRAWS", "EXACT_TOKENS"]
