"""The validation report and its guard.

The guard reads the committed H200 decode-step measurements and fails if the simulator's
median absolute error exceeds 10% or its worst exceeds 20% (issue 6). The other tests check
the report's plumbing on a synthetic CSV, its error arithmetic, the bad-input path, and that
the published anchors are reproduced from specs alone (their runs override nothing but the
chip count).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from sim.experiments import validation
from sim.report.validation import collectives_rows

MEASURED = validation.repo_path(validation.DECODE_CSV)


@pytest.mark.skipif(not MEASURED.is_file(),
                    reason=f"{validation.DECODE_CSV} is not committed yet (the H200 calibration run writes it)")
def test_measured_h200_graph_steps_meet_the_error_aim():
    """The guard: every CUDA-graph row (batch 1, 8, 32 x context 1k, 4k, 16k) within the aim.

    The eager rows are not guarded: the plain PyTorch step is host-bound there, its time varies
    up to 2x between processes (calibration/README.md), and the simulator's host model charges
    the measured 8 us per launch but not the framework's per-op dispatch of heavier ATen calls;
    the next test pins that the report says so with the figures."""
    rows = validation.read_measured()
    assert rows, "the committed CSV has no measured rows"
    predicted = [r for r in validation.predict_measured(rows) if r["graph"]]
    assert len(predicted) == 9
    stats = validation.error_stats(predicted)
    detail = "; ".join(f"B{r['batch']} L{r['context']}: {r['error_pct']:+.1f}%" for r in predicted)
    assert stats["median_abs_pct"] <= validation.MEDIAN_BOUND_PCT, detail
    assert stats["worst_abs_pct"] <= validation.WORST_BOUND_PCT, detail


@pytest.mark.skipif(not MEASURED.is_file(), reason=f"{validation.DECODE_CSV} is not committed yet")
def test_report_states_the_eager_miss_plainly():
    rows = validation.read_measured()
    eager = [r for r in validation.predict_measured(rows) if not r["graph"] and r["batch"] == 1]
    assert eager, "the issue asks for eager rows at batch 1"
    report = (validation.repo_path("reports/validation.md")).read_text()
    assert "eager" in report and "host" in report
    for r in eager:
        assert f"{r['error_pct']:+.1f}%" in report, f"report lacks the eager error {r['error_pct']:+.1f}%"


def _fake_csv(path: Path, rows) -> Path:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, ["batch", "context", "graph", "median_ms", "kernels_per_step", "note"])
        writer.writeheader()
        for row in rows:
            writer.writerow(row)
    return path


def test_error_arithmetic_on_a_synthetic_csv(tmp_path):
    # measured = 1.25 x the prediction -> error -20%; = 0.8 x -> +25%
    probe = validation.predict_measured([{"batch": 1, "context": 1024, "graph": True, "median_ms": 1.0},
                                         {"batch": 8, "context": 4096, "graph": False, "median_ms": 1.0}])
    p1, p2 = probe[0]["predicted_ms"], probe[1]["predicted_ms"]
    assert p2 > p1 > 0  # eager at batch 8 and a longer context costs more
    path = _fake_csv(tmp_path / "steps.csv", [
        {"batch": 1, "context": 1024, "graph": "true", "median_ms": 1.25 * p1, "kernels_per_step": 300, "note": "x"},
        {"batch": 8, "context": 4096, "graph": "false", "median_ms": 0.8 * p2, "kernels_per_step": 400, "note": "y"},
    ])
    got = validation.predict_measured(validation.read_measured(path))
    assert [round(r["error_pct"], 6) for r in got] == [-20.0, 25.0]
    stats = validation.error_stats(got)
    assert stats["median_abs_pct"] == pytest.approx(22.5) and stats["worst_abs_pct"] == pytest.approx(25.0)


def test_validate_command_writes_the_three_sections(cli, tmp_path):
    probe = validation.predict_measured([{"batch": 1, "context": 1024, "graph": True, "median_ms": 1.0}])
    path = _fake_csv(tmp_path / "steps.csv", [{"batch": 1, "context": 1024, "graph": "true",
                                               "median_ms": probe[0]["predicted_ms"], "kernels_per_step": 1,
                                               "note": ""}])
    out = tmp_path / "validation.md"
    code, stdout, err = cli("validate", "--out", str(out), "--csv", str(path))
    assert code == 0, err
    text = out.read_text()
    assert "## (a) H200" in text and "## (b) Published" in text and "## (c) Tensor parallel" in text
    assert "median absolute error 0.0%" in text
    for anchor in validation.ANCHORS:
        assert anchor.system in text
    if not validation.tp_measurements():
        assert "**Not measured.**" in text


def test_validate_with_a_missing_or_malformed_csv_is_one_line_exit_2(cli, tmp_path):
    code, _out, err = cli("validate", "--out", str(tmp_path / "v.md"), "--csv", str(tmp_path / "none.csv"))
    assert code == 2 and err.count("\n") == 1 and "none.csv" in err
    bad = tmp_path / "bad.csv"
    bad.write_text("batch,context,graph,median_ms\n1,1024,maybe,2.0\n")
    code, _out, err = cli("validate", "--out", str(tmp_path / "v.md"), "--csv", str(bad))
    assert code == 2 and err.count("\n") == 1 and "bad.csv" in err and "graph" in err


@pytest.mark.parametrize("row, expect", [
    ("1,1024,true,0", "line 3: median_ms: must be a finite number of milliseconds > 0, got '0'"),
    ("1,1024,true,nan", "line 3: median_ms: must be a finite number of milliseconds > 0, got 'nan'"),
    ("1,1024,true,-2.5", "line 3: median_ms: must be a finite number of milliseconds > 0, got '-2.5'"),
    ("0,1024,true,2.0", "line 3: batch: must be a whole number >= 1, got '0'"),
    ("1,1e3,true,2.0", "line 3: context: must be a whole number >= 1, got '1e3'"),
    ("1,2", "line 3: expected 4 fields, as the header names, got 2"),
    ("1,1024,true,2.0,extra", "line 3: expected 4 fields, as the header names, got 5"),
])
def test_a_bad_measured_row_is_one_line_naming_its_line_and_column(cli, tmp_path, row, expect):
    """Before any simulation: a zero or missing measurement would divide by zero or print nan%."""
    bad = tmp_path / "bad.csv"
    bad.write_text(f"batch,context,graph,median_ms\n1,1024,true,2.0\n{row}\n")
    out = tmp_path / "v.md"
    code, _out, err = cli("validate", "--out", str(out), "--csv", str(bad))
    assert code == 2 and err == f"decodesim: {bad}: {expect}\n" and not out.exists()


def test_a_failed_measurement_left_empty_is_left_out(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text("batch,context,graph,median_ms\n1,1024,true,2.0\n8,1024,true,\n")
    assert [r["batch"] for r in validation.read_measured(path)] == [1]


def test_anchors_are_reproduced_from_specs_alone():
    """No anchor may override anything but the chip count: no efficiency tuned to its target."""
    assert len(validation.ANCHORS) >= 3
    for anchor in validation.ANCHORS:
        assert all(path == "hardware.system.chips" for path, _ in anchor.overrides), anchor.system
        row = validation.predict_anchor(anchor)
        assert row["predicted_ms"] is not None and row["predicted_ms"] > 0, anchor.system
        assert anchor.published_ms > 0 and anchor.source


# ---------------------------------------------------------------- issue 7: the link fit


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sim.experiments import link_fit  # noqa: E402

SIZES = [2 * b * h for b in (1, 8, 64) for h in (4096, 8192)] + [4 << 20, 64 << 20]


def _synthetic(o, lat, bw, worlds=(2, 4, 8)):
    truth = link_fit.LinkFit(o, lat, bw, 0, 0.0, 0.0, "truth")
    return [{"op": op, "world_size": n, "bytes": s, "t_ns": truth.predict_ns(op, n, s)}
            for op in ("allreduce", "alltoall") for n in worlds for s in SIZES]


@settings(max_examples=40, deadline=None)
@given(o=st.floats(0, 20_000), lat=st.floats(100, 5_000), bw=st.floats(20, 900))
def test_link_fit_recovers_the_figures_it_was_made_from(o, lat, bw):
    got = link_fit.fit(_synthetic(o, lat, bw))
    assert got.per_message_overhead_ns == pytest.approx(o, rel=1e-6, abs=1.0)  # ns
    assert got.latency_ns == pytest.approx(lat, rel=1e-5)
    assert got.bandwidth_GBps == pytest.approx(bw, rel=1e-5)
    assert got.worst_abs_residual_pct < 1e-3


def test_link_fit_block_loads_and_the_engine_reproduces_the_measurement(tmp_path):
    """Fit -> profile -> simulated all-reduce op time equals the 'measured' time."""
    import yaml

    from sim import load_profile
    from sim.costs import CostModel
    from sim.lowering.graph import Access, Builder

    rows = _synthetic(7000, 1200, 380)
    path = tmp_path / "collectives.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, ["op", "world_size", "bytes", "median_us", "note"])
        writer.writeheader()
        for r in rows:
            writer.writerow({"op": r["op"], "world_size": r["world_size"], "bytes": int(r["bytes"]),
                             "median_us": r["t_ns"] / 1e3, "note": "synthetic"})
        writer.writerow({"op": "allreduce", "world_size": 1, "bytes": 8192, "median_us": 3.0, "note": "plumbing"})
    fitted = link_fit.fit(link_fit.read_rows(path), source=str(path))
    base = yaml.safe_load(validation.repo_path("hardware_profiles/h200-sxm-x8.yaml").read_text())
    gap = base["host"]["kernel_gap_ns"]["value"]
    base["system"]["links"] = yaml.safe_load("system:\n" + fitted.yaml_block(gap))["system"]["links"]
    profile_path = tmp_path / "fitted.yaml"
    profile_path.write_text(yaml.safe_dump(base))
    hw = load_profile(str(profile_path))
    costs = CostModel(hw)
    size = 2 * 8 * 8192
    b = Builder()
    op = b.add("allreduce_ffn", 0, "collective", [Access("link", size, "link")], collective=("allreduce", size, 8),
               parallelism=8, kernels=1)
    cost = costs.cost(op.work)
    simulated = cost.gap_ns + cost.fill_ns + cost.body_ns(costs.capacity) + cost.drain_ns
    assert simulated == pytest.approx(fitted.predict_ns("allreduce", 8, size), rel=1e-3)


def test_link_fit_bad_input_names_the_file(tmp_path):
    bad = tmp_path / "c.csv"
    bad.write_text("op,world_size,bytes\nallreduce,2,100\n")
    with pytest.raises(validation_config_error()) as err:
        link_fit.read_rows(bad)
    assert "c.csv" in str(err.value) and "median_us" in str(err.value)


def validation_config_error():
    from sim.errors import ConfigError

    return ConfigError


def test_tp_section_fits_a_multi_gpu_collectives_csv(tmp_path):
    """The calibration script's CSV layout (op all_reduce/all_to_all, eager and graph rows, the max
    over ranks): graph rows only, fitted figures shown beside the profile's."""
    rows = _synthetic(6000, 900, 360)
    path = tmp_path / "collectives_ws8.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, ["op", "mode", "world_size", "plumbing_check", "bytes", "median_us",
                                         "median_us_max_over_ranks"])
        writer.writeheader()
        for r in rows:
            op = {"allreduce": "all_reduce", "alltoall": "all_to_all"}[r["op"]]
            us = r["t_ns"] / 1e3
            writer.writerow({"op": op, "mode": "graph", "world_size": r["world_size"], "plumbing_check": False,
                             "bytes": int(r["bytes"]), "median_us": 0.9 * us, "median_us_max_over_ranks": us})
            writer.writerow({"op": op, "mode": "eager", "world_size": r["world_size"], "plumbing_check": False,
                             "bytes": int(r["bytes"]), "median_us": 3 * us, "median_us_max_over_ranks": 3 * us})
    fitted = link_fit.fit(link_fit.read_rows(path))
    assert fitted.latency_ns == pytest.approx(900, rel=1e-4) and fitted.bandwidth_GBps == pytest.approx(360, rel=1e-4)
    text = "\n".join(collectives_rows(validation.collectives([path])))
    assert "| latency per algorithm step (ns) |" in text and "| 900 |" in text and "| 360 |" in text
    assert validation._max_world_size(path) == 8


def test_des_reproduces_the_measured_two_stream_overlap():
    """calibration/kernels.py's overlap rows: the DES makespans of two streams sharing HBM lie
    within 10% of the measured ones, between the longer stream alone and the two in sequence."""
    rows = validation.overlap_rows()
    assert {r["pair"] for r in rows} == {"gemv_a+sdpa", "gemv_a+gemv_b"}
    for r in rows:
        m, d = r["measured"], r["des"]
        assert d["together"] == pytest.approx(m["together"], rel=0.10)
        assert max(d["alone_a"], d["alone_b"]) < d["together"] <= d["alone_a"] + d["alone_b"] + 1e-6
