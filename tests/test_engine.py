"""Truth tests for the lowering and the engine: bytes, agreement, monotonicity, determinism."""

from __future__ import annotations

from collections import defaultdict
from functools import reduce
from operator import add

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim import load_profile
from sim.analytic import analyse
from sim.costs import CostModel
from sim.engine.simulation import Simulation
from sim.engine.timer import ordered_sum
from sim.lowering.cache import GraphCache
from sim.lowering.decode import lower_step
from sim.lowering.graph import Access, Builder, make_graph
from sim.run import RunSpec, capacity, resolve, simulate

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_hand_computed_bytes_llama3_8b_batch1():
    res = resolve(RunSpec(batch=1, context=4096, steps=1))
    graph = lower_step(res, (4096,))
    h, layers, ffn, vocab = 4096, 32, 14336, 128256
    per_layer = 2 * (h * (4096 + 1024 + 1024) + 4096 * h + 3 * h * ffn)
    embed_row = h * 2
    lm_head = 2 * vocab * h
    assert graph.bytes("weights") == layers * per_layer + embed_row + lm_head
    # K and V: 8 KV heads x 128 x 2 bytes each, per token per layer
    assert graph.bytes("kv", write=False) == layers * 4096 * 2 * 8 * 128 * 2
    assert graph.bytes("kv", write=True) == layers * 2 * 8 * 128 * 2


def _log_bytes(log):
    by = defaultdict(int)
    for _s, _l, _op, resource, kind, _t0, _t1, nbytes, _f in log:
        if resource not in ("compute", "host", "kernels"):  # kernel spans carry no bytes of their own
            by[(resource, kind.startswith("write"))] += nbytes
    return by


@pytest.mark.parametrize("software", ["fused", "torch-graph", "torch-eager"])
@pytest.mark.parametrize("batch, context", [(1, 512), (16, 4096)])
def test_event_log_conserves_kernel_bytes(batch, context, software):
    """The log moves exactly the bytes of the kernels the stack runs the ops as."""
    result = simulate(batch=batch, context=context, steps=2, keep_log=True, software=software)
    res = result.resolved
    costs = CostModel(res.hardware, res.stack)
    expected = defaultdict(int)
    for step in res.steps:
        graph = lower_step(res, step.contexts, step.index)
        for op in graph.ops:
            for f in costs.cost(op.work).flows:
                expected[(f.link, f.write)] += f.bytes
    assert dict(_log_bytes(result.log)) == dict(expected)


@pytest.mark.parametrize("software", ["fused", "torch-graph", "torch-eager", "torch-graph-grouped"])
@pytest.mark.parametrize("model", ["llama-3-8b", "mixtral-8x7b"])
def test_kernels_move_at_least_each_ops_bytes(software, model):
    """Conservation of the stacks: every role an op reads or writes is moved by its kernels at
    least once (exactly once where the stack fuses the op into one kernel)."""
    from sim.lowering.kernels import role_bytes

    res = resolve(RunSpec(model=model, batch=4, context=1024, steps=1, software=software))
    graph = lower_step(res, res.steps[0].contexts)
    for op in graph.ops:
        for write in (False, True):
            need = role_bytes(op.accesses, write)
            moved = role_bytes([a for k in op.work.kernels_run for a in k.accesses if a.role != "temp"], write)
            for role, n in need.items():
                assert moved.get(role, 0) >= n * 0.999, (op.name, role, write, moved.get(role, 0), n)
            if len(op.work.kernels_run) == 1:
                assert {r: v for r, v in moved.items()} == need, op.name


@pytest.mark.parametrize("kw", [
    dict(batch=1, context=4096),
    dict(batch=32, context=1024),
    dict(batch=8, context=16384, graph=False),
    dict(model="llama-3-70b", weights="int8", batch=4, context=2048),
])
def test_des_equals_analytic_when_nothing_contends(kw):
    des = simulate(steps=2, **kw).summary["per_token_ms_p50"]
    ana = simulate(steps=2, engine="analytic", **kw).summary["per_token_ms_p50"]
    assert des is not None and ana is not None
    assert des == pytest.approx(ana, rel=0.03)


def _two_stream_graph(nbytes=200_000_000):
    b = Builder()
    b.add("a", 0, "vector", [Access("hbm", nbytes, "weights")], stream="s1", parallelism=132)
    b.add("b", 0, "vector", [Access("hbm", nbytes, "weights")], stream="s2", parallelism=132)
    return make_graph(b.ops, step=0, contexts=(), stages=1)


def test_contention_makes_des_slower_than_roofline_and_conserves_work():
    hw = load_profile("h200-sxm")
    costs = CostModel(hw)
    graph = _two_stream_graph()
    op_costs = [costs.cost(op.work) for op in graph.ops]
    des = Simulation(graph, op_costs, costs.capacity, costs.host, graph_mode=True).run()
    ana = analyse(graph, op_costs, costs.host, graph_mode=True)
    assert des.time_ns > 1.5 * ana.time_ns  # both streams share the HBM
    body = 200e6 / (hw.store.peak_GBps * hw.store.efficiency(None))
    # two bodies' worth of bytes through one link: the pair ends ~2x one body after its start
    end_bodies = max(t.body_end for t in des.timings) - min(t.body_start for t in des.timings)
    assert end_bodies == pytest.approx(2 * body, rel=1e-6)


def test_determinism():
    a = simulate(batch=8, context=2048, steps=3, keep_log=True, keep_ops=True)
    b = simulate(batch=8, context=2048, steps=3, keep_log=True, keep_ops=True)
    assert a.log == b.log and a.ops == b.ops
    assert a.summary["per_token_ms_p50"] == b.summary["per_token_ms_p50"]


def test_capacity_verdict_70b_bf16_batch64_context32k_does_not_fit():
    s = simulate(model="llama-3-70b", batch=64, context=32768, steps=1).summary
    assert s["verdict"] == "does-not-fit" and s["per_token_ms_p50"] is None
    cap = s["capacity"]
    assert cap["needed_bytes"] > cap["available_bytes"] == 141e9
    # weights alone are 141 GB in bf16 and KV is 64 x 32768 x 320 KiB
    assert cap["kv_bytes"] == pytest.approx(64 * 32768 * 80 * 2 * 8 * 128 * 2, rel=1e-3)


def test_70b_bf16_on_one_h200_does_not_fit_and_could_not_meet_10ms_anyway():
    s = simulate(model="llama-3-70b", batch=1, context=1024, steps=1).summary
    # 141.1 GB of bf16 weights against 141 GB of HBM; reading them takes >= 29 ms at 4.8 TB/s
    assert s["verdict"] == "does-not-fit"
    assert s["byte_floor_ms"] > 29 and "29." in s["reason"]


def test_70b_int8_on_one_h200_misses_10ms_memory_bound():
    s = simulate(model="llama-3-70b", weights="int8", batch=1, context=1024, steps=1).summary
    assert s["verdict"] == "misses-target" and s["bound"] == "memory"
    assert s["per_token_ms_p50"] > s["byte_floor_ms"] > 14


def test_8b_batch1_context4k_between_byte_floor_and_twice_it():
    s = simulate(batch=1, context=4096, steps=2).summary
    floor = (s["weight_bytes_per_token"] + s["kv_bytes_per_token"]) / 4.8e12 * 1e3
    assert floor == pytest.approx(3.2, abs=0.1)
    assert floor < s["per_token_ms_p50"] < 2 * floor


@FAST
@given(scale=st.floats(1.05, 4.0), batch=st.sampled_from([1, 4, 32]), context=st.sampled_from([256, 4096]))
def test_more_hbm_bandwidth_never_slows_a_step(scale, batch, context):
    base = simulate(batch=batch, context=context, steps=1).summary["per_token_ms_p50"]
    faster = simulate(batch=batch, context=context, steps=1,
                      overrides=[("hardware.hbm.channel_bandwidth_GBps", {"scale": scale})]).summary
    assert faster["per_token_ms_p50"] <= base * (1 + 1e-9)


@FAST
@given(tiles=st.integers(1, 131), batch=st.sampled_from([1, 64]))
def test_more_tiles_never_slow_a_step(tiles, batch):
    def at(n):
        return simulate(batch=batch, context=1024, steps=1, overrides=[
            ("hardware.compute.tiles", n), ("hardware.smem.count", n)]).summary["per_token_ms_p50"]

    assert at(tiles + 1) <= at(tiles) * (1 + 1e-9)


@FAST
@given(context=st.integers(16, 60000), extra=st.integers(1, 20000), batch=st.sampled_from([1, 8]))
def test_longer_context_never_speeds_a_step(context, extra, batch):
    a = simulate(batch=batch, context=context, steps=1).summary["per_token_ms_p50"]
    b = simulate(batch=batch, context=context + extra, steps=1).summary["per_token_ms_p50"]
    assert b >= a


def test_eager_costs_more_than_graph_and_is_launch_bound_at_batch1():
    g = simulate(batch=1, context=1024, steps=1).summary
    e = simulate(batch=1, context=1024, steps=1, graph=False, software="torch-eager").summary
    assert e["per_token_ms_p50"] > g["per_token_ms_p50"]
    assert e["breakdown_ms"]["launch_sync"] > g["breakdown_ms"]["launch_sync"]


def test_breakdown_rows_sum_to_step_time():
    s = simulate(batch=8, context=8192, steps=2).summary
    assert sum(s["breakdown_ms"].values()) == pytest.approx(s["per_token_ms_mean"], rel=1e-6)


def test_events_per_step_do_not_grow_with_context_or_model_bytes():
    e1 = simulate(batch=16, context=1024, steps=2).summary["events"]
    e2 = simulate(batch=16, context=32768, steps=2).summary["events"]
    assert e1 == e2
    small = simulate(batch=1, context=1024, steps=1, overrides=[("model.hidden", 1024)]).summary["events"]
    big = simulate(batch=1, context=1024, steps=1).summary["events"]
    assert small == big


def test_capacity_accounts_tp_split():
    res = resolve(RunSpec(model="llama-3-70b", batch=1, context=1024, steps=1,
                          overrides=[("hardware.system.chips", 8)]))
    cap = capacity(res)
    assert res.tp == 8
    assert cap["weights_bytes"] == pytest.approx(141.1e9 / 8, rel=0.01)


def test_layer_replication_equals_full_lowering(monkeypatch):
    import sim.lowering.decode as decode

    res = resolve(RunSpec(batch=4, context=1000, steps=1))
    fast = lower_step(res, (1000, 2000, 10, 77))
    monkeypatch.setattr(decode, "_same_ops", lambda a, b: False)
    full = lower_step(res, (1000, 2000, 10, 77))
    assert [decode._signature(op, 0) + (op.layer,) for op in fast.ops] == \
        [decode._signature(op, 0) + (op.layer,) for op in full.ops]


def test_pipeline_stages_split_layers_evenly():
    res = resolve(RunSpec(model="llama-3-70b", weights="int8", steps=1, tp=8, pp=9,
                          overrides=[("hardware.system.chips", 72)]))
    sizes = [len(res.stage_layers(s)) for s in range(9)]
    assert sum(sizes) == 80 and max(sizes) - min(sizes) <= 1
    assert [res.stage_of(layer) for layer in res.stage_layers(4)] == [4] * sizes[4]


@pytest.mark.parametrize("model", ["llama-3-8b", "gemma-2-9b"])  # gemma: sliding and global layers alternate
def test_reused_step_graph_equals_full_lowering(monkeypatch, model):
    import sim.lowering.decode as decode

    res = resolve(RunSpec(model=model, batch=3, context=1000, steps=1))
    cache = GraphCache(res)
    cache.lower((1000, 5, 300))  # primes the reuse
    cache.lower((1001, 6, 8000), step=1)
    reused = cache.lower((1002, 7, 9000), step=2)
    assert cache.reused == 2
    monkeypatch.setattr(decode, "_same_ops", lambda a, b: False)
    full = lower_step(res, (1002, 7, 9000), step=2)
    assert [decode._signature(op, 0) + (op.layer, op.work) for op in reused.ops] == \
        [decode._signature(op, 0) + (op.layer, op.work) for op in full.ops]
    assert reused.ops[3:9] == full.ops[3:9] and len(reused.ops) == len(full.ops)


def test_reused_steps_time_as_lowered_afresh(monkeypatch):
    """A run that re-lowers only attention between steps gives every step the times, rows and
    per-op table of lowering each step in full (gemma-2: two kinds of attention layer)."""
    kw = dict(model="gemma-2-9b", batch=2, context=6000, steps=3, keep_ops=True, check_capacity=False)
    reused = simulate(**kw)
    lower = GraphCache.lower

    def afresh(self, contexts, step=0, position=0, prefill=(), counts=None):
        self._bases.clear()
        return lower(self, contexts, step, position, prefill, counts)

    monkeypatch.setattr(GraphCache, "lower", afresh)
    full = simulate(**kw)
    assert reused.steps == full.steps and reused.ops == full.ops
    assert len({s["time_ns"] for s in full.steps}) == 3  # contexts grow: each step differs


@pytest.mark.parametrize("kw", [
    dict(batch=1, context=4096),
    dict(batch=8, context=2048, graph=False),
    dict(model="mixtral-8x7b", batch=4, context=1024, weights="int8", dispatch="host_sync", software="torch-eager"),
])
def test_one_stream_per_stage_is_timed_without_events(kw):
    """With one stream per stage nothing can contend: the engine times the step by the step
    timer's closed form, schedules no event, and logs each op alone on its links."""
    res = resolve(RunSpec(steps=1, **kw))
    costs = CostModel(res.hardware, res.stack)
    graph = lower_step(res, res.steps[0].contexts)
    assert len(graph.lanes) == graph.stages  # one stream per stage
    op_costs = [costs.cost(op.work) for op in graph.ops]
    des = Simulation(graph, op_costs, costs.capacity, costs.host, res.graph, log=True).run()
    ana = analyse(graph, op_costs, costs.host, res.graph)
    assert des.events == 0 and des.time_ns == ana.time_ns and des.timings == ana.timings
    bodies = defaultdict(list)  # (layer, op name) -> the bodies of the ops so named
    for op, timing in zip(graph.ops, des.timings, strict=True):
        bodies[(op.layer, op.name)].append((timing.body_start, timing.body_end))
    for span in des.log:
        if span.resource not in ("host", "kernels"):  # a flow: inside the body of an op of its name
            # (a per-expert loop's merged flow may end up to 1% past its body: the log's estimate)
            assert any(a <= span.t_start_ns and span.t_end_ns <= b + 0.01 * (b - a) + 1e-6
                       for a, b in bodies[(span.layer, span.op)])
    assert sum(s.bytes for s in des.log) == sum(f.bytes for c in op_costs for f in c.flows)  # the kernels' bytes
    host = [s for s in des.log if s.resource == "host"]
    assert len([s for s in host if s.kind == "host.sync"]) == len(graph.syncs)


def _mixed_stage_graph():
    """Stage 0 runs two streams one after the other (shared, but never at once); stage 1 runs
    one stream that waits for stage 0, then a host sync."""
    b = Builder()
    b.add("a", 0, "vector", [Access("hbm", 50_000_000, "weights")], stream="s1", parallelism=132)
    b.add("b", 0, "vector", [Access("hbm", 30_000_000, "weights")], stream="s2", deps=(0,), parallelism=132)
    b.stage = 1
    b.add("c", 1, "vector", [Access("hbm", 20_000_000, "weights")], deps=(1,), parallelism=132)
    b.add("d", 1, "vector", [Access("hbm", 10_000_000, "weights")], parallelism=132)
    b.add("e", 1, "vector", [Access("hbm", 1_000, "act")], host_sync=True, parallelism=1)
    return make_graph(b.ops, step=0, contexts=(), stages=2)


@pytest.mark.parametrize("graph_mode", [True, False])
def test_events_agree_with_the_closed_form_op_by_op_when_nothing_overlaps(graph_mode):
    """A shared stage (flows, SimPy processes) beside a lone one (``LoneStream``): when the
    shared stage's streams never run at once nothing contends, and every op's moments (ready,
    issued, start, body, end) agree with the closed form to float rounding, the host's
    launches and sync included."""
    hw = load_profile("h200-sxm")
    costs = CostModel(hw)
    graph = _mixed_stage_graph()
    op_costs = [costs.cost(op.work) for op in graph.ops]
    des = Simulation(graph, op_costs, costs.capacity, costs.host, graph_mode).run()
    ana = analyse(graph, op_costs, costs.host, graph_mode)
    assert des.events > 0 and des.contention_ns == pytest.approx(0.0, abs=1e-6)
    assert des.time_ns == pytest.approx(ana.time_ns, rel=1e-12)
    for d, a in zip(des.timings, ana.timings, strict=True):
        assert d == pytest.approx(a, rel=1e-12, abs=1e-6)


def test_lanes_partition_the_program_and_survive_reuse():
    """Each op is in exactly one lane, in program order; a lane's external waits are its deps
    other than the op before it; a re-lowered step keeps the lanes, syncs and watched ops of a
    fresh lowering."""
    res = resolve(RunSpec(batch=3, context=1000, steps=1, software="fused"))
    cache = GraphCache(res)
    cache.lower((1000, 5, 300))
    reused = cache.lower((1001, 6, 301), step=1)
    fresh = lower_step(res, (1001, 6, 301), step=1)
    for graph in (reused, fresh):
        seen = [idx for lane in graph.lanes for idx in lane.ops]
        assert sorted(seen) == list(range(len(graph.ops)))
        for lane in graph.lanes:
            assert list(lane.ops) == sorted(lane.ops)
            for i, idx in enumerate(lane.ops):
                op = graph.ops[idx]
                assert (op.stage, op.stream) == (lane.stage, lane.stream)
                previous = lane.ops[i - 1] if i else None
                assert lane.external[i] == tuple(d for d in op.deps if d != previous)
        assert graph.syncs == tuple(op.idx for op in graph.ops if op.host_sync)
    assert (reused.lanes, reused.syncs, reused.watched, reused.streams) == \
        (fresh.lanes, fresh.syncs, fresh.watched, fresh.streams)


def test_cost_memos_are_bounded_and_change_no_result(monkeypatch):
    """A long run's memos do not grow with its steps; clearing them changes nothing."""
    import sim.costs
    import sim.results

    kw = dict(batch=4, context=512, steps=40)
    unbounded = simulate(**kw)
    monkeypatch.setattr(sim.costs, "MEMO_LIMIT", 8)
    monkeypatch.setattr(sim.results, "MEMO_LIMIT", 8)
    costs = CostModel(load_profile("h200-sxm"))
    res = resolve(RunSpec(batch=4, context=512, steps=1))
    for context in range(512, 560):
        for op in lower_step(res, (context,) * 4).ops:
            costs.cost(op.work)
            assert len(costs._memo) <= 8
    bounded = simulate(**kw)
    assert bounded.steps == unbounded.steps


@pytest.mark.parametrize("model, gains", [("olmoe-1b-7b", (2048 * 2, 2048 * 2)), ("qwen3-30b-a3b", (128 * 2, 128 * 2)),
                                          ("llama-3-8b", None)])
def test_qk_norm_ops_and_bytes_by_hand(model, gains):
    """QK-norm (OLMoE: RMSNorm over the whole Q and K projections; Qwen3: RMSNorm(head_dim) per
    head) is two norms per layer after the QKV projection: each reads and writes its
    projection's activations once and reads its gain weights; a model without it has none."""
    res = resolve(RunSpec(model=model, batch=3, context=512, steps=1))
    graph = lower_step(res, (512, 512, 512))
    layer0 = [op for op in graph.ops if op.layer == 0]
    names = [op.name for op in layer0]
    if gains is None:
        assert "q_norm" not in names and "k_norm" not in names
        return
    assert names[names.index("qkv") + 1:names.index("qkv") + 3] == ["q_norm", "k_norm"]
    m = res.model
    for name, width, gain in (("q_norm", m.heads * m.head_dim, gains[0]), ("k_norm", m.kv_heads * m.head_dim, gains[1])):
        op = next(o for o in layer0 if o.name == name)
        assert op.bytes(write=True) == 3 * width * 2
        assert op.bytes(write=False) == 3 * width * 2 + gain
    per_layer = sum(op.bytes("act", write=False) for op in layer0 if op.name in ("q_norm", "k_norm"))
    assert per_layer == 3 * 2 * (m.heads + m.kv_heads) * m.head_dim + sum(gains)
    assert m.params()["norms"] == (2 * m.layers + 1) * m.hidden + m.layers * sum(gains) // 2


@pytest.mark.parametrize("fields", [
    dict(batch=16, context=1024, steps=6),
    dict(batch=4, context=2048, steps=3, engine="analytic", keep_ops=True, keep_log=True),
    dict(model="llama-3.2-1b", software="torch-eager", batch=1, context=512, steps=3),
    dict(model="gemma-2-9b", batch=2, context=8000, steps=3),
    dict(model="mixtral-8x7b", dispatch="host_sync", steps=2),
    dict(hardware="groq-lpu-576", model="llama-3-70b", weights="int8", steps=2),
    dict(trace="workloads/traces/azure-conv-2023-b32.jsonl", steps=20),
], ids=["dense", "analytic-kept", "eager", "sliding", "moe", "spatial", "trace"])
def test_a_run_without_shared_stages_leaves_no_reference_cycles(fields):
    """Steps timed in closed form make no cyclic garbage: everything a run allocates is freed by
    reference counting, so the garbage collector's passes (which a long serving replay or study
    pays for in proportion to what it allocates) never find work. A kept bound method of an
    owner in one of its parts was such a cycle once (two per run)."""
    import gc

    fields = dict(fields)
    keep = {k: fields.pop(k) for k in ("keep_ops", "keep_log") if k in fields}
    simulate(**fields, **keep)  # imports, bundled files and memos are made once, outside the count
    gc.collect()
    gc.disable()
    try:
        gc.set_debug(gc.DEBUG_SAVEALL)
        simulate(**fields, **keep)
        found = gc.collect()
        kinds = sorted({type(o).__name__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert found == 0, f"{found} objects in reference cycles: {kinds}"


def _timed_both_ways(graph, graph_mode):
    costs = CostModel(load_profile("h200-sxm"))
    op_costs = [costs.cost(op.work) for op in graph.ops]
    kept = analyse(graph, op_costs, costs.host, graph_mode)
    lean = analyse(graph, op_costs, costs.host, graph_mode, moments=False)
    return kept, lean


def test_a_wait_for_an_op_inside_a_chain_is_timed_without_moments():
    """Without moments the closed form keeps only each chain's last end; an op on another
    stream that waits for an op inside a chain gets that op's end worked out from the chain
    (``_interior_end``), the same figure the kept moments hold."""
    b = Builder()
    for name in "abc":  # a chain on the main stream
        b.add(name, 0, "vector", [Access("hbm", 40_000_000, "weights")], parallelism=132)
    b.add("side", 0, "vector", [Access("hbm", 200_000_000, "weights")], stream="s1", deps=(1,), parallelism=132)
    b.add("join", 0, "vector", [Access("hbm", 1_000, "act")], deps=(2, 3), host_sync=True, parallelism=1)
    graph = make_graph(b.ops, step=0, contexts=(), stages=1)
    assert graph.chains[0] == 3  # ops 1 and 2 follow op 0: op 1 is inside the chain
    kept, lean = _timed_both_ways(graph, graph_mode=True)
    ready, _issued, _start, end, _costs, _bodies = kept.moments
    assert ready[3] == end[1] and ready[4] == end[3] > end[2]  # the side op waited for the interior op; the join for it
    assert lean.moments is None
    assert (lean.time_ns, lean.wait_ns, lean.host_sync_ns, lean.last_end) == \
        (kept.time_ns, kept.wait_ns, kept.host_sync_ns, kept.last_end)
    with pytest.raises(ValueError, match="without its per-op moments"):
        lean.timings  # noqa: B018 (a property read for its error)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["main", "main", "main", "s1"]), st.integers(1, 60_000_000),
                          st.one_of(st.none(), st.none(), st.none(), st.floats(0, 1)), st.booleans()),
                min_size=1, max_size=24),
       st.booleans())
def test_the_closed_form_without_moments_times_every_program_alike(spec, graph_mode):
    """Over random programs (streams, a wait for any earlier op, host syncs) the closed form
    gives the same step time, waits and syncs with and without per-op moments: bit for bit."""
    b = Builder()
    for i, (stream, nbytes, wait, sync) in enumerate(spec):
        deps = (min(int(wait * i), i - 1),) if wait is not None and i else None
        b.add(f"op{i}", 0, "vector", [Access("hbm", nbytes, "weights")], stream=stream, deps=deps,
              host_sync=sync and i % 5 == 4, parallelism=132)
    graph = make_graph(b.ops, step=0, contexts=(), stages=1)
    kept, lean = _timed_both_ways(graph, graph_mode)
    assert (lean.time_ns, lean.wait_ns, lean.host_sync_ns, lean.last_end) == \
        (kept.time_ns, kept.wait_ns, kept.host_sync_ns, kept.last_end)


@given(st.lists(st.floats(min_value=0.0, max_value=1e9, allow_nan=False), max_size=400),
       st.floats(min_value=0.0, max_value=1e12, allow_nan=False))
def test_the_timers_chain_sum_adds_in_order_bit_for_bit(durations, start):
    """A chain's end is its head's end plus each duration in turn: whichever summation the timer
    uses on this Python, it must round as adding one float after another does."""
    assert ordered_sum(iter(durations), start) == reduce(add, durations, start)
    # an example where compensated summation (Python 3.12's sum) rounds otherwise
    assert ordered_sum(iter([1e16, 1.0, 1.0, 1.0]), 0.0) == ((1e16 + 1.0) + 1.0) + 1.0
