"""What a search hands back: the ``--json`` payload, the text table, and the files of ``--out``.

Files (each written atomically): ``deployments.parquet`` / ``.csv`` (one row per
deployment: its settings, status and pruning reason, screening estimates and, for those
replayed, the replay's figures and verdict), ``search.json`` (the ``--json`` payload),
``front.png`` (sim.report.search.plot_front) and ``report.md``.
"""

from __future__ import annotations

import math
from pathlib import Path

from sim.config.hardware import kernel_costs_origin
from sim.io import make_folder, to_json, write_atomic, write_frame
from sim.paths import display_path
from sim.report.search import plot_front, write_report
from sim.search.runner import SearchResult
from sim.search.space import Deployment
from sim.setup import load_profile

POINT_FIELDS = (
    "index", *Deployment.__dataclass_fields__, "status", "rate_per_s", "capacity_rate_per_s", "batch_limit",
    "batch_limit_by", "weights_GB_per_chip", "kv_pool_GB_per_chip", "est_batch", "est_tpot_ms", "est_ttft_ms",
    "tokens_per_s_per_chip", "tokens_per_s_per_user", "replay_rate_per_s", "replay_requests", "replay_rejected",
    "replay_mean_batch", "replay_preemptions", "ttft_ms_mean", "tpot_ms_mean", "tpot_ms_claimed",
    "replay_tokens_per_s_per_chip", "replay_tokens_per_s_per_user", "replay_goodput_tokens_per_s_per_chip",
    "screen_replay_gap", "screen_rounds", "screen_correction_tpot", "des_step_ms", "analytic_step_ms",
    "des_over_analytic", "bound", "verdict", "verdict_reason",
)


def point(row: dict, percentile: int) -> dict:
    """A front point as the JSON payload gives it."""
    keys = [*POINT_FIELDS, f"ttft_ms_p{percentile}", f"tpot_ms_p{percentile}"]
    out = {k: row.get(k) for k in keys}
    out["label"] = Deployment(**{k: row[k] for k in Deployment.__dataclass_fields__}).label
    return out


def payload(result: SearchResult, files: list[str] | None = None, command: str | None = None) -> dict:
    """The ``--json`` payload (kind ``search`` in sim/schema/output.schema.json)."""
    space, spec = result.space, result.space.spec
    pct = spec.slo.percentile
    return {
        "name": spec.name, "model": space.model, "file": display_path(space.file), "slo": spec.slo.model_dump(),
        "traffic": spec.traffic.model_dump(), "mode": "rate" if spec.traffic.rate is not None else "goodput" if spec.traffic.goodput else "load",
        "workload": result.workload.as_dict(), "axes": {k: v for k, v in space.axes.items() if v is not None},
        "excluded": [{"where": rule.where, "reason": rule.reason, "deployments": n} for rule, n in space.excluded],
        "counts": result.counts, "complete": result.complete, **({"partial": True} if result.interrupted else {}),
        "front": [point(r, pct) for r in result.front],
        "chosen": point(result.chosen, pct) if result.chosen else None,
        "timing": result.timing, "files": files or [], "command": command, "notes": spec.notes,
        "kernel_costs": {hw: kernel_costs_origin(load_profile(hw)) for hw in space.axes["hardware"]},
    }


def _f(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def text(result: SearchResult) -> str:
    """The front as a table, with the counts that led to it."""
    space, spec, work, c = result.space, result.space.spec, result.workload, result.counts
    pct = spec.slo.percentile
    t = spec.traffic
    rate = (f"{t.rate:g} req/s" if t.rate is not None else "each deployment at its goodput (the highest rate whose "
            "screened percentiles meet the SLOs)" if t.goodput else f"each deployment at {t.load:.0%} of its capacity")
    hardware = ", ".join(space.axes["hardware"])
    lines = [
        f"decodesim search: {space.model} on {hardware}; SLO TTFT p{pct} <= {spec.slo.ttft_ms:g} ms, "
        f"TPOT p{pct} <= {spec.slo.tpot_ms:g} ms",
        f"  traffic: {work.description}; {rate}; mean prompt {work.prompt_mean:.0f}, output {work.output_mean:.0f} "
        f"tokens; each replay: arrivals of {t.replay_lifetimes:g} request lifetimes (>= {t.replay_requests} requests, "
        f"<= {t.duration_s:g} s)",
        f"  {c['deployments']:,} deployments ({c['setups']} setups, {c['excluded']} excluded): "
        f"{c['does_not_fit']:,} do not fit, {c['invalid']:,} cannot run, {c['saturated']:,} cannot carry the rate, "
        + (f"{c['errors']:,} FAILED (see the table's reason column), " if c["errors"] else "") +
        f"{c['screened'] - c['screen_ok']:,} miss the SLOs on the screen, {c['screen_ok']:,} meet them; "
        f"{c['replays']} replayed ({c['replays_failed']} missed), "
        f"{c['front']} on the front" + ("" if result.complete else " (INCOMPLETE: interrupted during the replays)"
                                        if result.interrupted else " (INCOMPLETE: the replay budget ran out)"),
        "",
    ]
    head = ("", "deployment", "req/s", "tok/s/chip", "tok/s/user", f"TTFT p{pct}", f"TPOT p{pct}", "bound", "verdict")
    rows = []
    for r in result.front:
        mark = "*" if result.chosen is not None and r["index"] == result.chosen["index"] else ""
        label = Deployment(**{k: r[k] for k in Deployment.__dataclass_fields__}).label
        rows.append((mark, label, _f(r.get("rate_per_s"), ".3g"), _f(r["tokens_per_s_per_chip"], ",.0f"),
                     _f(r["tokens_per_s_per_user"], ".1f"), _f(r.get(f"ttft_ms_p{pct}"), ",.0f") + " ms",
                     _f(r.get(f"tpot_ms_p{pct}"), ".2f") + " ms", str(r.get("bound") or "-"), str(r.get("verdict"))))
    if rows:
        widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
        for x in [head, *rows]:
            lines.append("  " + "  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in
                                          enumerate(zip(x, widths, strict=True))))
        lines += ["", "  tok/s/chip and tok/s/user: the screen's steady state at the rate shown; TTFT and TPOT: "
                  "the replay's; * the chosen deployment (most tok/s/chip)"]
    elif result.interrupted:
        lines.append("  no replay confirmed a deployment before the interrupt")
    else:
        lines.append("  no deployment meets the SLOs at this traffic")
    tm = result.timing
    lines.append(f"  {tm['wall_s']:.1f} s (screen {tm['screen_s']:.1f} s, replays {tm['confirm_s']:.1f} s)")
    return "\n".join(lines)


def write_outputs(result: SearchResult, out: Path, command: str | None = None) -> list[str]:
    """Write the table, the JSON, the plot and the report into ``out``; returns the file names.
    A folder that cannot be made there is a ConfigError naming it (sim.io.make_folder)."""
    make_folder(out)
    table = result.table()
    for column in table.columns:  # one type per column for Parquet
        values = [v for v in table[column] if v is not None and not (isinstance(v, float) and v != v)]
        if values and len({type(v) for v in values}) > 1 and not all(isinstance(v, (int, float)) for v in values):
            table[column] = [None if v is None else str(v) for v in table[column]]
    write_frame(table, out / "deployments")
    files = ["deployments.parquet", "deployments.csv", "search.json", "front.png", "report.md"]
    data = payload(result, files, command)
    plot_front(result.rows, result.front, result.chosen, data, out / "front.png")
    write_report(data, out / "report.md", command=command, notes=result.space.spec.notes)
    write_atomic(out / "search.json", to_json(data))
    return files


__all__ = ["payload", "point", "text", "write_outputs"]
