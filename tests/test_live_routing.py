"""Live routing (sim.moe.live) for serving replays of Mixture-of-Experts models: per-step expert
loads from the live batch, deterministic by seed, distributed as routing every token would be,
per rank as the run's placement counts them; a replay's MoE step times equal their graphs'."""

from __future__ import annotations

import numpy as np
import pytest

from sim.moe.live import LiveRouting
from sim.moe.placement import place
from sim.moe.routing import expected_distinct, generate
from sim.run import RunSpec
from sim.serve.replay import serve
from sim.serve.spec import ServeSpec
from sim.serve.stepmodel import SimulatorStepModel, serve_resolved


def test_loads_are_deterministic_by_seed_and_conserve_pairs():
    a, b, c = (LiveRouting(64, 8, 4, kind="zipf", skew=1.1, locality=0.3, seed=s, ranks=4) for s in (7, 7, 8))
    sizes = [1, 5, 100, 5, 5, 37, 200]
    la, lb, lc = ([r.loads(n) for n in sizes] for r in (a, b, c))
    assert all(np.array_equal(x, y) for x, y in zip(la, lb, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(la, lc, strict=True))
    for n, loads in zip(sizes, la, strict=True):
        assert (loads.sum(axis=1) == n * 8).all()  # every token picks k experts in every layer
        assert loads.max() <= n  # distinct experts per token: an expert gets a token at most once


@pytest.mark.parametrize("kind, skew", [("uniform", 1.0), ("zipf", 1.2)])
def test_distinct_experts_follow_per_token_routing(kind, skew):
    """Mean distinct experts per layer match routing every token (the closed form for uniform;
    sim.moe.routing's per-token generator for zipf) within 1%."""
    live = LiveRouting(64, 8, 8, kind=kind, skew=skew, seed=3)
    got = np.mean([(live.loads(24) > 0).sum(axis=1).mean() for _ in range(300)])
    want = (expected_distinct(64, 8, 24) if kind == "uniform"
            else generate(64, 8, 8, 300, 24, kind=kind, skew=skew, seed=3).distinct(24).mean())
    assert got == pytest.approx(want, rel=0.01)


def test_counts_per_rank_are_the_placements_on_a_trace():
    """From a routing trace, each step's counts are those ``placement: spread`` records for the
    critical chip, and the mean rank's pairs are the ranks' mean."""
    trace = generate(16, 2, 3, 6, 10, kind="zipf", skew=1.0, seed=2)
    live = LiveRouting(16, 2, 3, ranks=4, trace=trace)
    placed = place(trace, "spread", 0, [10] * 6, chips=4)
    for step in range(6):
        loads = live.step(10)
        assert [c[0] for c in loads.counts] == placed.active[step].tolist()
        assert [c[3] for c in loads.counts] == placed.pairs[step].tolist()
        assert [c[3] for c in loads.mean_counts] == [(2 * 20 + 4) // 8] * 3  # 10 tokens x 2 picks over 4 ranks
        assert (loads.rank_pairs.sum(axis=1) == 20).all()


@pytest.mark.parametrize("kw", [dict(model="mixtral-8x7b"),
                                dict(model="olmoe-1b-7b", hardware="h200-sxm-x8", tp=4, chips=4,
                                     overrides=(("placement", "spread"), ("routing", "zipf")))])
def test_moe_step_times_equal_their_graphs(kw):
    """The chain decomposition with live expert loads equals the step's graph, analysed."""
    model = SimulatorStepModel(serve_resolved(RunSpec(engine="analytic", batch=512, context=1, steps=1, **kw)))
    assert not model.exact, model.fallback_reason
    for contexts, prefill in (((300, 20), ()), ((5,) * 9, ((40, 0),)), ((), ((128, 64),)), ((300, 20), ())):
        rows = len(contexts) + sum(chunk for chunk, _ in prefill)
        counts = model.live.step(rows).counts
        fast = model.chain.time_ns(contexts, prefill, counts)
        assert fast == pytest.approx(model.stepper.step(contexts, 0, 0, prefill, counts).outcome.time_ns, rel=1e-9)


def test_mixtral_replays_traffic_with_expert_load_per_rank():
    summary = serve(ServeSpec(model="mixtral-8x7b", hardware="h200-sxm-x8", tp=2, chips=2, requests="synthetic",
                              rate=2.0, duration_s=4.0, prompt_median=256, output_median=32,
                              overrides=(("placement", "spread"), ("routing", "zipf"))))
    assert summary["requests_done"] > 0 and summary["tpot_ms_p50"] > 0
    moe = summary["moe"]
    assert moe["expert_parallel"] == 2 and len(moe["expert_pairs_per_rank"]) == 2
    assert moe["hottest_rank_over_mean"] >= 1.0 and 0.0 <= moe["straggler_share"] < moe["moe_blocks_share"] < 1.0
    assert not summary["step_model"]["exact"]
