"""Contract tests over every bundled hardware profile (hardware_profiles/*.yaml).

Each profile loads under its file name, every number in it names a source, a tiny decode
step runs on it, the engine's event log conserves the op graph's bytes, and more backing
store bandwidth never makes a step slower. A tiny model (80 layers, so that a 576-chip
pipeline still has a layer or more per stage) keeps every profile inside its capacity,
SRAM-only chips included.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim import load_profile
from sim.config.hardware import HBM, sources
from sim.costs import CostModel
from sim.lowering.decode import lower_step
from sim.paths import hardware_dir
from sim.run import simulate

PROFILES = sorted(hardware_dir().glob("*.yaml"))
IDS = [p.stem for p in PROFILES]

TINY = {
    "name": "tiny-80l",
    "source": "test fixture: a small dense decoder with many layers",
    "layers": 80, "hidden": 256, "heads": 8, "kv_heads": 8, "head_dim": 32, "ffn": 512,
    "vocab": 1024, "tied_embeddings": False, "activation": "swiglu", "max_context": 4096,
}

EXPECTED = {"a100-sxm-80g", "h100-sxm", "h200-sxm", "b200", "mi300x", "tpu-v5e", "gaudi3", "groq-lpu",
            "cerebras-wse3", "sambanova-sn40l", "sram-heavy-10ms", "h200-sxm-x8", "groq-lpu-576"}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("models") / "tiny-80l.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return str(path)


def test_the_library_has_every_profile_the_issue_asks_for():
    assert EXPECTED <= set(IDS)


@pytest.mark.parametrize("path", PROFILES, ids=IDS)
def test_profile_loads_under_its_file_name(path: Path):
    profile = load_profile(str(path))
    assert profile.name == path.stem
    assert profile.description.strip()
    assert profile.store.capacity_bytes > 0 and profile.store.peak_GBps > 0
    if profile.chips > 1:
        assert profile.system.links is not None


@pytest.mark.parametrize("path", PROFILES, ids=IDS)
def test_every_number_has_a_source(path: Path):
    profile = load_profile(str(path))
    found = sources(profile)
    assert len(found) > 20
    for dotted, _value, source, _estimate in found:
        assert source.strip(), f"{path.name}: {dotted} has an empty source"
    # and in the raw YAML: no bare number hides outside a sourced quantity
    raw = yaml.safe_load(path.read_text())
    for dotted, value in _bare_numbers(raw, ""):
        pytest.fail(f"{path.name}: {dotted} = {value!r} is a bare number without a source")


def _bare_numbers(node, path):
    if isinstance(node, dict):
        if "source" in node:  # a sourced quantity or table
            return
        for key, child in node.items():
            yield from _bare_numbers(child, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _bare_numbers(item, f"{path}.{i}")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield path, node


def _run(path: Path, model: str, **kw):
    return simulate(hardware=str(path), model=model, steps=1, batch=1, context=128, engine="des", **kw)


@pytest.mark.parametrize("path", PROFILES, ids=IDS)
def test_tiny_run_works(path: Path, tiny_model: str):
    s = _run(path, tiny_model).summary
    assert s["verdict"] != "does-not-fit", s.get("reason")
    assert math.isfinite(s["per_token_ms_p50"]) and s["per_token_ms_p50"] > 0
    assert s["chips"] == load_profile(str(path)).chips
    # the step cannot beat its byte floor on the backing store
    assert s["per_token_ms_p50"] >= s["byte_floor_ms"]


@pytest.mark.parametrize("path", PROFILES, ids=IDS)
def test_event_log_conserves_op_graph_bytes(path: Path, tiny_model: str):
    result = _run(path, tiny_model, keep_log=True)
    res = result.resolved
    costs = CostModel(res.hardware, res.stack)
    expected = defaultdict(int)
    for position, step in enumerate(res.steps):
        for op in lower_step(res, step.contexts, step.index, position).ops:
            # memory levels move exactly the kernels' bytes; a collective's wire bytes are its
            # algorithm's (a ring all-reduce sends 2(n-1)/n of the message per chip)
            for f in costs.cost(op.work).flows:
                expected[(f.link, f.write)] += f.bytes
    logged = defaultdict(int)
    for _s, _l, _op, resource, kind, _t0, _t1, nbytes, _f in result.log:
        if resource not in ("compute", "host", "kernels"):  # kernel spans carry no bytes of their own
            logged[(resource, kind.startswith("write"))] += nbytes
    assert dict(logged) == dict(expected)
    assert expected[(res.hardware.store.name, False)] > 0


def _bandwidth_path(path: Path) -> str:
    store = load_profile(str(path)).store
    key = "channel_bandwidth_GBps" if isinstance(store, HBM) else "bandwidth_GBps"
    return f"hardware.{store.name}.{key}"


# An op's accesses to one level move together, capped at min(their tiles' load bandwidth, the sum
# of their channel caps) (sim.engine.flows.merge); per-cap merging once broke this on sambanova-sn40l.
@pytest.mark.parametrize("path", PROFILES, ids=IDS)
def test_more_store_bandwidth_never_slows_a_step(path: Path, tiny_model: str):
    knob = _bandwidth_path(path)
    times = [_run(path, tiny_model, overrides=[(knob, {"scale": s})]).summary["per_token_ms_p50"]
             for s in (0.25, 1.0, 4.0)]
    assert times[0] >= times[1] >= times[2]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(index=st.integers(0, len(PROFILES) - 1), scale=st.floats(1.0, 8.0), batch=st.integers(1, 16),
       context=st.integers(16, 2048))
def test_bandwidth_monotone_over_profiles_batches_and_contexts(tiny_model, index, scale, batch, context):
    path = PROFILES[index]
    knob = _bandwidth_path(path)
    base = simulate(hardware=str(path), model=tiny_model, steps=1, batch=batch, context=context)
    if base.summary["verdict"] == "does-not-fit":
        return
    faster = simulate(hardware=str(path), model=tiny_model, steps=1, batch=batch, context=context,
                      overrides=[(knob, {"scale": scale})])
    assert faster.summary["per_token_ms_p50"] <= base.summary["per_token_ms_p50"] * (1 + 1e-9)


def test_profiles_command_lists_every_profile(cli):
    code, out, err = cli("profiles")
    assert code == 0, err
    for name in IDS:
        assert name in out


def test_multi_chip_profiles_split_weights_over_their_chips(tiny_model):
    """h200-sxm-x8 holds an eighth of llama-3-70b per GPU; groq-lpu-576 fits llama-2-70b
    in int8 only because it is spread over 576 chips of 230 MB."""
    one = simulate(hardware="h200-sxm", model="llama-3-70b", steps=1, context=128, engine="analytic")
    eight = simulate(hardware="h200-sxm-x8", model="llama-3-70b", steps=1, context=128, engine="analytic")
    assert one.summary["verdict"] == "does-not-fit"  # 141.1 GB of bf16 weights on a 141 GB GPU
    assert eight.summary["tp"] == 8 and eight.summary["verdict"] != "does-not-fit"
    w1, w8 = one.summary["capacity"]["weights_bytes"], eight.summary["capacity"]["weights_bytes"]
    assert w8 == pytest.approx(w1 / 8, rel=0.02)
    assert eight.summary["per_token_ms_p50"] < one.summary["byte_floor_ms"]
    single = simulate(hardware="groq-lpu", model="llama-2-70b", weights="int8", steps=1, context=128)
    assert single.summary["verdict"] == "does-not-fit"


def test_sram_heavy_design_meets_10ms_and_needs_its_bandwidth():
    """The hypothetical profile's claim, re-checked with the current engine: llama-3-70b bf16
    at batch 1, context 4096 decodes under 10 ms, and 10% less SRAM bandwidth would miss."""
    from sim.experiments import sram_heavy

    run = dict(sram_heavy.RUN)
    s = simulate(hardware="sram-heavy-10ms", **run).summary
    assert s["verdict"] == "meets-target" and s["per_token_ms_p99"] <= sram_heavy.TARGET_MS
    slower = simulate(hardware="sram-heavy-10ms", overrides=[("hardware.sram.bandwidth_GBps", {"scale": 0.9})],
                      **run).summary
    assert slower["per_token_ms_p99"] > sram_heavy.TARGET_MS
    profile = load_profile("sram-heavy-10ms")
    assert profile.store.kind == "sram" and profile.store.capacity_bytes >= s["capacity"]["needed_bytes"]


def test_sram_heavy_command_runs_and_keeps_the_profile_energy_section(tmp_path):
    """``python -m sim.report.sram_heavy --write`` derives the design from h200-sxm (whose energy
    section names its HBM, which the design replaces) and writes the profile with the energy
    estimates it had; the profile it writes loads, energy included."""
    from sim.experiments.sram_heavy import NAME, derive
    from sim.report.sram_heavy import ENERGY_MARKER, write

    committed = (hardware_dir() / f"{NAME}.yaml").read_text()
    path = tmp_path / f"{NAME}.yaml"
    path.write_text(committed)
    result = derive()
    write(result, path)
    text = path.read_text()
    assert text.endswith(committed[committed.index(ENERGY_MARKER):]) and text.count(ENERGY_MARKER) == 1
    profile = load_profile(str(path))
    assert profile.store.kind == "sram" and profile.store.bandwidth_GBps.value == result["bandwidth_GBps"]
    assert profile.energy is not None and result["per_token_ms"] <= 10.0
    assert text == committed, ("hardware_profiles/sram-heavy-10ms.yaml is stale (h200-sxm changed since it was "
                               "derived): run `python -m sim.report.sram_heavy --write`")


@pytest.mark.parametrize("system", [s.name for s in __import__("sim.report.multichip", fromlist=["SYSTEMS"]).SYSTEMS])
def test_multi_chip_profiles_carry_their_base_chip_figures(system):
    """h200-sxm-x8 and groq-lpu-576 copy their single-chip bases; re-run
    `python -m sim.report.multichip` when a base changes."""
    from sim.report.multichip import PER_CHIP, SYSTEMS

    spec = next(s for s in SYSTEMS if s.name == system)
    many, one = load_profile(system), load_profile(spec.base)
    for section in PER_CHIP:
        assert getattr(many, section) == getattr(one, section), (
            f"{system}.{section} differs from {spec.base}: run `python -m sim.report.multichip`")
    assert many.chips == spec.chips and many.system.links == one.system.links


def test_h100_is_the_calibrated_h200_die_with_its_own_memory():
    """h100-sxm is generated from h200-sxm (same GH100 die and software stack, whose per-kernel
    overheads were measured on the H200) with the H100's own HBM3 and L2 capacity; what it
    takes from the H200 says "borrowed from h200-sxm", never "measured" (issue 44)."""
    h100, h200 = load_profile("h100-sxm"), load_profile("h200-sxm")

    def values(node):
        return {k: getattr(v, "value", v) for k, v in node}

    assert values(h100.compute) == values(h200.compute) and values(h100.host) == values(h200.host)
    assert h100.noc == h200.noc
    assert h100.host.kernel_gap_ns.source.startswith("borrowed from h200-sxm (NVIDIA H200")
    assert h100.store.peak_GBps == pytest.approx(3350, rel=1e-3) and h100.store.capacity_GB.value == 80
    assert h100.store.latency_ns.value == h200.store.latency_ns.value
    assert h100.level("l2").capacity_MB.value == 50
