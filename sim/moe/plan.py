"""The MoE part of a run's setup: routing, expert sizes, the SRAM budget and the placement.

Built once by the setup stage (``sim.setup.resolve``) for a model with a ``moe:``
section, before any step is lowered: the routing trace (generated or read), how many
experts (or expert shards) fit the chip's pinnable SRAM, and the placement's per-(step,
MoE layer) counts for the critical chip. The lowering reads it; nothing writes it later.

The routing and the placement are computed when first asked for (``plan.trace``,
``plan.placement``), not when the plan is built: the sizes a capacity check needs come from
the model alone, so a run that does not fit in memory never generates routing for every
token of a huge batch. Generated routing is bounded (``MAX_ROUTING_DRAWS``).

Sizes: one expert (or one chip's tensor-parallel shard of it) is ``ffn_matrices - 1`` up
rows plus the down matrix in the weight format. With ``placement: spread`` (expert
parallelism over the ``tp`` chips) whole experts live on one chip each.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from sim.config.hardware import HardwareProfile
from sim.config.model import ModelSpec
from sim.errors import ConfigError, SimulationError
from sim.moe import routing
from sim.moe.placement import Placement, place
from sim.moe.routing import RoutingTrace
from sim.moe.sizes import expert_bytes, experts_per_chip, sram_budget
from sim.paths import bundled
from sim.paths import resolve as resolve_path
from sim.units import MB

MAX_ROUTING_DRAWS = 500_000_000  # ~40 s of drawing; expert scores drawn for generated routing (steps x MoE layers x tokens x experts)


class MoECounts(NamedTuple):
    """What one MoE layer does at one step on the hottest EP rank (the one with the most distinct
    experts, then the most token-expert pairs: the step waits for it) and on the balanced rank
    (each count summed over the ranks, over ``ep``, rounded up: what every rank would do were the
    load even). Without expert parallelism the two are the same chip."""

    active: int
    resident: int
    fetched: int
    pairs: int
    resident_pairs: int
    balanced_active: int
    balanced_resident: int
    balanced_fetched: int
    balanced_pairs: int
    balanced_resident_pairs: int

    def hottest(self) -> tuple[int, int, int, int, int]:
        """(active, resident, fetched, pairs, resident_pairs) on the hottest rank."""
        return self[:5]

    def balanced(self) -> tuple[int, int, int, int, int]:
        """(active, resident, fetched, pairs, resident_pairs) on the balanced rank."""
        return self[5:]


@dataclass(frozen=True)
class MoEPlan:
    """Everything the MoE lowering needs that does not change from step to step."""

    dispatch: str
    ep: int  # chips the experts are spread over (1: every chip holds a shard of each)
    sram_level: str | None  # where resident experts live
    graph_mode: bool
    moe_index: dict[int, int]  # model layer -> MoE layer index
    route: Callable[[], tuple[RoutingTrace, Placement]] = field(repr=False, compare=False)
    pinned_bytes: int = 0  # bytes of the experts pinned in ``sram_level`` on one chip (all its MoE layers)
    redundant: int = 0  # extra expert replicas per MoE layer over the EP ranks (EPLB)
    microbatches: int = 1  # routing rows per step (``counts(position x M + g, layer)``: micro-batch g)

    @cached_property
    def _routed(self) -> tuple[RoutingTrace, Placement]:
        return self.route()

    @property
    def trace(self) -> RoutingTrace:
        """The run's routing (generated or read on first use)."""
        return self._routed[0]

    @property
    def placement(self) -> Placement:
        """The placement's per-(step, MoE layer) counts (computed on first use)."""
        return self._routed[1]

    def counts(self, position: int, layer: int) -> MoECounts:
        """The hottest and the balanced EP rank's (active, resident, fetched, pairs,
        resident_pairs) of ``layer`` at step ``position`` (``MoECounts``)."""
        pl = self.placement
        if position >= pl.active.shape[0]:
            raise SimulationError(f"the MoE placement covers {pl.active.shape[0]} steps; step {position} asked for")
        i = self.moe_index[layer]
        hot = (int(pl.active[position, i]), int(pl.resident[position, i]), int(pl.fetched[position, i]),
               int(pl.pairs[position, i]), int(pl.resident_pairs[position, i]))
        if pl.chips == 1:
            return MoECounts(*hot, *hot)
        ranks = pl.chips
        even = (-(-int(pl.rank_active[position, i].sum()) // ranks), -(-int(pl.rank_resident[position, i].sum()) // ranks),
                0, -(-int(pl.rank_pairs[position, i].sum()) // ranks),
                -(-int(pl.rank_resident_pairs[position, i].sum()) // ranks))
        return MoECounts(*hot, *even)


def routing_trace(spec, model: ModelSpec, batches: list[int]) -> RoutingTrace:
    """The run's routing: generated (``uniform``, ``zipf``) or read from a routing file."""
    moe = model.moe
    layers = moe_layers(model)
    if spec.routing in routing.KINDS:
        draws = len(batches) * layers * max(batches) * moe.experts
        if draws > MAX_ROUTING_DRAWS:
            raise SimulationError(f"generated routing for {len(batches):,} steps x {layers} MoE layers x "
                                  f"{max(batches):,} tokens x {moe.experts:,} experts draws {draws:.3g} expert "
                                  f"scores; at most {MAX_ROUTING_DRAWS:.0e}: simulate fewer steps or a smaller batch")
        return routing.generate(moe.experts, moe.top_k, layers, len(batches), max(batches), kind=spec.routing,
                                skew=spec.routing_skew, locality=spec.routing_locality, seed=spec.seed)
    return read_routing(spec, model, batches)


def read_routing(spec, model: ModelSpec, batches: list[int]) -> RoutingTrace:
    """A routing file, checked against the model and the run's largest batch."""
    moe = model.moe
    path = resolve_path(spec.routing, bundled("workloads", "routing"), "routing", suffixes=(".jsonl",),
                        builtin=routing.KINDS)
    trace = routing.read(path, moe.experts, moe.top_k, moe_layers(model))
    if trace.tokens < max(batches):
        raise ConfigError(spec.routing, "experts", f"each step needs {max(batches)} token rows "
                          f"(the largest batch of the run)", trace.tokens)
    return trace


def ep_degree(spec, tp: int) -> int:
    """Chips the experts are spread over: every chip of every attention data-parallel group under
    ``placement: spread`` (tp x attention_dp), else 1 (each chip holds a 1/tp shard of each)."""
    chips = tp * spec.attention_dp
    return chips if spec.placement == "spread" and chips > 1 else 1


def moe_layers(model: ModelSpec) -> int:
    """The model's layers with a Mixture-of-Experts FFN."""
    return sum(1 for layer in range(model.layers) if not model.moe.is_dense(layer))


def build(spec, model: ModelSpec, hardware: HardwareProfile, weights, tp: int, batches: list[int],
          graph: bool = True) -> MoEPlan:
    """The MoE plan of a run: sizes the SRAM slots and checks a requested pin count against
    the SRAM that exists now; the routing and the placement over the run's steps follow on
    first use (a routing file is read and checked now)."""
    moe = model.moe
    read = None if spec.routing in routing.KINDS else read_routing(spec, model, batches)
    ep = ep_degree(spec, tp)
    redundant = _redundant(spec, model, ep)
    level, budget = sram_budget(hardware)
    unit = expert_bytes(model, weights, tp, ep)
    on_chip = experts_per_chip(model, ep, redundant) * moe_layers(model)
    if spec.sram_experts is not None:
        if spec.placement == "all-hbm" and spec.sram_experts:
            raise SimulationError("placement all-hbm pins no experts; drop sram_experts or pick another policy")
        need = spec.sram_experts * unit
        if need > budget:
            where = (f"{level} holds {budget / MB:.1f} MB for resident data" if level
                     else "no on-chip SRAM can hold resident data")
            raise SimulationError(f"placement {spec.placement} asks for {spec.sram_experts} experts x "
                                  f"{unit / MB:.1f} MB = {need / MB:.1f} MB of SRAM per chip; {where}")
        slots = spec.sram_experts
    else:
        slots = on_chip if math.isinf(budget) else int(budget // unit) if unit else 0
    slots = min(slots, on_chip)
    batches = list(batches)
    parts, rows = micro_rows(batches, spec.microbatches)

    def route() -> tuple[RoutingTrace, Placement]:
        trace = read if read is not None else routing_trace(spec, model, batches)
        return trace, place(trace, spec.placement, slots, parts, chips=ep, redundant=redundant, rows=rows)

    layers = [layer for layer in range(model.layers) if not moe.is_dense(layer)]
    return MoEPlan(spec.dispatch, ep, level if slots else None, graph, {layer: i for i, layer in enumerate(layers)},
                   route, pinned_bytes=slots * unit if level is not None and level != hardware.store.name else 0,
                   redundant=redundant, microbatches=spec.microbatches)


def _redundant(spec, model: ModelSpec, ep: int) -> int:
    """The run's extra expert replicas per MoE layer (checked against its expert parallelism)."""
    if spec.redundant_experts and ep == 1:
        raise ConfigError(None, "redundant_experts", "replicas of hot experts need expert parallelism "
                          "(placement spread over more than one chip); use 0", spec.redundant_experts)
    if spec.redundant_experts > model.moe.experts:
        raise ConfigError(None, "redundant_experts", f"at most one extra replica per expert: at most "
                          f"{model.moe.experts} for {model.name}", spec.redundant_experts)
    return spec.redundant_experts


def micro_rows(batches: list[int], m: int) -> tuple[list[int], list[tuple[int, int]] | None]:
    """The placement's rows when each step runs as ``m`` micro-batches: row ``s x m + g`` is
    micro-batch g of step s, the contiguous token slots the lowering gives it
    (sim.lowering.decode.lower_step), as (tokens, (routing step, first slot)); ``m`` = 1: the
    steps themselves."""
    if m == 1:
        return batches, None
    parts, rows = [], []
    for s, batch in enumerate(batches):
        for g in range(m):
            lo, hi = g * batch // m, (g + 1) * batch // m
            parts.append(hi - lo)
            rows.append((s, lo))
    return parts, rows
