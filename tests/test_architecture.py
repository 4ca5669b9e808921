"""How the code reads, checked: few function-local imports of sim modules, each saying why, and
no function whose cyclomatic complexity passes 20 (issue 26's 'Done when')."""

from __future__ import annotations

import ast
from pathlib import Path

from radon.complexity import cc_visit

ROOT = Path(__file__).resolve().parent.parent / "sim"
SOURCES = sorted(ROOT.rglob("*.py"))
MAX_LOCAL_IMPORTS = 10
MAX_COMPLEXITY = 20


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
