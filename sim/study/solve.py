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


NOT_KNOBS = {"target_ms": "the target itself", "seed": "a random seed", "steps": "how many steps are simulated"}


def solve(spec: RunSpec, path: str, target_ms: float | None = None, lo: float | None = None,
          hi: float | None = None, rel_tol: float = 2e-3, max_evals: int = 60, integer: bool | None = None) -> Solution:
    if path in NOT_KNOBS:
        raise ConfigError("--vary", path, f"is {NOT_KNOBS[path]}, not a knob of the machine or the workload; "
                          "expected a hardware.*/model.* path or a run field such as batch, context or chips")
    target = target_ms if target_ms is not None else spec.target_ms
    base = current_value(spec, path)
    integer = isinstance(base, int) if integer is None else integer
    lo, hi = _range(base, lo, hi, integer, path)
    run = _Evaluator(spec.model_copy(update={"target_ms": target}), path, integer)
    at_lo, at_hi = run(lo), run(hi)
    if at_lo.meets == at_hi.meets:
        return _no_crossing(path, target, lo, hi, at_lo, at_hi, run.evals)
    direction = "increase" if at_hi.meets else "decrease"
    good, bad = (hi, lo) if direction == "increase" else (lo, hi)
    while len(run.evals) < max_evals and not _narrow(good, bad, integer, rel_tol):
        mid = (good + bad) // 2 if integer else \
            math.sqrt(good * bad) if bad / good > 4 or good / bad > 4 else (good + bad) / 2
        if run(mid).meets:
            good = mid
        else:
            bad = mid
    e, at_bad = run(good), run.cache[bad]
    word = "smallest" if direction == "increase" else "largest"
    bad_ms = at_bad.per_token_ms_p99 if at_bad.per_token_ms_p99 is not None else float("nan")
    return Solution(path, target, True, good, direction, lo, hi,
                    f"the {word} {path} that meets {target:g} ms is {good:g} (p99 {e.per_token_ms_p99:.3f} ms; "
                    f"{bad:g} gives {bad_ms:.3f} ms"
                    f"{'' if at_bad.per_token_ms_p99 is not None else ', does not fit'}); current value {base:g}",
                    run.evals)


def _range(base: float, lo: float | None, hi: float | None, integer: bool, path: str) -> tuple[float, float]:
    """The bracket to search: the given ends, else base / 16 .. base x 16 (integers 1 .. base x 16)."""
    if lo is None:
        lo = 1 if integer else base / 16
    if hi is None:
        hi = max(base * 16, 2) if integer else base * 16
    if not (0 < lo < hi < math.inf):
        raise ConfigError("--range", path, "expected 0 < LO < HI, both finite", (lo, hi))
    if integer:
        if lo != int(lo) or hi != int(hi):
            raise ConfigError("--range", path, "takes whole numbers: expected whole LO and HI", (lo, hi))
        lo, hi = int(lo), int(hi)
    return lo, hi


def _narrow(good: float, bad: float, integer: bool, rel_tol: float) -> bool:
    """True when the bracket is as narrow as asked (adjacent integers, or ``rel_tol``)."""
    return abs(good - bad) <= 1 if integer else abs(good - bad) <= rel_tol * abs(good)


class _Evaluator:
    """Simulates ``spec`` with ``path`` set to a value, once per value, keeping every evaluation."""

    def __init__(self, spec: RunSpec, path: str, integer: bool):
        self.spec, self.path, self.integer = spec, path, integer
        self.evals: list[Evaluation] = []
        self.cache: dict = {}

    def __call__(self, value) -> Evaluation:
        value = int(value) if self.integer else float(value)
        if value in self.cache:
            return self.cache[value]
        try:
            summary = simulate(with_overrides(self.spec, [(self.path, value)])).summary
        except ConfigError as err:  # a value of the range the parameter does not allow: name --range
            if err.file == "--set" and err.key_path == self.path:
                raise ConfigError("--range", self.path, f"{err.expected} (the range reaches {value:g})") from None
            raise
        e = Evaluation(value, summary.get("per_token_ms_p99"), bool(summary.get("meets_target")), summary["verdict"])
        self.cache[value] = e
        self.evals.append(e)
        return e


def _no_crossing(path: str, target: float, lo: float, hi: float, at_lo: Evaluation, at_hi: Evaluation,
                 evals: list[Evaluation]) -> Solution:
    """Both ends meet the target (the faster end is the bound) or neither does (the best end is named)."""
    if at_lo.meets:
        fast_lo = at_lo.per_token_ms_p99 is not None and at_hi.per_token_ms_p99 is not None \
            and at_lo.per_token_ms_p99 <= at_hi.per_token_ms_p99
        edge = hi if fast_lo else lo
        return Solution(path, target, True, edge, "decrease" if fast_lo else "increase", lo, hi,
                        f"every value in [{lo:g}, {hi:g}] meets {target:g} ms; the range end {edge:g} is the "
                        "bound (widen --range to look further)", evals)
    best = min((e for e in (at_lo, at_hi) if e.per_token_ms_p99 is not None), key=lambda e: e.per_token_ms_p99,
               default=None)
    best_txt = f"; best is {best.per_token_ms_p99:.3f} ms at {best.value:g}" if best else "; neither end fits in memory"
    return Solution(path, target, False, None, "unknown", lo, hi,
                    f"no value of {path} in [{lo:g}, {hi:g}] meets {target:g} ms{best_txt}", evals)
