"""The runs behind reports/moe.md: the three MoE dispatch paths on GPU and SRAM-centric hardware.

For Mixtral-8x7B and DeepSeek-V3 on h200-sxm (1 and 8 chips) and on the SRAM-centric
groq-lpu profile (as many chips as the weights need), every dispatch path at batch 1, 8 and
64: the run summaries and whether one expert fits in a chip's pinnable SRAM; the placement
policies and routing skew on a hypothetical HBM chip with pinnable SRAM (the test fixture);
a dense scale check on groq-lpu; and the MoE executions as kernels (issue 13). ``run``
returns them as one ``MoeResults``; sim.report.moe_report renders it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sim.config.defaults import PLACEMENTS
from sim.lowering.moe import DISPATCHES, HOST_DISPATCH_NS
from sim.moe.sizes import expert_bytes, experts_per_chip, sram_budget
from sim.paths import bundled
from sim.run import RunSpec, resolve, simulate
from sim.units import MB, MS_PER_S

__all__ = ["DISPATCHES", "HOST_DISPATCH_NS", "MoeCase", "MoeResults", "collect", "executions", "policy_table",
           "run", "scale_check"]

BATCHES = (1, 8, 64)
CONTEXT = 4096
STEPS = 4
HYPOTHETICAL = "tests/fixtures/moe/sram-rich.yaml"


@dataclass(frozen=True)
class MoeCase:
    """One deployment of the report's tables: its label and the RunSpec fields it sets."""

    label: str
    fields: dict = field(default_factory=dict)


SETUPS = (
    MoeCase("Mixtral-8x7B bf16, h200-sxm x1", dict(model="mixtral-8x7b", hardware="h200-sxm", weights="bf16")),
    MoeCase("Mixtral-8x7B bf16, h200-sxm x8, experts TP-sharded",
          dict(model="mixtral-8x7b", hardware="h200-sxm", weights="bf16", chips=8)),
    MoeCase("Mixtral-8x7B bf16, h200-sxm x8, expert parallel",
          dict(model="mixtral-8x7b", hardware="h200-sxm", weights="bf16", chips=8, placement="spread")),
    MoeCase("DeepSeek-V3 int8, h200-sxm x1", dict(model="deepseek-v3", hardware="h200-sxm", weights="int8")),
    MoeCase("DeepSeek-V3 int8, h200-sxm x8, experts TP-sharded",
          dict(model="deepseek-v3", hardware="h200-sxm", weights="int8", chips=8)),
    MoeCase("DeepSeek-V3 int8, h200-sxm x8, expert parallel",
          dict(model="deepseek-v3", hardware="h200-sxm", weights="int8", chips=8, placement="spread")),
    MoeCase("Mixtral-8x7B bf16, groq-lpu x576 (tp 18 x pp 32)",
          dict(model="mixtral-8x7b", hardware="groq-lpu", weights="bf16", chips=576, tp=18, pp=32)),
    MoeCase("Mixtral-8x7B bf16, groq-lpu x2304 (tp 72 x pp 32)",
          dict(model="mixtral-8x7b", hardware="groq-lpu", weights="bf16", chips=2304, tp=72, pp=32)),
    MoeCase("DeepSeek-V3 int8, groq-lpu x7808 (tp 128 x pp 61)",
          dict(model="deepseek-v3", hardware="groq-lpu", weights="int8", chips=7808, tp=128, pp=61)),
)


def _run(fields: dict, batch: int, dispatch: str) -> dict:
    spec = RunSpec(batch=batch, context=CONTEXT, steps=STEPS, dispatch=dispatch, **fields)
    return simulate(spec).summary


def _fit(fields: dict) -> dict:
    """Does one expert (the unit the placement pins) fit in a chip's pinnable SRAM?"""
    res = resolve(RunSpec(steps=1, **fields))
    block = res.moe
    unit = expert_bytes(res.model, res.weights, res.tp, block.ep)
    level, budget = sram_budget(res.hardware)
    full = expert_bytes(res.model, res.weights, res.tp, 2)  # a whole expert
    store = res.hardware.store
    info = {"unit_MB": unit / MB, "expert_MB": full / MB, "budget_MB": budget / MB, "level": level,
            "slots": block.placement.slots, "sram_store": store.kind == "sram",
            "store_MB": store.capacity_bytes / MB, "store_GBps": store.peak_GBps, "chips": res.hardware.chips,
            "on_chip": experts_per_chip(res.model, block.ep) * block.trace.layers}
    if info["sram_store"]:
        shard = " shard" if block.ep == 1 and res.tp > 1 else ""
        info["text"] = f"all resident ({level} is the store; {unit / MB:.2f} MB per expert{shard})"
    else:
        what = "expert" if block.ep > 1 or res.tp == 1 else "expert shard"
        slots = info["slots"]
        info["text"] = (f"{what} {unit / MB:.1f} MB vs {budget / MB:.1f} MB pinnable {level}: {slots} slot"
                        f"{'s' if slots != 1 else ''} of {info['on_chip']}")
    return info


def collect() -> list[dict]:
    """Every setup at every batch and dispatch path: its run summary and whether an expert fits."""
    out = []
    for setup in SETUPS:
        fit = _fit(setup.fields)
        for batch in BATCHES:
            for dispatch in DISPATCHES:
                s = _run(setup.fields, batch, dispatch)
                out.append({"setup": setup.label, "fit": fit, "batch": batch, "dispatch": dispatch, "summary": s})
    return out


def scale_check() -> dict:
    """The same groq-lpu profile on a dense model with a published per-user rate (anchors.md
    C1: Llama-2-70B at 300 tokens/s/user on 576 chips, about 3.3 ms per token)."""
    s = simulate(RunSpec(model="llama-2-70b", hardware="groq-lpu", weights="int8", chips=576, tp=18, pp=32,
                         batch=1, context=CONTEXT, steps=2, allow_long_context=True)).summary  # 4096 is its window
    return {"ms": s["per_token_ms_p99"], "published_ms": MS_PER_S / 300, "bound": s["bound"]}


def hypothetical_profile() -> Path:
    """The SRAM-rich profile the policy table runs on (bundled, so the report works installed)."""
    return bundled("tests", "fixtures", "moe") / Path(HYPOTHETICAL).name


HYPO_SET = ("hardware.sram.capacity_MB", 4000)
HYPO_CHIPS, HYPO_BATCH, HYPO_STEPS = 8, 8, 16


def policy_table() -> list[dict]:
    """Placement policies and routing skew on the hypothetical SRAM-rich HBM chip."""
    rows = []
    base = dict(hardware=str(hypothetical_profile()), model="qwen3-30b-a3b", chips=HYPO_CHIPS, overrides=(HYPO_SET,))
    fit = _fit(base)
    for routing, skew in (("uniform", 1.0), ("zipf", 1.2)):
        for placement in PLACEMENTS:
            s = simulate(RunSpec(batch=HYPO_BATCH, steps=HYPO_STEPS, context=CONTEXT, dispatch="sram_zero_copy",
                                 placement=placement, routing=routing, routing_skew=skew, **base)).summary
            rows.append({"routing": routing + (f" s={skew:g}" if routing == "zipf" else ""), "placement": placement,
                         "hit": s["moe"]["sram_hit_rate"], "ms": s["per_token_ms_p99"],
                         "active": s["moe"]["active_experts_per_layer"], "fit": fit})
    return rows


# -- MoE executions as kernels (issue 13) ------------------------------------------------------

EXEC_MODELS = (("Mixtral-8x7B", "mixtral-8x7b", {}), ("OLMoE-1B-7B", "olmoe-1b-7b", {}),
               ("Qwen3-30B-A3B", "qwen3-30b-a3b", {}))
EXECUTIONS = (
    ("eager, per-expert loop, host sync per layer", dict(software="torch-eager", dispatch="host_sync")),
    ("CUDA graph, per-expert loop", dict(software="torch-graph", dispatch="device")),
    ("CUDA graph, all experts dense", dict(software="torch-graph-dense", dispatch="device")),
    ("CUDA graph, grouped GEMM (Triton fused MoE)", dict(software="torch-graph-fused-moe", dispatch="device")),
    ("fused serving stack, grouped GEMM", dict(software="fused", dispatch="device")),
    ("fused serving stack, zero-copy SRAM dispatch", dict(software="fused", dispatch="sram_zero_copy")),
)
EXEC_BATCHES = (1, 8, 32)
MEMORY_ROWS = ("weights", "expert_weights", "kv", "activations", "outliers", "temp", "combine")


def _execution_row(fields: dict, batch: int) -> dict:
    s = simulate(RunSpec(batch=batch, context=CONTEXT, steps=2, allow_long_context=True,  # OLMoE's window is 4096
                         **fields)).summary
    b = s.get("breakdown_ms") or {}
    return {"ms": s["per_token_ms_p50"], "bytes": sum(b.get(r, 0.0) for r in MEMORY_ROWS),
            "startup": b.get("kernel_startup", 0.0), "host": b.get("launch_sync", 0.0),
            "other": s["per_token_ms_p50"] - sum(b.get(r, 0.0) for r in MEMORY_ROWS) - b.get("kernel_startup", 0.0)
            - b.get("launch_sync", 0.0), "kernels": None, "verdict": s["verdict"]}


def executions() -> dict[tuple[str, str, int], dict]:
    """(model label, execution, batch) -> where the step's time goes under that execution."""
    return {(label, name, batch): _execution_row(dict(model=model, weights="bf16", **fields, **extra), batch)
            for label, model, extra in EXEC_MODELS for name, fields in EXECUTIONS for batch in EXEC_BATCHES}


@dataclass(frozen=True)
class MoeResults:
    """Every figure of reports/moe.md."""

    results: list[dict]
    policy_rows: list[dict]
    scale: dict
    executions: dict[tuple[str, str, int], dict]


def run() -> MoeResults:
    return MoeResults(collect(), policy_table(), scale_check(), executions())
