"""What ``decodesim run`` does: simulate one setup, print or write its summary, tables,
trace and HTML view."""

from __future__ import annotations

import sys
from contextlib import nullcontext

from sim.commands.common import Interrupt, emit_json, fmt_bytes, to_json, write_atomic, write_frame
from sim.energy import render_lines
from sim.errors import COMMAND_LINE, ConfigError
from sim.experiments.band import band
from sim.experiments.estimates import deciding_estimates, render_line
from sim.explore.compute import run_view
from sim.io import output_set, writer_lock
from sim.options.spec import spec_from_args
from sim.report.timeline import trace_of
from sim.run import simulate
from sim.speculation import speculation_note


def step_range(text: str | None, steps: int) -> tuple[int, int] | None:
    """``--trace-steps A:B`` as (A, B), half-open like a Python slice; None keeps every step."""
    if text is None:
        return None
    lo, sep, hi = text.partition(":")
    try:
        a = int(lo) if lo.strip() else 0
        b = (int(hi) if hi.strip() else steps) if sep else a + 1
    except ValueError:
        raise ConfigError(COMMAND_LINE, "--trace-steps", "expected A:B with whole numbers (A <= step < B)",
                          text) from None
    if not 0 <= a < b:
        raise ConfigError(COMMAND_LINE, "--trace-steps", f"expected 0 <= A < B (the run has steps 0..{steps - 1})",
                          text)
    return a, b


def handle(args) -> int:
    spec = spec_from_args(args)
    trace_steps = step_range(args.trace_steps, spec.steps)
    keep = args.out is not None or args.trace_out is not None
    html = getattr(args, "html", None)
    # one writer per --out folder; Ctrl-C stops after the step under way and keeps the steps done
    with writer_lock(args.out) if args.out is not None else nullcontext(), Interrupt() as interrupt:
        result = simulate(spec, keep_ops=keep or html is not None, keep_log=keep, stop=interrupt)
        _estimates(args, spec, result)
        if getattr(args, "band", False) and result.summary.get("per_token_ms_p50") is not None:
            result.summary["band"] = band(spec, result.summary["per_token_ms_p50"])
        with output_set():  # every file of the run lands together, or none does
            _write(args, spec, result, trace_steps, html)
    if result.summary.get("partial"):
        done = result.summary["steps_done"]
        sys.stderr.write(f"decodesim: interrupted after {done} of {spec.steps} steps; the results are of those "
                         "steps, marked partial" + (f" (partial: true in {args.out / 'summary.json'})"
                                                    if args.out is not None else "") + "\n")
    if args.json:
        emit_json("run", result.summary)
    else:
        print(render(result.summary))
    return interrupt.exit_code


def _estimates(args, spec, result) -> None:
    """With ``--estimates N``: the N estimated profile figures that move the answer most, in the summary."""
    wanted = getattr(args, "estimates", None)
    if wanted is not None and wanted < 1:
        raise ConfigError(COMMAND_LINE, "--estimates", "expected a whole number >= 1 of estimates to name", wanted)
    if wanted is not None and result.steps:
        deciding = deciding_estimates(spec, wanted)
        result.summary.update(deciding_estimates=deciding["rows"], estimates_tried=deciding["tried"])


def _write(args, spec, result, trace_steps, html) -> None:
    """The files ``run`` was asked for: --out's tables and summary, --trace-out, --html."""
    if args.out is not None and result.steps:
        steps, ops, log = result.tables()
        write_frame(steps, args.out / "steps")
        write_frame(ops, args.out / "ops")
        write_frame(log, args.out / "events")
        write_atomic(args.out / "summary.json", to_json({**result.summary, "spec": spec.model_dump()}))
    if args.trace_out is not None and result.log:
        write_atomic(args.trace_out, trace_of(result, trace_steps))
    if html is not None:
        write_atomic(html, run_view(spec, result))


def _notes(s: dict) -> list[str]:
    """The summary's notes: a stack that is not the machine's own, an analytic engine over
    streams that share a stage, MoE options given to a dense model, kernel costs derived rather
    than measured."""
    lines = [f"  note: {s[note]}" for note in ("software_note", "engine_note", "moe_note", "datatype_note") if s.get(note)]
    if s.get("band"):
        b = s["band"]
        lines.append(f"  band p10-p90: {b['p10_ms']:.3f} - {b['p90_ms']:.3f} ms per token (sigma {b['sigma_ms']:.3f} ms); "
                     "deciding: " + ", ".join(f"{g['group']} {g['variance_share']:.0%} ({g['why']})"
                                              for g in b["groups"][:3] if g["variance_share"] >= 0.05))
    origin = s.get("kernel_costs", "")
    if origin.startswith("derived"):
        lines.append("  kernel costs: derived from the profile's own figures (no measured kernels: section; "
                     "`decodesim profiles --sources` states the rule)")
    elif origin:
        lines.append(f"  kernel costs: {origin}")
    return lines


def _bandwidth_line(s: dict) -> str:
    """The achieved bandwidth against the peak: one chip's, and (a pipeline whose stages work at
    once, past one chip's peak) all its stages' chips'."""
    line = (f"  achieved bandwidth: {s['hbm_achieved_GBps']:.0f} GB/s = "
            f"{100 * s['hbm_fraction_of_peak']:.1f}% of {s['hbm_peak_GBps']:.0f} GB/s peak")
    if s["pp"] > 1 and s["hbm_fraction_of_peak"] > 1:
        line += (f" (one chip's; its {s['pp']} pipeline stages work at once: {100 * s['hbm_fraction_of_peak'] / s['pp']:.1f}%"
                 f" of their {s['pp']} x {s['hbm_peak_GBps']:.0f} GB/s)")
    return line


def _speculation_lines(s: dict) -> list[str]:
    """What speculative decoding would need to meet a missed target (sim.speculation; a note of
    the text verdict, not a summary field: studies tabulate every summary field)."""
    if s["meets_target"] or "per_token_ms_p99" not in s:
        return []
    spec = speculation_note(s["per_token_ms_p99"], s["target_ms"])
    need = spec["acceptance_needed"]
    return [f"  speculation: {spec['tokens_per_step_needed']:.2f} tokens per step would meet it: "
            + (f"acceptance >= {need:.2f} with {spec['draft_tokens']} drafted tokens (verify steps costed as decode "
               "steps, drafting free)" if need is not None else
               f"more than {spec['draft_tokens']} drafted tokens at any acceptance")]


def _ep_lines(e: dict) -> list[str]:
    """Expert load per EP rank (each rank's tokens and experts per MoE layer, averaged over the
    steps; min / mean / max beyond 16 ranks) and the straggler it makes."""
    ranks = e["ep_ranks"]
    tokens = [r["tokens_per_layer"] for r in ranks]
    if len(ranks) <= 16:
        load = ", ".join(f"{r['rank']}: {r['tokens_per_layer']:.1f}/{r['experts_per_layer']:.1f}" for r in ranks)
        lines = [f"  expert load per EP rank (tokens/experts per MoE layer): {load}"]
    else:
        lines = [f"  expert load per EP rank (tokens per MoE layer): min {min(tokens):.1f}, "
                 f"mean {sum(tokens) / len(tokens):.1f}, max {max(tokens):.1f} over {len(ranks)} ranks"]
    where = "in the step" if e["straggler_in_step"] else "not in the analytic step, which assumes balanced ranks"
    lines.append(f"  hottest EP rank: {e['hottest_rank_tokens_per_layer']:.1f} tokens per MoE layer, "
                 f"{e['rank_imbalance']:.2f}x the mean"
                 + (f", {e['redundant_experts']} redundant experts" if e["redundant_experts"] else "")
                 + f"; straggler {e['straggler_ms_per_step']:.3f} ms per step = "
                 f"{100 * e['straggler_share']:.1f}% of the step ({where})")
    return lines


def _header(s: dict) -> list[str]:
    """The run's first two lines: what ran on what, and the workload."""
    return [f"decodesim: {s['model']} on {s['hardware']} ({s['chips']} chip{'s' if s['chips'] > 1 else ''}, "
             f"tp {s['tp']} x pp {s['pp']}"
             + (f" x attention-dp {s['attention_dp']}" if s.get("attention_dp") else "") + f"), weights {s['weights']}, KV {s['kv']}",
             f"  workload: batch {s.get('deployment_batch', s['batch'])}"
             + (f" ({s['batch']} in the fullest attention group)" if s.get("attention_dp") else "") + (f", context {s['context']}" if s.get("context") else "")
             + (f", trace {s['trace']}" if s.get("trace") else "") + f", {s['steps']} step{'s' if s['steps'] != 1 else ''}, "
             f"{s['engine']} engine, {'graph' if s['graph'] else 'eager'} launch"]


def render(s: dict) -> str:
    lines = _header(s)
    cap = s["capacity"]
    lines.append(f"  memory per chip: {fmt_bytes(cap['needed_bytes'])} needed "
                 f"(weights {fmt_bytes(cap['weights_bytes'])}, KV {fmt_bytes(cap['kv_bytes'])}) "
                 f"of {fmt_bytes(cap['available_bytes'])}")
    tiers = cap.get("tiers", {})
    if len(tiers) > 1:
        lines.append("  tiers per chip: " + ", ".join(f"{name} {fmt_bytes(t['needed_bytes'])} of "
                                                      f"{fmt_bytes(t['available_bytes'])}" for name, t in tiers.items()))
    lines.extend(_notes(s))
    if s.get("partial"):
        lines.append(f"  PARTIAL: interrupted after {s['steps_done']} of {s['steps']} steps; the figures below are "
                     "of those steps")
    if s["verdict"] == "does-not-fit":
        lines.append(f"  verdict: DOES NOT FIT: {s['reason']}")
        return "\n".join(lines)
    lines.append(f"  per-token latency: p50 {s['per_token_ms_p50']:.3f} ms, p99 {s['per_token_ms_p99']:.3f} ms "
                 f"(byte floor {s['byte_floor_ms']:.3f} ms at peak bandwidth)")
    lines.append("  breakdown (ms per step):")
    total = sum(s["breakdown_ms"].values()) or 1.0
    for row, ms in sorted(s["breakdown_ms"].items(), key=lambda kv: -kv[1]):
        if ms >= 1e-4:
            lines.append(f"    {row:<16}{ms:9.3f}  {100 * ms / total:5.1f}%")
    lines.append(f"  bytes per step: {fmt_bytes(s['hbm_bytes_per_token'])} from the backing store "
                 f"(weights {fmt_bytes(s['weight_bytes_per_token'])}, KV {fmt_bytes(s['kv_bytes_per_token'])})")
    lines.append(_bandwidth_line(s))
    if s.get("batch_over_time"):
        b = s["batch_over_time"]
        lines.append(f"  batch over the trace: min {min(b)}, median {sorted(b)[len(b) // 2]}, max {max(b)}")
    if s.get("moe"):
        e = s["moe"]
        lines.append(f"  MoE: {e['dispatch']} dispatch, {e['placement']} placement, routing {e['routing']}; "
                     f"{e['active_experts_per_layer']:.1f} experts active per layer on the critical chip, "
                     f"{e['resident_experts_per_layer']:.1f} read from SRAM"
                     + (f" ({e['sram_level']}, {e['sram_slots']} slots)" if e["sram_level"] else " (none fits)")
                     + (f"; expert parallel over {e['expert_parallel']} chips" if e["expert_parallel"] > 1 else ""))
        lines.append(f"  SRAM hit rate: {100 * e['sram_hit_rate']:.1f}% of expert weight reads")
        if e.get("ep_ranks"):
            lines.extend(_ep_lines(e))
    if s.get("energy"):
        lines.extend(render_lines(s["energy"]))
    if "deciding_estimates" in s:
        lines.append(render_line({"rows": s["deciding_estimates"], "tried": s["estimates_tried"]}))
    lines.append(f"  bound: {s['bound']}")
    word = "MEETS" if s["meets_target"] else "MISSES"
    lines.append(f"  verdict: {word} the {s['target_ms']:g} ms target (p99 {s['per_token_ms_p99']:.3f} ms, "
                 f"margin {s['margin_ms']:+.3f} ms)")
    lines.extend(_speculation_lines(s))
    lines.append(f"  simulated {s['events']} SimPy events in {s['wall_s']:.2f} s"
                 + (" (a stream that shares no resource is timed without events)" if s["events"] == 0 else ""))
    return "\n".join(lines)

