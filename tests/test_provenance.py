"""Provenance that never lies (issue 44): every profile's kernel costs say whether they were
measured on that chip, borrowed from another, transferred by rule or derived, and no figure
says "measured" for a measurement of another chip."""

from __future__ import annotations

import copy

import pytest
import yaml

from sim.config.hardware import HardwareProfile, borrow, foreign_measurements, kernel_costs_kind, kernel_costs_origin
from sim.paths import hardware_dir
from sim.setup import load_profile

PROFILES = sorted(p.stem for p in hardware_dir().glob("*.yaml"))


@pytest.mark.parametrize("name", PROFILES)
def test_no_profile_claims_another_chips_measurement(name):
    profile = load_profile(name)
    assert foreign_measurements(profile) == []
    assert kernel_costs_kind(profile) in {"measured", "borrowed", "transferred", "derived"}


def test_the_check_catches_a_copied_profile():
    """h200-sxm's text under another name with its provenance removed is caught, and `borrow`
    makes it honest."""
    raw = yaml.safe_load((hardware_dir() / "h200-sxm.yaml").read_text())
    copied = copy.deepcopy(raw)
    copied["kernels"].pop("provenance")
    bad = foreign_measurements(HardwareProfile.model_validate(copied))
    assert any(b.startswith("kernels.classes.matrix.startup_ns: measured on h200") for b in bad)
    assert any(b.startswith("host.kernel_gap_ns") for b in bad)
    fixed = HardwareProfile.model_validate(borrow(copied, "h200-sxm", "NVIDIA H200", "calibration/data/h200", "as is"))
    assert foreign_measurements(fixed) == []
    assert kernel_costs_origin(fixed).startswith("borrowed from NVIDIA H200")


def test_h200_is_measured_and_h100_is_not_the_h200s():
    assert kernel_costs_origin(load_profile("h200-sxm")) == "measured on NVIDIA H200 (calibration/data/h200)"
    h100 = load_profile("h100-sxm")
    origin = kernel_costs_origin(h100)
    assert "H200" not in origin or origin.startswith("borrowed")
    assert kernel_costs_kind(load_profile("mi300x")) == "derived"
