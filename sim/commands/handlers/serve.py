"""What ``decodesim serve`` does: one serving replay, a sweep of them, or a serving study, printed
or written (tables, plots, report)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from sim.commands.common import MAX_LIST, Interrupt, comma_list, emit_json, to_json, write_atomic
from sim.commands.serve import register
from sim.config.loader import parse_number, validate
from sim.errors import COMMAND_LINE, ConfigError
from sim.io import read_table
from sim.serve.plots import latency_vs_rate, over_time
from sim.serve.replay import serve
from sim.serve.report import render as render_report
from sim.serve.requests import named_at, open_source
from sim.serve.spec import ServeSpec, build, upgrade_names
from sim.serve.sweep import GROUP, check_setups, grid, load_study, run_sweep, study_key, study_points, write_table
from sim.setup import load_profile
from sim.units import GB

STUDY_OPTIONS = ("command", "handler", "study", "out", "jobs", "replot", "json", "no_progress", "spec_source")


def handle(args) -> int:
    if args.study:
        _refuse_given(args, STUDY_OPTIONS, "with --study: the study file sets every replay (edit its base)")
        return _study(args)
    lists = {name: comma_list(getattr(args, name), f"--{name}") for name in ("hardware", "model", "kv")}
    rates = _numbers(args.rates, "--rates")
    scales = _numbers(args.rate_scales, "--rate-scales")
    base = validate(ServeSpec, {
        "hardware": lists["hardware"][0], "model": lists["model"][0], "weights": args.weights, "kv": lists["kv"][0],
        "software": args.software, "graph": args.graph, "tp": args.tp, "pp": args.pp, "chips": args.chips, "overrides": args.overrides,
        "requests": args.requests, "rate_scale": args.rate_scale, "rate": args.rate, "duration_s": args.duration_s,
        "prompt_median": args.prompt_median, "output_median": args.output_median, "seed": args.seed,
        "max_batch": args.max_batch, "block_tokens": args.block_tokens,
        "max_tokens_per_step": args.max_tokens_per_step, "policy": args.policy, "target_ms": args.target_ms,
        "ttft_target_ms": args.ttft_target_ms, "client": args.client, "concurrency": args.concurrency,
        **_speculation(args),
    }, COMMAND_LINE)
    splits = _splits(args, base)
    if splits and len(splits) == 1:
        base = validate(ServeSpec, {**base.model_dump(), "prefill_chips": splits[0][0],
                                    "decode_chips": splits[0][1]}, COMMAND_LINE)
        splits = None
    if rates or scales or splits or any(len(v) > 1 for v in lists.values()):

        size = len(lists["hardware"]) * len(lists["model"]) * len(lists["kv"]) * len(rates or scales or [None])
        if size > MAX_POINTS:
            raise ConfigError(COMMAND_LINE, "--hardware/--model/--kv/--rates", f"the sweep has {size:,} "
                              f"replays; expected at most {MAX_POINTS:,}")

        points = grid(base, hardware=lists["hardware"], models=[(m, args.weights) for m in lists["model"]],
                      kv=lists["kv"], rates=rates, rate_scales=scales, splits=splits)
        check_setups(points)
        _check_sources(points)
        return _sweep(points, args, title="Serving sweep", command=_command(args))
    _refuse_given(args, tuple(a for a in vars(args) if a != "replot"), "for one replay: it redraws a sweep's "
                  "or study's plot and report from its table (give --rates, a comma list, or --study)")
    return _single(base, args)


def _splits(args, base) -> list[tuple[int, int]] | None:
    """The pool splits asked: --prefill-chips P[,P...] with --decode-chips D[,D...] (paired in
    order) or without it (each decode pool takes the profile's other chips)."""
    if args.prefill_chips is None and args.decode_chips is None:
        return None
    if args.prefill_chips is None:
        raise ConfigError(COMMAND_LINE, "--prefill-chips", "disaggregated serving needs the prefill pool's chips")
    pre = _counts(args.prefill_chips, "--prefill-chips")
    if args.decode_chips is not None:
        dec = _counts(args.decode_chips, "--decode-chips")
        if len(dec) != len(pre):
            raise ConfigError(COMMAND_LINE, "--decode-chips", f"expected {len(pre)} values, one per prefill pool",
                              args.decode_chips)
    else:
        total = load_profile(base.hardware).chips
        dec = [total - p for p in pre]
        if min(dec) < 1:
            raise ConfigError(COMMAND_LINE, "--prefill-chips", f"leaves no chip of {base.hardware}'s {total} for "
                              "the decode pool (give --decode-chips)", args.prefill_chips)
    return list(zip(pre, dec, strict=True))


def _counts(text: str, flag: str) -> list[int]:
    """A comma list of chip counts (whole numbers >= 1)."""
    values = _numbers(text, flag)
    bad = [v for v in values if not float(v).is_integer()]
    if bad:
        raise ConfigError(COMMAND_LINE, flag, "expected whole numbers of chips", bad[0])
    return [int(v) for v in values]


def _speculation(args) -> dict:
    """The speculation fields given (acceptance: one number, or a comma list per position)."""
    out = {}
    if args.speculate_k is not None:
        out["speculate_k"] = args.speculate_k
    if args.drafter is not None:
        out["drafter"] = args.drafter
    if args.acceptance is not None:
        values = _numbers(args.acceptance, "--acceptance") if args.acceptance.strip() not in ("0", "0.0") else [0.0]
        out["acceptance"] = values[0] if len(values) == 1 else tuple(values)
    return out


def _refuse_given(args, allowed: tuple[str, ...], why: str) -> None:
    """ConfigError for the first option given (not at its default) outside ``allowed``: an option
    that would change nothing is refused, not ignored."""
    defaults = vars(build_defaults())
    for name, value in vars(args).items():
        if name not in allowed and name in defaults and value != defaults[name]:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(COMMAND_LINE, flag, f"does not apply {why}", value)


def _check_sources(points, file: str = COMMAND_LINE, key: str = "--requests") -> None:
    """Open the request source of the sweep's busiest point (highest rate or scale) before any
    replay: a bad combination (a scale for synthetic arrivals) or too much work is one error
    now, not a row of errors after the others ran. A source that is not there is said against
    ``file`` and ``key`` (a bad request file names itself)."""
    busiest = max(points, key=lambda p: (p.rate or 0.0, p.rate_scale or 0.0))
    try:
        open_source(busiest.requests, rate_scale=busiest.rate_scale, rate_per_s=busiest.rate,
                    duration_s=busiest.duration_s, seed=busiest.seed, prompt_median=busiest.prompt_median,
                    output_median=busiest.output_median)
    except ConfigError as err:
        raise named_at(err, busiest.requests, file, key) from None


def _command(args) -> str:
    """The sweep's command line, from the options that differ from their defaults."""
    defaults = vars(build_defaults())
    words = ["decodesim", "serve"]
    for name, value in vars(args).items():
        if name in ("command", "handler", "out", "json", "jobs", "replot", "study", "no_progress") \
                or value == defaults.get(name):
            continue
        flag = "--" + name.replace("_", "-")
        if name == "overrides":
            words += [w for item in value for w in ("--set", item)]
        elif value is False:
            words.append("--no-" + name.replace("_", "-"))
        else:
            words += [flag, str(value)]
    if args.out is not None:
        words += ["--out", str(args.out)]
    return " ".join(words)


def build_defaults():
    """The serve options' defaults (a parse of no arguments)."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["serve"])


MAX_POINTS = 10_000  # replays of one sweep


def _numbers(text: str | None, flag: str) -> list[float] | None:
    """A comma list of decimal numbers > 0 (rates); empty items, hex and the like are errors."""
    if text is None:
        return None
    items = [v.strip() for v in text.split(",")]
    if len(items) > MAX_LIST:
        raise ConfigError(COMMAND_LINE, flag, f"expected at most {MAX_LIST} comma-separated numbers, "
                          f"got {len(items):,}")
    values = []
    for i, item in enumerate(items, 1):
        if not item:
            raise ConfigError(COMMAND_LINE, flag, f"item {i} of the comma list is empty; expected a comma list "
                              "of numbers", text)
        try:
            value = parse_number(item)
        except ValueError:
            raise ConfigError(COMMAND_LINE, flag, f"item {i}: expected a comma list of numbers", item) from None
        if not value > 0:
            raise ConfigError(COMMAND_LINE, flag, f"item {i}: expected numbers > 0", item)
        values.append(value)
    return values


class _Progress:
    """A tqdm bar on stderr over the simulated arrival window (shown after 2 s of wall time;
    off with --no-progress or when stderr is not a terminal)."""

    def __init__(self, total_s: float, enabled: bool):
        self.bar = None
        if enabled and total_s > 0 and sys.stderr.isatty():
            import shutil

            from tqdm import tqdm

            self.bar = tqdm(total=round(total_s, 1), unit="s", unit_scale=False, desc="decodesim serve",
                            # a pty that reports no size (0 x 0) makes tqdm draw nothing: 80 x 24 then
                            ncols=shutil.get_terminal_size().columns, nrows=shutil.get_terminal_size().lines,
                            file=sys.stderr, delay=2.0, leave=False,
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} simulated s "
                                       "[{elapsed}<{remaining}{postfix}]")

    def __call__(self, clock_s: float, done: int) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"{done:,} requests done", refresh=False)
            step = round(min(clock_s, self.bar.total), 1) - self.bar.n
            if step > 0:
                self.bar.update(step)  # tqdm draws after its delay, at most every mininterval

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _single(spec, args) -> int:
    try:
        setup = build(spec)
    except ConfigError as err:
        raise named_at(err, spec.requests, COMMAND_LINE, "--requests") from None
    progress = _Progress(setup.source.span_s, enabled=not args.no_progress)
    with Interrupt() as interrupt:
        try:
            summary = serve(setup, args.out, stop=interrupt, progress=progress)
        finally:
            progress.close()
        if summary.get("partial"):
            sys.stderr.write(f"decodesim: interrupted; stopped the replay at {summary['stopped_at_s']:.1f} "
                             "simulated s and kept what finished (summary marked partial; no over-time plot)\n")
        if args.out is not None:
            _write_single(args.out, summary, spec)
    if args.json:

        emit_json("serve", {"mode": "replay", "summary": summary, "spec": spec.model_dump(mode="json")})
    else:
        print(render(summary))
    return interrupt.exit_code


def _write_single(out: Path, summary: dict, spec) -> None:
    """The plot, then summary.json: the summary is written last, so a folder with one is complete."""
    if summary.get("partial"):  # no plot (it would take most of the second an interrupt has); none stale
        (out / "over-time.png").unlink(missing_ok=True)
    else:
        steps = pd.read_parquet(out / "steps.parquet", columns=["t_start_s", "step_ms", "batch", "kv_occupancy",
                                                                "waiting"])
        if len(steps):
            over_time(steps, out / "over-time.png",
                      title=f"{summary['model']} on {summary['hardware']}, KV {summary['kv']}, "
                            f"{_offered(summary['rate_per_s'])} ({summary['requests']})")
    write_atomic(out / "summary.json", to_json({**summary, "spec": spec.model_dump(mode="json")}))


def _sweep(points, args, *, title: str, command: str, description: str = "", question: str = "",
           notes: str = "", out: Path | None = None) -> int:

    def progress(row):
        done = f"p99 TPOT {row['tpot_ms_p99']:.2f} ms" if row.get("status") == "ok" else row.get("status")
        rate = row.get("rate_per_s", row.get("rate_request"))
        sys.stderr.write(f"  {row['hardware']} {row['model']} {row['weights']} KV {row['kv']} "
                         f"rate {rate:.4g} req/s: {done}\n" if rate else f"  {row['hardware']} {row['model']}: {done}\n")
        sys.stderr.flush()

    out = out or args.out
    with Interrupt() as interrupt:
        if args.replot:
            table = _saved_table(out)
        else:
            table = run_sweep(points, args.jobs, progress=progress, stop=interrupt)
        partial = interrupt.signal is not None and len(table) < len(points)
        if partial:
            sys.stderr.write(f"decodesim: interrupted; {len(table)} of {len(points)} replays finished and are "
                             "kept (the report is marked partial)\n")
            title += f" (partial: interrupted after {len(table)} of {len(points)} replays)"
        target = points[0].target_ms
        if out is not None and len(table):
            write_table(table, out)
            latency_vs_rate(table, out / "latency-vs-rate.png", target_ms=target)
            write_atomic(out / "report.md", render_report(table, title=title, target_ms=target,
                                                          description=description, question=question, notes=notes,
                                                          command=command))
    if args.json:

        emit_json("serve", {"mode": "sweep", "partial": partial, "rows": table.to_dict(orient="records")})
    elif len(table):
        print(render_table(table, target))
    return interrupt.exit_code


SAVED_TABLE = "the table.parquet of a `decodesim serve` sweep"
ROW_COLUMNS = (*GROUP, "status", "reason")  # every sweep row has them
RAN_COLUMNS = ("rate_per_s", "tpot_ms_p50", "tpot_ms_p99", "ttft_ms_p99", "step_ms_p50", "step_ms_p99",
               "mean_batch_busy", "mean_kv_occupancy", "kv_bytes_per_token", "kv_pool_tokens", "verdict")


def _saved_table(out: Path | None):
    """The table an earlier sweep wrote to ``out``, for --replot: a missing, damaged or foreign
    table (one without the columns the plot, the report and the printed table read) is one
    ConfigError naming it, before anything is redrawn."""
    if out is None or not (out / "table.parquet").is_file():
        raise ConfigError(str(out / "table.parquet") if out else COMMAND_LINE, None if out else "--out",
                          "--replot needs the table of an earlier run (--out DIR with table.parquet)")
    path = out / "table.parquet"
    table = upgrade_names(read_table(path, SAVED_TABLE, ROW_COLUMNS))
    missing = [c for c in RAN_COLUMNS if c not in table.columns]
    if missing and (table["status"] == "ok").any():
        raise ConfigError(str(path), None, f"not {SAVED_TABLE}: it has replays that finished but no column "
                                           f"{missing[0]!r}")
    return table


def _study(args) -> int:
    study, path = load_study(args.study)
    points = study_points(study, path)
    check_setups(points, path, study_key)
    _check_sources(points, path, "base.requests")
    out = args.out or Path("reports") / study.name
    return _sweep(points, args, title=f"{study.name}: serving latency against request rate and KV format",
                  command=f"decodesim serve --study {args.study}", description=study.description,
                  question=study.question, notes=study.notes, out=out)


def render(s: dict) -> str:
    """The summary of one replay as a table."""
    window = f"{s['window_s']:g} s window" if s.get("window_s") else "arrival span"
    lines = [f"decodesim serve: {s['model']} ({s['weights']} weights) on {s['hardware']} "
             f"({s['chips']} chip{'s' if s['chips'] > 1 else ''}, tp {s['tp']} x pp {s['pp']}), KV {s['kv']}"]
    if s.get("partial"):
        lines.append(f"  PARTIAL: interrupted at {s['stopped_at_s']:.1f} simulated s; figures cover the requests "
                     "that finished by then")
    offered = _offered(s["rate_per_s"])
    rate = f"{offered} over the {window}" if math.isfinite(s["rate_per_s"]) else "one arrival: no rate"
    lines += [f"  requests: {s['source']}; {s['arrivals']:,} arrived ({rate}), {s['requests_done']:,} done, "
              f"{s['requests_rejected']:,} rejected; "
              f"{s['simulated_s']:.1f} s simulated in {s['steps']:,} steps",
              f"  scheduler: {s['policy']}, <= {s['max_tokens_per_step']} tokens and <= {s['max_batch']} "
              f"sequences per step, {s['block_tokens']}-token KV blocks; KV pool "
              f"{s['kv_pool_bytes_per_chip'] / GB:.1f} GB per chip, room for {s['kv_pool_tokens']:,} cached tokens "
              f"({s['kv_pool_tokens'] // 4096:,} "
              f"sequences of 4,096 tokens)"]
    if s.get("prefill_chips"):
        lines.append(f"  disaggregated: prefill pool {s['prefill_chips']} chips ({s['prefill_pool_steps']:,} steps, "
                     f"{s['prefill_pool_busy_s']:.1f} s busy), decode pool {s['decode_chips']} chips; KV moved "
                     f"{s['kv_moved_bytes'] / GB:.2f} GB over {s['kv_link_pairs']} x {s['kv_link_GBps']:g} GB/s links, "
                     f"{s['kv_transfer_ms_mean']:.2f} ms per request (in TTFT)")
    if s.get("speculate_k"):
        lines.append(f"  speculation: {s['drafter']} drafts {s['speculate_k']} tokens per verify step at acceptance "
                     f"{s['acceptance']}: {s['tokens_per_step']:.2f} tokens per step expected (sim/serve/speculative.py)")
    if not s["requests_done"]:
        lines.append(f"  verdict: NO RESULT: none of the {s['arrivals']:,} requests finished ({s['requests_rejected']:,} "
                     "rejected: a request that exceeds the model's context or alone overflows the KV pool is "
                     "refused), so there is no latency to report")
        return "\n".join(lines)
    lines.append(f"  {'':<6}{'mean':>10}{'median':>10}{'std':>10}{'p90':>10}{'p99':>10}")
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2EL"),
                       ("step_ms", "step")):
        lines.append(f"  {label:<6}" + "".join(f"{s.get(f'{key}_{q}', math.nan):>10.2f}"
                                               for q in ("mean", "p50", "std", "p90", "p99")) + "  ms")
    requested = s.get("nominal_rate_per_s")
    requested = f"{requested:.3g}" if isinstance(requested, float) and math.isfinite(requested) else "-"
    if s.get("client", "open-loop") != "open-loop":
        requested = "inf"  # every request as soon as the client may send it
    slo = f"TPOT <= {s['target_ms']:g} ms" + (f", TTFT <= {s['ttft_target_ms']:g} ms" if s.get("ttft_target_ms") else "")
    lines += [f"  client: {s.get('client', 'open-loop')}" + (f", {s['concurrency']} in flight" if s.get("concurrency")
                                                             else "") +
              f"; rate requested {requested}, offered {_finite(s['rate_per_s'])}, achieved "
              f"{s['throughput_req_per_s']:.3g} req/s",
              f"  throughput: {s['throughput_tokens_per_s']:.0f} output tokens/s, "
              f"{s.get('total_tokens_per_s', math.nan):.0f} total tokens/s, {s['prefill_tokens_per_s']:.0f} "
              f"prefill tokens/s, {s['throughput_req_per_s']:.2f} requests/s; goodput ({slo}) "
              f"{s.get('goodput_req_per_s', math.nan):.2f} requests/s, {s.get('goodput_tokens_per_s', math.nan):.0f} "
              "output tokens/s",
              f"  batch: mean {s['mean_batch']:.1f} (while busy {s['mean_batch_busy']:.1f}), largest "
              f"{s['max_batch_seen']}; waiting: mean {s['mean_waiting']:.1f}, max {s['max_waiting']}",
              f"  KV occupancy: mean {100 * s['mean_kv_occupancy']:.1f}%, max {100 * s['max_kv_occupancy']:.1f}%; "
              f"preemptions {s['preemptions']} ({s['recomputed_tokens']} tokens recomputed)"]
    word = "MEETS" if s["meets_target"] else "MISSES"
    lines.append(f"  verdict: {word} the {s['target_ms']:g} ms target: p99 TPOT {s['tpot_ms_p99']:.2f} ms at "
                 f"{offered}" + (" (partial replay)" if s.get("partial") else ""))
    if s.get("J_per_output_token") is not None:
        lines.append(f"  energy: {s['J_per_output_token']:.3f} J per output token (chips alone "
                     f"{s['chip_J_per_output_token']:.3f} J), average {s['energy_avg_W']:.0f} W; dynamic part from "
                     f"{s['energy_sampled_steps']} exactly evaluated steps")
    if s.get("moe"):
        lines.append(_moe_line(s["moe"]))
    lines.append(f"  replayed in {s['wall_s']:.1f} s wall")
    return "\n".join(lines)


def _moe_line(moe: dict) -> str:
    """The replay's expert load per expert-parallel rank and the straggler's share of the time."""
    pairs = moe["expert_pairs_per_rank"]
    line = f"  experts: {moe['routing']} routing, {moe['expert_parallel']} expert-parallel rank(s)"
    if len(pairs) > 1:
        line += (f"; token-expert pairs per rank {min(pairs):,}-{max(pairs):,} "
                 f"(hottest {moe['hottest_rank_over_mean']:.3f} x the mean); the step's most loaded rank adds {100 * moe['straggler_share']:.1f}% of the time")
    if moe.get("moe_blocks_share"):
        line += f"; MoE blocks {100 * moe['moe_blocks_share']:.0f}% of the time"
    return line


def _finite(value: float) -> str:
    return f"{value:.3g}" if math.isfinite(value) else "-"


def _offered(rate_per_s: float) -> str:
    """The offered rate as the summary and the plot say it (one arrival has none)."""
    return f"{rate_per_s:.3g} req/s offered" if math.isfinite(rate_per_s) else "one arrival"


def render_table(table, target_ms: float) -> str:
    """A sweep as one line per point."""
    labels = [_hardware_label(r) for _, r in table.iterrows()]
    width = max([13, *(len(x) + 1 for x in labels)])
    lines = [f"{'hardware':<{width}}{'model':<13}{'weights':<8}{'kv':<18}{'req/s':>7}{'TPOT p50':>10}{'TPOT p99':>10}"
             f"{'TTFT p99':>10}{'batch':>7}{'KV occ':>8}  verdict (p99 TPOT <= {target_ms:g} ms)"]
    for label, (_, r) in zip(labels, table.iterrows(), strict=True):
        head = f"{label:<{width}}{r['model']:<13}{r['weights']:<8}{r['kv']:<18}"
        if r.get("status") != "ok":
            lines.append(head + f"  {r.get('status')}: {r.get('reason')}")
            continue
        lines.append(head + f"{r['rate_per_s']:>7.3g}{r['tpot_ms_p50']:>10.2f}{r['tpot_ms_p99']:>10.2f}"
                     f"{r['ttft_ms_p99']:>10.0f}{r['mean_batch_busy']:>7.1f}{100 * r['mean_kv_occupancy']:>7.1f}%"
                     f"  {r['verdict']}" + (f"  {r['J_per_output_token']:.3f} J/token"
                                            if r.get("J_per_output_token", None) == r.get("J_per_output_token", None)
                                            and r.get("J_per_output_token", None) is not None else ""))
    return "\n".join(lines)



def _hardware_label(r) -> str:
    """A sweep row's hardware, with its pool split (prefill + decode chips) when disaggregated."""
    split = r.get("prefill_chips")
    return r["hardware"] + (f" {int(split)}+{int(r['decode_chips'])}" if split == split and split else "")