"""The estimates that decide an answer: which of a profile's figures marked ``estimate: true``
move a run's per-token time most.

Each estimated figure of the hardware profile that can affect time (memory, compute, on-chip
network, host and links; not the energy figures, not whole-number counts, not tables) is set
to the low and the high end of its range, here +-50% of its value (a fraction is capped at 1),
and the run is repeated with the analytic engine (the contention-free closed form of the same
kernels: a few milliseconds a run). A figure the step does not use moves nothing and is left
out. The rows are ranked by the larger of the two moves, in ms per token, and say:

* ``field``: the override path (``decodesim run --set FIELD=...`` changes it);
* ``source``, ``value``: the profile's figure and what it says about it;
* ``low_ms`` / ``high_ms``: the analytic per-token time with the figure at the low / high end;
* ``share_of_step``: the step's elasticity to the figure over its range,
  ln(high_ms / low_ms) / ln(high / low): 1.0 when the whole step is proportional to it (an
  additive latency that makes up the whole step), -1.0 when inversely (a bandwidth that bounds
  it), near 0 when it hardly matters; for an additive latency it is close to the fraction of
  the step that figure accounts for.

Costs two analytic runs per estimated figure (about 40 to 90 figures per profile); `run`
computes it only when asked (``--estimates``).
"""

from __future__ import annotations

import math
from typing import Iterator, NamedTuple

from sim.config.hardware import HardwareProfile
from sim.config.quantity import Frac, Num, Share
from sim.errors import ConfigError
from sim.run import RunSpec, simulate
from sim.setup import resolve

SPREAD = 0.5  # +-50% where the profile states no range
SKIP = ("energy",)  # sections that do not change time


class Estimate(NamedTuple):
    """One estimated figure: its override path, value, source and the two ends of its range."""

    field: str
    value: float
    source: str
    low: float
    high: float


def _range(q: Num) -> tuple[float, float]:
    """The low and high ends of an estimated figure (+-SPREAD; a fraction stays <= 1)."""
    low, high = q.value * (1 - SPREAD), q.value * (1 + SPREAD)
    if isinstance(q, (Frac, Share)):
        high = min(high, 1.0)
    return low, high


def _walk(node, path: str) -> Iterator[tuple[str, Num]]:
    """(override path, quantity) of every sourced number under ``node``."""
    if isinstance(node, Num):
        yield path, node
        return
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
        return
    fields = getattr(type(node), "model_fields", None)
    if fields is None:
        return
    for key in fields:
        yield from _walk(getattr(node, key), f"{path}.{key}")


def estimates(hardware: HardwareProfile) -> list[Estimate]:
    """Every estimated, non-integer figure of ``hardware`` that can change time, with its range."""
    out = []
    roots = [(f"hardware.{level.name}", level) for level in hardware.memory]
    roots += [(f"hardware.{key}", getattr(hardware, key)) for key in ("compute", "noc", "host", "system")]
    for root, node in roots:
        for path, q in _walk(node, root):
            if not q.estimate or q.value == 0 or any(f".{s}." in path for s in SKIP):
                continue
            low, high = _range(q)
            if high > low:
                out.append(Estimate(path, q.value, q.source, low, high))
    return out


def _analytic_ms(spec: RunSpec, overrides: tuple = ()) -> float | None:
    """Per-token p50 of ``spec`` with the analytic engine and extra ``overrides`` (None: does not fit)."""
    run = spec.model_copy(update={"engine": "analytic", "overrides": (*spec.overrides, *overrides)})
    return simulate(run).summary.get("per_token_ms_p50")


def deciding_estimates(spec: RunSpec, top: int = 3) -> dict:
    """The ``top`` estimates whose ranges move ``spec``'s per-token time most (see the module
    docstring), with the analytic baseline they are measured against and how many were tried."""
    base = _analytic_ms(spec)
    rows = []
    tried = estimates(resolve(spec).hardware)
    if base is None:
        return {"baseline_ms": None, "tried": len(tried), "rows": []}
    for e in tried:
        try:
            low = _analytic_ms(spec, ((e.field, e.low),))
            high = _analytic_ms(spec, ((e.field, e.high),))
        except ConfigError:  # an end of the range the profile's checks refuse (e.g. below another figure)
            continue
        if low is None or high is None or (math.isclose(low, base) and math.isclose(high, base)):
            continue  # a figure this step does not use
        share = math.log(high / low) / math.log(e.high / e.low) if low > 0 and high > 0 else 0.0
        rows.append({"field": e.field, "source": e.source, "value": e.value, "low": e.low, "high": e.high,
                     "low_ms": low, "high_ms": high, "delta_ms": max(abs(low - base), abs(high - base)),
                     "share_of_step": share})
    rows.sort(key=lambda r: -r["delta_ms"])
    return {"baseline_ms": base, "tried": len(tried), "rows": rows[:top]}


def render_line(data: dict) -> str:
    """One line for the run table: the deciding estimates and their shares of the step."""
    rows = data["rows"]
    if not rows:
        return f"  deciding estimates: none of the {data['tried']} estimated figures moves this step"
    parts = [f"{r['field'].removeprefix('hardware.')} = {r['value']:g} ({100 * abs(r['share_of_step']):.0f}% of "
             f"the step; {r['low_ms']:.3g} / {r['high_ms']:.3g} ms at -/+50%)" for r in rows]
    return f"  deciding estimates ({len(rows)} of {data['tried']}, analytic): " + "; ".join(parts)
