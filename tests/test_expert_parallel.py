"""Expert-parallel deployments: load per EP rank, the straggler the hottest rank makes, redundant
experts (EPLB), attention data-parallel groups, all-to-alls over typed links, and the MoE names
declared once."""

from __future__ import annotations

import typing

import numpy as np
import pytest

from sim.config import defaults
from sim.config.hardware import Level
from sim.config.loader import _UNION_TAGS
from sim.config.spec import RunSpec
from sim.lowering.decode import lower_step
from sim.moe.placement import expert_loads, layout, place
from sim.moe.routing import RoutingTrace, generate, write
from sim.moe.sizes import expert_bytes
from sim.run import resolve, simulate

TINY = "tests/fixtures/moe/tiny-moe.yaml"
NONE = "tests/fixtures/moe/no-sram.yaml"


def _routing_file(tmp_path, layers: int, rows: list[list[int]], experts: int = 8) -> str:
    """A one-step routing file in which every MoE layer routes the tokens as ``rows``."""
    ids = np.array([[rows] * layers], dtype=np.int32)
    path = str(tmp_path / "routing.jsonl")
    write(RoutingTrace(ids, np.full(ids.shape, 1.0 / ids.shape[-1], dtype=np.float32), experts, "hand"), path)
    return path


def test_des_exceeds_analytic_by_the_hottest_ranks_extra_expert(tmp_path):
    """Mixtral-8x7B in bf16 on two H200s (h200-sxm-x8 cut to 2 chips), experts spread over the
    two (expert e on rank e mod 2), batch 1, one step; the token routes to experts 0 and 2 in all
    32 MoE layers, so rank 0 runs 2 experts and rank 1 none. The balanced rank (the analytic
    engine's) runs ceil(2 / 2) = 1 expert with ceil(2 / 2) = 1 pair; the hottest (the DES's) 2
    experts with 2 pairs. The all-to-alls are the same on both: the rank sends its ceil(1 / 2) =
    1 token's k = 2 rows and receives 2 (hottest) or 1 (balanced) rows, max = 2 either way.

    So the DES's step is longer by one whole expert's weights per layer, read at the expert op's
    stream rate: 3 x 4096 x 14336 x 2 B = 352,321,536 B at the store's sustained 4800 GB/s x
    0.9428 x (1 - 0.02) = 4434.9 GB/s x the matrix class's stream_fraction 0.995 = 4412.8 GB/s
    = 79.84 us per layer, x 32 layers = 2.555 ms (the extra pair's FLOPs overlap the load)."""
    path = _routing_file(tmp_path, 32, [[0, 2]])
    kw = dict(model="mixtral-8x7b", hardware="h200-sxm-x8", chips=2, placement="spread", batch=1, steps=1,
              context=1024, routing=path)
    des, analytic = simulate(engine="des", **kw).summary, simulate(engine="analytic", **kw).summary
    expert = 3 * 4096 * 14336 * 2
    rate_GBps = 4800 * 0.9428 * (1 - 0.02) * 0.995
    hand_ms = 32 * expert / rate_GBps / 1e6
    assert des["per_token_ms_mean"] - analytic["per_token_ms_mean"] == pytest.approx(hand_ms, rel=2e-3)
    moe = des["moe"]
    assert moe["straggler_ms_per_step"] == pytest.approx(hand_ms, rel=2e-3)
    assert moe["straggler_share"] == pytest.approx(hand_ms / des["per_token_ms_mean"], rel=2e-3)
    assert [r["tokens_per_layer"] for r in moe["ep_ranks"]] == [2.0, 0.0]
    assert moe["rank_imbalance"] == 2.0 and analytic["moe"]["straggler_in_step"] is False


@pytest.mark.parametrize("kw", [
    dict(routing="zipf", batch=16, chips=4),
    dict(routing="uniform", batch=5, chips=2),
    dict(routing="zipf", batch=16, chips=4, redundant_experts=4),
    dict(routing="zipf", batch=16, chips=4, attention_dp=2),
    dict(routing="zipf", batch=16, chips=4, microbatches=2),
])
def test_des_is_never_faster_than_the_balanced_analytic_step(kw):
    runs = {e: simulate(model=TINY, hardware=NONE, placement="spread", steps=3, context=256, engine=e, **kw)
            for e in ("des", "analytic")}
    for des, analytic in zip(runs["des"].steps, runs["analytic"].steps, strict=True):
        assert des["time_ns"] >= analytic["time_ns"]
    assert runs["des"].summary["moe"]["straggler_ms_per_step"] >= 0


def test_expert_bytes_and_pairs_are_conserved_over_the_ranks():
    """Every (token, expert) pair lands on one rank, and the ranks' expert weight bytes add up to
    the step's: each touched expert instance read once (a replicated expert's tokens split over
    its two replicas, so n tokens touch min(n, 2) of them)."""
    kw = dict(model=TINY, hardware=NONE, placement="spread", chips=4, batch=12, steps=3, context=256, routing="zipf",
              redundant_experts=3)
    res = resolve(RunSpec(**kw))
    plan, pl = res.moe, res.moe.placement
    assert (pl.rank_pairs.sum(axis=2) == 12 * res.model.moe.top_k).all()
    copies = layout(expert_loads(plan.trace, [12] * 3), pl.chips, pl.redundant).copies
    touched = sum(int(np.minimum(np.bincount(plan.trace.at(step, layer, 12).ravel(), minlength=8),
                                 copies[layer]).sum())
                  for step in range(3) for layer in range(pl.rank_active.shape[1]))
    assert pl.rank_active.sum() == touched
    ranks = simulate(**kw).summary["moe"]["ep_ranks"]
    unit = expert_bytes(res.model, res.weights, res.tp, plan.ep)
    assert sum(r["expert_bytes_per_step"] for r in ranks) * 3 == pytest.approx(touched * unit)


def test_redundant_experts_even_the_ranks_and_cost_their_memory():
    trace = generate(16, 2, 2, 6, 64, kind="zipf", skew=1.5, seed=3)
    plain = place(trace, "spread", 0, [64] * 6, chips=4)
    eplb = place(trace, "spread", 0, [64] * 6, chips=4, redundant=4)
    assert eplb.pairs.sum() < plain.pairs.sum()  # the hottest rank carries fewer tokens
    assert (eplb.rank_pairs.sum(axis=2) == plain.rank_pairs.sum(axis=2)).all()
    lay = layout(trace.counts(64), 4, 4)
    for layer in range(2):
        for rank in range(4):
            held = lay.expert[layer][lay.rank[layer] == rank]
            assert len(held) <= 5 and len(set(held)) == len(held)  # room ceil(20 / 4), no expert twice
        assert set(lay.expert[layer]) == set(range(16)) and (lay.copies[layer] >= 1).all()
    base = dict(model=TINY, hardware=NONE, placement="spread", chips=4, batch=8, steps=1, context=256)
    a, b = (simulate(**base, redundant_experts=r).summary["capacity"]["weights_bytes"] for r in (0, 4))
    assert b - a == 3 * expert_bytes(resolve(RunSpec(**base)).model, resolve(RunSpec(**base)).weights, 4, 4)


def test_attention_data_parallel_groups_share_the_batch_and_spread_the_experts():
    res = resolve(RunSpec(model=TINY, hardware=NONE, placement="spread", chips=4, attention_dp=2, batch=9,
                          steps=2, context=256))
    assert (res.tp, res.attention_dp, res.moe.ep) == (2, 2, 4)
    assert [s.batch for s in res.steps] == [5, 5] and res.deployment_batches == (9, 9)
    assert res.moe.placement.rank_pairs.sum(axis=2).max() == 9 * res.model.moe.top_k
    s = simulate(model=TINY, hardware=NONE, placement="spread", chips=4, attention_dp=2, batch=9, steps=2,
                 context=256).summary
    assert s["deployment_batch"] == 9 and s["batch"] == 5
    # a chip holds the KV of its group's 5 sequences, as one group of 2 chips alone would
    alone = simulate(model=TINY, hardware=NONE, chips=2, batch=5, steps=2, context=256).summary
    assert s["capacity"]["kv_bytes"] == alone["capacity"]["kv_bytes"] > 0
    assert s["throughput_tokens_per_s"] == pytest.approx(9 * 1e3 / s["per_token_ms_mean"], rel=1e-6)


def test_attention_dp_must_divide_the_chips():
    from sim.errors import ConfigError

    with pytest.raises(ConfigError, match="attention_dp"):
        resolve(RunSpec(model=TINY, hardware=NONE, chips=4, attention_dp=3))


def test_an_all_to_all_across_nodes_splits_its_rows_over_nvlink_and_infiniband():
    """16 EP ranks over two nodes of 8: of a rank's all-to-all rows, 7/16 go to its own node's
    other GPUs over NVLink and 8/16 to the other node over InfiniBand (1/16 stays)."""
    res = resolve(RunSpec(model="mixtral-8x7b", hardware="h200-sxm-x16", placement="spread", attention_dp=2,
                          batch=16, steps=1, context=256))
    graph = lower_step(res, res.steps[0].contexts)
    a2a = next(op for op in graph.ops if op.name == "dispatch_all_to_all")
    kind, size, n = a2a.work.collective
    by_level = {a.level: a.bytes for a in a2a.work.accesses if a.category == "link"}
    assert (kind, n) == ("alltoall_by_link", 16)
    assert by_level == {"link": -(-7 * size // 16), "scaleout": size // 2}
    one_node = resolve(RunSpec(model="mixtral-8x7b", hardware="h200-sxm-x8", placement="spread", batch=16, steps=1,
                               context=256))
    op = next(op for op in lower_step(one_node, one_node.steps[0].contexts).ops if op.name == "dispatch_all_to_all")
    assert op.work.collective[0] == "alltoall" and {a.level for a in op.work.accesses if a.category == "link"} == {"link"}


def test_moe_names_are_declared_once():
    assert typing.get_args(RunSpec.model_fields["dispatch"].annotation) == defaults.DISPATCHES
    assert typing.get_args(RunSpec.model_fields["placement"].annotation) == defaults.PLACEMENTS
    kinds = {typing.get_args(m.model_fields["kind"].annotation)[0] for m in typing.get_args(typing.get_args(Level)[0])}
    assert kinds == set(defaults.MEMORY_KINDS) == set(_UNION_TAGS)


def _space(model: str, grid: dict, moe: bool):
    from sim.search.space import SearchSpec, build_space

    spec = SearchSpec.model_validate({"model": model, "slo": {"ttft_ms": 2000, "tpot_ms": 100},
                                      "space": {"grid": {"hardware": ["h200-sxm-x8"], "weights": ["fp8"],
                                                         "kv": ["fp16"], "max_batch": [64],
                                                         "max_tokens_per_step": [2048], **grid}}})
    return build_space(spec, "search.yaml", lambda name: 8, lambda axis, value: None, moe=moe)


def test_search_space_spans_expert_parallel_layouts_of_moe_models():
    space = _space("deepseek-v3", {"chips": [8]}, moe=True)
    layouts = {(d.tp, d.pp, d.attention_dp, d.ep) for d in space.deployments}
    # ep is 1 or tp x attention_dp; tp x pp x attention_dp = 8; attention_dp stays 1 (below)
    assert (8, 1, 1, 8) in layouts and (8, 1, 1, 1) in layouts and (4, 2, 1, 4) in layouts
    assert all(ep in (1, tp * dp) and tp * pp * dp == 8 and dp == 1 for tp, pp, dp, ep in layouts)
    d = next(d for d in space.deployments if (d.tp, d.pp, d.ep) == (8, 1, 8))
    assert d.run_fields() == {"placement": "spread"} and "ep8" in d.label
    from sim.search.screen import run_spec

    res = resolve(run_spec(d, "mixtral-8x7b", (), batch=8, context=64, weights="bf16"))
    assert (res.tp, res.attention_dp, res.moe.ep) == (8, 1, 8)


def test_search_space_refuses_attention_data_parallel_groups_the_replay_cannot_time():
    """The serving replay that confirms a front times the whole live batch as one group
    (sim.serve.spec refuses attention_dp > 1), so the search does not offer such layouts."""
    from sim.errors import ConfigError

    with pytest.raises(ConfigError, match="space.grid.attention_dp"):
        _space("deepseek-v3", {"chips": [8], "attention_dp": [1, 2, 8]}, moe=True)


def test_search_space_keeps_dense_models_without_expert_parallelism():
    from sim.errors import ConfigError

    assert {d.ep for d in _space("llama-3-8b", {"chips": [8]}, moe=False).deployments} == {1}
    for axis in ("ep", "attention_dp"):
        with pytest.raises(ConfigError, match=f"space.grid.{axis}"):
            _space("llama-3-8b", {axis: [1, 8]}, moe=False)


def test_two_batch_overlap_routes_each_micro_batch_and_overlaps_its_all_to_all():
    """With two micro-batches (DeepEP/SGLang's two-batch overlap) each routes its own half of
    the tokens, and one's all-to-alls run while the other computes."""
    kw = dict(model=TINY, hardware=NONE, placement="spread", chips=4, batch=15, steps=2, context=256, microbatches=2)
    res = resolve(RunSpec(**kw))
    pairs = res.moe.placement.rank_pairs.sum(axis=2)  # rows: step x 2 + micro-batch
    assert pairs.shape[0] == 4 and (pairs[0::2] == 7 * 2).all() and (pairs[1::2] == 8 * 2).all()
    ops = simulate(**kw, keep_ops=True).ops
    a2a = [(o["t_start_ns"], o["t_end_ns"]) for o in ops if o["name"].endswith("all_to_all") and o["stream"] == "mb1"]
    busy = [(o["t_start_ns"], o["t_end_ns"]) for o in ops if o["stream"] == "main" and o["kind"] == "matmul"]
    assert any(a < d and c < b for a, b in a2a for c, d in busy)


def test_a_stack_that_says_two_batch_overlap_runs_moe_steps_as_two_micro_batches(tmp_path):
    import yaml

    raw = yaml.safe_load(open("workloads/software/fused.yaml"))
    raw.update(name="fused-tbo", moe_microbatches=2)
    stack = tmp_path / "fused-tbo.yaml"
    stack.write_text(yaml.safe_dump(raw))
    kw = dict(model=TINY, hardware=NONE, placement="spread", chips=4, batch=8, steps=1, context=256,
              software=str(stack))
    assert resolve(RunSpec(**kw)).spec.microbatches == 2
    assert resolve(RunSpec(**kw, microbatches=1)).spec.microbatches == 1  # the run's own wins
    assert resolve(RunSpec(**{**kw, "model": "llama-3-8b", "hardware": "h200-sxm"})).spec.microbatches == 1
