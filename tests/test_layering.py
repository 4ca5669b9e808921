"""The stages import one way (DESIGN.md "Data flows one way"): a module may import only
from its own layer or the layers below it, never upward, and no import cycle exists, with
function-local imports counted like any other (a local import may defer a heavy library
for start-up time, never dodge a cycle).

Layers, lowest first. Within one layer imports are allowed as long as they form no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "sim"

LAYERS: list[tuple[str, ...]] = [
    ("sim.units", "sim.errors", "sim.io", "sim.version", "sim.schema", "sim.config.defaults", "sim.kernel_classes",
     "sim.speculation"),
    ("sim.paths",),
    ("sim.config.quantity", "sim.config.loader"),
    ("sim.config",),  # hardware, model, spec, software, energy: nothing of formats, moe or the setup
    ("sim.formats", "sim.decode_trace"),
    ("sim.moe",),
    ("sim.setup",),
    ("sim.lowering",),
    ("sim.costs",),
    ("sim.engine", "sim.analytic"),
    ("sim.results", "sim.energy"),
    ("sim.run",),
    ("sim.experiments", "sim.calibrate"),
    ("sim.study", "sim.report", "sim.serve", "sim.search", "sim.explore.html", "sim.explore.figures",
     "sim.explore.compute"),
    ("sim.options",),  # the command-line options both front ends (commands, explore) parse
    ("sim.commands", "sim.cli", "sim.__main__", "sim.__api__", "sim", "sim.explore", "sim.api"),
]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer_of(module: str) -> int:
    """The layer of the longest listed prefix of ``module``."""
    best, best_len = None, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best_len:
                best, best_len = i, len(name)
    if best is None:
        raise AssertionError(f"{module} is in no layer of tests/test_layering.py: add it")
    return best


def imports_of(path: Path) -> list[tuple[str, int, bool]]:
    """(imported sim module, line, function-local?) for every import of a sim module."""
    tree = ast.parse(path.read_text())
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    local_lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    local_lines.add(inner.lineno)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            # "from sim.x import y" may import the submodule sim.x.y; "from sim import name" reaches
            # the package root's API wrappers (top layer) unless it is the version
            names = [f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}")
                     else ("sim.__api__" if base == "sim" and alias.name != "__version__" else base)
                     for alias in node.names]
        else:
            continue
        for name in names:
            if name == "sim" or name.startswith("sim."):
                out.append((name, node.lineno, node.lineno in local_lines))
    return out


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT.parent / rel).with_suffix(".py").is_file() or (ROOT.parent / rel / "__init__.py").is_file()


MODULES = sorted(ROOT.rglob("*.py"))


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in MODULES:
        if "_bundled" in path.parts:
            continue
        src = module_name(path)
        for target, _line, _local in imports_of(path):
            if target != src and not (target == "sim" and src.startswith("sim")):
                edges.setdefault(src, set()).add(target)
    return edges


def test_no_import_runs_upward():
    bad = []
    for path in MODULES:
        if "_bundled" in path.parts:
            continue
        src = module_name(path)
        for target, line, local in imports_of(path):
            if target == "sim":  # the package root holds only the version and lazy API wrappers
                continue
            if layer_of(target) > layer_of(src):
                bad.append(f"{path.relative_to(ROOT.parent)}:{line}: {src} (layer {layer_of(src)}) imports "
                           f"{target} (layer {layer_of(target)}){' in a function' if local else ''}")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_import_cycle():
    edges = _edges()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if state.get(nxt) is None:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if state.get(node) is None:
            cycle = visit(node)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


RENDER_ONLY_BANS = ("sim.engine", "sim.run", "sim.costs", "sim.lowering", "sim.analytic")


def test_reports_only_render():
    """sim.report renders results; the runs behind them live in sim.experiments, so no report
    module imports the pipeline (function-local imports included)."""
    bad = sorted({f"{path.relative_to(ROOT.parent)}:{line}: imports {target}"
                  for path in (ROOT / "report").rglob("*.py")
                  for target, line, _local in imports_of(path)
                  if any(target == ban or target.startswith(ban + ".") for ban in RENDER_ONLY_BANS)})
    assert not bad, "report modules that run the pipeline:\n" + "\n".join(bad)


def _folder(module: str) -> str | None:
    """The top-level sim subpackage ``module`` belongs to (None for a top-level module)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (ROOT / parts[1] / "__init__.py").is_file()) else None


def test_no_two_folders_import_each_other():
    """Folders depend one way too: for each pair of sim subpackages, at most one imports
    the other (module-level cycles are caught above; this catches folders that point at
    each other through different modules, as config/ and formats/ did through the setup)."""
    pairs: dict[tuple[str, str], str] = {}
    for src, targets in _edges().items():
        for target in targets:
            a, b = _folder(src), _folder(target)
            if a and b and a != b:
                pairs.setdefault((a, b), f"{src} -> {target}")
    both = {tuple(sorted(p)): f"{pairs[p]} and {pairs[p[::-1]]}" for p in pairs if p[::-1] in pairs}
    assert not both, "folders that import each other:\n" + "\n".join(f"{a} <-> {b}: {v}" for (a, b), v in both.items())


def test_config_imports_nothing_of_formats_moe_or_the_setup():
    """The setup sits above formats and moe; sim.config (the loader and the config models)
    sits below them and reads none of them."""
    bad = [f"{src} -> {target}" for src, targets in _edges().items() if src == "sim.config" or src.startswith("sim.config.")
           for target in targets if target.split(".")[:2] in (["sim", "formats"], ["sim", "moe"], ["sim", "setup"])]
    assert not bad, "sim.config imports upward:\n" + "\n".join(bad)


@pytest.mark.parametrize("module", ["sim.costs", "sim.engine.simulation", "sim.lowering.decode"])
def test_core_stages_read_no_yaml(module):
    """The loader is the only YAML reader: the core stages do not import yaml."""
    path = ROOT.parent.joinpath(*module.split("."))
    for file in sorted(path.glob("*.py")) if path.is_dir() else [path.with_suffix(".py")]:
        tree = ast.parse(file.read_text())
        names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert "yaml" not in names, file
