"""The runner API (sim.run.Stepper) re-lowers and re-costs only what changes between steps:
attention through the contexts and each MoE layer's block through its expert loads. Every step
equals lowering and costing it in full: the same ops, costs, engine outcome and step sums. A step
whose MoE blocks changed is costed afresh from the memo, so its breakdown is bit-identical too; a
step whose attention alone changed keeps the distinct ops' counts in another order, so its
breakdown rows agree within float rounding (as before issue 40: a dense run's rows differ from a
full lowering's in the last digit)."""

from __future__ import annotations

import dataclasses

import pytest

from sim.lowering.decode import _signature
from sim.moe.live import LiveRouting, fixed_plan
from sim.results import Ledger
from sim.run import RunSpec, Stepper, resolve

CASES = {
    "dense": dict(model="llama-3.2-1b", batch=3),
    "mixtral": dict(model="mixtral-8x7b", batch=4, routing="zipf", routing_skew=1.2, routing_locality=0.3),
    "olmoe-lru": dict(model="olmoe-1b-7b", batch=4, placement="lru", dispatch="sram_zero_copy", sram_experts=3),
    "deepseek-v3-ep": dict(model="deepseek-v3", hardware="h200-sxm-x8", tp=8, batch=6, placement="spread"),
    "olmoe-host-sync": dict(model="olmoe-1b-7b", batch=5, dispatch="host_sync", software="torch-eager"),
    "quantized-kv": dict(model="mixtral-8x7b", batch=2, kv="kivi-2"),
    "pp2": dict(model="mixtral-8x7b", hardware="h200-sxm-x8", tp=2, pp=2, chips=4, batch=3),
    "spatial": dict(model="mixtral-8x7b", hardware="sambanova-sn40l-8", batch=3),
    "spatial-staged-experts": dict(model="olmoe-1b-7b", hardware="sambanova-sn40l-8", batch=4, routing="zipf",
                                   overrides=(("hardware.placement.experts",
                                               {"tier": "hbm", "mode": "streamed", "buffer": "pmu"}),)),
}


def _steps(setup, incremental: bool):
    """Per step: the ops (as their signatures), their costs, the outcome's time and the step sums."""
    stepper = Stepper(setup, incremental=incremental)
    ledger = Ledger(stepper.costs)
    out, moved, before = [], 0, {}
    for position, step in enumerate(setup.steps):
        contexts = tuple(c + position * 37 for c in step.contexts)  # contexts grow faster than a trace's
        graph, state, outcome = stepper.step(contexts, step.index, position)
        moved += sum(op.name == "experts" and op.work != before.get(op.idx, op.work) for op in graph.ops)
        before = {op.idx: op.work for op in graph.ops if op.name == "experts"}
        sums = ledger.graph_sums_from(state.keys, state.costs)
        out.append(([_signature(op, 0) + (op.layer,) for op in graph.ops], list(state.costs), outcome.time_ns,
                    outcome.events, sums.by_category, sums.by_level, sums.flops, sums.kernels,
                    ledger.step_breakdown(sums, outcome)))
    return out, moved, stepper.graphs


@pytest.mark.parametrize("engine", ["des", "analytic"])
@pytest.mark.parametrize("case", list(CASES))
def test_incremental_steps_equal_full_lowering(case, engine):
    setup = resolve(RunSpec(context=700, steps=4, engine=engine, **CASES[case]))
    incremental, moved, cache = _steps(setup, True)
    full, _, _ = _steps(setup, False)
    assert cache.reused == len(setup.steps) - 1  # every step after the first re-lowered only what changed
    assert (moved > 0) == (setup.moe is not None)  # MoE blocks were re-lowered through their expert loads
    for position, (a, b) in enumerate(zip(incremental, full, strict=True)):
        assert a[:-1] == b[:-1], f"step {position} differs"
        assert a[-1] == pytest.approx(b[-1], rel=1e-12, abs=1e-9), f"step {position}'s breakdown differs"
        if setup.moe is not None and moved:
            assert a[-1] == b[-1]
    assert len({step[2] for step in full}) > 1  # the steps differ from one another


SERVING_STEPS = [  # (decode contexts, prompt chunks): shapes recur, as a serving replay's do
    ((700, 30, 1200), ()),
    ((701, 31, 1201), ((64, 0),)),
    ((702, 32, 1202), ()),
    ((40, 703, 33, 1203), ((16, 64), (8, 0))),
    ((703, 33, 1203), ()),
    ((41, 704, 34, 1204), ((16, 80), (8, 8))),
]


@pytest.mark.parametrize("case", ["dense", "mixtral", "deepseek-v3-ep", "spatial-staged-experts"])
def test_serving_steps_with_live_expert_loads_equal_full_lowering(case):
    """Steps of changing shape, with prompt chunks and expert loads from a live routing model,
    equal lowering each in full under a plan that holds those loads."""
    setup = resolve(RunSpec(context=700, steps=1, engine="analytic", **{**CASES[case], "batch": 64}))
    live = None
    if setup.moe is not None:
        moe = setup.model.moe
        live = LiveRouting(moe.experts, moe.top_k, len(setup.moe.moe_index), seed=5, ranks=setup.moe.ep)
    stepper = Stepper(setup)
    for index, (contexts, prefill) in enumerate(SERVING_STEPS):
        rows = len(contexts) + sum(chunk for chunk, _ in prefill)
        counts = live.step(rows).counts if live else None
        graph, state, outcome = stepper.step(contexts, index, 0, prefill, counts)
        fixed = setup if live is None else dataclasses.replace(setup, moe=fixed_plan(setup.moe, counts))
        ref_graph, ref_state, ref_outcome = Stepper(fixed, incremental=False).step(contexts, index, 0, prefill)
        assert [_signature(op, 0) + (op.layer,) for op in graph.ops] == \
            [_signature(op, 0) + (op.layer,) for op in ref_graph.ops], f"step {index}'s ops differ"
        assert list(state.costs) == list(ref_state.costs) and outcome.time_ns == ref_outcome.time_ns
    assert stepper.graphs.reused >= 2  # shapes seen before re-lowered only what changed (but where a staging
    # copy of experts appears or vanishes with the loads: such a step is lowered afresh)


def test_a_step_with_a_side_stream_makes_the_serving_model_exact_before_the_screen_reads_it():
    """deepseek-v3's shared expert runs on a side stream, so its step is not one chain of ops: the
    serving step model finds that when it is built (not on the screen's first parts_ns, which
    raised and failed every deployment of a deepseek-v3 search) and times whole steps, which
    equal the stepper's."""
    from sim.serve.stepmodel import SimulatorStepModel

    setup = resolve(RunSpec(model="deepseek-v3", hardware="h200-sxm-x8", weights="fp8", engine="analytic",
                            placement="spread", batch=8, context=512, steps=1))
    model = SimulatorStepModel(setup)
    assert model.exact and "not one chain of ops" in model.fallback_reason
    contexts = (512,) * 8
    assert model.step_ns(contexts) == model.exact_ns(contexts, (), model._last_counts)
