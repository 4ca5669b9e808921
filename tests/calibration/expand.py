"""Expands every calibration sweep into the shapes (or configuration ids) it measures, without torch.

Used twice: once on the scripts as they were before the sweeps became data (the result is the
committed fixture tests/fixtures/calibration_sweeps.json), and by tests/test_calibration_sweeps.py
on the scripts as they are now. Each script is imported with the torch stub installed (and dropped again
afterwards), and its own expansion code is called.
"""
from __future__ import annotations

import importlib
import tempfile
from pathlib import Path
from types import SimpleNamespace

from tests.calibration import torch_stub

CAL = Path(__file__).resolve().parents[2] / "calibration"
MODES = ("full", "quick", "cpu")


def load(name: str):
    """calibration/<name>.py imported (call within torch_stub.installed)."""
    return importlib.import_module(name)


def kernels_ids() -> dict:
    """kernels.py: section -> mode -> the configuration ids, in visiting order."""
    k = load("kernels")
    out: dict = {}
    for mode in MODES:
        with tempfile.TemporaryDirectory() as tmp:
            args = SimpleNamespace(cpu=mode == "cpu", quick=mode == "quick", budget_s=170.0, out=tmp,
                                   only="")
            b = k.Bench(args)
            for section, configs in k.SECTION_CONFIGS.items():
                out.setdefault(section, {})[mode] = [c.cid for c in configs(b)]
            b.csv.close()
            b.names.close()
    return out


def kv_attention_shapes() -> dict:
    """kv_attention.py: mode -> check shape, sweep (B, L) points, skipped points; formats -> impls."""
    kv = load("kv_attention")
    out: dict = {}
    for mode in MODES:
        args = kv.parse_args(["--out", "x"] + {"full": [], "quick": ["--quick"], "cpu": ["--cpu"]}[mode])
        args.heads = kv.default_heads(args)
        check, shapes, skipped = kv.sweep_shapes(args, mode != "cpu")
        out[mode] = {"check": [check.B, check.Hq, check.Hkv, check.D, check.L],
                     "points": [[s.B, s.L] for s in shapes], "skipped": [[s["B"], s["L"]] for s in skipped]}
    out["formats"] = {str(D): {f.name: kv.impls_for(f) for f in kv.formats_for(D)} for D in (64, 128, 256)}
    return out


def moe_shapes() -> dict:
    """moe_host.py: the sampled sweep (default 120 configurations, seed 0) and the fixed ones."""
    m = load("moe_host")
    rows = lambda shapes: [[s.H, s.F, s.E, s.top_k, s.T] for s in shapes]  # noqa: E731
    out = {"full": rows(m.sample_configs(120, 0))}
    for mode in ("quick", "cpu"):
        out[mode] = rows(m.fixed_configs(SimpleNamespace(cpu=mode == "cpu", quick=mode == "quick")))
    return out


def expand_all() -> dict:
    """Every sweep's expansion (the fixture's layout), with the stub installed only meanwhile."""
    with torch_stub.installed(str(CAL)):
        return {"kernels": kernels_ids(), "kv_attention": kv_attention_shapes(), "moe_host": moe_shapes()}
