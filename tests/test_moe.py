"""MoE decode: dispatch-path ordering, fallback, byte conservation, placement, capacity
errors, op counts and the bundled MoE models."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.costs import CostModel
from sim.errors import SimulationError
from sim.lowering.decode import lower_step
from sim.moe.placement import place
from sim.moe.routing import generate
from sim.moe.sizes import expert_bytes
from sim.run import RunSpec, resolve, simulate

RICH = "tests/fixtures/moe/sram-rich.yaml"
NONE = "tests/fixtures/moe/no-sram.yaml"
TINY = "tests/fixtures/moe/tiny-moe.yaml"
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _ms(**kw):
    return simulate(steps=3, context=1024, **kw).summary["per_token_ms_mean"]


@pytest.mark.parametrize("batch", [1, 8, 64])
@pytest.mark.parametrize("routing", ["uniform", "zipf"])
def test_latency_orders_host_sync_device_zero_copy_where_experts_fit(batch, routing):
    t = {d: _ms(hardware=RICH, model=TINY, batch=batch, dispatch=d, routing=routing, seed=5)
         for d in ("host_sync", "device", "sram_zero_copy")}
    assert t["host_sync"] > t["device"] > t["sram_zero_copy"]


@pytest.mark.parametrize("batch", [1, 16])
@pytest.mark.parametrize("placement", ["static", "lru", "spread"])
def test_zero_copy_equals_device_without_sram_to_spare(batch, placement):
    kw = dict(hardware=NONE, model=TINY, batch=batch, placement=placement, steps=2, context=512, keep_ops=True)
    dev = simulate(dispatch="device", **kw)
    zc = simulate(dispatch="sram_zero_copy", **kw)
    assert zc.summary["moe"]["sram_hit_rate"] == 0.0
    assert zc.summary["per_token_ms_mean"] == dev.summary["per_token_ms_mean"]
    assert zc.ops == dev.ops


def test_zero_copy_moves_resident_activations_over_the_noc_not_hbm():
    kw = dict(hardware=RICH, model=TINY, batch=8, steps=1, context=512)
    dev, zc = resolve(RunSpec(dispatch="device", **kw)), resolve(RunSpec(dispatch="sram_zero_copy", **kw))
    gd, gz = (lower_step(r, r.steps[0].contexts) for r in (dev, zc))
    assert gd.bytes(category="act", level="noc") == 0 < gz.bytes(category="act", level="noc")
    moved = gz.bytes(category="act", level="noc")
    # device: each pair's row is written to HBM, read by its expert, written back, read by the
    # combine; zero-copy: it goes to the expert's tile and comes back over the NoC
    assert gd.bytes(category="act", level="hbm") - gz.bytes(category="act", level="hbm") == 2 * moved
    assert gd.bytes("expert") == gz.bytes("expert")  # weights are where the placement put them either way


def _log_bytes(log):
    by = defaultdict(int)
    for _s, _l, _op, resource, kind, _t0, _t1, nbytes, _f in log:
        if resource not in ("compute", "host", "kernels"):  # kernel spans carry no bytes of their own
            by[(resource, kind.startswith("write"))] += nbytes
    return dict(by)


@pytest.mark.parametrize("kw", [
    dict(hardware=RICH, dispatch="sram_zero_copy", placement="lru", batch=8),
    dict(hardware=RICH, dispatch="host_sync", placement="static", batch=3, routing="zipf"),
    dict(hardware=NONE, dispatch="device", placement="spread", batch=16, chips=4),
    dict(hardware=RICH, dispatch="sram_zero_copy", placement="spread", batch=8, chips=2, graph=False),
])
def test_event_log_conserves_moe_op_graph_bytes(kw):
    result = simulate(model=TINY, steps=2, context=512, keep_log=True, **kw)
    res = result.resolved
    costs = CostModel(res.hardware, res.stack)
    expected = defaultdict(int)
    for position, step in enumerate(res.steps):
        for op in lower_step(res, step.contexts, step.index, position).ops:
            for flow in costs.cost(op.work).flows:  # a collective's link bytes follow its algorithm
                expected[(flow.link, flow.write)] += flow.bytes

    assert _log_bytes(result.log) == dict(expected)
    assert any(level == "noc" for level, _ in expected) == (kw["dispatch"] == "sram_zero_copy")


def test_skewed_trace_with_static_policy_hits_more_than_uniform():
    kw = dict(hardware=RICH, model=TINY, batch=8, steps=8, context=512, placement="static", sram_experts=6)
    skewed = simulate(routing="zipf", routing_skew=1.5, **kw).summary["moe"]["sram_hit_rate"]
    uniform = simulate(routing="uniform", **kw).summary["moe"]["sram_hit_rate"]
    assert skewed > uniform > 0


def test_placement_asking_for_more_sram_than_exists_is_an_error(cli):
    with pytest.raises(SimulationError, match=r"MB of SRAM per chip; sram holds 900.0 MB"):
        simulate(hardware=RICH, model=TINY, sram_experts=1000, steps=1)
    code, out, err = cli("run", "--model", "mixtral-8x7b", "--set", "sram_experts=4")
    assert code == 2 and out == ""
    from sim import load_profile

    l2 = load_profile("h200-sxm").level("l2")
    assert "4 experts x 352.3 MB" in err and f"l2 holds {l2.resident_bytes / 1e6:.1f} MB" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("dispatch", ["host_sync", "device", "sram_zero_copy"])
def test_ops_per_step_do_not_grow_with_batch(dispatch):
    counts = set()
    for batch in (1, 8, 64):
        res = resolve(RunSpec(hardware=RICH, model=TINY, batch=batch, steps=1, context=256, dispatch=dispatch))
        counts.add(len(lower_step(res, res.steps[0].contexts).ops))
    assert len(counts) == 1


def test_host_sync_pays_a_sync_and_one_launch_per_active_expert():
    res = resolve(RunSpec(hardware=RICH, model=TINY, batch=8, steps=1, context=256, dispatch="host_sync",
                          software="torch-eager"))
    graph = lower_step(res, res.steps[0].contexts)
    syncs = [op for op in graph.ops if op.host_sync]
    assert syncs[-1].name == "argmax"  # the host needs the step's tokens
    syncs = syncs[:-1]
    experts = [op for op in graph.ops if op.name == "experts"]
    assert len(syncs) == len(experts) == 3  # three MoE layers (the first is dense)
    costs = CostModel(res.hardware, res.stack)
    per_expert = sum(k.per_expert for k in res.stack.kernels_for("experts"))
    host = res.stack.moe_host
    for sync, op in zip(syncs, experts, strict=True):
        active = op.tag("active_experts")
        assert active >= 2 and op.kernels == per_expert * active + len(res.stack.kernels_for("experts")) - per_expert
        # eager: the experts' launches are the host's dispatch at issue; the sync pays the host's
        # grouping and the plain PyTorch block's further syncs per touched expert
        assert costs.cost(sync.work).host_ns == pytest.approx(
            host.grouping_ns.value + host.syncs_per_expert * active * res.hardware.host.sync_round_trip_ns.value)
    assert "gate_up" in [op.name for op in graph.ops if op.layer == 0]  # the dense first layer


def test_breakdown_rows_and_links_under_expert_parallelism():
    s = simulate(model="mixtral-8x7b", chips=8, placement="spread", batch=8, steps=2).summary
    rows = s["breakdown_ms"]
    for row in ("router", "dispatch", "expert_compute", "expert_weights", "combine", "links"):
        assert rows.get(row, 0) > 0, row
    assert s["chips"] == 8 and s["moe"]["expert_parallel"] == 8
    assert s["moe"]["active_experts_per_layer"] <= 2  # one expert per chip: the critical chip has 1 or 2 hot


@FAST
@given(experts=st.integers(2, 32), k=st.integers(1, 4), tokens=st.integers(1, 16), slots=st.integers(0, 40),
       policy=st.sampled_from(["all-hbm", "static", "lru", "lfu", "spread"]), chips=st.integers(1, 4),
       seed=st.integers(0, 100))
def test_placement_invariants(experts, k, tokens, slots, policy, chips, seed):
    k = min(k, experts)
    trace = generate(experts, k, 3, 4, tokens, kind="zipf", skew=1.0, seed=seed)
    pl = place(trace, policy, slots, [tokens] * 4, chips=chips)
    assert (pl.resident <= pl.active).all() and (pl.resident_pairs <= pl.pairs).all()
    assert (pl.fetched + pl.resident <= pl.active).all() and 0 <= pl.hits <= pl.reads
    assert (pl.pairs >= pl.active).all()
    if policy == "all-hbm" or slots == 0:
        assert pl.hits == 0 and not pl.resident.any()
    if policy != "spread":
        assert (pl.active == trace.distinct(tokens)).all() and (pl.pairs == tokens * k).all()
    if policy == "static" and slots >= 3 * experts:
        assert pl.hit_rate == 1.0


def test_lru_misses_pay_their_fetch_into_sram():
    res = resolve(RunSpec(hardware=RICH, model=TINY, batch=4, steps=2, context=256, placement="lru",
                          sram_experts=4))
    pl = res.moe.placement
    assert pl.fetched.sum() > 0
    graph = lower_step(res, res.steps[0].contexts)
    assert graph.bytes("expert", level="sram", write=True) == pl.fetched[0].sum() * expert_bytes(
        res.model, res.weights, res.tp, 1)


def test_bundled_moe_models():
    mix = resolve(RunSpec(model="mixtral-8x7b", steps=1))
    assert mix.model.total_params == pytest.approx(46.7e9, rel=0.01)
    assert mix.model.active_params == pytest.approx(12.9e9, rel=0.01)
    ds = resolve(RunSpec(model="deepseek-v3", chips=8, weights="int8", steps=1))
    assert ds.model.total_params == pytest.approx(671e9, rel=0.01)
    assert ds.k_width + ds.v_width == 576  # MLA latent + RoPE key, replicated per chip
    assert ds.kv.kv_footprint(1, ds.k_width, ds.v_width) * 61 == 70_272  # anchors.md B1
    for name in ("qwen3-30b-a3b", "gpt-oss-120b"):
        m = resolve(RunSpec(model=name, steps=1)).model
        assert m.moe.experts == 128
    assert resolve(RunSpec(model="qwen3-30b-a3b", steps=1)).model.total_params == pytest.approx(30.5e9, rel=0.01)


def test_run_cli_prints_moe_rows_and_hit_rate(cli):
    for dispatch in ("host_sync", "device", "sram_zero_copy"):
        code, out, err = cli("run", "--model", "mixtral-8x7b", "--dispatch", dispatch, "--placement", "lfu",
                             "--chips", "2", "--steps", "2")
        assert code == 0, err
        assert "SRAM hit rate:" in out and "expert_weights" in out and "router" in out
    code, _, err = cli("run", "--model", "mixtral-8x7b", "--dispatch", "magic")
    assert code == 2 and "invalid choice" in err


def test_dense_models_are_unchanged_by_moe_options():
    a = simulate(batch=4, steps=1).summary
    b = simulate(batch=4, steps=1, dispatch="host_sync", placement="lru").summary
    assert a["per_token_ms_mean"] == b["per_token_ms_mean"] and "moe" not in a


def test_uniform_active_experts_in_a_run_follow_the_closed_form():
    res = resolve(RunSpec(model="deepseek-v3", chips=8, weights="int8", batch=8, steps=4))
    active = res.moe.placement.active  # no EP: every chip holds a shard of every expert
    assert np.mean(active) == pytest.approx(256 * (1 - (1 - 8 / 256) ** 8), rel=0.03)


@pytest.mark.slow
def test_policy_table_of_the_report():
    from sim.experiments.moe import policy_table

    rows = {(r["routing"].split()[0], r["placement"]): r for r in policy_table()}
    assert rows[("uniform", "all-hbm")]["hit"] == 0 == rows[("zipf", "all-hbm")]["hit"]
    assert rows[("zipf", "static")]["hit"] > rows[("uniform", "static")]["hit"] > 0
    assert rows[("uniform", "static")]["ms"] < rows[("uniform", "all-hbm")]["ms"]


@pytest.mark.slow
def test_moe_report_command(cli, tmp_path):
    out = tmp_path / "moe.md"
    code, _, err = cli("moe-report", "--out", str(out))
    assert code == 0, err
    text = out.read_text()
    for needle in ("Mixtral-8x7B bf16, h200-sxm x1", "DeepSeek-V3 int8, h200-sxm x8", "groq-lpu",
                   "Where the zero-copy claim holds", "does not fit", "![breakdown](moe-breakdown-b8.png)"):
        assert needle in text
    assert (tmp_path / "moe-breakdown-b8.png").stat().st_size > 10_000


def test_every_moe_layer_is_lowered_from_its_own_routing():
    # DeepSeek-V3's first two layers are dense and identical; the lowering must not copy
    # them over the 58 routed layers
    res = resolve(RunSpec(model="deepseek-v3", chips=8, weights="int8", batch=8, steps=1))
    graph = lower_step(res, res.steps[0].contexts)
    experts = [op for op in graph.ops if op.name == "experts"]
    assert [op.layer for op in experts] == list(range(3, 61))
    assert [op.tag("active_experts") for op in experts] == res.moe.placement.active[0].tolist()


@pytest.mark.parametrize("kw", [dict(dispatch="device"), dict(dispatch="sram_zero_copy", placement="lfu"),
                                dict(dispatch="host_sync", chips=2, placement="spread")])
def test_des_equals_analytic_for_moe(kw):
    base = dict(hardware=RICH, model=TINY, batch=8, steps=2, context=512, **kw)
    des = simulate(**base).summary["per_token_ms_mean"]
    ana = simulate(engine="analytic", **base).summary["per_token_ms_mean"]
    assert des == pytest.approx(ana, rel=0.03)


@FAST
@given(slots=st.integers(0, 24), more=st.integers(1, 8), batch=st.integers(1, 16))
def test_more_pinned_experts_never_read_more_from_hbm(slots, more, batch):
    # Latency is not monotone here: an op reading experts from HBM and SRAM at once is
    # fastest when the two streams balance (the cost model caps tile loads per level).
    kw = dict(hardware=RICH, model=TINY, batch=batch, steps=2, context=256, dispatch="sram_zero_copy",
              engine="analytic")
    fewer = simulate(sram_experts=slots, **kw)
    most = simulate(sram_experts=slots + more, **kw)
    assert most.summary["moe"]["sram_hit_rate"] >= fewer.summary["moe"]["sram_hit_rate"]
    assert all(m["store_bytes"] <= f["store_bytes"] for m, f in zip(most.steps, fewer.steps, strict=True))


def test_all_experts_resident_beats_none():
    kw = dict(hardware=RICH, model=TINY, batch=8, dispatch="sram_zero_copy")
    assert _ms(sram_experts=24, **kw) < _ms(sram_experts=0, **kw) == _ms(placement="all-hbm", **kw)


def test_routing_options_through_set_and_files(cli):
    code, out, err = cli("run", "--model", "mixtral-8x7b", "--routing", "zipf", "--set", "routing_skew=2",
                         "--set", "routing_locality=0.5", "--batch", "8", "--steps", "2")
    assert code == 0, err
    assert "zipf s=2 locality=0.5" in out
    code, out, err = cli("run", "--model", "mixtral-8x7b", "--routing", "workloads/routing/mixtral-zipf1.5-loc0.3-b8.jsonl",
                         "--batch", "8", "--steps", "2")
    assert code == 0 and "routing file mixtral-zipf1.5-loc0.3-b8.jsonl" in out
    code, _, err = cli("run", "--model", "deepseek-v3", "--routing", "workloads/routing/mixtral-zipf1.5-loc0.3-b8.jsonl")
    assert code == 2 and "routing.experts: the model has 256" in err
    code, _, err = cli("run", "--model", "mixtral-8x7b", "--set", "routing_locality=2")
    assert code == 2 and "routing_locality" in err


def _step_ms(**kw):
    return simulate(hardware="h200-sxm", steps=2, context=1024, **kw).summary["per_token_ms_mean"]


@pytest.mark.parametrize("model", ["mixtral-8x7b", "olmoe-1b-7b"])
@pytest.mark.parametrize("batch", [1, 8, 32])
def test_per_expert_loop_is_never_faster_than_the_grouped_gemm(model, batch):
    """Same bytes (the touched experts' weights), more kernels: the loop pays a start-up per
    kernel per touched expert."""
    loop = _step_ms(model=model, batch=batch, software="torch-graph")
    grouped = _step_ms(model=model, batch=batch, software="torch-graph-fused-moe")
    assert loop >= grouped


def test_kernel_count_grows_with_the_distinct_experts_touched():
    """Hand count on a tiny routing: 8 loop kernels per touched expert plus the block's fixed ones."""
    res = resolve(RunSpec(hardware=RICH, model=TINY, batch=8, steps=1, context=256, software="torch-graph"))
    graph = lower_step(res, res.steps[0].contexts)
    specs = res.stack.kernels_for("experts")
    per_expert = sum(1 for k in specs if k.per_expert)
    fixed = len(specs) - per_expert
    for op in (o for o in graph.ops if o.name == "experts"):
        active = op.tag("active_experts")
        assert op.kernels == fixed + per_expert * active
    assert per_expert == 8 and fixed == 0  # index_select, gate, up, silu, mul, down, scale, index_add


@pytest.mark.parametrize("software", ["torch-graph", "torch-eager", "fused"])
def test_host_synced_dispatch_is_never_faster_than_on_device(software):
    for model in ("mixtral-8x7b", "olmoe-1b-7b"):
        synced = _step_ms(model=model, batch=8, software=software, dispatch="host_sync")
        device = _step_ms(model=model, batch=8, software=software, dispatch="device")
        assert synced >= device


def test_moe_options_on_a_dense_model_are_run_with_a_note():
    """Dispatch and routing mean nothing to a model without MoE layers: the run goes ahead (a
    study sweeps them over dense and MoE models alike), its figures are those of the defaults,
    and the summary says the options changed nothing; an MoE model, or the defaults, get no note."""
    plain = simulate(model="llama-3-8b", batch=2, context=512, steps=1)
    asked = simulate(model="llama-3-8b", batch=2, context=512, steps=1, routing="zipf", routing_skew=2.0)
    assert asked.summary["moe_note"] == "llama-3-8b has no Mixture-of-Experts layers: routing, routing_skew change nothing"
    assert asked.summary["per_token_ms_p50"] == plain.summary["per_token_ms_p50"]
    assert "moe_note" not in plain.summary
    assert "moe_note" not in simulate(model="mixtral-8x7b", batch=2, context=512, steps=1, routing="zipf").summary
