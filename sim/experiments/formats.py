"""The runs behind the formats report (reports/formats.md): byte tables, fidelity on synthetic
KV, the side-by-side run and the attention-kernel grid.

Byte counts come from the bundled formats (sim/formats/base.py), fidelity from the numpy
reference quantizer on synthetic KV, latencies from the simulator. ``run`` returns one
``FormatsResults``; sim.report.formats_report renders it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.config.loader import load_yaml, validate
from sim.config.model import ModelSpec
from sim.experiments.compare import attention_rows, compare_rows
from sim.formats import build_format, list_formats
from sim.formats.fidelity import SyntheticKV, score_std, synthetic
from sim.formats.tables import byte_row, fidelity_rows, weight_row, widths
from sim.paths import models_dir, resolve
from sim.run import RunSpec, simulate

CONTEXTS = (1024, 4096, 32768)
FIDELITY = SyntheticKV(tokens=4096, seed=0)
COMPARE = dict(model="llama-3-8b", hardware="h200-sxm", batch=16, context=32768, steps=2)
COMPARE_KV = ["fp16", "int8", "fp8-e4m3", "kivi-4", "kivi-2", "int4-asym-g128", "kvquant-3-1pct", "int2-asym-outlier"]
KERNEL_STACKS = ("fused", "fused-naive-kv")
KERNEL_GRID = ((1, 4096), (16, 4096), (16, 32768), (64, 16384), (64, 65536))


@dataclass(frozen=True)
class FormatsResults:
    """Every figure of the formats report. ``bytes`` maps (format, context) to its byte row;
    ``kernel_ms`` maps (stack, KV format, batch, context) to ms per token (None: does not fit)."""

    model: str
    k_width: int
    v_width: int
    kv_formats: list
    bytes: dict[tuple[str, int], dict]
    weights: list[dict]
    fidelity: SyntheticKV
    score_std: float
    fidelity_rows: list[dict]
    k_layout_rows: list[dict]
    compare: dict
    compare_kv: list[str]
    compare_rows: list[dict]
    kernel_ms: dict[tuple[str, str, int, int], float | None]
    break_even: list[dict]


def k_layout_formats():
    """Three 2-bit K layouts with V kept in fp16, so only K differs."""
    base = {"description": "K-layout probe", "role": "kv", "bits": 2, "symmetric": False, "scale_dtype": "fp16",
            "zero_dtype": "fp16", "per": "row", "group_size": 32,
            "v": {"encoding": "float", "float_format": "fp16", "bits": 16, "symmetric": True,
                  "scale_dtype": "none", "zero_dtype": "none", "group_size": None}}
    return [
        build_format({**base, "name": "K 2-bit per token (g32)", "k": {"per": "row"}}),
        build_format({**base, "name": "K 2-bit per channel (g32)", "k": {"per": "column"}}),
        build_format({**base, "name": "K 2-bit per channel (g32) + 1% outliers",
                      "k": {"per": "column", "outliers": {"fraction": 0.01}}}),
    ]


def kernel_grid(run: RunSpec, kv_formats: list[str]) -> dict[tuple[str, str, int, int], float | None]:
    """Per-token ms of every KV format under each measured attention kernel, over KERNEL_GRID."""
    out = {}
    for software in KERNEL_STACKS:
        for kv in kv_formats:
            for batch, context in KERNEL_GRID:
                spec = run.model_copy(update={"kv": kv, "software": software, "batch": batch, "context": context})
                out[(software, kv, batch, context)] = simulate(spec).summary["per_token_ms_p50"]
    return out


def run(model: str = "llama-3-8b", fidelity: SyntheticKV = FIDELITY, compare: dict | None = None,
        compare_kv: list[str] | None = None) -> FormatsResults:
    """The report's figures. The defaults are the published report's settings; tests pass
    smaller ones."""
    compare = {**COMPARE, "model": model, **(compare or {})}
    compare_kv = compare_kv or COMPARE_KV
    path = resolve(model, models_dir(), "model")
    spec = validate(ModelSpec, load_yaml(path), path)
    kw, vw = widths(spec)
    kv_formats = list_formats("kv")
    sample = synthetic(fidelity)
    run_spec = RunSpec(**compare)
    return FormatsResults(
        model=spec.name, k_width=kw, v_width=vw, kv_formats=kv_formats,
        bytes={(f.name, c): byte_row(f, c, kw, vw) for f in kv_formats for c in CONTEXTS},
        weights=[weight_row(f) for f in list_formats("weights")],
        fidelity=fidelity, score_std=score_std(sample),
        fidelity_rows=fidelity_rows(kv_formats, sample, seed=fidelity.seed),
        k_layout_rows=fidelity_rows(k_layout_formats(), sample, seed=fidelity.seed),
        compare=compare, compare_kv=compare_kv, compare_rows=compare_rows(run_spec, compare_kv),
        kernel_ms=kernel_grid(run_spec, compare_kv),
        break_even=attention_rows(run_spec.model_copy(update={"batch": 16, "context": 32768}), compare_kv,
                                  list(KERNEL_STACKS)))
