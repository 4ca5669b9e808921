"""How the code reads, checked: few function-local imports of sim modules, each saying why, no
function whose cyclomatic complexity passes 20 (issue 26's 'Done when'), and unit conversions
only through sim.units."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest
from radon.complexity import cc_visit

from sim.costs.records import OpCost
from sim.lowering.graph import Access, OpGraph, Work

ROOT = Path(__file__).resolve().parent.parent / "sim"
SOURCES = sorted(ROOT.rglob("*.py"))
MAX_LOCAL_IMPORTS = 10
MAX_COMPLEXITY = 20
# a literal unit factor: 1e3, 1e-6, 1e9, 1e12 ..., / 1000, * 1000, 1024**2, 1024**3, 1_000_000
UNIT_LITERAL = re.compile(r"\b1e(-)?(3|6|9|12)\b|/ ?1000\b|\* ?1000\b|1024 ?\*\* ?[23]|\b1_000_000\b")
# file -> (lines matching UNIT_LITERAL, why they stay): the lines that are no unit conversion
UNIT_LITERALS_ALLOWED = {
    "sim/commands/handlers/trace.py": (3, "flag bounds (LIMITS)"),
    "sim/config/hardware.py": (1, "module docstring stating the units"),
    "sim/config/loader.py": (3, "1e9 as an example of number syntax in a docstring, a message, a comment"),
    "sim/config/model.py": (2, "bounds: PosFloat <= 1e6, MAX_WIDTH"),
    "sim/config/quantity.py": (4, "bounds MAX_VALUE, MIN_POSITIVE and docstrings showing them"),
    "sim/config/spec.py": (4, "bounds: MAX_BATCH, MAX_STEPS, MAX_TARGET_MS, MAX_CHIPS"),
    "sim/costs/compute.py": (1, "epsilon under ceil"),
    "sim/engine/flows.py": (1, "epsilon _EPS"),
    "sim/engine/simulation.py": (1, "relative tolerance"),
    "sim/experiments/link_fit.py": (1, "relative tolerance of the fit"),
    "sim/experiments/sram_heavy.py": (1, "bisection bracket 1 TB/s to 1 PB/s, values in GB/s"),
    "sim/experiments/validation.py": (1, "relative tolerance"),
    "sim/explore/compute.py": (1, "epsilon duration guard"),
    "sim/explore/views.py": (1, "--rates bound"),
    "sim/formats/fidelity.py": (1, "epsilon under sqrt"),
    "sim/formats/reference.py": (1, "epsilon under ceil"),
    "sim/lowering/placement.py": (2, "parallelism=1e9: unbounded parallelism, a count"),
    "sim/report/detail_plots.py": (2, "epsilon duration guard, log-axis floor"),
    "sim/report/figures.py": (1, "tolerance of a tick's leading digit"),
    "sim/report/labels.py": (2, "number-format thresholds"),
    "sim/report/markdown.py": (1, "number-format threshold"),
    "sim/report/moe_report.py": (1, "tolerance: a difference under 1e-3 ms is no change"),
    "sim/report/plots.py": (3, "NO_EFFECT_FRACTION, log-colour floor, axis-span fallback"),
    "sim/search/screen.py": (1, "absolute tolerance"),
    "sim/search/space.py": (3, "bounds: MAX_DEPLOYMENTS, rate, axis values"),
    "sim/search/workload.py": (1, "relative and absolute padding of a duration"),
    "sim/serve/plots.py": (2, "epsilon guards"),
    "sim/serve/requests.py": (2, "bounds: MAX_REQUESTS, MAX_ARRIVAL_S"),
    "sim/serve/spec.py": (1, "bound MAX_RATE_SCALE"),
    "sim/run.py": (1, "relative tolerance CHAIN_TOLERANCE (the chain decomposition, from sim/serve/stepmodel.py)"),
}


def _imports_sim(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return bool(node.level) or (node.module or "").split(".")[0] == "sim"
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == "sim" for alias in node.names)
    return False


def _explained(lines: list[str], lineno: int) -> bool:
    if "#" in lines[lineno - 1]:
        return True
    above = lineno - 2
    while above >= 0 and lines[above].strip().startswith(("from ", "import ")):
        above -= 1
    return above >= 0 and lines[above].strip().startswith("#")


def local_sim_imports() -> list[tuple[Path, int, bool]]:
    """(file, line, explained?) for every import of a sim module inside a function; explained
    means a comment on the line itself or just above its block of imports."""
    found = []
    for path in SOURCES:
        lines = path.read_text().splitlines()
        seen = set()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if _imports_sim(node) and node.lineno not in seen:
                    seen.add(node.lineno)
                    found.append((path, node.lineno, _explained(lines, node.lineno)))
    return found


def test_few_function_local_imports_of_sim_modules_and_each_says_why():
    found = local_sim_imports()
    where = [f"{p.relative_to(ROOT.parent)}:{line}" for p, line, _ in found]
    assert len(found) <= MAX_LOCAL_IMPORTS, f"{len(found)} function-local imports of sim modules: {where}"
    unexplained = [f"{p.relative_to(ROOT.parent)}:{line}" for p, line, ok in found if not ok]
    assert not unexplained, f"function-local imports without a comment saying why: {unexplained}"


def test_no_function_is_more_complex_than_twenty():
    over = [f"{path.relative_to(ROOT.parent)}:{block.lineno} {block.fullname} ({block.complexity})"
            for path in SOURCES for block in cc_visit(path.read_text())
            if block.complexity > MAX_COMPLEXITY]
    assert not over, "cyclomatic complexity above 20 (split them): " + "; ".join(over)


def unit_literal_lines() -> dict[str, list[str]]:
    """file -> its lines with a literal unit factor, over all of sim/ but sim/units.py."""
    found: dict[str, list[str]] = {}
    for path in SOURCES:
        name = str(path.relative_to(ROOT.parent))
        if name == "sim/units.py":
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if UNIT_LITERAL.search(line):
                found.setdefault(name, []).append(f"{name}:{lineno}: {line.strip()}")
    return found


def test_unit_conversions_go_through_sim_units():
    found = unit_literal_lines()
    over = [line for name, lines in found.items() if len(lines) > UNIT_LITERALS_ALLOWED.get(name, (0, ""))[0]
            for line in lines]
    assert not over, ("more literal unit factors than UNIT_LITERALS_ALLOWED lists (convert through sim.units' "
                      "constants and converters, same arithmetic; or list a literal that is no conversion): "
                      + "; ".join(over))
    stale = {name: (n, len(found.get(name, []))) for name, (n, _) in UNIT_LITERALS_ALLOWED.items()
             if len(found.get(name, [])) != n}
    assert not stale, f"UNIT_LITERALS_ALLOWED counts (allowed, found) to lower: {stale}"


@pytest.mark.parametrize("record", [Work, OpCost, OpGraph])
def test_a_frozen_record_with_its_own_init_takes_and_sets_every_field(record):
    """Work, OpCost and OpGraph write their frozen dataclass __init__ out (speed): it must take
    every init field, in order, with the field's default, set each, and stay frozen."""
    fields = [f for f in dataclasses.fields(record) if f.init]
    params = list(inspect.signature(record.__init__).parameters.values())[1:]
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        default = f.default if f.default is not dataclasses.MISSING else inspect.Parameter.empty
        assert p.default == default, f.name
    values = {f.name: (f"{f.name}-value",) for f in fields}
    made = record(**values)
    assert all(getattr(made, name) == value for name, value in values.items())
    assert dataclasses.replace(made) == made
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.__setattr__(fields[0].name, None)


def test_a_works_hash_and_an_op_costs_total_are_set_by_their_init():
    accesses = (Access("hbm", 100, "weights"),)
    assert hash(Work("matmul", accesses, 8)) == hash(Work("matmul", accesses, 8)) != hash(Work("matmul", accesses, 9))
    cost = OpCost((), 1.0, 1.0, 0.0, 0.0, 0.0, fill_ns=2.0, drain_ns=3.0, gap_ns=4.0, ideal_body_ns=5.0)
    assert cost.total_ns == 14.0 and cost == dataclasses.replace(cost)
