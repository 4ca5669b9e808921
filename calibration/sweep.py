"""The calibration sweeps as data: calibration/sweeps/<script>.yaml, read here.

Each script names its axes (``axis("kernels", "gemm", "M", mode)``) and loops over them; what a
sweep measures is the YAML, how one point is timed is the script. An axis is either one value
for every run mode or a mapping ``{full: ..., quick: ..., cpu: ...}`` (full: the device sweep,
quick: the GPU smoke run, cpu: the CPU plumbing check). Lists of pairs come back as tuples, so
shapes compare and hash as the scripts' literals did. This module imports no torch: the sweep
test (tests/test_calibration_sweeps.py) and the fits read it on a machine without a GPU.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import yaml

SWEEPS = Path(__file__).resolve().parent / "sweeps"
MODES = ("full", "quick", "cpu")


@functools.cache
def load(script: str) -> dict:
    """The sweep file of one script, parsed once."""
    with open(SWEEPS / f"{script}.yaml") as f:
        return yaml.safe_load(f)


def _frozen(value):
    """YAML lists of lists as lists of tuples (shapes), scalars and flat lists unchanged."""
    if isinstance(value, list):
        return [tuple(v) if isinstance(v, list) else v for v in value]
    return value


def axis(script: str, section: str, name: str, mode: str):
    """One axis of one section at one run mode."""
    value = load(script)[section][name]
    if isinstance(value, dict) and set(value) <= set(MODES):
        if mode not in value:
            raise KeyError(f"calibration/sweeps/{script}.yaml: {section}.{name} has no {mode!r} value")
        value = value[mode]
    return _frozen(value)


def coverage_order(values: list) -> list:
    """values reordered so that a prefix spans the range: every other one first, then the rest.

    Sweeps loop over this order outermost, so a run cut by the budget still covers every
    shape at spread-out M values or sizes.
    """
    return values[::2] + values[1::2]


def corners_first(points: list) -> list:
    """Order (B, L) points by greedy farthest-point in (log2 B, log2 L), starting at the
    smallest: the corners come first, then the middle (a run cut by the budget still spans the grid)."""
    pts = sorted(points)
    if not pts:
        return []
    coord = {p: (math.log2(p[0]), math.log2(p[1])) for p in pts}
    order = [pts[0]]
    rest = pts[1:]
    while rest:
        def mind(p):
            return min((coord[p][0] - coord[o][0]) ** 2 + (coord[p][1] - coord[o][1]) ** 2 for o in order)
        best = max(rest, key=lambda p: (mind(p), p))
        order.append(best)
        rest.remove(best)
    return order
