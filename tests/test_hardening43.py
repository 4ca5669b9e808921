"""Issue 43's tracebacks and physics checks that are not one bad input each (those are in
tests/test_corpus.py): compare when the fp16 reference does not fit, search interrupted during
its replays, the byte and compute floors."""

from __future__ import annotations

import json

import pytest

from sim.errors import SimulationError
from tests.conftest import ROOT, run_cli

TINY = ROOT / "tests" / "fixtures" / "search" / "tiny.yaml"


def test_compare_when_the_fp16_reference_does_not_fit_says_so():
    code, out, err = run_cli("compare", "--model", "llama-3-70b", "--kv", "fp16,kivi-2", "--kernels", "fused",
                             "--steps", "1", "--fidelity-tokens", "64")
    assert code == 0, err
    assert "does-not-fit" in out and "the fp16 reference does not fit this setup" in out
    code, out, err = run_cli("compare", "--model", "llama-3-70b", "--kv", "fp16,kivi-2", "--steps", "1",
                             "--fidelity-tokens", "64", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["kv_qualities"] == [] and data["kernels"] == []


def test_search_interrupted_in_its_replays_keeps_the_screen_and_what_finished(tmp_path, monkeypatch):
    import sim.search.runner as runner

    real, calls = runner.verify, []

    def interrupted_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "verify", interrupted_second)
    out = tmp_path / "s"
    code, text, err = run_cli("search", "--space", str(TINY), "--jobs", "1", "--quiet", "--out", str(out))
    assert code == 130, err
    assert err.count("\n") == 1 and "interrupted during the replays" in err and "1 replays that finished" in err
    assert "INCOMPLETE: interrupted during the replays" in text
    data = json.loads((out / "search.json").read_text())
    assert data["partial"] is True and data["complete"] is False and data["counts"]["replays"] == 1
    import pandas as pd

    table = pd.read_parquet(out / "deployments.parquet")
    assert len(table) == data["counts"]["deployments"] == 16 and table["checked"].fillna(False).sum() == 1
    assert "PARTIAL: interrupted during the replays" in (out / "report.md").read_text()


def test_an_interrupt_in_the_screen_leaves_no_folder(tmp_path, monkeypatch):
    import sim.search.runner as runner

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "screen", interrupted)
    out = tmp_path / "s"
    code, _text, err = run_cli("search", "--space", str(TINY), "--jobs", "1", "--quiet", "--out", str(out))
    assert code == 130 and err == "decodesim: interrupted\n"
    assert not out.exists()


def test_no_step_runs_below_its_byte_or_compute_floor():
    from sim.run import check_floors, simulate

    result = simulate(steps=1, engine="analytic", batch=4)
    setup, row = result.resolved, dict(result.steps[0])
    check_floors(setup, [row])  # a real step: at or above both floors
    byte_floor_ns = row["store_bytes"] / setup.hardware.store.peak_GBps
    fast = dict(row, time_ns=0.5 * byte_floor_ns)
    with pytest.raises(SimulationError, match=r"below its byte floor of .* ms \(.* bytes in hbm at 4800 GB/s peak\)"):
        check_floors(setup, [fast])
    assert check_floors(setup, [fast], clamp=True) and fast["time_ns"] == byte_floor_ns
    assert fast["ms_contention"] > 0
    compute = dict(row, flops=row["flops"] * 10**6)
    with pytest.raises(SimulationError, match="below its compute floor"):
        check_floors(setup, [compute])


def test_the_analytic_engine_is_raised_to_the_floor_and_says_so():
    from sim.run import simulate

    result = simulate(hardware="sambanova-sn40l", model="llama-2-7b", steps=1, engine="analytic", context=2048)
    s = result.summary
    assert s["hbm_fraction_of_peak"] <= 1 + 1e-9 and "raised to the floor" in s["engine_note"]
    assert s["breakdown_ms"]["contention"] > 0
