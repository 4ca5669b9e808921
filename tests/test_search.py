"""decodesim search (sim.search): the front it claims, its invariants, its input errors.

The real pipeline runs once on a tiny space (llama-3.2-1b on one H200, 16 deployments, short
replays); the front's invariants are also held as hypothesis properties of the pure
functions (sim.search.front) with a stand-in check, where thousands of cases are cheap.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.errors import ConfigError
from sim.search import load_space, run_search
from sim.search.front import X, Y, confirmed_front, dominates, pareto
from sim.search.output import text as summary_text
from sim.search.screen import queue_ttft_ns, steady_batch
from tests.conftest import ROOT, run_cli

TINY = ROOT / "tests" / "fixtures" / "search" / "tiny.yaml"
VOLATILE = {"replay_wall_s"}


@pytest.fixture(scope="module")
def tiny():
    return run_search(load_space(TINY), jobs=1, progress=False)


def _stable(rows):
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]


# -- the real search -------------------------------------------------------------------------


def test_every_front_point_meets_the_slos_it_claims_and_fits(tiny):
    slo = tiny.space.spec.slo
    pct = slo.percentile
    assert tiny.front, "the tiny search should find a front"
    assert tiny.complete
    for p in tiny.front:
        assert p["status"] == "screened" and p["kv_pool_GB_per_chip"] > 0  # fits: pruning let it through
        assert p["checked"] and p["verdict"] == "meets-slo", p.get("verdict_reason")
        assert p[f"ttft_ms_p{pct}"] <= slo.ttft_ms
        assert p[f"tpot_ms_p{pct}"] * max(1.0, p["des_over_analytic"]) <= slo.tpot_ms
        assert p["tpot_ms_claimed"] <= slo.tpot_ms
        assert p["replay_rejected"] == 0 and p["replay_requests"] > 0


def test_no_dominated_point_on_the_front(tiny):
    passing = [r for r in tiny.rows if r.get("verdict") == "meets-slo"]
    for p in tiny.front:
        assert not any(dominates(q, p) for q in passing), p["index"]
    # and every replayed deployment that passed is on or below the front
    for q in passing:
        assert any(p is q or dominates(p, q) or (p[X] == q[X] and p[Y] == q[Y]) for p in tiny.front)
    assert tiny.chosen is not None and tiny.chosen[X] == max(p[X] for p in tiny.front)


def test_pruning_happens_before_anything_is_timed():
    space = load_space(TINY, {"model": "llama-3-70b", "space.grid.weights": ["bf16"], "space.grid.kv": ["fp16"],
                              "space.grid.max_batch": [32], "space.grid.max_tokens_per_step": [512]})
    result = run_search(space, jobs=1, progress=False)  # 141 GB of bf16 weights on one 141 GB H200
    (row,) = result.rows
    assert row["status"] == "does-not-fit" and "KV" in row["reason"]
    assert "est_tpot_ms" not in row and result.counts["replays"] == 0 and not result.front


def test_search_is_deterministic(tiny):
    again = run_search(load_space(TINY), jobs=1, progress=False)
    assert _stable(again.rows) == _stable(tiny.rows)
    assert [p["index"] for p in again.front] == [p["index"] for p in tiny.front]


def test_removing_an_axis_value_never_improves_the_real_front(tiny):
    fewer = run_search(load_space(TINY, {"space.grid.max_batch": [32]}), jobs=1, progress=False)
    assert fewer.rows and len(fewer.rows) < len(tiny.rows)
    for p in fewer.front:
        assert any(q[X] >= p[X] and q[Y] >= p[Y] for q in tiny.front), p


# -- the front's invariants as properties ------------------------------------------------------

AXIS = st.sampled_from(["a", "b", "c", "d"])
CANDIDATE = st.tuples(AXIS, st.integers(0, 6), st.integers(0, 6), st.booleans())


def _candidates(specs):
    """Candidates with an axis value, integer coordinates (ties happen) and a hidden verdict."""
    return [{"index": i, "axis": a, X: float(x), Y: float(y), "passes": ok} for i, (a, x, y, ok) in enumerate(specs)]


def _confirm(batch):
    return [{"verdict": "meets-slo" if c["passes"] else "misses-slo"} for c in batch]


def _passed(row):
    return row["verdict"] == "meets-slo"


@settings(max_examples=300, deadline=None)
@given(st.lists(CANDIDATE, max_size=40))
def test_pareto_front_is_exactly_the_non_dominated_points(specs):
    points = _candidates(specs)
    front = pareto(points)
    ids = {p["index"] for p in front}
    for p in front:
        assert not any(dominates(q, p) for q in points)
    for q in points:  # every other point is dominated, or equal to a point on the front
        if q["index"] not in ids:
            assert any(dominates(p, q) or (p[X] == q[X] and p[Y] == q[Y]) for p in front)


@settings(max_examples=300, deadline=None)
@given(st.lists(CANDIDATE, max_size=40))
def test_confirmed_front_is_the_front_of_the_passing_candidates(specs):
    points = _candidates(specs)
    result = confirmed_front(points, _confirm, budget=10_000, passed=_passed)
    assert result.complete
    assert result.front == pareto([p for p in points if p["passes"]])
    assert all(result.checked[p["index"]]["verdict"] == "meets-slo" for p in result.front)


@settings(max_examples=300, deadline=None)
@given(st.lists(CANDIDATE, max_size=40), AXIS)
def test_removing_an_axis_value_never_improves_the_front(specs, removed):
    points = _candidates(specs)
    full = confirmed_front(points, _confirm, budget=10_000, passed=_passed).front
    fewer = confirmed_front([p for p in points if p["axis"] != removed], _confirm, budget=10_000,
                            passed=_passed).front
    for p in fewer:
        assert any(q[X] >= p[X] and q[Y] >= p[Y] for q in full)


@settings(max_examples=200, deadline=None)
@given(st.floats(0.01, 100), st.floats(1, 200), st.integers(1, 512), st.floats(1e5, 1e8), st.floats(0, 5e4))
def test_steady_batch_solves_littles_law(rate, output, limit, base_ns, slope_ns):
    def T(b):
        return base_ns + slope_ns * b

    b = steady_batch(T, rate, output, limit)
    if b is None:  # no steady state: even the batch limit cannot carry the rate
        assert rate * output * T(limit) / 1e9 > limit
    else:
        assert 1 <= b <= limit and (b == 1 or rate * output * T(b) / 1e9 <= b * (1 + 1e-6))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10), st.integers(1, 4000), st.integers(1, 400)), min_size=1, max_size=60),
       st.integers(1, 16))
def test_queue_ttft_needs_more_slots_never_longer(requests, slots):
    arrivals = np.sort(np.array([a for a, _, _ in requests]))
    prompts = np.array([p for _, p, _ in requests])
    outputs = np.array([o for _, _, o in requests])
    prefill = prompts * 1e4  # ns
    fewer = queue_ttft_ns(arrivals, prompts, outputs, slots, prefill, 2e7, 99)
    more = queue_ttft_ns(arrivals, prompts, outputs, slots + 1, prefill, 2e7, 99)
    alone = float(np.percentile(prefill, 99))  # enough slots: nobody waits
    assert more <= fewer + 1e-6
    assert queue_ttft_ns(arrivals, prompts, outputs, len(requests), prefill, 2e7, 99) == pytest.approx(alone)


# -- the command line ----------------------------------------------------------------------------


def test_cli_json_is_the_versioned_envelope(tiny, tmp_path):
    import jsonschema

    from sim.schema import output_schema

    code, out, err = run_cli("search", "--space", str(TINY), "--jobs", "1", "--quiet", "--json", "--out",
                             str(tmp_path / "out"))
    assert code == 0, err
    data = json.loads(out)
    jsonschema.Draft202012Validator(output_schema()).validate(data)
    assert data["kind"] == "search" and data["chosen"]["index"] == tiny.chosen["index"]
    assert [p["index"] for p in data["front"]] == [p["index"] for p in tiny.front]
    for name in ("deployments.parquet", "deployments.csv", "search.json", "front.png", "report.md"):
        assert (tmp_path / "out" / name).is_file(), name
    assert "chosen" in (tmp_path / "out" / "report.md").read_text()
    from sim.report.search import rerender  # redraws from the folder's files alone

    before = (tmp_path / "out" / "report.md").read_text()
    rerender(tmp_path / "out")
    assert (tmp_path / "out" / "report.md").read_text() == before


BAD = {
    "unknown axis": ("space: {grid: {batch_size: [1]}}", "space.grid.batch_size", "unknown axis"),
    "wrong type": ("space: {grid: {max_batch: [16, big]}}", "space.grid.max_batch.1", "whole number"),
    "unknown format": ("space: {grid: {kv: [fp16, int3]}}", "space.grid.kv.1", "unknown format"),
    "unknown hardware": ("space: {grid: {hardware: [h999]}}", "space.grid.hardware.0", "unknown hardware"),
    "bad range": ("space: {grid: {max_batch: {from: 1, to: 8}}}", "space.grid.max_batch", "steps"),
    "unknown key": ("slo: {ttft_ms: 1, tpot_ms: 1}\nbudget: 3", "budget", ""),
    "missing slo": ("", "slo", "latency targets"),
    "bad slo": ("slo: {ttft_ms: -1, tpot_ms: 1}", "slo.ttft_ms", ""),
    "exclude typo": ("space:\n  grid: {kv: [fp16]}\n  exclude: [{where: {kv: fp61}, reason: x}]",
                     "space.exclude.0.where.kv", "value of the axis"),
    "ep on a dense model": ("space: {grid: {ep: [1, 8]}}", "space.grid.ep", "Mixture-of-Experts"),
    "yaml syntax": ("space: {grid: [", "", ""),
    "not a mapping": ("- 1\n- 2", "", ""),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_search_yaml_is_one_line_and_exit_2(tmp_path, case):
    body, key, expected = BAD[case]
    path = tmp_path / "bad.yaml"
    slo = "" if "slo" in body or case == "missing slo" else "slo: {ttft_ms: 9, tpot_ms: 9}\n"
    head = "model: llama-3.2-1b\n" + slo
    path.write_text(head + textwrap.dedent(body) + "\n")
    code, out, err = run_cli("search", "--space", str(path), "--quiet")
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(path) in lines[0] and key in lines[0] and expected in lines[0], lines[0]


@pytest.mark.parametrize("argv, expect", [
    (("--model", "no-such-model"), "command line: --model: unknown model 'no-such-model'"),
    (("--tpot-ms", "-3"), "command line: --tpot-ms: "),
    (("--hardware", ","), "command line: --hardware: item 1 of the comma list is empty"),
    (("--hardware", "h200-sxm,,b200"), "command line: --hardware: item 2 of the comma list is empty"),
    (("--requests", "no-such-source"), "command line: --requests: request source not found"),
])
def test_bad_command_line_values_are_said_against_the_option(argv, expect):
    """A value an option gave is not blamed on the search file key it overrode."""
    code, out, err = run_cli("search", "--space", str(TINY), "--quiet", *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)
    assert err.startswith(f"decodesim: {expect}"), err


def test_a_request_source_that_is_not_there_names_the_search_file_key(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(TINY.read_text().replace("requests: azure-conv", "requests: no-such-source"))
    code, _out, err = run_cli("search", "--space", str(path), "--quiet")
    assert code == 2 and err.startswith(f"decodesim: {path}: traffic.requests: request source not found"), err


def test_dask_executor_gives_the_local_result(tiny):
    distributed = pytest.importorskip("dask.distributed")
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as client:
        result = run_search(load_space(TINY), executor="dask", address=client, progress=False)
    assert _stable(result.rows) == _stable(tiny.rows)


UNMAKEABLE = Path("/proc/decodesim-out")  # root passes the permission check there; the kernel refuses the folder
needs_proc = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")


@needs_proc
def test_an_out_folder_that_cannot_be_made_is_refused_before_the_search_runs(monkeypatch):
    import sim.commands.handlers.search as handler

    def boom(*a, **k):
        raise AssertionError("the search must not run")

    monkeypatch.setattr(handler, "run_search", boom)
    code, out, err = run_cli("search", "--space", str(TINY), "--duration-s", "2", "--quiet", "--out", str(UNMAKEABLE))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"decodesim: {UNMAKEABLE}"), err


@needs_proc
def test_writing_the_outputs_where_no_folder_can_be_made_names_the_folder(tiny):
    from sim.search.output import write_outputs

    with pytest.raises(ConfigError) as info:
        write_outputs(tiny, UNMAKEABLE)
    assert info.value.file == str(UNMAKEABLE)


def test_the_summary_line_accounts_for_every_deployment(tiny):
    """do not fit + cannot run + cannot carry the rate + miss + meet on the screen = deployments."""
    line = summary_text(tiny).splitlines()[2]
    total = int(re.search(r"([\d,]+) deployments", line).group(1).replace(",", ""))
    parts = [r"([\d,]+) do not fit", r"([\d,]+) cannot run", r"([\d,]+) cannot carry the rate",
             r"([\d,]+) miss the SLOs on the screen", r"([\d,]+) meet them"]
    counts = [int(re.search(part, line).group(1).replace(",", "")) for part in parts]
    assert sum(counts) == total and counts[3] > 0 and counts[4] > 0, line
