"""The calibration sweeps, now data (calibration/sweeps/*.yaml), expand to exactly the shapes of before.

Two references: the fixture tests/fixtures/calibration_sweeps.json, captured from the scripts
before their sweeps became data (kernels.py configuration ids per section and run mode,
kv_attention.py's shapes and formats, moe_host.py's sampled and fixed configurations), and
the committed measurements under calibration/data/h200, whose CSVs list the shapes they
measured. No torch is imported: the scripts run under tests/calibration/torch_stub.py, whose
inert tensors the sweep expansion never reads.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.calibration import expand

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "calibration" / "data" / "h200"
FIXTURE = json.loads((ROOT / "tests" / "fixtures" / "calibration_sweeps.json").read_text())


def _sweep_module():
    """calibration/sweep.py (torch-free), imported from its folder."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("calibration_sweep", ROOT / "calibration" / "sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sweep = _sweep_module()


@pytest.fixture(scope="module")
def expanded():
    """Every sweep expanded from the current scripts (their progress lines silenced)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return expand.expand_all()


def rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_stub_leaks_nowhere(expanded):
    """After the expansion neither the stub nor the scripts stay imported."""
    assert not {"torch", "triton", "kernels", "kv_attention", "moe_host"} & set(sys.modules)


@pytest.mark.parametrize("script", ["kernels", "kv_attention", "moe_host"])
def test_expansion_matches_fixture(expanded, script):
    assert expanded[script] == FIXTURE[script]


@pytest.mark.parametrize("folder, mode", [
    ("kernels/k", "full"), ("kernels/kq", "quick"), ("i21/k", "full"), ("i21/kq", "quick"),
    ("i21/bcast/b", "full"), ("i21/bcast/bq", "quick"), ("i21/fp8n/b", "full"), ("i21/fp8n/bq", "quick")])
def test_kernels_sections_match_measured_ids(expanded, folder, mode):
    """Each section a measured kernels.csv ran expands to exactly the ids it lists, in its order
    (a section runs a repeated id once: kernels.unique_configs)."""
    measured = [r["config_id"] for r in rows(DATA / folder / "kernels.csv")]
    sections = {cid.split(":")[0] for cid in measured} - {"overlap"}  # overlap: two fixed pairs, no sweep
    for section in sections:
        got = [cid for cid in measured if cid.split(":")[0] == section]
        assert got == list(dict.fromkeys(expanded["kernels"][section][mode])), (folder, section)


def test_kv_attention_matches_measured(expanded):
    measured = rows(DATA / "kv" / "kv" / "kv_attention.csv")
    points = {(int(r["B"]), int(r["L"])) for r in measured if r["phase"] == "sweep"}
    assert points == {tuple(p) for p in expanded["kv_attention"]["full"]["points"]}
    check = {(int(r["B"]), int(r["Hq"]), int(r["Hkv"]), int(r["D"]), int(r["L"])) for r in measured
             if r["phase"] == "check"}
    assert check == {tuple(expanded["kv_attention"]["full"]["check"])}
    fmts = expanded["kv_attention"]["formats"]["128"]
    assert {(r["fmt"], r["impl"]) for r in measured} == {(f, i) for f, impls in fmts.items() for i in impls}


def test_moe_matches_measured(expanded):
    measured = {}
    for r in rows(DATA / "moe" / "m" / "moe.csv"):
        measured[int(r["config_id"])] = [int(r[k]) for k in ("H", "F", "E", "top_k", "T")]
    assert [measured[i] for i in sorted(measured)] == expanded["moe_host"]["full"][:len(measured)]
    quick = {tuple(int(r[k]) for k in ("H", "F", "E", "top_k", "T")) for r in rows(DATA / "moe" / "mq" / "moe.csv")}
    assert quick == {tuple(r) for r in expanded["moe_host"]["quick"]}


def test_microbench_matches_measured():
    """microbench.py's axes against run 1's CSVs (its sweep was never a separate expansion)."""
    ax = lambda section, name: sweep.axis("microbench", section, name, "full")  # noqa: E731
    hbm = rows(DATA / "hbm_bandwidth.csv")
    sizes, s = [], ax("hbm", "first_size_bytes")
    while s <= ax("hbm", "pool_bytes"):
        sizes.append(s)
        s *= 2
    sizes = sorted(set(sizes + [e for e in ax("hbm", "extra_sizes_bytes") if e <= ax("hbm", "pool_bytes")]))
    assert sorted({int(r["bytes"]) for r in hbm if r["kind"] == "read_triton"}) == sizes
    assert sorted({int(r["bytes"]) for r in hbm if r["kind"].startswith("l2_multipass")}) == ax("hbm", "l2_sizes_bytes")
    assert {r["kind"] for r in hbm if r["kind"].startswith("l2_multipass")} == \
        {f"l2_multipass_triton_{p}perSM" for p in ax("hbm", "l2_programs_per_sm")}
    gather = rows(DATA / "gather_bandwidth.csv")
    assert sorted({int(r["granule_bytes"]) for r in gather}) == ax("gather", "granule_bytes")
    gemm = rows(DATA / "gemm.csv")
    decode = {(int(r["M"]), int(r["K"]), int(r["N"])) for r in gemm if r["kind"] == "decode"}
    assert decode == {(m, k, n) for m in ax("gemm", "M") for k, n in ax("gemm", "KN")}
    assert {int(r["M"]) for r in gemm if r["kind"] == "large_square"} == set(ax("gemm", "square"))
    att = rows(DATA / "attention.csv")
    assert {(int(r["B"]), int(r["L"])) for r in att} == \
        {(b, ll) for b in ax("attention", "batches") for ll in ax("attention", "contexts")}
    assert {(int(r["Hq"]), int(r["Hkv"]), int(r["D"])) for r in att} == {tuple(ax("attention", "heads"))}


def test_decode_step_matches_measured():
    steps = rows(DATA / "decode_steps.csv")
    ax = lambda name: sweep.axis("decode_step", "steps", name, "full")  # noqa: E731
    assert {(int(r["batch"]), int(r["context"])) for r in steps} == \
        {(b, c) for b in ax("batches") for c in ax("contexts")}
    assert {int(r["batch"]) for r in steps if r["graph"] == "false"} == set(ax("eager_batches"))


def test_axes_name_their_modes():
    """Every per-mode axis names only the known modes; a missing mode is an error, not a default."""
    for path in sorted(sweep.SWEEPS.glob("*.yaml")):
        for section, axes in sweep.load(path.stem).items():
            for name, value in axes.items():
                if isinstance(value, dict) and set(value) & set(sweep.MODES):
                    assert set(value) <= set(sweep.MODES), (path.name, section, name)
    with pytest.raises(KeyError, match="no 'cpu' value"):
        sweep.axis("kernels", "fp8_static", "M", "cpu")


def _validation_cases():
    """validation/cases.py (torch-free), imported from its file."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("validation_cases", ROOT / "validation" / "cases.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("mode", ["full", "quick", "cpu"])
def test_validation_case_order_unchanged(mode):
    """whole_step.py's split left the cases it runs, and their order, as they were (fixture captured
    from the one-file whole_step.py); cases.yaml itself is frozen and untouched."""
    cases = _validation_cases()
    before = json.loads((ROOT / "tests" / "fixtures" / "validation_cases_order.json").read_text())
    args = SimpleNamespace(cases=str(ROOT / "validation" / "cases.yaml"), only_ids="", quick=mode == "quick",
                           cpu=mode == "cpu")
    chosen = cases.select_cases(args)
    assert [c.id for c in chosen] == before[mode]
    if mode == "cpu":
        assert {c.id: [c.model, c.batch, c.context] for c in chosen} == before["cpu_shapes"]
    for c in cases.load_cases(ROOT / "validation" / "cases.yaml"):
        s = cases.load_shape(c.model)
        assert [repr(s), repr(cases.tiny_shape(s))] == before["shapes"][c.model]


@pytest.mark.parametrize("folder, module", [
    ("calibration", m) for m in ("microbench", "decode_step", "collectives", "host_ops", "kernels", "kv_attention",
                                 "moe_host")] + [("calibration/energy", "bench"), ("validation", "whole_step")])
def test_scripts_import(folder, module):
    """Every measuring script (and the split whole_step.py with its modules) imports cleanly: the
    harness, the sweep files and the kernel modules resolve, with torch stubbed."""
    import importlib

    from tests.calibration import torch_stub
    with torch_stub.installed(str(ROOT / folder), str(ROOT / "calibration")):
        importlib.import_module(module)


def test_energy_matches_measured():
    """energy/bench.py's axes against its committed run (names and duties of every window)."""
    ax = lambda section, name: sweep.axis("energy", section, name, "full")  # noqa: E731
    MiB = 2**20
    want = {(f"hbm_copy_{s // MiB}MiB", d) for s in ax("memory", "copy_sizes_bytes") for d in ax("memory", "duties")}
    want |= {(f"hbm_read_{s // MiB}MiB", d) for s in ax("memory", "read_sizes_bytes") for d in ax("memory", "duties")[:2]}
    l2 = ax("memory", "l2_size_bytes") // MiB
    want |= {(f"l2_{kind}_{l2}MiB", d) for kind in ("copy", "read") for d in ax("memory", "duties")[:2]}
    for dtype in ax("gemms", "dtypes"):
        for m, n, k in ax("gemms", "MNK"):
            duties = ax("gemms", "duties_square") if m >= 4096 else [1.0, 0.5]
            want |= {(f"gemm_{dtype}_{m}x{n}x{k}", d) for d in duties}
    want |= {(name, 0.0) for name in ("idle_start", "idle_end", "spin_start", "spin_end")}
    measured = {(r["name"], float(r["duty"])) for r in rows(ROOT / "calibration" / "energy" / "data" / "energy_bench.csv")}
    assert measured == want
