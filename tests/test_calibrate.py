"""`decodesim calibrate` (issue 44): one clear line without PyTorch or a GPU; the fit recovers
the figures synthetic rows were made from; `--from` writes a profile whose measured figures
name the run and which loads."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from sim.calibrate import fit
from sim.calibrate.harness import torch_installed
from sim.cli import main
from sim.commands.handlers import calibrate as handler
from sim.config.hardware import foreign_measurements, kernel_costs_origin
from sim.setup import load_profile

STARTUP = {"elementwise": 1500.0, "copy": 1300.0, "cast": 1450.0}
BW = {"elementwise": 3000.0, "copy": 2900.0, "cast": 3050.0}  # GB/s = bytes/ns


class _NoCuda:
    __version__ = "2.x"

    class cuda:  # noqa: N801 - stands in for torch.cuda
        @staticmethod
        def is_available():
            return False


@pytest.mark.parametrize("installed, words", [(False, "PyTorch is not installed"), (True, "sees no GPU")])
def test_no_torch_or_no_gpu_is_one_line(monkeypatch, capsys, installed, words):
    monkeypatch.setattr(handler, "torch_installed", lambda: installed)
    monkeypatch.setattr(handler, "torch", _NoCuda)
    assert main(["calibrate", "--quick"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err


def _rows() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for kclass in STARTUP:
        for kib in (4, 16, 64, 256, 4096, 65536, 262144, 1048576):
            size = kib * 1024
            t_ns = (STARTUP[kclass] + 2 * size / BW[kclass]) * (1 + rng.normal(0, 0.01))
            rows.append(dict(section="classes", impl=kclass, kclass=kclass, config_id=f"{kclass}:{kib}", size_bytes=size,
                             bytes_read=size, bytes_written=size, hbm_cold=size >= 64 * 2**20, median_us=t_ns / 1e3))
    for mib in (256, 1024, 2048):
        size = mib * 2**20
        rows.append(dict(section="hbm", impl="read_sum", kclass="reduction", config_id=f"hbm:{mib}", size_bytes=size,
                         bytes_read=size, bytes_written=4, median_us=(5000 + size / 3100.0) / 1e3))
    for impl, us in (("launch_eager", 8.0), ("graph_per_kernel", 1.1), ("graph_launch", 3.5), ("sync_idle", 6.0)):
        rows.append(dict(section="overheads", impl=impl, kclass="host", config_id=f"host:{impl}", median_us=us))
    return pd.DataFrame(rows).assign(error="")


def test_fit_recovers_the_classes():
    got = fit.fit_all(_rows(), peak_GBps=3350.0, refresh=0.02, peak_TFLOPs=989.4)
    assert got["hbm"]["sustained_GBps"] == pytest.approx(3100, rel=0.02)  # achieved at >= 1 GiB, start-up included
    for kclass in STARTUP:
        c = got["classes"][kclass]
        assert c["bandwidth_GBps"] == pytest.approx(BW[kclass], rel=0.03)
        assert c["startup_ns"] == pytest.approx(STARTUP[kclass], rel=0.05)
        assert c["held_out"]["n"] > 0 and c["fit"]["median_abs_pct"] < 3
    assert got["host"]["kernel_gap_ns"] == pytest.approx(1100)


def test_from_dir_writes_a_profile_that_names_the_run(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    _rows().to_csv(run / "calibrate.csv", index=False)
    facts = {"gpu_name": "NVIDIA H100 80GB HBM3", "driver": "580.1", "torch": "2.11.0", "torch_cuda": "13.0",
             "triton": "3.6.0", "date_utc": "2026-12-08T02:00:00+00:00"}
    (run / "calibrate_run.json").write_text(json.dumps({"facts": facts, "mode": "quick", "report": {}}))
    out = tmp_path / "out"
    assert main(["calibrate", "--from", str(run), "--out", str(out), "--data-name", "calibration/data/h100"]) == 0
    profile = load_profile(str(out / "h100-sxm-calibrated.yaml"))
    assert kernel_costs_origin(profile) == "measured on NVIDIA H100 80GB HBM3 (calibration/data/h100)"
    src = profile.kernels.classes["copy"].startup_ns.source
    assert src.startswith("measured: NVIDIA H100 80GB HBM3, driver 580.1, torch 2.11.0") and "2026-12-08" in src
    assert profile.host.kernel_gap_ns.value == 1100
    assert foreign_measurements(profile) == []  # what is still the H200's says borrowed
    assert "HBM stream 30" in capsys.readouterr().out


def test_cpu_plumbing_runs_every_section(tmp_path, capsys):
    """`calibrate --cpu` runs every benchmark code path with tiny sizes on the CPU (where PyTorch is
    installed) without a failed row, and writes rows and a fit but no profile."""
    if not torch_installed():
        pytest.skip("PyTorch is not installed")
    # a process of its own: PyTorch stays out of this one (tests/test_calibration_sweeps.py checks that)
    done = subprocess.run([sys.executable, "-m", "sim", "calibrate", "--cpu", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    run = json.loads((tmp_path / "calibrate_run.json").read_text())
    assert run["report"]["failed"] == {} and run["report"]["rows"] >= 40
    rows = pd.read_csv(tmp_path / "calibrate.csv")
    assert rows.error.isna().all() and set(rows.section) == {"hbm", "l2", "classes", "gemm", "sdpa", "peak"}
    assert not list(tmp_path.glob("*.yaml")) and "no profile is written" in done.stdout


def test_bundling_an_h100_overlay_makes_h100_sxm_measured(tmp_path, monkeypatch):
    """What `decodesim calibrate` writes as overlay.json, committed as calibration/data/h100/overlay.json,
    turns h100-sxm (python -m sim.report.multichip) into a profile measured on the H100, the rest
    still saying borrowed."""
    import yaml

    from sim.config.hardware import HardwareProfile
    from sim.report import multichip

    run = tmp_path / "run"
    run.mkdir()
    _rows().to_csv(run / "calibrate.csv", index=False)
    facts = {"gpu_name": "NVIDIA H100 80GB HBM3", "date_utc": "2026-12-08"}
    (run / "calibrate_run.json").write_text(json.dumps({"facts": facts, "mode": "full", "report": {}}))
    assert main(["calibrate", "--from", str(run), "--out", str(tmp_path / "o"), "--data-name",
                 "calibration/data/h100"]) == 0
    figs = json.loads((tmp_path / "o" / "overlay.json").read_text())
    monkeypatch.setattr(multichip, "h100_overlay", lambda: figs)
    text = multichip.render_h100()
    hw = HardwareProfile.model_validate(yaml.safe_load(text))
    assert kernel_costs_origin(hw) == "measured on NVIDIA H100 80GB HBM3 (calibration/data/h100)"
    assert foreign_measurements(hw) == [] and hw.host.kernel_gap_ns.value == 1100
    assert hw.memory[0].gather_efficiency.source.startswith("borrowed from h200-sxm")
    assert "measured on an H100 by `decodesim calibrate`" in text.splitlines()[2]
