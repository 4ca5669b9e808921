"""Routing traces: the uniform closed form, generator invariants, skew, locality, the file
format and ``decodesim routing``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.errors import ConfigError
from sim.moe import routing
from sim.moe.routing import expected_distinct, generate


@pytest.mark.parametrize("experts,top_k", [(8, 2), (256, 8), (128, 4), (64, 6)])
@pytest.mark.parametrize("tokens", [1, 3, 8, 64])
def test_uniform_distinct_matches_closed_form(experts, top_k, tokens):
    trace = generate(experts, top_k, layers=20, steps=100, tokens=tokens, kind="uniform", seed=7)
    measured = trace.distinct(tokens).mean()  # 2000 (step, layer) samples
    assert measured == pytest.approx(expected_distinct(experts, top_k, tokens), rel=0.02)


@settings(max_examples=30, deadline=None)
@given(experts=st.integers(2, 64), data=st.data(), tokens=st.integers(1, 16), seed=st.integers(0, 1000),
       kind=st.sampled_from(["uniform", "zipf"]), locality=st.floats(0, 1))
def test_generated_rows_are_valid_and_deterministic(experts, data, tokens, seed, kind, locality):
    k = data.draw(st.integers(1, experts))
    a = generate(experts, k, 3, 4, tokens, kind=kind, skew=1.3, locality=locality, seed=seed)
    b = generate(experts, k, 3, 4, tokens, kind=kind, skew=1.3, locality=locality, seed=seed)
    assert np.array_equal(a.experts, b.experts) and np.array_equal(a.gates, b.gates)
    assert a.experts.min() >= 0 and a.experts.max() < experts
    sorted_ids = np.sort(a.experts, axis=3)
    assert (np.diff(sorted_ids, axis=3) > 0).all()  # a token's k experts are distinct
    assert np.allclose(a.gates.sum(axis=3), 1.0, atol=1e-5)
    assert (a.distinct(tokens) <= min(experts, k * tokens)).all()


def test_zipf_concentrates_and_locality_repeats():
    uniform = generate(64, 4, 8, 40, 16, kind="uniform", seed=3)
    skewed = generate(64, 4, 8, 40, 16, kind="zipf", skew=1.5, seed=3)
    assert skewed.distinct().mean() < 0.8 * uniform.distinct().mean()
    # per-layer variation: each layer has its own hottest expert
    hottest = skewed.counts().argmax(axis=1)
    assert len(set(hottest.tolist())) > 1
    sticky = generate(64, 4, 2, 30, 16, kind="uniform", locality=1.0, seed=3)
    assert (sticky.experts[1:] == sticky.experts[:-1]).all()
    half = generate(64, 4, 2, 200, 16, kind="uniform", locality=0.5, seed=3)
    same = (half.experts[1:] == half.experts[:-1]).all(axis=3).mean()
    assert 0.45 < same < 0.55


def test_bad_generator_arguments():
    with pytest.raises(ConfigError, match="routing"):
        generate(8, 2, 1, 1, 1, kind="pareto")
    with pytest.raises(ConfigError, match="locality"):
        generate(8, 2, 1, 1, 1, locality=1.5)


def test_file_round_trip(tmp_path):
    trace = generate(16, 2, 3, 5, 4, kind="zipf", skew=1.0, seed=2)
    path = tmp_path / "r.jsonl"
    routing.write(trace, path)
    back = routing.read(path, 16, 2, 3)
    assert np.array_equal(back.experts, trace.experts)
    assert np.allclose(back.gates, trace.gates, atol=1e-4)


def _lines(*records):
    return "\n".join(json.dumps(r) for r in records) + "\n"


@pytest.mark.parametrize("records,match", [
    ([{"step": 0, "layer": 0, "experts": [[1, 1]]}], "distinct"),
    ([{"step": 0, "layer": 0, "experts": [[1, 9]]}], r"ints in \[0, 8\)"),
    ([{"step": 0, "layer": 0, "experts": [[1]]}], "rows of 2"),
    ([{"step": 0, "experts": [[1, 2]]}], "missing key 'layer'"),
    ([{"routing": {"experts": 16}}], "routing.experts"),
    ([{"step": 1, "layer": 0, "experts": [[1, 2]]}], "step 0, layer 0"),
])
def test_bad_files_name_the_line(tmp_path, records, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(_lines(*records))
    with pytest.raises(ConfigError, match=match):
        routing.read(path, 8, 2, 1)


def test_routing_command(cli, tmp_path):
    code, out, err = cli("routing", "--model", "mixtral-8x7b", "--batch", "1,8", "--steps", "8")
    assert code == 0, err
    assert "E(1-(1-k/E)^T)" in out and "7.20" in out  # the closed form at batch 8
    target = tmp_path / "t.jsonl"
    code, out, _ = cli("routing", "--model", "deepseek-v3", "--batch", "4", "--steps", "2", "--write", str(target),
                       "--json")
    assert code == 0
    rows = json.loads(out)["rows"]
    assert rows[0]["batch"] == 4 and json.loads(target.read_text().splitlines()[0])["routing"]["layers"] == 58
    code, _, err = cli("routing", "--model", "llama-3-8b")
    assert code == 2 and "no moe" in err
