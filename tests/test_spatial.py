"""Spatial and tiered-memory machines: placement, staging, partitions, contention (issue 20).

Hand-worked numbers: where the DES is slower than the closed form it is because two flows
share one tier's bandwidth; the amounts are computed here from the flows' bytes.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.analytic import analyse
from sim.config.hardware import HardwareProfile
from sim.costs import CostModel, Flow, HostTimes, OpCost
from sim.engine.simulation import Simulation
from sim.errors import ConfigError
from sim.lowering.decode import lower_step
from sim.lowering.graph import Access, Op, Work, make_graph
from sim.run import RunSpec, capacity, resolve, simulate
from sim.setup import balanced_partition, layer_units, parallelism

SN = "sambanova-sn40l"
RESIDENT_PMU = ("hardware.placement.weights.tier=pmu", "hardware.placement.weights.mode=resident")


def _lone_flow_cost(link: str, nbytes: int, capacity: float) -> OpCost:
    flow = Flow(link, nbytes, 1.0, math.inf, "kv", False)
    return OpCost((flow,), 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, ideal_body_ns=nbytes / capacity)


@pytest.mark.parametrize("kv_bytes, staged_bytes", [(3_000_000, 1_000_000), (1_000_000, 1_000_000), (500, 7_000)])
def test_staging_copy_sharing_hbm_with_kv_reads_by_hand(kv_bytes, staged_bytes):
    """A KV read (main stream) and a staging copy (dma stream) start together on one HBM of
    capacity C. Closed form: each alone, max(K, S) / C. Fluid sharing: both at C/2 until the
    smaller is done (2 min / C), then the rest at C: (K + S) / C in all."""
    capacity = 1000.0  # bytes/ns
    ops = [Op(idx=0, name="attention", layer=0, work=Work(kind="attention", accesses=(Access("hbm", kv_bytes, "kv"),))),
           Op(idx=1, name="stage_weights", layer=1, stream="dma",
              work=Work(kind="vector", accesses=(Access("hbm", staged_bytes, "weights"),)))]
    graph = make_graph(ops, step=0, contexts=(), stages=1)
    costs = [_lone_flow_cost("hbm", kv_bytes, capacity), _lone_flow_cost("hbm", staged_bytes, capacity)]
    host = HostTimes(0.0, 0.0, 0.0)
    des = Simulation(graph, costs, {"hbm": capacity, "compute": 1.0}, host, graph_mode=True).run()
    ana = analyse(graph, costs, host, graph_mode=True)
    assert ana.time_ns == pytest.approx(max(kv_bytes, staged_bytes) / capacity)
    assert des.time_ns == pytest.approx((kv_bytes + staged_bytes) / capacity)
    assert des.time_ns - ana.time_ns == pytest.approx(min(kv_bytes, staged_bytes) / capacity)


def _spec(**kw) -> RunSpec:
    base = dict(hardware=SN, model="llama-3-8b", batch=1, context=1024, steps=1)
    base.update(kw)
    return RunSpec(**base)


def test_streamed_weights_are_staged_once_and_conserved_per_tier():
    """Every weight byte leaves HBM once (as in the resident placement); a staged one is written
    into the PMU buffer once and read from it once by the op that uses it, and an op too large
    to stage whole (over a quarter of the PMU) reads its weights from HBM as it runs."""
    streamed = resolve(_spec())
    resident_hbm = resolve(_spec(overrides=("hardware.placement.weights.mode=resident",)))
    g = lower_step(streamed, streamed.steps[0].contexts)
    r = lower_step(resident_hbm, resident_hbm.steps[0].contexts)
    from_hbm = g.bytes(category="weights", level="hbm")
    assert from_hbm == r.bytes(category="weights", level="hbm")
    gathered = sum(a.bytes for op in g.ops for a in op.accesses if a.category == "weights" and a.granule)
    copies = [op for op in g.ops if op.name == "stage_weights"]
    copied = sum(op.bytes(level="hbm") for op in copies)
    through = [op for op in g.ops if op.name != "stage_weights" and op.bytes(category="weights", level="hbm")
               and not any(a.granule for a in op.accesses)]
    limit = streamed.hardware.level("pmu").resident_bytes / 4
    assert through and all(op.bytes(category="weights", level="hbm") > limit for op in through)
    assert all(op.bytes(level="hbm") <= limit for op in copies)
    assert copied + sum(op.bytes(category="weights", level="hbm") for op in through) == from_hbm - gathered
    assert g.bytes(category="staged", level="pmu", write=True) == copied
    assert g.bytes(category="staged", level="pmu", write=False) == copied
    assert copies and all(op.stream == "dma" for op in copies)
    # every reader waits for its copy; copies run at most two ahead (double buffering)
    readers = [op for op in g.ops if op.bytes(category="staged", level="pmu", write=False)]
    assert len(readers) == len(copies)
    for m, (copy, reader) in enumerate(zip(copies, readers, strict=True)):
        assert copy.idx in reader.deps
        if m >= 2:
            assert readers[m - 2].idx in copy.deps


@pytest.mark.parametrize("batch, context", [(1, 1024), (4, 8192), (16, 2048)])
def test_streamed_weights_are_never_faster_than_sram_resident(batch, context):
    kw = dict(batch=batch, context=context)
    for engine in ("analytic", "des"):
        resident = simulate(_spec(engine=engine, overrides=RESIDENT_PMU, **kw), check_capacity=False)
        streamed = simulate(_spec(engine=engine, **kw), check_capacity=False)
        assert streamed.summary["per_token_ms_p50"] >= resident.summary["per_token_ms_p50"] * (1 - 1e-9)


def test_streaming_contends_with_kv_reads_by_a_bounded_amount():
    """Long context: the KV read of each layer's attention shares HBM with the copy of the next
    projection's weights. The DES is strictly slower than the closed form, by no more than the
    staging copies' time alone on HBM (they cannot cost more than being serialised)."""
    spec = dict(batch=8, context=16384)
    des = simulate(_spec(**spec), check_capacity=False)
    ana = simulate(_spec(engine="analytic", **spec), check_capacity=False)
    setup = resolve(_spec(**spec))
    graph = lower_step(setup, setup.steps[0].contexts)
    hbm = setup.hardware.store
    staged = sum(op.bytes(level="hbm") for op in graph.ops if op.name == "stage_weights")
    bound_ns = staged / (hbm.peak_GBps * hbm.efficiency(None))
    extra_ns = (des.summary["per_token_ms_p50"] - ana.summary["per_token_ms_p50"]) * 1e6
    assert extra_ns > 1e3  # at least a microsecond of real contention
    assert extra_ns <= bound_ns


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.sampled_from([1, 2, 8, 32]), context=st.sampled_from([128, 2048, 16384]),
       case=st.sampled_from([(SN, "llama-3-8b", ()), (SN, "llama-3-8b", RESIDENT_PMU),
                             ("groq-lpu-576", "llama-3-8b", ()), ("h200-sxm", "llama-3-8b", ())]))
def test_des_is_never_faster_than_the_closed_form(batch, context, case):
    hardware, model, overrides = case
    kw = dict(hardware=hardware, model=model, batch=batch, context=context, steps=1, overrides=overrides)
    des = simulate(RunSpec(**kw), check_capacity=False).summary["per_token_ms_p50"]
    ana = simulate(RunSpec(engine="analytic", **kw), check_capacity=False).summary["per_token_ms_p50"]
    assert des >= ana * (1 - 1e-9)


def test_a_deployment_that_does_not_fit_names_the_tier_and_the_overflow():
    res = simulate(hardware="groq-lpu-576", model="llama-3-70b", weights="bf16", steps=1)
    s = res.summary
    assert s["verdict"] == "does-not-fit" and s["overflowing_tiers"] == ["sram"]
    tier = s["capacity"]["tiers"]["sram"]
    over_mb = (tier["needed_bytes"] - tier["available_bytes"]) / 1e6
    assert "sram overflows by" in s["reason"] and f"{over_mb:.1f} MB" in s["reason"]
    # staging buffers count against SRAM: the PMU overflows when asked to hold 405B's largest projections
    pmu = capacity(resolve(_spec(model="llama-3-8b", overrides=RESIDENT_PMU)))
    assert not pmu["fits"] and "pmu" in [t for t, row in pmu["tiers"].items() if not row["fits"]]


def test_int8_70b_fits_the_published_groq_deployment_once_stages_are_balanced():
    cap = capacity(resolve(RunSpec(hardware="groq-lpu-576", model="llama-3-70b", weights="int8", steps=1)))
    assert cap["fits"], cap["tiers"]
    # and the even whole-layer split (two layers plus the LM head on the last stage) would not
    setup = resolve(RunSpec(hardware="groq-lpu-576", model="llama-3-70b", weights="int8", steps=1,
                            overrides=("hardware.system.partition=layers",)))
    assert not capacity(setup)["fits"]


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 1000), min_size=1, max_size=9), data=st.data())
def test_balanced_partition_is_contiguous_and_optimal(sizes, data):
    pp = data.draw(st.integers(1, len(sizes)))
    units = [((i, "attn"), s) for i, s in enumerate(sizes)]
    stages = balanced_partition(units, pp)
    assert len(stages) == pp and all(stages)
    assert [u for stage in stages for u in stage] == [u for u, _ in units]
    size_of = dict(units)
    worst = max(sum(size_of[u] for u in stage) for stage in stages)

    def best(i: int, k: int) -> float:  # brute force: the least largest stage over sizes[i:] in k stages
        if k == 1:
            return sum(sizes[i:])
        return min(max(sum(sizes[i:j]), best(j, k - 1)) for j in range(i + 1, len(sizes) - k + 2))

    assert worst == best(0, pp)


def test_many_chips_for_a_small_model_choose_a_valid_split():
    setup = resolve(RunSpec(hardware="groq-lpu-576", model="llama-3-8b", steps=1))
    assert setup.tp * setup.pp == 576 and setup.pp <= len(layer_units(32))
    units = [u for stage in setup.partition for u in stage]
    assert units == layer_units(32)
    with pytest.raises(ConfigError, match="66 half-layer units"):
        parallelism(RunSpec(hardware="groq-lpu-576", model="llama-3-8b", tp=1), setup.hardware, setup.model)


def test_stages_in_different_groups_talk_over_the_scaleout_links():
    raw = {"chips_per_group": {"value": 8, "source": "test"}, "bandwidth_GBps": {"value": 12.5, "source": "test"},
           "latency_ns": {"value": 5000, "source": "test"}, "per_message_overhead_ns": {"value": 0, "source": "test"}}
    base = resolve(RunSpec(hardware="sambanova-sn40l-16", model="llama-3-8b", tp=4, steps=1))
    data = copy.deepcopy(base.hardware.model_dump(mode="python"))
    data["system"]["scaleout"] = raw
    hw = HardwareProfile.model_validate(data)
    setup = dataclasses.replace(base, hardware=hw)
    graph = lower_step(setup, setup.steps[0].contexts)
    recv = [op for op in graph.ops if op.name == "recv_activations"]
    levels = [op.accesses[0].level for op in recv]
    # 16 chips at tp 4: stages 0-1 in group 0, 2-3 in group 1; only the stage-2 boundary crosses
    assert levels == ["link", "scaleout", "link"]
    costs = CostModel(hw)
    cross = costs.cost(recv[1].work)
    inside = costs.cost(recv[0].work)
    assert cross.total_ns > inside.total_ns
    assert costs.links.collective_latency_ns(recv[1].work) == pytest.approx(5000)


def test_fit_policy_places_what_fits_in_sram_and_stages_the_rest():
    fit = ("hardware.placement.policy=fit",)
    small = simulate(hardware="sambanova-sn40l-16", model="llama-3.2-1b", steps=1, overrides=fit)
    assert small.summary["placement"]["weights"] == {"tier": "pmu", "mode": "resident", "buffer": None}
    given = simulate(hardware="sambanova-sn40l-16", model="llama-3.2-1b", steps=1)
    assert given.summary["placement"]["weights"]["mode"] == "streamed"
    assert small.summary["per_token_ms_p50"] < given.summary["per_token_ms_p50"]
    moe = simulate(hardware="sambanova-sn40l-16", model="mixtral-8x7b", steps=1, overrides=fit)
    assert moe.summary["capacity"]["fits"]
    assert moe.summary["placement"]["experts"] == {"tier": "hbm", "mode": "streamed", "buffer": "pmu"}


def test_microbatches_interleave_their_own_programs():
    """Each micro-batch is its own lowering, on its own streams; the merged program keeps each
    one's ops and dependencies (renumbered) and reads the weights once per micro-batch."""
    one = resolve(RunSpec(hardware="h200-sxm", model="llama-3-8b", batch=4, context=512, steps=1))
    two = resolve(RunSpec(hardware="h200-sxm", model="llama-3-8b", batch=4, context=512, steps=1, microbatches=2))
    g1, g2 = lower_step(one, one.steps[0].contexts), lower_step(two, two.steps[0].contexts)
    assert len(g2.ops) == 2 * len(g1.ops)
    assert {op.stream for op in g2.ops} == {"main", "mb1"}
    for op in g2.ops:
        assert all(d < op.idx and g2.ops[d].stream == op.stream for d in op.deps)
    def streamed(g):  # weight bytes other than the embedding's gathered rows (one row per sequence)
        return sum(a.bytes for op in g.ops for a in op.accesses if a.category == "weights" and not a.granule)

    assert streamed(g2) == 2 * streamed(g1)
    assert g2.bytes(category="kv") == g1.bytes(category="kv")


def test_microbatches_on_one_chip_share_its_hbm_in_the_des_only():
    """Two micro-batches on one H200 each stream the weights. The DES cannot beat moving all
    their HBM bytes at the sustained rate; the closed form, which lets each stream use the whole
    HBM, can (it is the contention-free bound, not a prediction)."""
    kw = dict(hardware="h200-sxm", model="llama-3-8b", batch=8, context=2048, steps=1, microbatches=2)
    des = simulate(RunSpec(**kw)).summary
    ana = simulate(RunSpec(engine="analytic", **kw)).summary
    setup = resolve(RunSpec(**kw))
    graph = lower_step(setup, setup.steps[0].contexts)
    hbm = setup.hardware.store
    floor_ms = graph.bytes(level="hbm") / (hbm.peak_GBps * hbm.efficiency(None)) / 1e6
    assert des["per_token_ms_p50"] >= floor_ms
    assert ana["per_token_ms_p50"] < floor_ms < des["per_token_ms_p50"]
    assert des["breakdown_ms"].get("contention", 0) > 0
    assert "contention-free bound" in ana["engine_note"] and "engine_note" not in des
    single = simulate(RunSpec(engine="analytic", **{**kw, "microbatches": 1})).summary
    assert "engine_note" not in single  # one stream: the closed form is the prediction


def test_microbatches_pipeline_over_stages():
    """Four wafers, four micro-batches of one sequence: while micro-batch 1 runs on wafer 0,
    micro-batch 0 runs on wafer 1, so the step takes far less than four one-sequence steps."""
    base = dict(hardware="cerebras-wse3-x4", model="llama-3-70b", context=1024, steps=1)
    single = simulate(RunSpec(batch=1, **base)).summary["per_token_ms_p50"]
    piped = simulate(RunSpec(batch=4, microbatches=4, **base)).summary["per_token_ms_p50"]
    assert single < piped < 2 * single
    # a MoE model's micro-batches each route their own tokens (tests/test_expert_parallel.py)
    moe = dict(hardware="groq-lpu-576", model="mixtral-8x7b", batch=2, steps=1)
    assert simulate(RunSpec(microbatches=2, **moe)).summary["per_token_ms_p50"] > 0


def test_a_profile_naming_a_missing_stack_is_an_error_against_the_profile(tmp_path):
    profile = tmp_path / "lpu.yaml"
    text = (Path(__file__).resolve().parent.parent / "hardware_profiles" / "groq-lpu.yaml").read_text()
    profile.write_text(text.replace("software: static-schedule", "software: no-such-stack"))
    with pytest.raises(ConfigError) as err:
        resolve(RunSpec(hardware=str(profile), model="llama-3.2-1b", steps=1))
    assert err.value.file == str(profile) and err.value.key_path == "software"
