"""Comparisons inside the validation run: the grouped Triton MoE against the loop and a float64
reference (a case is timed only when they agree), and the status table the run ends with.

These check the measuring code, not the simulator: decodesim's predictions are compared with
the measured steps elsewhere (sim/report/validation.py), never here.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from harness import log

from model import DecodeStep, GroupedConfig, fused_moe


def rel_err(a, b) -> float:
    """|a - b| / |b| in float64 (Frobenius norms)."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def moe_reference(x2, w_gate_up, w_down, routing_weights, selected):
    """Float64 MoE, token by token (the CPU check's ground truth)."""
    f = w_gate_up.shape[1] // 2
    out = torch.zeros(x2.shape, dtype=torch.float64)
    for t in range(x2.shape[0]):
        for j in range(selected.shape[1]):
            e = int(selected[t, j])
            h = w_gate_up[e].double() @ x2[t].double()
            out[t] += float(routing_weights[t, j]) * (w_down[e].double() @ (F.silu(h[:f]) * h[f:]))
    return out


def selftest_grouped(device) -> float:
    """The Triton MoE in float32 against the float64 reference (exact up to fp32 rounding; the
    interpreter truncates fp32 to bf16, so the bf16 checks there read about 1e-2)."""
    gen = torch.Generator(device="cpu").manual_seed(3)
    worst = 0.0
    for tokens, hidden, ffn, experts, top_k in ((1, 64, 48, 8, 2), (3, 64, 48, 16, 8), (5, 96, 80, 8, 2)):
        x2 = torch.randn(tokens, hidden, generator=gen)
        w_gate_up = torch.randn(experts, 2 * ffn, hidden, generator=gen) * 0.1
        w_down = torch.randn(experts, hidden, ffn, generator=gen) * 0.1
        probs = torch.randn(tokens, experts, generator=gen).softmax(-1)
        routing_weights, selected = torch.topk(probs, top_k, dim=-1)
        args = [t.to(device) for t in (x2, w_gate_up, w_down, routing_weights, selected)]
        out = fused_moe(*args, GroupedConfig(block_k=32, sm_count=4))
        worst = max(worst, rel_err(out.cpu(), moe_reference(x2, w_gate_up, w_down, routing_weights, selected)))
    if worst > 1e-5:
        raise AssertionError(f"grouped MoE in float32 differs from float64 by {worst:.3g}")
    return worst


def check_grouped(step: DecodeStep, with_reference: bool) -> dict:
    """Layer 0's MoE on one input: the grouped kernel, loop_sync and dense_all against the loop
    (and all four against float64 when with_reference: the CPU check)."""
    s = step.s
    lw = step.w.layers[0]
    gen = torch.Generator(device="cpu").manual_seed(7)
    x2 = torch.randn(step.batch, s.hidden, generator=gen).to(device=lw.router.device, dtype=torch.bfloat16)
    routing_weights, selected = step.route(0, lw, x2)
    probe = DecodeStep.__new__(DecodeStep)
    probe.__dict__.update(step.__dict__)
    probe.plan, probe.routing = [None] * s.layers, [None] * s.layers
    outs = {"loop": probe.moe_loop(0, lw, x2, routing_weights, selected),
            "grouped": fused_moe(x2, lw.w_gate_up, lw.w_down, routing_weights, selected, step.grouped_cfg),
            "loop_sync": probe.moe_loop_sync(0, lw, x2, routing_weights, selected),
            "dense_all": probe.moe_dense_all(0, lw, x2, routing_weights, selected)}
    result = {f"{name}_vs_loop": rel_err(out, outs["loop"]) for name, out in outs.items() if name != "loop"}
    if with_reference:
        ref = moe_reference(x2.cpu(), lw.w_gate_up.cpu(), lw.w_down.cpu(), routing_weights.cpu(), selected.cpu())
        result.update({f"{name}_vs_float64": rel_err(out.cpu(), ref) for name, out in outs.items()})
    return result


def status_of(row: dict) -> str:
    """One line: the error, the skip reason, or the timing."""
    if row.get("error") or row.get("skipped_reason"):
        return row.get("error") or row.get("skipped_reason")
    text = f"{row['median_ms']:.3f} ms (p10 {row['p10_ms']:.3f}, p90 {row['p90_ms']:.3f}, n={row['reps']})"
    if "kernels_per_step" in row:
        text += f", {row['kernels_per_step']} kernels"
    return text


def print_table(rows: list[dict]):
    log("\ncase                                                    median_ms    p10     p90   kernels")
    for r in rows:
        if r.get("median_ms") is not None and not r.get("error"):
            log(f"{r['case_id']:<54} {r['median_ms']:>9.3f} {r['p10_ms']:>7.3f} {r['p90_ms']:>7.3f} "
                f"{r.get('kernels_per_step', '')!s:>8}")
        else:
            log(f"{r['case_id']:<54} {(r.get('error') or r.get('skipped_reason') or '')[:60]}")
