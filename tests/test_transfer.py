"""The transfer rule (issue 44, item 3): kernel classes in the chip's own units (cycles, fractions
of its stream), fitted across measured GPUs and checked leave-one-GPU-out; with one measured GPU
it refuses to transfer."""

from __future__ import annotations

import copy

import pytest
import yaml

from sim.calibrate import transfer
from sim.config.hardware import HardwareProfile
from sim.paths import hardware_dir
from sim.setup import load_profile


def _chip(name: str, clock: float, startup_scale: float, fraction_scale: float) -> HardwareProfile:
    raw = copy.deepcopy(yaml.safe_load((hardware_dir() / "h200-sxm.yaml").read_text()))
    raw["name"] = name
    raw["compute"]["clock_GHz"]["value"] = clock
    for c in raw["kernels"]["classes"].values():
        c["startup_ns"]["value"] *= startup_scale
        c["stream_fraction"]["value"] = min(c["stream_fraction"]["value"] * fraction_scale, 1.2)
    raw["kernels"]["provenance"]["data"] = f"calibration/data/{name}"
    return HardwareProfile.model_validate(raw)


def test_the_rule_carries_cycles_and_fractions():
    """Chips whose start-ups are the same number of cycles and whose fractions agree are predicted
    exactly; a chip 10% low in its fractions shows as 11% leave-one-out error on them."""
    same = {"a": _chip("a", 1.83, 1.0, 1.0), "b": _chip("b", 1.83 * 1.5, 1 / 1.5, 1.0)}
    loo = transfer.leave_one_out(same)
    assert loo["a"]["worst_abs_pct"] < 0.5 and loo["b"]["worst_abs_pct"] < 0.5
    off = {**same, "c": _chip("c", 1.83, 1.0, 0.9)}
    loo = transfer.leave_one_out(off)
    assert 10.5 < loo["c"]["worst_abs_pct"] < 11.5  # 1/0.9 - 1 on every fraction; start-ups exact
    classes, uncertainty = transfer.transferred(load_profile("mi300x"), off)
    assert uncertainty == max(v["median_abs_pct"] for v in loo.values())
    mi = load_profile("mi300x")
    ratio = classes["matrix"]["startup_ns"] * mi.compute.clock_GHz.value
    assert ratio == pytest.approx(load_profile("h200-sxm").kernels.classes["matrix"].startup_ns.value * 1.83, rel=0.01)


def test_one_measured_gpu_refuses():
    measured = transfer.measured_profiles()
    assert set(measured) == {"h200"}  # until another GPU's calibration is bundled
    with pytest.raises(ValueError, match="at least two"):
        transfer.transferred(load_profile("mi300x"), measured)
