"""Inverse what-if: the value of one parameter at which a setup just meets a latency target.

``solve(spec, path, target_ms)`` bisects over one dotted path (the same paths as ``--set``)
between ``lo`` and ``hi``. The latency must be monotone in the parameter (more bandwidth,
SRAM or chips never slows a step; a larger batch or context never speeds it); the
direction that helps is found from the two ends. A point that does not fit in memory
counts as missing the target. Integer parameters (chip count, batch, ...) bisect over
integers; real ones stop when the bracket is narrower than ``rel_tol`` of the value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sim.config.spec import (
    HARDWARE,
    MODEL,
    RUN_FIELDS,
    RunSpec,
    apply_run_overrides,
    check_path,
    hardware_subpath,
    with_overrides,
)
from sim.errors import ConfigError
from sim.run import simulate
from sim.setup import resolve


@dataclass
class Evaluation:
    value: float
    per_token_ms_p99: float | None  # None: does not fit
    meets: bool
    verdict: str


@dataclass
class Solution:
    path: str
    target_ms: float
    found: bool
    value: float | None  # the smallest (or largest) value that meets the target
    direction: str  # "increase" (larger helps) or "decrease"
    lo: float
    hi: float
    message: str
    evaluations: list[Evaluation] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"path": self.path, "target_ms": self.target_ms, "found": self.found, "value": self.value,
                "direction": self.direction, "range": [self.lo, self.hi], "message": self.message,
                "evaluations": [e.__dict__ for e in self.evaluations]}


def current_value(spec: RunSpec, path: str) -> Any:
    """The value ``path`` has in the resolved setup (a sourced quantity gives its value)."""
    res = resolve(spec)
    if path in RUN_FIELDS:
        value = getattr(apply_run_overrides(spec), path)
        if value is None and path == "chips":
            return res.hardware.chips
        if value is None and path in ("tp", "pp"):
            return getattr(res, path)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError("--vary", path, "must name a number", value)
        return value
    check_path(path, "--vary")
    if path.startswith(HARDWARE):
        node: Any = res.hardware
        parts = hardware_subpath(path[len(HARDWARE):], res.hardware.model_dump()).split(".")
    else:
        node = res.model
        parts = path[len(MODEL):].split(".")
    for part in parts:
        if isinstance(node, list):
            match = [item for item in node if getattr(item, "name", None) == part]
            node = match[0] if match else node[int(part)] if part.isdigit() else None
        else:
            node = getattr(node, part, None)
        if node is None:
            raise ConfigError("--vary", path, "no such path in the resolved setup")
    if hasattr(node, "value") and hasattr(node, "source"):
        node = node.value
    if not isinstance(node, (int, float)) or isinstance(node, bool):
        raise ConfigError("--vary", path, "must name a number", node)
    return node


def solve(spec: RunSpec, path: str, target_ms: float | None = None, lo: float | None = None,
          hi: float | None = None, rel_tol: float = 2e-3, max_evals: int = 60, integer: bool | None = None) -> Solution:
    target = target_ms if target_ms is not None else spec.target_ms
    base = current_value(spec, path)
    integer = isinstance(base, int) if integer is None else integer
    if lo is None:
        lo = 1 if integer else base / 16
    if hi is None:
        hi = max(base * 16, 2) if integer else base * 16
    if not (0 < lo < hi < math.inf):
        raise ConfigError("--range", path, "expected 0 < LO < HI, both finite", (lo, hi))
    if integer:
        lo, hi = int(math.floor(lo)), int(math.ceil(hi))
    evals: list[Evaluation] = []
    cache: dict = {}

    def run(value) -> Evaluation:
        value = int(value) if integer else float(value)
        if value in cache:
            return cache[value]
        s = with_overrides(spec.model_copy(update={"target_ms": target}), [(path, value)])
        try:
            summary = simulate(s).summary
        except ConfigError as err:  # a value of the range the parameter does not allow: name --range
            if err.file == "--set" and err.key_path == path:
                raise ConfigError("--range", path, f"{err.expected} (the range reaches {value:g})") from None
            raise
        p99 = summary.get("per_token_ms_p99")
        e = Evaluation(value, p99, bool(summary.get("meets_target")), summary["verdict"])
        cache[value] = e
        evals.append(e)
        return e

    at_lo, at_hi = run(lo), run(hi)
    if at_lo.meets and at_hi.meets:
        fast_lo = at_lo.per_token_ms_p99 is not None and at_hi.per_token_ms_p99 is not None and at_lo.per_token_ms_p99 <= at_hi.per_token_ms_p99
        direction = "decrease" if fast_lo else "increase"
        edge = hi if fast_lo else lo
        return Solution(path, target, True, edge, direction, lo, hi,
                        f"every value in [{lo:g}, {hi:g}] meets {target:g} ms; the range end {edge:g} is the "
                        "bound (widen --range to look further)", evals)
    if not at_lo.meets and not at_hi.meets:
        best = min((e for e in (at_lo, at_hi) if e.per_token_ms_p99 is not None), key=lambda e: e.per_token_ms_p99, default=None)
        best_txt = f"; best is {best.per_token_ms_p99:.3f} ms at {best.value:g}" if best else "; neither end fits in memory"
        return Solution(path, target, False, None, "unknown", lo, hi,
                        f"no value of {path} in [{lo:g}, {hi:g}] meets {target:g} ms{best_txt}", evals)
    direction = "increase" if at_hi.meets else "decrease"
    good, bad = (hi, lo) if direction == "increase" else (lo, hi)
    while len(evals) < max_evals:
        if integer:
            if abs(good - bad) <= 1:
                break
            mid = (good + bad) // 2
        else:
            if abs(good - bad) <= rel_tol * abs(good):
                break
            mid = math.sqrt(good * bad) if bad / good > 4 or good / bad > 4 else (good + bad) / 2
        if run(mid).meets:
            good = mid
        else:
            bad = mid
    e = run(good)
    word = "smallest" if direction == "increase" else "largest"
    return Solution(path, target, True, good, direction, lo, hi,
                    f"the {word} {path} that meets {target:g} ms is {good:g} (p99 {e.per_token_ms_p99:.3f} ms; "
                    f"{bad:g} gives {cache[bad].per_token_ms_p99 if cache[bad].per_token_ms_p99 is not None else float('nan'):.3f} ms"
                    f"{'' if cache[bad].per_token_ms_p99 is not None else ', does not fit'}); current value {base:g}", evals)
