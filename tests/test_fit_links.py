"""calibration/fit_links.py: the link fit recovers known figures, refuses plumbing checks, agrees
with the simulator's own collective cost, and edits profiles only as a whole."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import load_profile
from sim.costs import CostModel
from sim.errors import ConfigError
from sim.lowering.graph import Access, Work
from sim.run import simulate

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "calibration" / "fit_links.py"
WS1 = REPO / "calibration" / "data" / "h200" / "collectives_ws1.csv"
_spec = importlib.util.spec_from_file_location("fit_links", SCRIPT)
fit_links = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("fit_links", fit_links)
_spec.loader.exec_module(fit_links)

TRUE_FIGURES = {"per_message_overhead_ns": 8000.0, "latency_ns": 900.0, "bandwidth_GBps": 380.0}
GAP_NS = load_profile("h200-sxm-x8").host.kernel_gap_ns.value
AR_BATCH = [1, 2, 4, 8, 16, 32, 64]  # calibration/collectives.py's sizes
A2A_TOKENS = [1, 4, 16, 64, 128, 256, 512, 1024]


def model_ns(kind: str, n: int, size: float, fig: dict, gap: float = GAP_NS) -> float:
    """The simulator's collective time written out independently of fit_links (sim/costs/links.py)."""
    if kind == "allreduce":
        k, wire = 2 * (n - 1), math.ceil(2 * (n - 1) * size / n)
    else:
        k, wire = n - 1, math.ceil((n - 1) * size / n)
    return gap + fig["per_message_overhead_ns"] + k * fig["latency_ns"] + wire / fig["bandwidth_GBps"]


def synthetic_csv(path: Path, fig: dict = TRUE_FIGURES, noise: float = 0.01, seed: int = 7,
                  world_sizes=(2, 4, 8), all_to_all: bool = True) -> Path:
    """A CSV in calibration/collectives.py's layout (header from the committed ws1 run), eager and graph
    rows, graph times from ``fig`` with multiplicative noise; eager rows are 3x slower (must be ignored)."""
    with open(WS1, newline="") as handle:
        header = next(csv.reader(handle))
    rng = np.random.default_rng(seed)
    cases = [("all_reduce", "allreduce", b, h, b * h * 2) for h in (4096, 8192) for b in AR_BATCH]
    if all_to_all:
        cases += [("all_to_all", "alltoall", t, h, t * h * 2) for h in (4096, 7168) for t in A2A_TOKENS]
    with open(path, "w", newline="") as handle:
        out = csv.DictWriter(handle, header)
        out.writeheader()
        for n in world_sizes:
            for op, kind, size, hidden, nbytes in cases:
                nbytes = (nbytes + n - 1) // n * n
                us = model_ns(kind, n, nbytes, fig) * (1 + noise * rng.standard_normal()) / 1e3
                for mode, t in (("eager", 3 * us), ("graph", us)):
                    out.writerow({"op": op, "mode": mode, "world_size": n, "plumbing_check": False, "size": size,
                                  "hidden": hidden, "bytes": nbytes, "median_us": t * 0.98,
                                  "median_us_max_over_ranks": t, "n_inner": 20, "trials": 25, "note": ""})
    return path


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=60)


def test_recovers_known_figures_from_a_noisy_synthetic_csv(tmp_path):
    data = synthetic_csv(tmp_path / "collectives.csv")
    out = tmp_path / "links_fit.json"
    proc = run_cli(data, "--out", out)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    for key, true in TRUE_FIGURES.items():
        assert doc[key]["value"] == pytest.approx(true, rel=0.03), key
        assert doc[key]["source"].startswith("measured: ") and "via calibration/fit_links.py" in doc[key]["source"]
        assert "graph rows" in doc[key]["method"]
    assert doc["pinned"] == {}
    assert doc["residuals"]["median_abs_pct"] < 2.0  # 1% noise, the right model
    assert len(doc["residuals"]["rows"]) == 3 * (14 + 16)  # graph rows only
    assert "residuals: rms" in proc.stdout


def test_all_reduce_alone_over_three_world_sizes_separates_overhead_and_latency(tmp_path):
    rows = fit_links.read_csv(synthetic_csv(tmp_path / "c.csv", all_to_all=False), "graph")
    result = fit_links.fit(rows, GAP_NS, ["c.csv"])
    assert result.per_message_overhead_ns == pytest.approx(8000, rel=0.05)
    assert result.latency_ns == pytest.approx(900, rel=0.05)
    assert result.bandwidth_GBps == pytest.approx(380, rel=0.05)


def test_noise_free_data_is_recovered_exactly(tmp_path):
    rows = fit_links.read_csv(synthetic_csv(tmp_path / "c.csv", noise=0.0))
    result = fit_links.fit(rows, GAP_NS, ["c.csv"])
    assert result.per_message_overhead_ns == pytest.approx(8000, rel=1e-6)
    assert result.latency_ns == pytest.approx(900, rel=1e-6)
    assert result.bandwidth_GBps == pytest.approx(380, rel=1e-6)
    assert np.abs(result.residuals_pct()).max() < 1e-6


def test_a_negative_figure_is_pinned_at_zero_and_the_rest_refitted(tmp_path):
    """Times with no per-message overhead and less than the kernel gap at small sizes: an unconstrained
    fit would give a negative overhead."""
    fig = {"per_message_overhead_ns": -600.0, "latency_ns": 900.0, "bandwidth_GBps": 380.0}
    rows = fit_links.read_csv(synthetic_csv(tmp_path / "c.csv", fig=fig, noise=0.0))
    result = fit_links.fit(rows, GAP_NS, ["c.csv"])
    assert result.per_message_overhead_ns == 0.0 and "per_message_overhead_ns" in result.pinned
    assert result.latency_ns > 0 and result.bandwidth_GBps > 0


def test_one_world_size_of_one_op_pins_latency_and_says_so(tmp_path):
    rows = fit_links.read_csv(synthetic_csv(tmp_path / "c.csv", world_sizes=(8,), all_to_all=False))
    result = fit_links.fit(rows, GAP_NS, ["c.csv"])
    assert result.latency_ns == 0.0 and "world sizes" in result.pinned["latency_ns"]
    # all the fixed time goes to the overhead, so n = 8 is still predicted
    assert result.per_message_overhead_ns == pytest.approx(8000 + 14 * 900, rel=0.03)
    assert "pinned at 0: latency_ns" in result.method()


def test_the_committed_world_size_1_plumbing_csv_is_refused(tmp_path):
    out = tmp_path / "links_fit.json"
    proc = run_cli(WS1.relative_to(REPO), "--out", out)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "plumbing check" in lines[0] and "collectives_ws1.csv" in lines[0], proc.stderr
    assert not out.exists() and proc.stdout == ""


def test_a_world_size_1_row_is_refused_even_unlabelled(tmp_path):
    data = synthetic_csv(tmp_path / "c.csv")
    text = data.read_text().splitlines()
    fields = text[1].split(",")
    fields[2], fields[3] = "1", "False"
    data.write_text("\n".join([text[0], ",".join(fields), *text[2:]]) + "\n")
    with pytest.raises(ConfigError, match=r"line 2\.world_size: a plumbing check"):
        fit_links.read_csv(data)


def test_a_row_labelled_plumbing_check_is_refused_whatever_its_world_size(tmp_path):
    data = synthetic_csv(tmp_path / "c.csv")
    text = data.read_text().splitlines()
    fields = text[5].split(",")
    fields[3] = "True"
    data.write_text("\n".join([*text[:5], ",".join(fields), *text[6:]]) + "\n")
    with pytest.raises(ConfigError, match=r"line 6\.plumbing_check: a plumbing check"):
        fit_links.read_csv(data)


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["allreduce", "alltoall"]), n=st.integers(2, 64), size=st.integers(1, 10 ** 9))
def test_model_terms_are_the_cost_models(kind, n, size):
    """steps(n) and wire_bytes are what sim/costs/links.py charges on the switch topology."""
    hw = load_profile("h200-sxm-x8")
    links = hw.system.links
    assert links.topology in fit_links.TOPOLOGIES
    costs = CostModel(hw)
    access = Access("link", size, "link")
    op = Work(kind="collective", accesses=(access,), collective=(kind, size, n))
    assert costs.links.wire_bytes(op, access) == fit_links.wire_bytes(kind, n, size)
    assert costs.links.collective_latency_ns(op) == pytest.approx(
        links.per_message_overhead_ns.value + fit_links.steps(kind, n) * links.latency_ns.value)


@pytest.mark.parametrize("batch", [1, 64])
def test_fitted_figures_in_the_simulator_reproduce_the_fits_prediction(tmp_path, batch):
    """The fitted figures, set on h200-sxm at 8 chips (tensor parallel), give an all-reduce op
    time equal to what the fit predicts for that message."""
    rows = fit_links.read_csv(synthetic_csv(tmp_path / "c.csv"))
    gap = load_profile("h200-sxm").host.kernel_gap_ns.value
    result = fit_links.fit(rows, gap, ["c.csv"])
    links = "hardware.system.links."
    run = simulate(hardware="h200-sxm", model="llama-3-8b", batch=batch, context=256, steps=1, keep_ops=True,
                   overrides=[("hardware.system.chips", 8),
                              (links + "per_message_overhead_ns", result.per_message_overhead_ns),
                              (links + "latency_ns", result.latency_ns),
                              (links + "bandwidth_GBps", result.bandwidth_GBps)])
    assert run.summary["tp"] == 8
    ops = [o for o in run.ops if o["name"] == "allreduce_attn"]
    assert ops
    size = batch * 4096 * 2  # llama-3-8b hidden 4096, bf16
    assert all(o["read_link_link_bytes"] == size for o in ops)
    predicted = result.predict_ns("allreduce", 8, size)
    for o in ops:
        assert o["duration_ns"] == pytest.approx(predicted, rel=1e-6)
    assert predicted == pytest.approx(model_ns("allreduce", 8, size, TRUE_FIGURES, gap), rel=0.03)


def _profiles(tmp_path) -> tuple[Path, Path]:
    base, many = (tmp_path / "h200-sxm.yaml", tmp_path / "h200-sxm-x8.yaml")
    for p in (base, many):
        shutil.copy(REPO / "hardware_profiles" / p.name, p)
    return base, many


def test_write_profile_edits_only_the_three_links_lines_of_base_and_derived(tmp_path):
    base, many = _profiles(tmp_path)
    before = {p: p.read_text().splitlines() for p in (base, many)}
    data = synthetic_csv(tmp_path / "collectives.csv")
    proc = run_cli(data, "--out", tmp_path / "f.json", "--write-profile", base, "--write-profile", many)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "f.json").read_text())
    loaded = [load_profile(str(p)) for p in (base, many)]
    assert loaded[0].system.links == loaded[1].system.links  # tests/test_profiles.py's contract holds
    links = loaded[1].system.links
    assert links.latency_ns.value == round(doc["latency_ns"]["value"])
    assert links.per_message_overhead_ns.value == round(doc["per_message_overhead_ns"]["value"])
    assert links.bandwidth_GBps.value == pytest.approx(doc["bandwidth_GBps"]["value"], abs=0.05)
    for key in ("latency_ns", "per_message_overhead_ns", "bandwidth_GBps"):
        fig = getattr(links, key)
        assert fig.source.startswith(f"measured: {data.resolve()} via calibration/fit_links.py") and not fig.estimate
    for p in (base, many):
        after = p.read_text().splitlines()
        changed = [i for i, (x, y) in enumerate(zip(before[p], after, strict=True)) if x != y]
        assert len(after) == len(before[p]) and len(changed) == 3
        assert all(after[i].startswith("    ") and "calibration/fit_links.py" in after[i] for i in changed)
    assert loaded[1].memory == load_profile("h200-sxm-x8").memory  # nothing else moved


def test_write_profile_refuses_a_derived_profile_alone_and_a_plumbing_csv(tmp_path):
    base, many = _profiles(tmp_path)
    before = {p: p.read_text() for p in (base, many)}
    data = synthetic_csv(tmp_path / "collectives.csv")
    alone = run_cli(data, "--out", tmp_path / "f.json", "--write-profile", many)
    assert alone.returncode == 2 and "copies its links from h200-sxm" in alone.stderr
    plumbing = run_cli(WS1, "--out", tmp_path / "g.json", "--write-profile", base, "--write-profile", many)
    assert plumbing.returncode == 2 and "plumbing check" in plumbing.stderr
    assert {p: p.read_text() for p in (base, many)} == before
    assert not (tmp_path / "f.json").exists() and not (tmp_path / "g.json").exists()
    assert sorted(q.name for q in tmp_path.iterdir()) == ["collectives.csv", "h200-sxm-x8.yaml", "h200-sxm.yaml"]
