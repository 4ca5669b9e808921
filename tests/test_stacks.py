"""Software stacks: every bundled stack runs every bundled model and profile; a broken stack
is one line and exit 2; adding a kernel never makes a step faster; a stack of one ideal kernel
per op on a profile with no start-up reproduces the byte model."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sim.config.software import list_stacks, software_dir
from sim.paths import hardware_dir, models_dir
from sim.run import simulate

STACKS = list_stacks()
MODELS = sorted(p.stem for p in models_dir().glob("*.yaml"))
PROFILES = sorted(p.stem for p in hardware_dir().glob("*.yaml"))


@pytest.mark.parametrize("software", STACKS)
@pytest.mark.parametrize("model", MODELS)
def test_every_stack_runs_every_model(software, model):
    s = simulate(model=model, software=software, steps=1, batch=2, context=512, check_capacity=False,
                 chips=8 if model in ("deepseek-v3", "llama-3-70b", "llama-2-70b", "llama-3.3-70b", "gpt-oss-120b")
                 else None).summary
    assert s["per_token_ms_p50"] > 0


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from tests.test_profiles import TINY

    path = tmp_path_factory.mktemp("models") / "tiny-80l.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return str(path)


@pytest.mark.parametrize("profile", PROFILES)
def test_the_plain_pytorch_stack_runs_on_every_profile(profile, tiny_model):
    for software in ("torch-eager", "torch-graph"):
        s = simulate(hardware=profile, model=tiny_model, software=software, steps=1, batch=2, context=256,
                     check_capacity=False).summary
        assert s["per_token_ms_p50"] > 0


def test_a_broken_stack_file_is_one_line_and_exit_2(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndescription: x\nsource: y\nlaunch: graph\nops:\n  qkv:\n    kernels:\n"
                   "      - {name: q, class: magic}\n")
    code, out, err = cli("run", "--software", str(bad), "--steps", "1")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "bad.yaml" in err and "ops.qkv.kernels" in err


def _stack_with(tmp_path: Path, name: str, change, base: str = "torch-graph") -> str:
    """A copy of bundled stack ``base`` named ``name``, changed in place by ``change(raw)``."""
    raw = yaml.safe_load((software_dir() / f"{base}.yaml").read_text())
    raw["name"] = name
    change(raw)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.mark.parametrize("op", ["attn_norm", "qkv", "attention", "down"])
def test_adding_a_kernel_never_makes_a_step_faster(tmp_path, op):
    def add(raw):
        entry = raw["ops"].get(op) or raw["ops"][next(g for g, ops in raw["groups"].items() if op in ops)]
        entry["kernels"].append({"name": "extra", "class": "elementwise", "reads": ["x"]})
        if op not in raw["ops"]:
            raw["ops"][op] = entry

    base = simulate(software="torch-graph", batch=4, context=2048, steps=1).summary["per_token_ms_p50"]
    more = simulate(software=_stack_with(tmp_path, "more", add), batch=4, context=2048, steps=1).summary
    assert more["per_token_ms_p50"] > base


def test_ideal_kernels_reproduce_the_byte_model(tmp_path):
    """One kernel per op (no stack entries), no start-up, every class at the store's full
    stream rate: the step is the graph launch, the sync and each op's slower of its bytes and
    its compute (the byte model), with no kernel start-up row."""
    def strip(raw):
        raw["ops"] = {}
        raw["groups"] = {}
        raw.pop("matrix_prologue", None)

    stack = _stack_with(tmp_path, "ideal", strip)
    classes = ("matrix", "attention", "elementwise", "reduction", "index", "copy", "cast")
    zero = [f"hardware.kernels.classes.{c}.startup_ns=0" for c in classes]
    full = [f"hardware.kernels.classes.{c}.stream_fraction=1" for c in classes]
    rows = ["hardware.kernels.classes.reduction.cta_bandwidth_GBps=1e6", "hardware.kernels.classes.index.cta_bandwidth_GBps=1e6"]
    r = simulate(software=stack, batch=4, context=2048, steps=1, overrides=zero + full + rows, keep_ops=True)
    s = r.summary
    assert s["breakdown_ms"].get("kernel_startup", 0.0) == 0.0
    bodies_ms = sum(o["duration_ns"] for o in r.ops) / 1e6
    assert s["per_token_ms_p50"] >= bodies_ms  # the chain of op bodies, plus launch and sync
    assert s["per_token_ms_p50"] - bodies_ms < 0.02  # only the graph launch and the sync beyond it
    assert s["per_token_ms_p50"] >= s["byte_floor_ms"]


def test_framework_calls_cost_the_host_exactly_their_price_and_only_in_eager(tmp_path):
    """A stack's kernel-less framework calls (``calls``) add their measured host time to each
    eager launch: one more module call on the down projection adds exactly layers x its price
    to the host's issue time of a batch-1 step (host-bound), and nothing to a captured graph."""
    def one_more(raw):
        raw["ops"]["down"]["kernels"][0]["calls"] = ["module_call", "module_call"]

    price = yaml.safe_load((software_dir() / "torch-eager.yaml").read_text())["host_calls_ns"]["module_call"]["value"]
    more = _stack_with(tmp_path, "more", one_more, "torch-eager")
    for graph in (False, True):
        kw = dict(batch=1, context=1024, steps=1, graph=graph)
        base = simulate(software="torch-eager", **kw).summary["per_token_ms_p50"]
        extra = simulate(software=more, **kw).summary["per_token_ms_p50"]
        expected = 0.0 if graph else 32 * price / 1e6  # llama-3-8b: 32 layers
        assert extra - base == pytest.approx(expected, abs=1e-9)


def test_an_unknown_framework_call_is_one_line_and_exit_2(cli, tmp_path):
    def bad(raw):
        raw["ops"]["down"]["kernels"][0]["calls"] = ["teleport"]

    code, out, err = cli("run", "--software", _stack_with(tmp_path, "badcall", bad, "torch-eager"), "--steps", "1")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "framework call 'teleport' is not in host_calls_ns" in err
