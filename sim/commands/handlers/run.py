"""What ``decodesim run`` does: simulate one setup, print or write its summary, tables,
trace and HTML view."""

from __future__ import annotations

from sim.commands.common import emit_json, fmt_bytes, to_json, write_atomic, write_frame
from sim.energy import render_lines
from sim.errors import COMMAND_LINE, ConfigError
from sim.experiments.estimates import deciding_estimates, render_line
from sim.explore.compute import run_view
from sim.options.spec import spec_from_args
from sim.report.timeline import trace_of
from sim.run import simulate


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
    result = simulate(spec, keep_ops=keep or html is not None, keep_log=keep)
    summary = result.summary
    wanted = getattr(args, "estimates", None)
    if wanted is not None and wanted < 1:
        raise ConfigError(COMMAND_LINE, "--estimates", "expected a whole number >= 1 of estimates to name", wanted)
    if wanted is not None and result.steps:
        deciding = deciding_estimates(spec, wanted)
        summary = {**summary, "deciding_estimates": deciding["rows"], "estimates_tried": deciding["tried"]}
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
    if args.json:
        emit_json("run", summary)
    else:
        print(render(summary))
    return 0


def _notes(s: dict) -> list[str]:
    """The summary's notes: a stack that is not the machine's own, an analytic engine over
    streams that share a stage, MoE options given to a dense model, kernel costs derived rather
    than measured."""
    lines = [f"  note: {s[note]}" for note in ("software_note", "engine_note", "moe_note", "datatype_note") if s.get(note)]
    if s.get("kernel_costs", "").startswith("derived"):
        lines.append("  kernel costs: derived from the profile's own figures (no measured kernels: section; "
                     "`decodesim profiles --sources` states the rule)")
    return lines


def render(s: dict) -> str:
    lines = [f"decodesim: {s['model']} on {s['hardware']} ({s['chips']} chip{'s' if s['chips'] > 1 else ''}, "
             f"tp {s['tp']} x pp {s['pp']}), weights {s['weights']}, KV {s['kv']}",
             f"  workload: batch {s['batch']}" + (f", context {s['context']}" if s.get("context") else "")
             + (f", trace {s['trace']}" if s.get("trace") else "") + f", {s['steps']} step{'s' if s['steps'] != 1 else ''}, "
             f"{s['engine']} engine, {'graph' if s['graph'] else 'eager'} launch"]
    cap = s["capacity"]
    lines.append(f"  memory per chip: {fmt_bytes(cap['needed_bytes'])} needed "
                 f"(weights {fmt_bytes(cap['weights_bytes'])}, KV {fmt_bytes(cap['kv_bytes'])}) "
                 f"of {fmt_bytes(cap['available_bytes'])}")
    tiers = cap.get("tiers", {})
    if len(tiers) > 1:
        lines.append("  tiers per chip: " + ", ".join(f"{name} {fmt_bytes(t['needed_bytes'])} of "
                                                      f"{fmt_bytes(t['available_bytes'])}" for name, t in tiers.items()))
    lines.extend(_notes(s))
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
    lines.append(f"  achieved bandwidth: {s['hbm_achieved_GBps']:.0f} GB/s = "
                 f"{100 * s['hbm_fraction_of_peak']:.1f}% of {s['hbm_peak_GBps']:.0f} GB/s peak")
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
    if s.get("energy"):
        lines.extend(render_lines(s["energy"]))
    if "deciding_estimates" in s:
        lines.append(render_line({"rows": s["deciding_estimates"], "tried": s["estimates_tried"]}))
    lines.append(f"  bound: {s['bound']}")
    word = "MEETS" if s["meets_target"] else "MISSES"
    lines.append(f"  verdict: {word} the {s['target_ms']:g} ms target (p99 {s['per_token_ms_p99']:.3f} ms, "
                 f"margin {s['margin_ms']:+.3f} ms)")
    lines.append(f"  simulated {s['events']} SimPy events in {s['wall_s']:.2f} s"
                 + (" (a stream that shares no resource is timed without events)" if s["events"] == 0 else ""))
    return "\n".join(lines)

