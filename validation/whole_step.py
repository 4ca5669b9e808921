#!/usr/bin/env python3
"""Frozen validation set of decodesim: whole decode steps of models the kernel-cost calibration
never sees, timed on one GPU (an H200), in code that shares nothing with calibration/ except its
measuring harness (calibration/harness.py: timing, CSV writer, machine facts).

The code: cases.py (the frozen cases and model shapes, which cases a run takes, in what order),
model.py (the decode step in PyTorch), measuring.py (timing, profiling, the Runner),
comparison.py (grouped MoE against the loop and float64; the final table); this file is the
command line.

Each case of validation/cases.yaml is one decode step of a model built here in plain PyTorch
with random bf16 weights (seeded), written the way Hugging Face transformers' modeling code runs
a decode step, as a user would: embedding; per layer RMSNorm (fp32 upcast, pow, mean, rsqrt,
mul, cast, weight mul), Q/K/V projections (separate for Llama, Mistral, Qwen2 with Qwen2's
bias, fused qkv_proj for Phi-3; OLMoE's QK-norm), RoPE via rotate_half (cos/sin computed once
per step from the position ids), a static KV cache [B, Hkv, Lmax, D] written with
``index_copy_`` at a position tensor, ``F.scaled_dot_product_attention(..., enable_gqa=True)``
over the first context + 1 positions (default backend), O projection, residual adds, RMSNorm,
SwiGLU MLP (gate, up, silu(gate) * up, down; Phi-3's fused gate_up_proj) or the MoE block;
final norm, LM head on the last position, fp32 copy of the logits and argmax (greedy decoding).

MoE block (Hugging Face Mixtral/OLMoE): router linear, softmax in fp32, top-k, renormalise
(Mixtral; OLMoE has norm_topk_prob false), cast to bf16, then one of four executions:
  loop       per touched expert: gather its tokens, gate, up, silu*mul, down, times its router
             weight, index_add_ into the output. Token-to-expert order comes from an argsort
             of the expert ids on the device each step; the touched experts and their token counts are
             read once before capture (the routing of the captured step), so the step is
             graph-safe and the graph replays exactly that routing.
  loop_sync  Hugging Face's eager loop: one_hot, nonzero over the hit experts (host sync), and
             for each hit expert an int() (host sync, as indexing a ModuleList does) and a
             torch.where (host sync): 1 + 2 x touched syncs per MoE layer.
  grouped    a Triton fused MoE written here: one kernel aligns the token slots into blocks of
             BLOCK_M per expert, one grouped GEMM does gate_up for all experts, one kernel does
             silu(gate) * up, one grouped GEMM does down and multiplies by the router weights,
             and a sum over top_k gives the output (5 kernels after the router).
  dense_all  every expert over every token: batched GEMMs over the stacked expert weights,
             weighted by a dense [tokens, experts] router matrix.
FP8 weights: every layer linear holds e4m3 weights with a per-tensor scale; each call
quantizes its activation per tensor (abs, amax, divide, clamp, cast) and calls
torch._scaled_mm (bf16 out); embeddings, norms and the LM head stay bf16.

Timing (the project's method): torch-graph captures one decode step (positions fixed at the
context) in a CUDA graph after two warm-up steps on a side stream, replays it once untimed and
then >= 20 times, each replay bracketed by CUDA events and synchronized: median, p10, p90.
torch-eager runs the step 3 times to warm up, then >= 10 times, each followed by
torch.cuda.synchronize(), timed with the host clock. Kernel counts: after all timing (so the
profiler can neither slow nor crash a timed step), one torch.profiler pass per (model, stack,
execution, weights) group, at the group's smallest measured case, rebuilt for it: an annotated
eager step names every kernel's op and layer, and for torch-graph one profiled graph replay
counts what the graph runs.

Budget: cases are timed in an order that puts the smallest case of every group first (the
grouped Triton cases after all others, in the same way); no new
case starts after --budget-s minus --profile-reserve-s (240 - 45 s by default), and no new
profile after --budget-s. Cases not started get a row with skipped_reason "budget".

Outputs in --out:
  steps.csv: case_id, model, stack, execution, weights, batch, context, median_ms, p10_ms,
      p90_ms, reps, kernels_per_step (profiled cases only, from the graph replay for
      torch-graph; filled in when the run ends: steps.csv is rewritten then, and a run that dies
      earlier leaves the row-by-row file without them), error, skipped_reason, layers_run
      (layers actually built: fewer under --quick and --cpu), experts_touched_mean (MoE:
      distinct experts per layer, mean),
      host_syncs_per_step (loop_sync: 1 + 2 x touched per MoE layer; 0 otherwise),
      check_rel_err (grouped: |grouped - loop| / |loop| for layer 0's MoE), wall_s
  kernels_<model>_<stack>.csv: case_id, model, stack, execution, weights, batch, context,
      scope (layer0: the first layer; outside: before and after the layers), index, op (the
      annotation the kernel was launched under, e.g. "L0.qkv", "lm_head"), op_source
      (launch: matched by the launch's correlation id; gpu_range: by the GPU-side annotation
      range; previous: inherited from the kernel before it), kernel, grid, block,
      registers_per_thread, shared_memory, duration_us
  routing.csv: case_id, layer, expert, tokens (MoE cases: the routing the measured step used)
  profiles.csv: case_id, model, stack, execution, weights, batch, context, kernels_per_step,
      eager_step_kernels, graph_replay_kernels, layer0_kernels, outside_kernels, memcpy, memset,
      annotations, error, note, wall_s (one row per profiled case, written as it is profiled)
  steps_summary.json: machine facts (calibration/harness.py), arguments, budget use,
      truncated_by_budget, cases not run, per-group profile facts, grouped-kernel checks.

Usage on the device (expected wall time of the default run: 120-240 s; nothing new starts
after 240 s, and the case in flight finishes, at most ~10 s):
  python3 validation/whole_step.py --out $OUT
Smoke run of every code path on the GPU (2 layers per model, 16 cases, 8 profiles; about 20-30 s,
mostly Triton compilation and CUDA/cuBLAS/cuDNN start-up):
  python3 validation/whole_step.py --quick --out $OUT
Plumbing check on the CPU (tiny shapes; graph stacks run eagerly; numbers mean nothing):
  TRITON_INTERPRET=1 python3 validation/whole_step.py --cpu --out /tmp/v
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "calibration"))

import torch  # noqa: E402
from harness import log, machine_facts, nvidia_smi_snapshot, run_mode, write_json  # noqa: E402

from cases import select_cases  # noqa: E402
from comparison import print_table, selftest_grouped  # noqa: E402
from measuring import Runner, _selftest_parser  # noqa: E402
from model import HAVE_TRITON, INTERPRET  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--cases", default=str(REPO / "validation" / "cases.yaml"))
    p.add_argument("--budget-s", type=float, default=240.0, help="start no new case after this wall time")
    p.add_argument("--quick", action="store_true", help="GPU smoke run: 2 cases per code path, 2 layers")
    p.add_argument("--cpu", action="store_true", help="CPU plumbing check: tiny shapes, 2 cases per path")
    p.add_argument("--only-ids", default="", help="comma-separated case ids")
    p.add_argument("--graph-reps", type=int, default=25, help="timed graph replays (>= 20)")
    p.add_argument("--eager-reps", type=int, default=10, help="timed eager steps (>= 10)")
    p.add_argument("--profile-all", action="store_true", help="profile every case, not one per group")
    p.add_argument("--profile-reserve-s", type=float, default=45.0,
                   help="seconds of the budget kept for the profiler passes after the timing")
    p.add_argument("--verbose", action="store_true", help="print tracebacks")
    args = p.parse_args(argv)
    if args.quick or args.cpu:
        args.graph_reps, args.eager_reps = min(args.graph_reps, 5), min(args.eager_reps, 3)
    return args


def run_outcome(args, runner, cases) -> dict:
    """What the run did, for steps_summary.json: wall time and budget use, cases and profiles not run,
    errors, skips, profiles and the grouped-kernel checks."""
    return {
        "wall_s": round(runner.elapsed(), 1), "budget_s": args.budget_s,
        "truncated_by_budget": bool(runner.not_run or runner.profiles_not_run), "not_run": runner.not_run,
        "profiles_not_run": runner.profiles_not_run,
        "profile_errors": {k: v["error"] for k, v in runner.profiled.items() if v.get("error")},
        "cases": len(cases), "measured": sum(1 for r in runner.results if r.get("median_ms") is not None
                                             and not r.get("error")),
        "errors": {r["case_id"]: r["error"] for r in runner.results if r.get("error")},
        "skipped": {r["case_id"]: r["skipped_reason"] for r in runner.results if r.get("skipped_reason")},
        "profiles": runner.profiled, "grouped_checks": runner.checks,
        "notes": ["loop (graph): routing read before capture; the graph replays that routing",
                  "loop_sync: Hugging Face's loop, 1 + 2 x touched host syncs per MoE layer",
                  "Phi-3's sliding_window 2047 is not applied (no attention mask anywhere)",
                  "Triton under TRITON_INTERPRET=1: bf16 is upcast to fp32 before tl.dot, and fp32 -> bf16 "
                  "stores truncate (the GPU rounds to nearest), so CPU bf16 checks read ~1e-2"]}


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: use --cpu for the plumbing check")
    cases = select_cases(args)
    runner = Runner(args)
    mode = run_mode(args)
    log(f"whole_step: {len(cases)} cases, mode {mode}, budget {args.budget_s:.0f} s, out {args.out}")
    summary = {"script": "validation/whole_step.py", "mode": mode, "args": vars(args),
               "machine": machine_facts(runner.cuda), "triton_interpret": INTERPRET}
    if runner.cuda:
        summary["nvidia_smi_before"] = nvidia_smi_snapshot()
    if args.cpu:
        _selftest_parser()
        summary["parser_selftest"] = "ok"
        if HAVE_TRITON and INTERPRET:
            summary["grouped_fp32_selftest_rel_err"] = selftest_grouped(runner.device)
            log(f"grouped MoE fp32 self-test: rel err {summary['grouped_fp32_selftest_rel_err']:.2e}")
    try:
        runner.run(cases)
    finally:
        runner.close()
        summary.update(run_outcome(args, runner, cases))
        if runner.cuda:
            summary["nvidia_smi_after"] = nvidia_smi_snapshot()
        write_json(str(Path(args.out) / "steps_summary.json"), summary)
    print_table(runner.results)
    bad_checks = [k for k, v in runner.checks.items() if v["grouped_vs_loop"] >= 2e-2]
    log(f"done in {runner.elapsed():.1f} s: {summary['measured']}/{len(cases)} measured, "
        f"{len(summary['errors'])} errors, {len(summary['skipped'])} skipped, {len(runner.not_run)} not run; "
        f"grouped checks failed: {bad_checks or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
