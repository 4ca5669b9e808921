#!/usr/bin/env python3
"""Kernel-class microbenchmarks of one GPU, for decodesim's kernel-level cost model.

Each row is one kernel class at one shape: a bf16 GEMM, an FP8 GEMM, a weight-only quantized
GEMV, an elementwise/reduction/gather kernel, a streaming read at a given number of programs,
an empty kernel at a given grid, or two kernels contending for HBM on two streams. The fit
that reads these CSVs models each kernel as start-up + bytes / achieved bandwidth (bandwidth
by bytes and by parallelism) + matrix time by M/N/K tiling. Whole decode steps are never
measured here.

Code: the shapes of every section are calibration/sweeps/kernels.yaml; each section's
configurations and the PyTorch code they time are in calibration/sections/ (one module per
kernel class; the runner in sections/bench.py), the Triton kernels in calibration/ops/, the
timing in calibration/harness.py. This file is the command line, the section order and the
summary.

Timing (the calibration method shared by these scripts): warm up, then capture R invocations of the
configuration in one CUDA graph (R so that one replay lasts ~1.5 ms), rotating through input
buffers whose total size is >= 2x L2 where the invocation count allows it, so each invocation
reads from HBM; time >= 7 replays with CUDA events behind a `torch.cuda._sleep` backlog;
per-invocation time = replay time / R (this includes the ~1 us gap between kernels of a graph
replay). Gathers and scatters draw fresh random row indices between replays (outside the
timed interval). If capture fails, the row falls back to back-to-back eager calls timed with events
(column `timing` says which). Each section first runs every configuration once eagerly
(warm-up, error check), then profiles one call of each with torch.profiler to record which
kernels ran (names, grids, blocks, registers, shared memory, durations), then times them.

Sections (``--only a,b``; default order, cheap and important first):
  launch      Triton empty / one-store kernels at grids {1,132,1320,13200} x blocks {128,1024}
  grid        Triton streaming read (each program one contiguous chunk), sizes 1..1024 MiB x
              programs 1..4224; Triton persistent strided read at 1x and 4x the SM count
  elementwise copy, add, mul, silu, silu*mul, casts, F.rms_norm, HF fp32 RMSNorm, softmax,
              sum, cat over 4 KB..1 GB; argmax and vocab softmax over logits rows;
              index_copy_, index_select, F.embedding, index_add_ of B rows in a 1 GB table
  gemm        bf16 F.linear(x[M,K], W[N,K]) for M 1..256 over 45 (N,K) projection/LM-head pairs
  gemm_fp8    torch._scaled_mm with e4m3 weights (GEMM alone), the activation quantization
              alone, and the whole plain-PyTorch FP8 linear
  gemm_wonly  int4 tinygemm (torch._weight_int4pack_mm, groups 32/64/128), int8 weight-only
              unfused (plain PyTorch), and Triton fused-dequant split-K GEMV for int8
              (per-channel) and int4 (asymmetric, group 128, 2 per byte)
  overlap     a bf16 GEMV and a decode SDPA alone and together on two streams (graphs), and
              two GEMVs together

Expected wall time of the default run on one H200: about 150 s (EXPECTED_SECONDS below, plus
~10 s start-up); ``--budget-s`` (default 170) stops starting new configurations in time, and
each section leaves room for the ones after it.

Output files (in --out):

kernels.csv: one row per timed configuration (all sections; columns a section does not use
are empty):
  config_id        unique id "<section>:<impl>:<shape>" (key into kernel_names.csv)
  section, impl    section name; the implementation (e.g. F.linear, torch._scaled_mm,
                   triton_splitk_int4_g128, copy_, hf_rmsnorm_fp32)
  kclass           kernel class for the cost model (gemm, gemv_wq, elementwise, reduction,
                   row_norm, gather, scatter, stream_read, launch, overlap, ...)
  dtype            data type of the main operand (bf16, fp32, fp8_e4m3, int8, int4)
  M, N, K          GEMM shape: x[M,K], W[N,K], y[M,N]
  M_padded         M actually passed to the kernel (if padding was needed; else = M)
  group_size       quantization group along K (0 = per output channel)
  elements         elements of the main tensor (elementwise sections)
  rows, row_width  row count and row width in elements (row-wise ops, gathers, scatters)
  size_bytes       the nominal size of the sweep axis (elementwise: bytes read + written,
                   except rms_norm rows = size/8 KiB; grid: bytes read)
  n_programs       launched programs (Triton sections)
  block_threads    threads per program (launch section)
  bytes_read       minimal bytes the operation must read (inputs once)
  bytes_written    minimal bytes the operation must write (outputs once)
  bytes_intermediate extra bytes the eager kernels move through HBM/L2 for intermediates
                   (written + read back; estimate from the op sequence; 0 for one kernel)
  flops            floating-point operations (2*M*N*K for GEMMs; 0 where not meaningful)
  reps             invocations per graph replay (R)
  replays          timed replays
  timing           graph | eager_backlog | cpu_host (meaningless numbers)
  median_us, p10_us, p90_us   per-invocation time over replays (replay time / R)
  achieved_GBps    (bytes_read + bytes_written) / median, decimal GB/s
  achieved_TFLOPs  flops / median
  rotation_bytes   bytes touched by distinct buffers within one replay (rotation pool)
  hbm_cold         True if rotation_bytes >= 2x L2 (inputs come from HBM), else False
  kernels          kernels (incl. memset/memcpy) one invocation launched (profiler)
  grid, block      grid and block of the longest kernel (profiler), "x*y*z"
  kernel_main      name of the longest kernel (truncated)
  kernels_sum_us   sum of the profiled kernel durations of one eager invocation
  rel_err          relative error against a float64 reference where checked
  alone_a_us, alone_b_us, together_us, sequential_us, finish_a_us, finish_b_us,
  bytes_a, bytes_b, reps_a, reps_b
                   overlap section only: makespan of stream a's graph alone, b's alone, both
                   launched together on two streams, both one after the other on one stream;
                   time from the common start to the end of a and of b when together;
                   bytes per invocation of a and b; invocations per graph (whole graphs, not
                   per invocation)
  note             free text
  error            exception type and message (one line) when the configuration failed

kernel_names.csv: config_id, section, kernel_index, kind (kernel|memcpy|memset), name, grid,
  block, registers, shared_memory_bytes, duration_us (one profiled eager invocation).

kernels_summary.json: machine facts (harness.machine_facts), arguments, expected and used
  seconds per section, budget, truncated_by_budget, rows/errors per section (first error
  messages), numerics checks, skipped configurations.

Usage on the device:   python3 calibration/kernels.py --out $OUT/kernels
GPU smoke test (<15 s): python3 calibration/kernels.py --quick --out /tmp/kq
CPU plumbing check:     TRITON_INTERPRET=1 python calibration/kernels.py --cpu --out /tmp/k
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from harness import log, machine_facts, nvidia_smi_snapshot, one_line, write_json  # noqa: E402
from sections.bench import (EXPECTED_SECONDS, MAX_GRAPH_NODES, REPLAY_TARGET_US, Bench,  # noqa: E402
                            SectionStats)
from sections.castred import bcast_configs, castred_configs  # noqa: E402
from sections.elementwise import elementwise_configs  # noqa: E402
from sections.gemm import fp8_narrow_configs, fp8_static_configs, gemm_configs, gemm_fp8_configs  # noqa: E402
from sections.gemm_wonly import gemm_wonly_configs  # noqa: E402
from sections.grouped_mm import grouped_mm_configs  # noqa: E402
from sections.kv_append import kv_append_configs  # noqa: E402
from sections.launch_grid import check_grid_kernels, grid_configs, launch_configs  # noqa: E402
from sections.overlap import overlap_section  # noqa: E402

DEFAULT_ORDER = ["launch", "grid", "elementwise", "gemm", "gemm_fp8", "gemm_wonly", "overlap"]
# issue 21's sections: run with --only (not part of the default run)
EXTRA_ORDER = ["castred", "kv_append", "fp8_static", "grouped_mm", "bcast", "fp8_narrow"]


SECTION_CONFIGS = {
    "bcast": bcast_configs,
    "fp8_narrow": fp8_narrow_configs,
    "castred": castred_configs,
    "kv_append": kv_append_configs,
    "fp8_static": fp8_static_configs,
    "grouped_mm": grouped_mm_configs,
    "launch": launch_configs,
    "grid": grid_configs,
    "elementwise": elementwise_configs,
    "gemm": gemm_configs,
    "gemm_fp8": gemm_fp8_configs,
    "gemm_wonly": gemm_wonly_configs,
}


def parse_args(argv=None):
    """Command-line arguments."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--budget-s", type=float, default=170.0,
                    help="stop starting configurations after this many seconds (default 170)")
    ap.add_argument("--quick", action="store_true", help="tiny GPU smoke run of every code path")
    ap.add_argument("--cpu", action="store_true", help="plumbing check on CPU, tiny shapes")
    ap.add_argument("--only", default=",".join(DEFAULT_ORDER),
                    help="comma-separated sections, run in the default order")
    return ap.parse_args(argv)


def run_sections(b: Bench, order: list):
    """Runs the selected sections in order, each guarded so a failure costs only itself."""
    for name in order:
        if time.time() > b.deadline:
            b.truncated = True
            b.stats.setdefault(name, SectionStats(EXPECTED_SECONDS.get(name, 0))).not_started = True
            log(f"== section {name} skipped: budget spent")
            continue
        try:
            if name == "overlap":
                st = b.stats.setdefault(name, SectionStats(EXPECTED_SECONDS[name]))
                t0 = time.time()
                log(f"== section overlap (expected {EXPECTED_SECONDS[name]} s)")
                overlap_section(b, st)
                st.used_s = time.time() - t0
            else:
                if name == "grid":
                    check_grid_kernels(b)
                b.run_section(name, lambda name=name: SECTION_CONFIGS[name](b), order)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            st = b.stats.setdefault(name, SectionStats(EXPECTED_SECONDS.get(name, 0)))
            b.record_error(st, f"{name}:section", one_line(e))
        write_summary(b, order, final=False)


def write_summary(b: Bench, order: list, final: bool, facts=None):
    """kernels_summary.json (rewritten after every section, so a cut run keeps one)."""
    path = os.path.join(b.args.out, "kernels_summary.json")
    if facts is None:
        facts = getattr(b, "facts", {})
    obj = {
        "script": "calibration/kernels.py", "final": final, "mode": b.mode,
        "args": vars(b.args), "sections": order,
        "budget_s": b.args.budget_s, "elapsed_s": round(b.elapsed_s(), 2),
        "truncated_by_budget": b.truncated,
        "expected_seconds": EXPECTED_SECONDS,
        "section_stats": {k: vars(v) for k, v in b.stats.items()},
        "rows_total": sum(v.rows for v in b.stats.values()),
        "errors_total": sum(v.errors for v in b.stats.values()),
        "checks": b.checks, "notes": b.notes, "skipped_by_budget": b.skipped[:500],
        "l2_bytes": b.l2_bytes, "sm_count": b.nsm,
        "timing": {"replay_target_us": REPLAY_TARGET_US, "max_graph_nodes": MAX_GRAPH_NODES,
                   "rotation_target_bytes": b.rot_target, "replays": b.replays},
        "machine": facts,
    }
    write_json(path, obj)


def print_table(b: Bench):
    """Short final table: per section rows, errors, skips and seconds."""
    log(f"{'section':12s} {'rows':>5s} {'errors':>6s} {'unsupp':>6s} {'budget':>6s} {'used_s':>7s} "
        f"{'expected_s':>10s}")
    for name, st in b.stats.items():
        log(f"{name:12s} {st.rows:5d} {st.errors:6d} {st.skipped_unsupported:6d} {st.skipped_budget:6d} "
            f"{st.used_s:7.1f} {st.expected_s:10.0f}" + ("  (not started: budget)" if st.not_started else ""))
    log(f"total {b.elapsed_s():.1f} s of budget {b.args.budget_s:.0f} s; truncated_by_budget={b.truncated}")
    log("checks:", json.dumps(b.checks, default=str)[:2000])


def main(argv=None):
    """Entry point."""
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if not args.cpu and not torch.cuda.is_available():
        log("no CUDA device; use --cpu for a plumbing check")
        return 2
    b = Bench(args)
    facts = machine_facts(b.cuda)
    if b.cuda:
        facts["nvidia_smi_before"] = nvidia_smi_snapshot()
    b.facts = facts
    log("machine:", {k: v for k, v in facts.items() if not k.startswith("nvidia_smi")})
    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in DEFAULT_ORDER + EXTRA_ORDER]
    if unknown:
        log(f"unknown sections {unknown}; known: {DEFAULT_ORDER + EXTRA_ORDER}")
        return 2
    order = [s for s in DEFAULT_ORDER + EXTRA_ORDER if s in wanted]
    log(f"mode {b.mode}, sections {order}, budget {args.budget_s:.0f} s, "
        f"expected {sum(EXPECTED_SECONDS[s] for s in order)} s + start-up")
    run_sections(b, order)
    if b.cuda:
        facts["nvidia_smi_after"] = nvidia_smi_snapshot()
    write_summary(b, order, final=True, facts=facts)
    b.csv.close()
    b.names.close()
    print_table(b)
    return 0


if __name__ == "__main__":
    sys.exit(main())
