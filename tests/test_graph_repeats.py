"""Runs of copied layers (``OpGraph.repeats``): what make_graph derives by shifting the span a
run copies, and what the runner counts and costs from it, equal what walking every op gives."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.config.loader import validate
from sim.config.spec import RunSpec
from sim.costs import CostModel
from sim.lowering.cache import GraphCache, attention_kinds
from sim.lowering.decode import lower_step
from sim.lowering.graph import make_graph
from sim.run import _afresh, simulate
from sim.setup import resolve

FIELDS = ("streams", "watched", "lanes", "syncs", "chains", "watched_ops")
CASES = [
    dict(model="llama-3-8b"),
    dict(model="llama-3-8b", software="torch-eager"),
    dict(model="llama-3-8b", software="torch-graph-kv-quant", kv="int4-asym-g128"),
    dict(model="llama-3-70b", weights="int8", hardware="h200-sxm-x8", tp=8),
    dict(model="llama-3-70b", weights="int8", hardware="h200-sxm-x8", tp=2, pp=4),
    dict(model="llama-3-70b", weights="int8", hardware="groq-lpu-576"),
    dict(model="llama-3-8b", hardware="cerebras-wse3"),
    dict(model="llama-3-8b", hardware="sambanova-sn40l"),
    dict(model="qwen2.5-14b", software="fused"),
    dict(model="gemma-2-9b"),
    dict(model="mixtral-8x7b"),
    dict(model="deepseek-v3", weights="int4-g128", hardware="h200-sxm-x8", tp=8),
]


def _setup(batch: int, context: int, **kw):
    return resolve(validate(RunSpec, dict(batch=batch, context=context, steps=1, **kw), "test"))


def _derived(graph):
    return {name: getattr(graph, name) for name in FIELDS}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), batch=st.sampled_from([1, 3, 16]), context=st.sampled_from([128, 5000]))
def test_shifted_copies_derive_what_walking_every_op_does(case, batch, context):
    setup = _setup(batch, context, **case)
    graph = lower_step(setup, setup.steps[0].contexts)
    walked = make_graph(graph.ops, step=graph.step, contexts=graph.contexts, stages=graph.stages)
    assert _derived(graph) == _derived(walked)
    for repeat in graph.repeats:  # each copy is the span before the run, moved
        span = graph.ops[repeat.start - repeat.length:repeat.start]
        for k in range(repeat.count):
            shift = (k + 1) * repeat.length
            for op, copy in zip(span, graph.ops[repeat.start + k * repeat.length:][:repeat.length], strict=True):
                assert copy.work is op.work and copy.idx == op.idx + shift
                assert copy.deps == tuple(d + shift for d in op.deps)


@pytest.mark.parametrize("case", CASES[:4])
def test_the_runner_counts_and_costs_a_run_as_every_op(case):
    setup = _setup(16, 2048, **case)
    graph = GraphCache(setup).lower(setup.steps[0].contexts)
    costs = CostModel(setup.hardware, setup.stack)
    fast = _afresh(graph, costs)
    slow = _afresh(dataclasses.replace(graph, repeats=()), costs)
    assert fast.costs == slow.costs and fast.durations == slow.durations
    assert list(fast.keys) == list(slow.keys)  # the same keys in the same first-use order
    assert [(n, op.idx) for n, op in fast.keys.values()] == [(n, op.idx) for n, op in slow.keys.values()]


@pytest.mark.parametrize("case", CASES + [dict(model="llama-3-8b", microbatches=2)])
def test_attention_kinds_counted_from_a_run_are_those_of_every_op(case):
    """The graph cache's attention ops by kind, counted from each run's span, are what grouping
    every op (each copy made) gives: the same kinds in first-use order, indices and first layer."""
    setup = _setup(8, 5000, **case)
    graph = lower_step(setup, setup.steps[0].contexts)
    window = setup.model.window
    walked: dict[tuple, list] = {}
    for op in tuple(graph.ops):
        if op.work.kind == "attention":
            walked.setdefault((window(op.layer), op.row, op.compute_row), []).append(op)
    expected = [(ops[0].layer, (row, compute_row), tuple(op.idx for op in ops))
                for (_window, row, compute_row), ops in walked.items()]
    assert [(kind.layer, kind.rows, kind.places) for kind in attention_kinds(graph, window)] == expected
    assert not any(kind.prefill for kind in attention_kinds(graph, window))  # decode attention only
    assert sum(len(kind.places) for kind in attention_kinds(graph, window)) >= setup.model.layers // setup.pp


def test_attention_kinds_of_a_span_with_two_attention_ops_of_one_kind_are_in_program_order():
    """A run copying a span that holds two attention ops of one kind: their copies interleave."""
    from sim.lowering.graph import Access, Builder

    b = Builder()
    b.add("embed", -1, "vector", [Access("hbm", 64, "weights")])
    start = len(b.ops)
    for name in ("attn_a", "mid", "attn_b"):
        b.add(name, 0, "attention" if name != "mid" else "vector", [Access("hbm", 1000 + len(name), "kv")])
    b.append_copies(b.ops[start:], [1, 2, 3], repeat=True)
    b.add("head", -1, "vector", [Access("hbm", 64, "weights")])
    graph = make_graph(b.ops, step=0, contexts=(), stages=1, repeats=tuple(b.repeats))
    assert graph.repeats
    (kind,) = attention_kinds(graph, lambda layer: None)
    assert kind.layer == 0 and kind.places == (1, 3, 4, 6, 7, 9, 10, 12)


def test_a_dense_model_is_lowered_as_one_layer_and_a_run():
    setup = _setup(8, 1024, model="llama-3-8b")
    graph = lower_step(setup, setup.steps[0].contexts)
    (repeat,) = graph.repeats
    assert repeat.count == setup.model.layers - 1
    assert repeat.end == graph.ops[-1].idx + 1 - sum(op.layer < 0 for op in graph.ops[repeat.end:])


@pytest.mark.parametrize("case", CASES + [dict(model="deepseek-v3", weights="int4-g128", hardware="h200-sxm-x8",
                                                  tp=8, software="torch-graph-fused-moe")])
def test_copied_layers_equal_layers_lowered_one_by_one(case, monkeypatch):
    """Copies of a layer (by its kind, or after two equal layers) are what lowering each layer gives."""
    import sim.lowering.decode as decode

    setup = _setup(4, 5000, **case)
    copied = lower_step(setup, setup.steps[0].contexts)
    monkeypatch.setattr(decode, "layer_kind", lambda setup, layer: None if setup.is_moe_layer(layer) else (layer,))
    one_by_one = lower_step(setup, setup.steps[0].contexts)
    assert one_by_one.repeats == () and list(copied.ops) == list(one_by_one.ops)
    assert _derived(copied) == _derived(one_by_one)


def test_micro_batches_and_staged_weights_keep_no_run():
    setup = _setup(8, 1024, model="llama-3-8b", microbatches=2)
    assert lower_step(setup, setup.steps[0].contexts).repeats == ()
    assert simulate(model="llama-3-8b", batch=8, microbatches=2, steps=2).summary["per_token_ms_p50"] > 0


@given(layers=st.integers(3, 9), side=st.sampled_from(["b", "c", None]), sync=st.booleans())
@settings(max_examples=40, deadline=None)
def test_copies_of_layers_with_a_side_stream_derive_what_walking_does(layers, side, sync):
    """A layer whose op runs on a side stream (forked from the main stream's tail, joined by a
    later op): the waits across streams and the ops they mark as watched move with each copy."""
    from sim.lowering.decode import _same_ops
    from sim.lowering.graph import Access, Builder

    b = Builder(streams=lambda name: ("side", "join") if name == side else None)
    b.add("embed", -1, "vector", [Access("hbm", 64, "weights")])
    previous, template, run = None, None, []
    for layer in range(layers):
        if template is not None:
            run.append(layer)
            continue
        start = len(b.ops)
        for name in ("a", "b", "c", "join"):
            b.add(name, layer, "vector", [Access("hbm", 1000 + len(name), "act")], host_sync=sync and name == "c")
        span = b.ops[start:]
        if previous is not None and _same_ops(previous, span):
            template = previous
        previous = span
    b.append_copies(template or [], run, repeat=template is not None)
    b.add("head", -1, "vector", [Access("hbm", 64, "weights")])
    graph = make_graph(b.ops, step=0, contexts=(), stages=1, repeats=tuple(b.repeats))
    walked = make_graph(b.ops, step=0, contexts=(), stages=1)
    assert _derived(graph) == _derived(walked)
    assert bool(graph.repeats) == (layers > 3 if side else layers > 2)


@pytest.mark.parametrize("before", ["pre", "main"])
def test_a_run_whose_span_follows_another_stream_is_walked(before):
    """A span that waits for an op of another stream (its first op), copied: each copy waits
    for the span before it on its own stream instead, so make_graph walks the copies."""
    from sim.lowering.graph import Access, Builder

    b = Builder()
    embed = b.add("embed", -1, "vector", [Access("hbm", 64, "weights")], stream=before)
    start = len(b.ops)
    b.add("a", 0, "vector", [Access("hbm", 1000, "act")], deps=(embed.idx,))
    b.add("b", 0, "vector", [Access("hbm", 2000, "act")])
    b.append_copies(b.ops[start:], [1, 2, 3], repeat=True)
    graph = make_graph(b.ops, step=0, contexts=(), stages=1, repeats=tuple(b.repeats))
    walked = make_graph(b.ops, step=0, contexts=(), stages=1)
    assert graph.repeats and _derived(graph) == _derived(walked)


def test_programs_of_one_shape_but_other_waits_derive_apart():
    """make_graph keeps what it derives for a program with runs of copies by the program's shape
    (sim.lowering.graph._shape): two programs alike in all but what one op outside the copies
    waits for must not share a derivation."""
    from sim.lowering.graph import Access, Builder

    derived = []
    for wait_for_embed in (False, True, False):
        b = Builder()
        embed = b.add("embed", -1, "vector", [Access("hbm", 64, "weights")])
        start = len(b.ops)
        b.add("a", 0, "vector", [Access("hbm", 1000, "act")])
        b.add("b", 0, "vector", [Access("hbm", 2000, "act")])
        b.append_copies(b.ops[start:start + 2], [1], repeat=False)
        b.append_copies(b.ops[start + 2:start + 4], [2, 3], repeat=True)
        b.add("head", -1, "vector", [Access("hbm", 64, "weights")],
              deps=(b.ops[-1].idx, embed.idx) if wait_for_embed else None)
        graph = make_graph(b.ops, step=0, contexts=(), stages=1, repeats=tuple(b.repeats))
        walked = make_graph(b.ops, step=0, contexts=(), stages=1)
        assert graph.repeats and _derived(graph) == _derived(walked)
        derived.append(_derived(graph))
    assert derived[0] != derived[1] and derived[0] == derived[2]


@pytest.mark.parametrize("index", [0, 5, -1, -7])
def test_a_program_indexes_and_slices_as_the_tuple_of_its_ops(index):
    setup = _setup(4, 512, model="llama-3-8b")
    ops = lower_step(setup, setup.steps[0].contexts).ops
    whole = tuple(ops)
    assert ops[index] == whole[index]
    assert ops[3:40:7] == whole[3:40:7] and isinstance(ops[3:40:7], tuple)
    with pytest.raises(IndexError):
        ops[-len(whole) - 1]
    with pytest.raises(IndexError):
        ops[len(whole)]


def test_read_and_write_make_the_accesses_their_keywords_name():
    from sim.lowering.graph import Access, read, write

    assert read("hbm", 5, "kv", "kv") == Access("hbm", 5, "kv", role="kv")
    assert read("hbm", 5, "outliers", "kv", granule=32) == Access("hbm", 5, "outliers", granule=32, role="kv")
    assert write("l2", 7, "act", "y") == Access("l2", 7, "act", write=True, role="y")
    assert type(read("l2", 1, "act", "x")) is Access and read("l2", 1, "act", "x").role == "x"
