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
* ``spread``: expert parallelism over ``chips`` chips (EP ranks), expert e on chip e mod chips;
  with ``redundant`` extra replicas per layer (DeepSeek's EPLB) the hottest experts of each
  layer over the run get a second replica and the instances are packed to even the ranks'
  loads (``layout``); a replicated expert's tokens split evenly over its replicas. Each chip
  pins the hottest instances of its own shard up to ``slots``.

With expert parallelism the step waits for the most loaded chip, so the recorded figures
are those of the chip with the most distinct experts in that layer (ties: the most
pairs); every rank's figures are kept too (``rank_active``, ``rank_pairs``, ...: [steps,
layers, chips]), for the balanced rank the analytic model times and the load per rank a run
reports. The SRAM hit rate is over all chips: experts read from SRAM / experts read.
What is ignored: prefetch ahead of use, partial residency of one expert, EPLB's re-packing
during a run (the layout is fixed from the whole run's loads, as a periodic rebalance would
give).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from sim.config.defaults import PLACEMENTS
from sim.moe.routing import RoutingTrace

POLICIES = PLACEMENTS  # declared once in sim.config.defaults


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
    # per EP rank: [steps, layers, chips] distinct experts (instances) touched, token-expert pairs,
    # and of those read from SRAM (one rank without expert parallelism)
    rank_active: np.ndarray | None = None
    rank_pairs: np.ndarray | None = None
    rank_resident: np.ndarray | None = None
    rank_resident_pairs: np.ndarray | None = None
    redundant: int = 0  # extra expert replicas per layer (EPLB)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.reads if self.reads else 0.0


class Layout(NamedTuple):
    """Where each expert instance of each MoE layer lives: ``expert[layer, i]`` is the expert that
    instance i holds, ``rank[layer, i]`` its EP rank, ``replica[layer, i]`` which of the expert's
    ``copies[layer, expert]`` replicas it is."""

    expert: np.ndarray
    rank: np.ndarray
    replica: np.ndarray
    copies: np.ndarray


def layout(load: np.ndarray, chips: int, redundant: int = 0) -> Layout:
    """Expert instances over ``chips`` EP ranks from the expected load per (layer, expert)
    (``load``). Without redundant experts expert e sits on rank e mod chips. With ``redundant``
    extra replicas per layer (DeepSeek's EPLB: replicate the heaviest experts, then pack so that
    ranks carry even loads): the ``redundant`` most loaded experts of each layer get a second
    replica (each replica takes half its tokens), and instances go, heaviest first, to the least
    loaded rank that has room (``ceil((E + redundant) / chips)`` instances a rank) and does not
    hold that expert yet."""
    layers, e = load.shape
    if redundant <= 0:
        expert = np.broadcast_to(np.arange(e), (layers, e)).copy()
        return Layout(expert, expert % chips, np.zeros((layers, e), dtype=np.int64),
                      np.ones((layers, e), dtype=np.int64))
    room = math.ceil((e + redundant) / chips)
    expert, rank, replica = (np.zeros((layers, e + redundant), dtype=np.int64) for _ in range(3))
    copies = np.ones((layers, e), dtype=np.int64)
    for layer in range(layers):
        hot = np.lexsort((np.arange(e), -load[layer]))[:redundant]
        copies[layer, hot] += 1
        inst = [(load[layer, x] / copies[layer, x], x, j) for x in range(e) for j in range(copies[layer, x])]
        inst.sort(key=lambda t: (-t[0], t[1], t[2]))
        carried, held = np.zeros(chips), [set() for _ in range(chips)]
        for i, (share, x, j) in enumerate(inst):
            free = [c for c in range(chips) if len(held[c]) < room and x not in held[c]]
            c = min(free, key=lambda c: (carried[c], c))
            carried[c] += share
            held[c].add(x)
            expert[layer, i], rank[layer, i], replica[layer, i] = x, c, j
    return Layout(expert, rank, replica, copies)


def place(trace: RoutingTrace, policy: str, slots: int, batches: list[int], chips: int = 1,
          redundant: int = 0, rows: list[tuple[int, int]] | None = None) -> Placement:
    """Run ``policy`` over the routing of decode steps with ``batches[i]`` tokens at step i
    (step i uses routing step i, wrapping around; ``rows[i]``: (routing step, first token slot)
    instead, for micro-batches). Under ``spread`` a replicated expert's tokens are split evenly
    over its replicas."""
    if policy not in POLICIES:
        raise ValueError(f"unknown placement {policy!r}; expected one of {', '.join(POLICIES)}")
    spread = policy == "spread"
    chips = chips if spread else 1
    redundant = redundant if spread and chips > 1 else 0
    slots = 0 if policy == "all-hbm" else max(0, slots)
    steps, layers, e = len(batches), trace.layers, trace.num_experts
    shape = (steps, layers)
    active, resident, fetched, pairs, rpairs = (np.zeros(shape, dtype=np.int64) for _ in range(5))
    per_rank = [np.zeros((steps, layers, chips), dtype=np.int64) for _ in range(4)]
    rows = rows if rows is not None else [(s, 0) for s in range(len(batches))]
    load = expert_loads(trace, batches, rows) if policy in ("static", "spread") else None
    lay = layout(load if load is not None else np.zeros((layers, e)), chips, redundant)
    pinned = _pinned(load, lay, slots, chips) if load is not None else None
    cache = _Cache(slots, policy) if policy in ("lru", "lfu") else None
    hits = reads = 0
    for s, ((step, start), batch) in enumerate(zip(rows, batches, strict=True)):
        for layer in range(layers):
            n = np.bincount(trace.at(step, layer, batch, start).ravel(), minlength=e)
            inst_expert, ranks = lay.expert[layer], lay.rank[layer]
            reps = lay.copies[layer][inst_expert]
            tokens = n[inst_expert] // reps + (lay.replica[layer] < n[inst_expert] % reps)
            touched = tokens > 0
            hit = _hits(touched, layer, cache, pinned)
            hits += int(hit.sum())
            reads += int(touched.sum())
            a = np.bincount(ranks[touched], minlength=chips)
            p = np.bincount(ranks, weights=tokens, minlength=chips).astype(np.int64)
            r = np.bincount(ranks[hit], minlength=chips)
            rp = np.bincount(ranks[hit], weights=tokens[hit], minlength=chips).astype(np.int64)
            for out, row in zip(per_rank, (a, p, r, rp)):
                out[s, layer] = row
            c = int(np.argmax(a * (int(p.sum()) + 1) + p))  # the most experts, then the most pairs; first of ties
            active[s, layer], pairs[s, layer], resident[s, layer], rpairs[s, layer] = a[c], p[c], r[c], rp[c]
            fetched[s, layer] = (a[c] - r[c]) if cache is not None and slots > 0 else 0
    return Placement(policy, chips, slots, active, resident, fetched, pairs, rpairs, hits, reads, *per_rank,
                     redundant=redundant)


def _hits(touched: np.ndarray, layer: int, cache, pinned) -> np.ndarray:
    """Which touched expert instances of ``layer`` are read from SRAM: an SRAM cache's hits
    (each access updates it), the statically pinned ones, or none."""
    if cache is not None:
        hit = np.zeros(len(touched), dtype=bool)
        hit[touched] = [cache.access((layer, int(x))) for x in np.flatnonzero(touched)]
        return hit
    if pinned is not None:
        return pinned[layer] & touched
    return np.zeros(len(touched), dtype=bool)


def expert_loads(trace, batches, rows: list[tuple[int, int]] | None = None) -> np.ndarray:
    """[layers, experts] how often each expert is picked over the run's steps (``rows``: as
    ``place`` reads them)."""
    rows = rows if rows is not None else [(s, 0) for s in range(len(batches))]
    counts = np.zeros((trace.layers, trace.num_experts), dtype=np.int64)
    for (s, start), batch in zip(rows, batches, strict=True):
        for layer in range(trace.layers):
            counts[layer] += np.bincount(trace.at(s, layer, batch, start).ravel(), minlength=trace.num_experts)
    return counts


def _pinned(counts, lay: Layout, slots, chips) -> np.ndarray:
    """[layers, instances] True where static pinning puts the expert instance in SRAM: the most
    used (layer, instance) pairs over the run (a replica's share of its expert's uses), per chip,
    up to ``slots`` per chip."""
    uses = counts[np.arange(counts.shape[0])[:, None], lay.expert] / lay.copies[
        np.arange(counts.shape[0])[:, None], lay.expert]
    pinned = np.zeros(lay.expert.shape, dtype=bool)
    if slots <= 0:
        return pinned
    for chip in range(chips):
        layer_idx, inst_idx = np.nonzero(lay.rank == chip)
        order = np.lexsort((inst_idx, layer_idx, -uses[layer_idx, inst_idx]))[:slots]
        pinned[layer_idx[order], inst_idx[order]] = True
    return pinned


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
