"""Sizes of experts and the SRAM that can hold them: arithmetic only (no numpy), shared by
the setup stage (sim.moe.plan) and the MoE lowering.

One expert (or one chip's tensor-parallel shard of it) is ``ffn_matrices - 1`` up rows plus
the down matrix in the weight format; with expert parallelism (``ep > 1``) whole experts
live on one chip each.
"""

from __future__ import annotations

import math

from sim.config.hardware import HardwareProfile
from sim.config.model import ModelSpec


def expert_ffn_per_chip(model: ModelSpec, tp: int, ep: int) -> int:
    ffn = model.moe.expert_ffn
    return ffn if ep > 1 else math.ceil(ffn / tp)


def expert_bytes(model: ModelSpec, weights, tp: int, ep: int) -> int:
    """Weight bytes of one expert (or one chip's shard of it)."""
    ffn = expert_ffn_per_chip(model, tp, ep)
    return weights.weight_bytes((model.ffn_matrices - 1) * ffn, model.hidden) + weights.weight_bytes(model.hidden, ffn)


def experts_per_chip(model: ModelSpec, ep: int, redundant: int = 0) -> int:
    """Experts (or expert shards) one chip holds per MoE layer: its share of the experts and of
    the ``redundant`` extra replicas (EPLB) under expert parallelism."""
    return math.ceil((model.moe.experts + (redundant if ep > 1 else 0)) / ep)


def sram_budget(hardware: HardwareProfile) -> tuple[str | None, float]:
    """(level, bytes) where experts can be pinned on one chip. On an SRAM-store chip the
    store itself (every expert on the chip is resident: the run's capacity check covers it);
    otherwise the on-chip level with the most software-pinnable bytes, less what the profile's
    placement keeps there: half of it where dense weights are staged through it (two staging
    buffers of at most a quarter each, sim.lowering.placement), all of it where experts are
    staged through it or the weights are resident in it."""
    if hardware.store.kind == "sram":
        return hardware.store.name, math.inf
    levels = [level for level in hardware.on_chip if level.resident_bytes > 0]
    if not levels:
        return None, 0.0
    best = max(levels, key=lambda level: level.resident_bytes)
    budget = best.resident_bytes
    if hardware.placement is not None:
        for what in ("weights", "experts"):
            place = hardware.place(what)
            if place.mode == "streamed" and place.buffer == best.name:
                # staged experts come through this level's buffers, so none is pinned there; staged
                # dense weights leave the other half (two buffers of at most a quarter each)
                budget = 0.0 if what == "experts" else min(budget, best.resident_bytes / 2)
            elif place.mode == "resident" and place.tier == best.name:
                budget = 0.0  # the placement fills this level with the weights themselves
    return best.name, budget
