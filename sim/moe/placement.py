"""Expert placement: where each expert's weights live (HBM or on-chip SRAM), under capacity.

A placement runs over a routing trace once, step by step and layer by layer, and records per
(step, MoE layer) what the critical chip does: how many distinct experts it touches
(``active``), how many of those it reads from SRAM (``resident``), how many it fetches from
HBM into SRAM (``fetched``, cache policies), and how many token-expert pairs it computes
(``pairs``, ``resident_pairs``). ``slots`` is how many experts (or expert shards, when
experts are split tensor-parallel) fit in one chip's SRAM budget.

Policies:

* ``all-hbm``: every expert streams from HBM (no SRAM use);
* ``static``: the hottest (layer, expert) pairs over the trace are pinned, up to ``slots``;
* ``lru`` / ``lfu``: an SRAM cache of ``slots`` experts shared by all layers; a miss reads
  the expert from HBM and writes it into SRAM (the fetch is paid, the eviction is free);
  LFU evicts the least used so far (ties: least recent);
* ``spread``: expert parallelism over ``chips`` chips, expert e on chip e mod chips; each
  chip pins the hottest experts of its own shard up to ``slots``.

With expert parallelism the step waits for the most loaded chip, so the recorded figures
are those of the chip with the most distinct experts in that layer (ties: the most
pairs). The SRAM hit rate is over all chips: experts read from SRAM / experts read.
What is ignored: replication of hot experts (DeepSeek's EPLB), prefetch ahead of use,
partial residency of one expert.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from sim.moe.routing import RoutingTrace

POLICIES = ("all-hbm", "static", "lru", "lfu", "spread")


@dataclass(frozen=True)
class Placement:
    policy: str
    chips: int
    slots: int
    active: np.ndarray  # [steps, layers] on the critical chip
    resident: np.ndarray
    fetched: np.ndarray
    pairs: np.ndarray
    resident_pairs: np.ndarray
    hits: int  # over all chips and the whole run
    reads: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.reads if self.reads else 0.0


def place(trace: RoutingTrace, policy: str, slots: int, batches: list[int], chips: int = 1) -> Placement:
    """Run ``policy`` over the routing of decode steps with ``batches[i]`` tokens at step i
    (step i uses routing step i, wrapping around)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown placement {policy!r}; expected one of {', '.join(POLICIES)}")
    chips = chips if policy == "spread" else 1
    slots = 0 if policy == "all-hbm" else max(0, slots)
    if policy not in ("lru", "lfu"):  # no state carried from step to step: all steps at once
        return _place_stateless(trace, policy, slots, batches, chips)
    steps, layers, e = len(batches), trace.layers, trace.num_experts
    shape = (steps, layers)
    active, resident, fetched, pairs, rpairs = (np.zeros(shape, dtype=np.int64) for _ in range(5))
    owner = np.arange(e) % chips
    pinned = _pinned(trace, policy, slots, batches, chips, owner) if policy in ("static", "spread") else None
    cache = _Cache(slots, policy) if policy in ("lru", "lfu") else None
    hits = reads = 0
    for s, batch in enumerate(batches):
        for layer in range(layers):
            ids = trace.at(s, layer, batch)
            per_expert = np.bincount(ids.ravel(), minlength=e)
            touched = np.flatnonzero(per_expert)
            if cache is not None:
                hit = np.array([cache.access((layer, int(x))) for x in touched], dtype=bool)
            elif pinned is not None:
                hit = pinned[layer, touched]
            else:
                hit = np.zeros(len(touched), dtype=bool)
            hits += int(hit.sum())
            reads += len(touched)
            best = None
            for chip in range(chips):
                mine = owner[touched] == chip
                a, n = int(mine.sum()), int(per_expert[touched[mine]].sum())
                if best is None or (a, n) > best[:2]:
                    r = int((hit & mine).sum())
                    rp = int(per_expert[touched[hit & mine]].sum())
                    best = (a, n, r, rp)
            a, n, r, rp = best
            active[s, layer], pairs[s, layer], resident[s, layer], rpairs[s, layer] = a, n, r, rp
            fetched[s, layer] = (a - r) if cache is not None and slots > 0 else 0
    return Placement(policy, chips, slots, active, resident, fetched, pairs, rpairs, hits, reads)


STATELESS_CELLS = 1 << 22  # (step, layer, token, pick) cells gathered at once by ``_place_stateless``


def _place_stateless(trace: RoutingTrace, policy: str, slots: int, batches: list[int], chips: int) -> Placement:
    """``place`` for the policies without a cache (all-hbm, static, spread), vectorized over
    steps and layers (the same figures as the step-by-step loop: the critical chip is the
    first with the most (distinct experts, pairs))."""
    e, layers = trace.num_experts, trace.layers
    steps = len(batches)
    if steps and max(batches) > trace.tokens:
        trace.at(0, 0, max(batches))  # raises: too few token slots
    chunk = max(1, STATELESS_CELLS // max(1, layers * max(batches, default=1) * trace.top_k))
    counts = [_expert_counts(trace, batches[lo:lo + chunk], lo) for lo in range(0, steps, chunk)]
    pinned = np.zeros((layers, e), dtype=bool)
    if policy in ("static", "spread") and slots > 0:
        pinned = _pinned_from(sum(c.sum(axis=0) for c in counts), slots, chips, np.arange(e) % chips)
    out = [_critical_chip(c, pinned, chips) for c in counts]
    if not out:
        empty = np.zeros((0, layers), dtype=np.int64)
        return Placement(policy, chips, slots, empty, empty, empty, empty, empty, 0, 0)
    active, pairs, resident, rpairs = (np.concatenate([o[i] for o in out]) for i in range(4))
    hits, reads = sum(o[4] for o in out), sum(o[5] for o in out)
    return Placement(policy, chips, slots, active, resident, np.zeros_like(active), pairs, rpairs, hits, reads)


def _expert_counts(trace: RoutingTrace, batches: list[int], first: int) -> np.ndarray:
    """[steps, layers, experts] tokens routed to each expert at steps ``first ..`` (batch
    ``batches[i]`` at step ``first + i``, routing steps wrapping around)."""
    e, layers, n = trace.num_experts, trace.layers, len(batches)
    width = max(batches)
    rows = (first + np.arange(n)) % trace.steps
    ids = trace.experts[rows][:, :, :width].astype(np.int64)  # [n, layers, width, k]
    valid = np.arange(width)[None, :] < np.asarray(batches)[:, None]  # [n, width]
    cell = (np.arange(n)[:, None] * layers + np.arange(layers)[None, :]) * e  # [n, layers]
    flat = (ids + cell[:, :, None, None])[np.broadcast_to(valid[:, None, :, None], ids.shape)]
    return np.bincount(flat, minlength=n * layers * e).reshape(n, layers, e)


def _critical_chip(counts: np.ndarray, pinned: np.ndarray, chips: int) -> tuple:
    """(active, pairs, resident, resident pairs) [steps, layers] of the critical chip, and the
    hits and reads over all chips, from ``counts`` [steps, layers, experts]."""
    touched = counts > 0
    hit = touched & pinned[None]
    e = counts.shape[2]
    owner = np.arange(e) % chips

    def per_chip(values: np.ndarray) -> np.ndarray:  # [chips, steps, layers]
        return np.stack([values[:, :, owner == chip].sum(axis=2) for chip in range(chips)])

    a, n = per_chip(touched.astype(np.int64)), per_chip(counts)
    r, rp = per_chip(hit.astype(np.int64)), per_chip(np.where(hit, counts, 0))
    best = np.argmax(a * (int(n.max(initial=0)) + 1) + n, axis=0)[None]  # the first chip with the most (a, n)
    pick = [np.take_along_axis(v, best, axis=0)[0] for v in (a, n, r, rp)]
    return (*pick, int(hit.sum()), int(touched.sum()))


def _pinned_from(counts: np.ndarray, slots: int, chips: int, owner: np.ndarray) -> np.ndarray:
    """``_pinned``'s choice from the run's [layers, experts] counts."""
    pinned = np.zeros(counts.shape, dtype=bool)
    for chip in range(chips):
        layer_idx, expert_idx = np.nonzero(np.broadcast_to(owner == chip, counts.shape))
        order = np.lexsort((expert_idx, layer_idx, -counts[layer_idx, expert_idx]))[:slots]
        pinned[layer_idx[order], expert_idx[order]] = True
    return pinned


def _pinned(trace, policy, slots, batches, chips, owner) -> np.ndarray:
    """[layers, experts] True where static pinning puts the expert in SRAM: the most used
    (layer, expert) pairs over the run, per chip, up to ``slots`` per chip."""
    counts = np.zeros((trace.layers, trace.num_experts), dtype=np.int64)
    for s, batch in enumerate(batches):
        for layer in range(trace.layers):
            counts[layer] += np.bincount(trace.at(s, layer, batch).ravel(), minlength=trace.num_experts)
    return _pinned_from(counts, slots, chips, owner) if slots > 0 else np.zeros(counts.shape, dtype=bool)


class _Cache:
    """An SRAM cache of experts keyed by (layer, expert)."""

    def __init__(self, slots: int, kind: str):
        self.slots = slots
        self.kind = kind
        self.entries: OrderedDict = OrderedDict()  # key -> uses; order: least recent first
        self.uses: dict = {}

    def access(self, key) -> bool:
        self.uses[key] = self.uses.get(key, 0) + 1
        if key in self.entries:
            self.entries.move_to_end(key)
            return True
        if self.slots <= 0:
            return False
        if len(self.entries) >= self.slots:
            if self.kind == "lru":
                self.entries.popitem(last=False)
            else:  # lfu: fewest uses so far; ties go to the least recent (first in order)
                victim = min(self.entries, key=lambda k: self.uses[k])
                del self.entries[victim]
        self.entries[key] = True
        return False
