"""Energy per token (sim.energy, sim.config.energy): conservation across the breakdown, the
idle floor, fewer bytes never costing more at equal time, every profile's energy section, and
one-line errors for bad energy sections."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import load_profile
from sim.energy import EnergyModel, split
from sim.paths import hardware_dir
from sim.run import simulate

H200 = "hardware_profiles/h200-sxm.yaml"
PROFILES = sorted(hardware_dir().glob("*.yaml"))
ROWS = ["weights", "kv", "activations", "compute", "dequant", "kernel_startup", "launch_sync", "links"]
PARTS = ["hbm", "l2", "smem", "matrix", "vector", "link"]

pj = st.floats(min_value=0, max_value=1e12, allow_nan=False)
record = st.tuples(st.integers(0, 64), st.dictionaries(st.sampled_from(ROWS), pj, max_size=4),
                   st.dictionaries(st.sampled_from(PARTS), pj, max_size=4))
breakdown = st.dictionaries(st.sampled_from(ROWS), st.floats(min_value=0, max_value=1e8), max_size=6)


def _consistent(rec):
    """A record whose rows and components hold the same pJ (as EnergyModel's do)."""
    n, rows, _parts = rec
    total = sum(rows.values())
    return n, rows, ({"hbm": total} if total else {})


@settings(max_examples=60, deadline=None)
@given(st.lists(record, max_size=6), breakdown, st.floats(min_value=1, max_value=1e9),
       st.floats(0, 1000), st.floats(0, 200), st.floats(0, 1))
def test_rows_and_components_both_sum_to_the_step_energy(records, rows, time_ns, static, host, idle_share):
    records = [_consistent(r) for r in records]
    e = split(records, rows, time_ns, static, host, idle_share * static, tokens=4)
    assert sum(e.by_row.values()) == pytest.approx(e.total_J, rel=1e-9, abs=1e-15)
    assert sum(e.by_component.values()) == pytest.approx(e.total_J, rel=1e-9, abs=1e-15)
    assert e.floor_J <= e.total_J * (1 + 1e-12) + 1e-15  # idle power x time is a floor


@settings(max_examples=60, deadline=None)
@given(st.lists(record, min_size=1, max_size=6), breakdown, st.floats(min_value=1, max_value=1e9),
       st.lists(st.floats(0, 1), min_size=6, max_size=6))
def test_fewer_bytes_never_cost_more_at_equal_time(records, rows, time_ns, keep):
    records = [_consistent(r) for r in records]
    fewer = [(n, {k: v * f for k, v in r.items()}, {k: v * f for k, v in p.items()})
             for (n, r, p), f in zip(records, keep, strict=False)]
    more = split(records, rows, time_ns, 137.0, 60.0, 126.0, tokens=1)
    less = split(fewer, rows, time_ns, 137.0, 60.0, 126.0, tokens=1)
    assert less.total_J <= more.total_J * (1 + 1e-12) + 1e-15


def _run(**kw):
    base = dict(hardware="h200-sxm", model="llama-3-8b", batch=8, context=2048, steps=2, software="fused")
    return simulate({**base, **kw}, check_capacity=False)


@pytest.mark.parametrize("kw", [{}, {"kv": "int8"}, {"kv": "kivi-2", "engine": "analytic"},
                                {"model": "mixtral-8x7b", "batch": 4, "context": 512, "steps": 1},
                                {"hardware": "h200-sxm-x8", "steps": 1}])
def test_run_energy_is_conserved_and_above_the_idle_floor(kw):
    s = _run(**kw).summary
    e = s["energy"]
    assert sum(e["by_row_J_per_token"].values()) == pytest.approx(e["J_per_token"], rel=1e-9)
    assert sum(e["by_component_J_per_token"].values()) == pytest.approx(e["J_per_token"], rel=1e-9)
    assert set(e["by_row_J_per_token"]) >= {k for k, v in s["breakdown_ms"].items() if v > 0}
    assert e["floor_J_per_token"] < e["chip_J_per_token"] < e["J_per_token"]
    hw = load_profile(s["hardware"])
    seconds = s["per_token_ms_mean"] / 1e3
    assert e["floor_J_per_token"] == pytest.approx(hw.energy.idle_W.value * s["chips"] * seconds / s["batch"],
                                                   rel=1e-6)


def test_a_smaller_kv_format_moves_fewer_bytes_and_costs_less_dynamic_energy():
    base, small = _run(kv="fp16").summary["energy"], _run(kv="kivi-2").summary["energy"]
    assert small["by_component_J_per_token"]["hbm"] < base["by_component_J_per_token"]["hbm"]
    assert small["by_row_J_per_token"]["kv"] < base["by_row_J_per_token"]["kv"]


def test_energy_model_charges_every_flow_at_its_tier():
    hw = load_profile("h200-sxm")
    m = EnergyModel(hw)
    assert m.pj_per_bit["hbm"] == hw.energy.memory_pJ_per_bit["hbm"].value
    assert m.pj_per_bit["smem"] == hw.energy.memory_pJ_per_bit["smem"].value
    assert m.static_W == hw.energy.static_W.value
    assert EnergyModel(hw, tp=4, pp=2).static_W == pytest.approx(8 * hw.energy.static_W.value)


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_every_profile_has_a_sourced_energy_section(path):
    hw = load_profile(str(path))
    assert hw.energy is not None
    assert hw.energy.idle_W.value <= hw.energy.static_W.value
    for level in hw.memory:
        assert hw.energy.tier_pJ(level.name, level.kind) is not None


def test_h200_energy_figures_are_the_measured_fit(root):
    fit = json.loads((root / "calibration" / "energy" / "energy_fit.json").read_text())
    e = load_profile("h200-sxm").energy
    assert e.memory_pJ_per_bit["hbm"].value == pytest.approx(fit["figures"]["hbm_pJ_per_bit"], abs=0.01)
    assert e.static_W.value == pytest.approx(fit["figures"]["static_W"], abs=0.1)
    assert not e.static_W.estimate and "calibration/energy/" in e.static_W.source
    assert not e.memory_pJ_per_bit["hbm"].estimate


def _mutated(root, tmp_path, mutate):
    data = yaml.safe_load((root / H200).read_text())
    mutate(data["energy"])
    path = tmp_path / "mutant.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("mutate, expect", [
    (lambda e: e.pop("static_W"), "energy.static_W: required key is missing"),
    (lambda e: e["memory_pJ_per_bit"]["hbm"].update(value=-1), "energy.memory_pJ_per_bit.hbm.value: must be"),
    (lambda e: e["matrix_pJ_per_flop"]["bf16"].update(value="cheap"), "energy.matrix_pJ_per_flop.bf16.value"),
    (lambda e: e.update(idle_W={"value": 500, "source": "x"}), "idle_W (500) must be at most static_W"),
    (lambda e: e["memory_pJ_per_bit"].pop("smem"), "needs an entry for memory level 'smem'"),
    (lambda e: e["memory_pJ_per_bit"].update(ddr={"value": 20, "source": "x"}), "ddr: not a memory level"),
    (lambda e: e["matrix_pJ_per_flop"].update(fp6={"value": 1, "source": "x"}), "unknown dtype 'fp6'"),
    (lambda e: e.update(watts={"value": 1, "source": "x"}), "unknown key; allowed keys:"),
    (lambda e: e["static_W"].update(source=" "), "source must name"),
])
def test_bad_energy_section_gives_one_line(root, tmp_path, cli, mutate, expect):
    path = _mutated(root, tmp_path, mutate)
    code, out, err = cli("run", "--hardware", str(path), "--steps", "1")
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert str(path) in err and expect in err


def test_profile_without_energy_section_still_runs(root, tmp_path):
    data = yaml.safe_load((root / H200).read_text())
    data.pop("energy")
    path = tmp_path / "no-energy.yaml"
    path.write_text(yaml.safe_dump(data))
    s = simulate(dict(hardware=str(path), steps=1))
    assert "energy" not in s.summary and math.isfinite(s.summary["per_token_ms_p50"])


def test_run_text_and_json_show_energy(cli):
    code, out, _ = cli("run", "--steps", "1")
    assert code == 0 and "J per token" in out and "energy split (J per token):" in out
    code, out, _ = cli("run", "--steps", "1", "--json")
    assert json.loads(out)["energy"]["J_per_token"] > 0


def test_serve_reports_joules_per_output_token_and_idle_raises_it():
    from sim.serve.replay import serve
    from sim.serve.spec import ServeSpec

    busy = serve(ServeSpec(rate=8, duration_s=10))
    quiet = serve(ServeSpec(rate=1, duration_s=10))
    assert busy["J_per_output_token"] > busy["chip_J_per_output_token"] > 0
    assert quiet["J_per_output_token"] > busy["J_per_output_token"]  # idle power spread over fewer tokens
