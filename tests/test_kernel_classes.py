"""Kernel classes are declared once (sim/kernel_classes.py) and read everywhere: each declared
class is accepted by the schemas, chosen and given its work by the lowering, and costed by its
measured figures; a class added to the registry alone reaches all three; no other module of
sim/ lists class names."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sim import load_profile
from sim.config.hardware import KernelCosts
from sim.config.loader import load_yaml
from sim.config.software import Kernel, SoftwareStack, software_dir
from sim.costs import CostModel
from sim.kernel_classes import CLASSES, FALLBACK, KVQuant, default_class
from sim.lowering.graph import Access, KernelWork, Work
from sim.lowering.kernels import expand, with_prologue

ROOT = Path(__file__).resolve().parent.parent
SOURCE = {"source": "test"}
QUANT = KVQuant(bits=4, group_size=32, outlier_fraction=0.0, k_per_channel=False, codebook=False)


def _kernel(kclass: str, name: str = "k", reads=("x", "w"), writes=("y",)) -> Kernel:
    return Kernel.model_validate({"name": name, "class": kclass, "reads": list(reads), "writes": list(writes)})


def _accesses() -> tuple[Access, ...]:
    return (Access("hbm", 4096, "act", False, None, "x"), Access("hbm", 1 << 20, "weights", False, None, "w"),
            Access("hbm", 4096, "act", True, None, "y"))


def _expand(specs, kind: str = "matmul", **work):
    fields = dict(matrix_flops=1000, matrix_m=1, vector_ops=300, dequant_ops=100, dtype="fp8", parallelism=64,
                  values=50, quant=QUANT)
    return expand(specs, kind, _accesses(), **{**fields, **work})


@pytest.mark.parametrize("name", CLASSES)
def test_a_declared_class_is_accepted_by_every_schema(name):
    assert _kernel(name).kclass == name
    costs = KernelCosts.model_validate({"cta_bandwidth_GBps": {"value": 25.0, **SOURCE}, "classes": {
        name: {"startup_ns": {"value": 1000.0, **SOURCE}, "stream_fraction": {"value": 0.9, **SOURCE}}}})
    assert name in costs.classes
    raw = load_yaml(software_dir() / "torch-eager.yaml")
    raw["dispatch_ns"] = {name: {"value": 5000.0, **SOURCE}}
    assert SoftwareStack.model_validate(raw).dispatch(name) == 5000.0


def test_an_undeclared_class_is_rejected_naming_the_declared_ones():
    with pytest.raises(ValueError, match="matrix"):
        _kernel("tiled_gemv")
    with pytest.raises(ValueError, match="unknown kernel class 'tiled_gemv'"):
        KernelCosts.model_validate({"cta_bandwidth_GBps": {"value": 25.0, **SOURCE}, "classes": {
            "tiled_gemv": {"startup_ns": {"value": 1.0, **SOURCE}, "stream_fraction": {"value": 0.9, **SOURCE}}}})


@pytest.mark.parametrize("name", CLASSES)
def test_the_lowering_runs_an_unnamed_op_as_the_class_its_kind_defaults_to(name):
    for kind in CLASSES[name].default_for:
        assert default_class(kind) == name
        (kernel,) = _expand(None, kind)
        assert kernel.kclass == name
    assert default_class("no such kind") == FALLBACK


@pytest.mark.parametrize("name", CLASSES)
def test_the_lowering_gives_a_class_the_work_its_declaration_says(name):
    spec = CLASSES[name]
    first, kernel = _expand((_kernel("elementwise", "before", reads=("x",)), _kernel(name)))
    assert kernel.kclass == name
    assert kernel.matrix_flops == (1000 if spec.matrix else 0)  # without a matrix kernel the first takes them
    assert kernel.dtype == ("fp8" if spec.matrix else "bf16")
    assert kernel.quant == (QUANT if spec.cache_dequant else None)
    assert kernel.values == (50 if spec.cache_dequant else 0)
    if spec.unfused_dequant:  # it reads the weights: it takes all their dequantization
        assert (kernel.dequant_ops, first.dequant_ops) == (100, 0)
    wrapped = with_prologue((_kernel(name),), (_kernel("cast", "quantize_x", reads=("x",)),), "matmul")
    assert [k.name for k in wrapped] == (["quantize_x", "k"] if spec.gemm else ["k"])


@pytest.mark.parametrize("name", CLASSES)
def test_a_declared_class_is_costed_by_its_measured_figures(name):
    hw = load_profile("h200-sxm")
    measured = KernelCosts.model_validate({"cta_bandwidth_GBps": {"value": 25.0, **SOURCE}, "classes": {
        name: {"startup_ns": {"value": 1234.0, **SOURCE}, "stream_fraction": {"value": 0.5, **SOURCE}}}})
    costs = CostModel(hw.model_copy(update={"kernels": measured}))
    accesses = (Access(hw.store.name, 1 << 30, "weights", False, None, "w"),)
    k = KernelWork(name="k", kclass=name, accesses=accesses, parallelism=1e9)
    cost = costs.kernel_cost(Work(kind="vector", accesses=accesses), k, first=True)
    assert cost.startup_ns == 1234.0
    assert cost.body_ns == pytest.approx((1 << 30) / (0.5 * hw.store.sustained_GBps))


def test_a_class_added_to_the_registry_alone_reaches_schema_lowering_and_costs():
    """Declared before the schemas are imported (as an entry in CLASSES would be), a new class
    is accepted, chosen for the op kind it claims, given the matrix work and costed."""
    script = textwrap.dedent("""
        import sim.kernel_classes as kc
        kc.CLASSES["tiled_gemv"] = kc.ClassSpec("tiled_gemv", "a test class", matrix=True, default_for=("gemv",))
        from sim.config.hardware import KernelCosts
        from sim import load_profile
        from sim.config.software import Kernel
        from sim.costs import CostModel
        from sim.lowering.graph import Access, Work
        from sim.lowering.kernels import expand

        q = {"source": "test"}
        spec = Kernel.model_validate({"name": "k", "class": "tiled_gemv", "reads": ["x", "w"], "writes": ["y"]})
        acc = (Access("hbm", 1 << 20, "weights", False, None, "w"),)
        work = dict(matrix_flops=1000, matrix_m=1, vector_ops=0, dequant_ops=0, dtype="bf16", parallelism=64)
        (chosen,) = expand(None, "gemv", acc, **work)
        (named,) = expand((spec,), "matmul", acc, **work)
        measured = KernelCosts.model_validate({"cta_bandwidth_GBps": {"value": 25.0, **q}, "classes": {
            "tiled_gemv": {"startup_ns": {"value": 777.0, **q}, "stream_fraction": {"value": 0.5, **q}}}})
        hw = load_profile("h200-sxm")
        cost = CostModel(hw.model_copy(update={"kernels": measured})).kernel_cost(Work(kind="gemv", accesses=acc),
                                                                                  chosen, first=True)
        print(chosen.kclass, named.matrix_flops, cost.startup_ns)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.split() == ["tiled_gemv", "1000", "777.0"]


def test_no_module_but_the_registry_lists_class_names():
    """A tuple, list, set or dict keys of sim/ that name two or more classes is a second list
    to keep in step: read sim.kernel_classes instead."""
    found = []
    for path in sorted((ROOT / "sim").rglob("*.py")):
        if path.name == "kernel_classes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                items = node.elts
            elif isinstance(node, ast.Dict):
                items = [k for k in node.keys if k is not None]
            else:
                continue
            names = {e.value for e in items if isinstance(e, ast.Constant) and e.value in CLASSES}
            if len(names) >= 2:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {sorted(names)}")
    assert not found, "kernel class names listed outside sim/kernel_classes.py:\n" + "\n".join(found)
