"""Load across expert-parallel ranks: what each EP rank carries and what the hottest one costs.

Under expert parallelism (``placement: spread``) every MoE layer's tokens go to the ranks that
hold their experts, so ranks carry unequal loads; the combine all-to-all waits for the slowest.
The placement (sim.moe.placement) records per step, MoE layer and rank the token-expert pairs
and the distinct experts; the DES times the hottest rank, the analytic model the balanced one
(sim.lowering.moe). Here, per step, the straggler: the hottest rank's expert op time less the
balanced rank's (each summed over the MoE layers), both costed by the run's cost model, and the
load of each rank (tokens, experts, expert weight bytes) averaged over the run.

With micro-batches (the two-batch overlap) each micro-batch's straggler is counted and the
loads are a step's micro-batches together (each reads its own experts).

The straggler share is the straggler over the step of the hottest rank (the DES's step; for the
analytic engine, whose step is the balanced one, its step plus the straggler). The all-to-alls'
own imbalance (the hottest rank receives more rows) is in the DES's step, not in this figure.
"""

from __future__ import annotations

from sim.costs import CostModel
from sim.lowering.moe import expert_work
from sim.moe.sizes import expert_bytes
from sim.setup import RunSetup
from sim.units import ns_to_ms


def ep_load(setup: RunSetup, costs: CostModel, step_times_ns: list[float]) -> dict:
    """Expert load per EP rank and the straggler of ``setup``'s steps (``step_times_ns``: the
    run's step times, one per step, in order); {} without expert parallelism."""
    plan = setup.moe
    if plan is None or plan.ep <= 1:
        return {}
    pl, m = plan.placement, plan.microbatches
    steps = len(step_times_ns)
    rows = steps * m  # the placement's rows: micro-batch g of step s is row s x m + g
    memo: dict = {}  # (hottest, balanced) counts -> straggler ns, shared by every step and layer
    straggler = [sum(_layer_straggler_ns(setup, costs, position * m + g, layer, memo)
                     for g in range(m) for layer in plan.moe_index) for position in range(steps)]
    unit = expert_bytes(setup.model, setup.weights, setup.tp, plan.ep)
    cells = steps * pl.rank_pairs.shape[1]
    tokens = pl.rank_pairs[:rows].sum(axis=(0, 1)) / cells  # a step's micro-batches together
    experts = pl.rank_active[:rows].sum(axis=(0, 1)) / cells
    rank_bytes = pl.rank_active[:rows].sum(axis=(0, 1)) * unit / steps
    hottest = [float(t) for t in pl.pairs[:rows].reshape(steps, m, -1).sum(axis=1).mean(axis=1)]
    mean = float(tokens.mean())
    analytic = setup.spec.engine == "analytic"
    total_step = sum(step_times_ns) + (sum(straggler) if analytic else 0.0)
    return {
        "ep_ranks": [{"rank": r, "tokens_per_layer": float(tokens[r]), "experts_per_layer": float(experts[r]),
                      "expert_bytes_per_step": float(rank_bytes[r])} for r in range(pl.chips)],
        "redundant_experts": pl.redundant,
        "hottest_rank_tokens_per_layer": sum(hottest) / steps,
        "mean_rank_tokens_per_layer": mean,
        "rank_imbalance": (sum(hottest) / steps) / mean if mean else 1.0,
        "straggler_ms_per_step": ns_to_ms(sum(straggler) / steps),
        "straggler_share": sum(straggler) / total_step if total_step else 0.0,
        "straggler_in_step": not analytic,
    }


def _layer_straggler_ns(setup: RunSetup, costs: CostModel, position: int, layer: int, memo: dict) -> float:
    """The hottest rank's expert op time less the balanced rank's, of ``layer`` at ``position``."""
    counts = setup.moe.counts(position, layer)
    key = tuple(counts)
    if key not in memo:
        hot, even = (expert_work(setup, layer, c) for c in (counts.hottest(), counts.balanced()))
        memo[key] = ((costs.cost_once(hot).total_ns if hot is not None else 0.0)
                     - (costs.cost_once(even).total_ns if even is not None else 0.0))
    return memo[key]
