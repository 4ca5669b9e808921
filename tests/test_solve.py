"""``solve``: bisection over one monotone parameter to just meet a latency target."""

from __future__ import annotations

import json

import pytest

from sim.run import RunSpec, simulate
from sim.study.solve import current_value, solve
from tests.conftest import run_cli

BASE = RunSpec(model="llama-3-8b", batch=8, context=4096, steps=1)


def p99(spec: RunSpec, path: str, value) -> float:
    s = RunSpec.model_validate({**spec.model_dump(), "overrides": list(spec.overrides) + [(path, value)]})
    return simulate(s).summary["per_token_ms_p99"]


def test_smallest_hbm_bandwidth_meets_and_two_percent_less_misses():
    path = "hardware.hbm.channel_bandwidth_GBps"
    target = 6.0
    sol = solve(BASE, path, target)
    assert sol.found and sol.direction == "increase"
    assert p99(BASE, path, sol.value) <= target
    assert p99(BASE, path, sol.value * 0.98) > target


def test_largest_batch_meets_and_the_next_batch_misses():
    sol = solve(RunSpec(model="llama-3-8b", context=8192, steps=1), "batch", 10.0, 1, 256)
    assert sol.found and sol.direction == "decrease" and isinstance(sol.value, int)
    spec = RunSpec(model="llama-3-8b", context=8192, steps=1)
    assert p99(spec, "batch", sol.value) <= 10.0
    further = max(sol.value + 1, round(sol.value * 1.02))
    assert p99(spec, "batch", further) > 10.0


def test_no_value_in_range_is_said_so():
    sol = solve(BASE, "hardware.hbm.channel_bandwidth_GBps", 0.05)
    assert not sol.found and sol.value is None
    assert "no value of hardware.hbm.channel_bandwidth_GBps" in sol.message


def test_cli_solve(tmp_path):
    code, out, err = run_cli("solve", "--target-ms", "6", "--vary", "hardware.hbm.channel_bandwidth_GBps",
                             "--batch", "8", "--steps", "1", "--json")
    assert code == 0, err
    answer = json.loads(out)
    assert answer["found"] and answer["value"] > 0
    code, out, err = run_cli("solve", "--target-ms", "0.05", "--vary", "hardware.hbm.channel_bandwidth_GBps",
                             "--steps", "1")
    assert code == 1 and "no value" in out
    code, out, err = run_cli("solve", "--target-ms", "0.05", "--vary", "hardware.hbm.channel_bandwidth_GBps",
                             "--steps", "1", "--json")
    assert code == 1 and json.loads(out)["found"] is False  # the same answer, the same status
    code, out, err = run_cli("solve", "--vary", "hardware.hbm.nope", "--steps", "1")
    assert code == 2 and err.count("\n") == 1 and "hardware.hbm.nope" in err


def test_current_value():
    from sim import load_model, load_profile

    hw, model = load_profile("h200-sxm"), load_model("llama-3-8b")
    assert current_value(BASE, "hardware.hbm.channel_bandwidth_GBps") == hw.level("hbm").channel_bandwidth_GBps.value
    assert current_value(BASE, "hardware.l2.capacity_MB") == hw.level("l2").capacity_MB.value
    assert current_value(BASE, "hardware.compute.clock_GHz") == hw.compute.clock_GHz.value
    assert current_value(BASE, "model.layers") == model.layers
    assert current_value(BASE, "batch") == 8
    assert current_value(RunSpec(overrides=[("batch", 3)]), "batch") == 3


@pytest.mark.parametrize("argv, expect", [
    (("--vary", "target_ms"), "--vary: target_ms: is the target itself, not a knob"),
    (("--vary", "seed"), "--vary: seed: is a random seed, not a knob"),
    (("--vary", "batch", "--range", "1:3.5"), "--range: batch: takes whole numbers"),
])
def test_a_question_without_a_meaning_is_refused(argv, expect):
    code, _out, err = run_cli("solve", "--steps", "1", *argv)
    assert code == 2 and err.count("\n") == 1 and expect in err, err
