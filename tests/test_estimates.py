"""The estimates that decide an answer: ``run --estimates`` perturbs each estimated profile
figure by +-50%, reruns the analytic step and names those that move it most."""

from __future__ import annotations

import json

import pytest

from sim.experiments.estimates import deciding_estimates, estimates
from sim.run import RunSpec
from sim.setup import load_profile


def test_cerebras_llama_3_8b_is_decided_by_the_950_ns_per_scheduled_unit():
    """Each scheduled unit starts after one traversal of the wafer's mesh (the SRAM latency,
    950 ns, an estimate): nearly the whole step is proportional to it."""
    spec = RunSpec(hardware="cerebras-wse3", model="llama-3-8b", batch=1, context=1024, steps=1)
    d = deciding_estimates(spec, top=3)
    first = d["rows"][0]
    assert first["field"] == "hardware.sram.latency_ns" and first["value"] == 950
    assert 0.85 < first["share_of_step"] <= 1.0
    assert first["low_ms"] < d["baseline_ms"] < first["high_ms"]
    assert first["delta_ms"] >= max(r["delta_ms"] for r in d["rows"])
    assert len(d["rows"]) == 3 and d["tried"] == len(estimates(load_profile("cerebras-wse3")))


def test_a_bandwidth_that_bounds_the_step_has_a_negative_share():
    spec = RunSpec(hardware="h200-sxm", model="llama-3-8b", batch=1, context=1024, steps=1)
    first = deciding_estimates(spec, top=1)["rows"][0]
    assert first["field"] == "hardware.hbm.channel_bandwidth_GBps"
    assert -1.0 <= first["share_of_step"] < -0.5 and first["high_ms"] < first["low_ms"]


def test_only_estimates_are_perturbed_and_fractions_stay_fractions():
    rows = estimates(load_profile("groq-lpu"))
    assert rows and all(".energy." not in r.field for r in rows)
    by = {r.field: r for r in rows}
    assert by["hardware.sram.stream_efficiency"].high == 1.0  # 0.95 x 1.5 capped
    assert by["hardware.system.links.latency_ns"].low == 500
    assert "hardware.compute.matrix_flops_per_cycle.int8" not in by  # 750 TOPS is the datasheet's


def test_run_names_them_in_the_table_and_json(cli):
    args = ("run", "--hardware", "cerebras-wse3", "--model", "llama-3-8b", "--steps", "1", "--estimates", "2")
    code, out, _ = cli(*args)
    assert code == 0 and "deciding estimates (2 of" in out and "sram.latency_ns = 950 (9" in out
    code, out, _ = cli(*args, "--json")
    rows = json.loads(out)["deciding_estimates"]
    assert len(rows) == 2 and rows[0]["field"] == "hardware.sram.latency_ns"
    assert {"field", "source", "value", "share_of_step"} <= set(rows[0]) and "core mesh" in rows[0]["source"]


def test_groq_native_int8_is_decided_by_the_1_us_link_hop():
    spec = RunSpec(hardware="groq-lpu-576", model="llama-3-70b", weights="int8", batch=1, context=1024, steps=1)
    first = deciding_estimates(spec, top=1)["rows"][0]
    assert first["field"] == "hardware.system.links.latency_ns" and first["value"] == 1000
    assert "TPU ICI hop" in first["source"] and 0.3 < first["share_of_step"] < 0.7


@pytest.mark.parametrize("bad", ["0", "-2"])
def test_estimates_needs_a_positive_count(cli, bad):
    code, _out, err = cli("run", "--model", "llama-3-8b", "--steps", "1", "--estimates", bad)
    assert code == 2 and "--estimates" in err and "Traceback" not in err
