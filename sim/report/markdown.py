"""The study report: ``<out>/report.md`` (and ``report.html`` beside it, self-contained) from
the saved table, settings and plots.

Sections: the question and its answer in numbers (how many points meet the target, where
the frontier lies along the first numeric axis for every other combination), the verdict
table, the sensitivity table, the plots, failures, and the resolved settings (base spec,
overrides, axes, hardware headline and every hardware number with its source).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pandas as pd

from sim.explore.html import write_study_html
from sim.io import write_atomic
from sim.paths import display_path, relative_text
from sim.report.claims import claim_panels, metric_columns, metric_label, variants
from sim.report.plots import LATENCY, load, no_effect, sensitivity_swings
from sim.units import GB

MAX_ROWS = 80


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:,.0f}" if abs(v) < 1e9 else f"{v:.4g}"
    return str(v)


def _val(v) -> str:
    """An axis value as written in a study (25, 12.5, 1.583e+03)."""
    if isinstance(v, float) and v == v:
        return f"{v:.6g}"
    return _fmt(v)


def _table(frame: pd.DataFrame, columns: list[str], exact=frozenset()) -> list[str]:
    """A Markdown table; the ``exact`` columns (swept axes) show their values as written."""
    cols = [c for c in columns if c in frame]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in frame[cols].iterrows():
        lines.append("| " + " | ".join((_val if c in exact or c.endswith(" at best") else _fmt)(row[c])
                                       .replace("|", "/") for c in cols) + " |")
    return lines


def _numeric(values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def frontier(grid: pd.DataFrame, axes: dict[str, list]) -> tuple[str | None, pd.DataFrame]:
    """For every combination of the other axes, the largest (and smallest) value of the first
    numeric axis at which the target is met."""
    varying = [a for a, v in axes.items() if len(v) > 1 and a in grid]
    numeric = [a for a in varying if _numeric(axes[a])]
    if not numeric:
        return None, pd.DataFrame()
    x = numeric[0]
    others = [a for a in varying if a != x]
    ok = grid[grid["status"] == "ok"].copy()
    ok["meets"] = ok["meets_target"].fillna(False).astype(bool) if "meets_target" in ok else False
    rows = []
    groups = ok.groupby(others, sort=False, dropna=False) if others else [((), ok)]
    for key, sel in groups:
        key = key if isinstance(key, tuple) else (key,)
        meets = sel[sel["meets"]]
        row = dict(zip(others, key, strict=False))
        row[f"{x} meeting"] = (f"{_val(meets[x].min())} .. {_val(meets[x].max())}" if not meets.empty else "none")
        row["points meeting"] = f"{len(meets)}/{len(sel)}"
        best = sel.loc[pd.to_numeric(sel[LATENCY], errors="coerce").idxmin()] if sel[LATENCY].notna().any() else None
        row["best p99 ms"] = float(best[LATENCY]) if best is not None else None
        row[f"{x} at best"] = best[x] if best is not None else None
        rows.append(row)
    return x, pd.DataFrame(rows)


def answer(grid: pd.DataFrame, axes: dict) -> list[str]:
    ok = grid[grid["status"] == "ok"]
    total = len(grid)
    meets = ok[ok["meets_target"].fillna(False).astype(bool)] if "meets_target" in ok else ok.iloc[0:0]
    unfit = ok[ok["verdict"] == "does-not-fit"] if "verdict" in ok else ok.iloc[0:0]
    target = grid["target_ms"].dropna().iloc[0] if "target_ms" in grid and grid["target_ms"].notna().any() else 10
    lines = [f"- {len(meets)} of {total} grid points meet the {target:g} ms p99 per-token target; "
             f"{len(unfit)} do not fit in memory; {total - len(ok)} failed."]
    if not ok.empty and ok[LATENCY].notna().any():
        best = ok.loc[pd.to_numeric(ok[LATENCY], errors="coerce").idxmin()]
        worst = ok.loc[pd.to_numeric(ok[LATENCY], errors="coerce").idxmax()]
        varying = [a for a, v in axes.items() if len(v) > 1 and a in grid]

        def where(row):
            return ", ".join(f"{a}={_val(row[a])}" for a in varying) or "the base point"

        lines.append(f"- Fastest: {best[LATENCY]:.3f} ms at {where(best)} (bound: {best.get('bound')}).")
        lines.append(f"- Slowest that fits: {worst[LATENCY]:.3f} ms at {where(worst)} (bound: {worst.get('bound')}).")
        if "bound" in ok:
            counts = ok[ok[LATENCY].notna()]["bound"].value_counts()
            lines.append("- What bounds the step: " + ", ".join(f"{k} at {v} points" for k, v in counts.items()) + ".")
    return lines


def _meets(frame: pd.DataFrame) -> pd.Series:
    return (frame["status"] == "ok") & frame.get("meets_target", pd.Series(False, frame.index)).fillna(False).astype(bool)


def compare(grid: pd.DataFrame, axes: dict, axis: str, baseline, by: list[str]) -> pd.DataFrame:
    """Each value of ``axis`` against ``baseline`` at equal values of every other axis."""
    others = [a for a, v in axes.items() if len(v) > 1 and a != axis and a in grid] + ["seed"]
    frame = grid.copy()
    frame["_meets"] = _meets(frame)
    frame["_p99"] = pd.to_numeric(frame.get(LATENCY), errors="coerce")
    base = frame[frame[axis].astype(str) == str(baseline)]
    rows = []
    groups = frame.groupby(by, sort=False, dropna=False) if by else [((), frame)]
    for key, sel in groups:
        key = key if isinstance(key, tuple) else (key,)
        for value in [v for v in axes[axis] if str(v) != str(baseline)]:
            mine = sel[sel[axis].astype(str) == str(value)]
            pairs = mine.merge(base, on=others, suffixes=("", "_base"))
            both = pairs[pairs["_p99"].notna() & pairs["_p99_base"].notna()]
            row = dict(zip(by, key, strict=False))
            row[axis] = value
            row["pairs"] = len(pairs)
            if not both.empty:
                row["median p99 change %"] = float((100 * (both["_p99"] / both["_p99_base"] - 1)).median())
                row["median p99 change ms"] = float((both["_p99"] - both["_p99_base"]).median())
                if "kv_bytes_per_token" in both:
                    kv = both[both["kv_bytes_per_token_base"] > 0]
                    if not kv.empty:
                        row["median KV bytes cut %"] = float(
                            (100 * (1 - kv["kv_bytes_per_token"] / kv["kv_bytes_per_token_base"])).median())
                for label, cols in (("dispatch ms", ["ms_dispatch"]), ("launch+sync ms", ["ms_launch_sync"])):
                    if all(c in both for c in cols):
                        was = sum(both[f"{c}_base"].fillna(0) for c in cols).median()
                        now = sum(both[c].fillna(0) for c in cols).median()
                        row[f"median {label} (base -> this)"] = f"{was:.3f} -> {now:.3f}"
            row["newly meet"] = int((pairs["_meets"] & ~pairs["_meets_base"]).sum())
            row["newly miss"] = int((~pairs["_meets"] & pairs["_meets_base"]).sum())
            rows.append(row)
    return pd.DataFrame(rows)


def summary_by(grid: pd.DataFrame, axes: dict, by: list[str]) -> pd.DataFrame:
    """Per value of ``by``: how many points meet, the best setting, and the heaviest load that meets."""
    varying = [a for a, v in axes.items() if len(v) > 1 and a in grid and a not in by]
    frame = grid.copy()
    frame["_meets"] = _meets(frame)
    frame["_p99"] = pd.to_numeric(frame.get(LATENCY), errors="coerce")
    rows = []
    for key, sel in frame.groupby(by, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(by, key, strict=False))
        row["meet / points"] = f"{int(sel['_meets'].sum())}/{len(sel)}"
        row["do not fit"] = int((sel.get("verdict") == "does-not-fit").sum())
        row["failed"] = int((sel["status"] != "ok").sum())
        if sel["_p99"].notna().any():
            best = sel.loc[sel["_p99"].idxmin()]
            row["best p99 ms"] = float(best["_p99"])
            row["best setting"] = ", ".join(f"{_short(a)}={_val(best[a])}" for a in varying)
        meets = sel[sel["_meets"]]
        if not meets.empty and {"batch", "context"} <= set(meets.columns):
            load = pd.to_numeric(meets["batch"], errors="coerce") * pd.to_numeric(meets["context"], errors="coerce")
            top = meets.loc[load.idxmax()]
            row["heaviest load meeting"] = (", ".join(f"{_short(a)}={_val(top[a])}" for a in varying)
                                            + f" ({top['_p99']:.2f} ms)")
        rows.append(row)
    return pd.DataFrame(rows)


def focus(grid: pd.DataFrame, axes: dict, where: dict, by: list[str]) -> tuple[int, int, pd.DataFrame]:
    """The points matching ``where``; per ``by`` group, which settings of the other axes meet."""
    sel = grid
    for axis, wanted in where.items():
        wanted = wanted if isinstance(wanted, list) else [wanted]
        sel = sel[sel[axis].astype(str).isin([str(w) for w in wanted])]
    sel = sel.copy()
    sel["_meets"] = _meets(sel)
    sel["_p99"] = pd.to_numeric(sel.get(LATENCY), errors="coerce")
    rest = [a for a, v in axes.items() if len(v) > 1 and a in grid and a not in by
            and not (a in where and not isinstance(where[a], list))]
    rows = []
    groups = sel.groupby(by, sort=False, dropna=False) if by else [((), sel)]
    for key, part in groups:
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(by, key, strict=False))
        row["meet / points"] = f"{int(part['_meets'].sum())}/{len(part)}"
        meets = part[part["_meets"]].sort_values("_p99")
        shown = [", ".join(f"{_short(a)}={_val(r[a])}" for a in rest) + f" ({r['_p99']:.2f})"
                 for _, r in meets.head(12).iterrows()]
        row["settings that meet (p99 ms), fastest first"] = "; ".join(shown) + (
            f"; ... {len(meets) - 12} more" if len(meets) > 12 else "") if shown else "none"
        rows.append(row)
    return int(sel["_meets"].sum()), len(sel), pd.DataFrame(rows)


def _short(axis: str) -> str:
    return axis.split(".")[-1]


PICTURES = (("feasibility", "Feasibility map: p99 latency over two swept axes, target contour in red"),
            ("breakdown", "Per-token latency breakdown"),
            ("tornado", "Sensitivity: which knob moves latency most"),
            ("bandwidth", "Bandwidth use within one decode step (DES event log)"),
            ("roofline", "Roofline: every op of one step under each memory level's roof"))


def write_report(out_dir: str | Path) -> Path:
    """Write ``<out_dir>/report.md`` from the saved table, settings and plots."""
    out_dir = Path(out_dir)
    table, settings = load(out_dir)
    grid = table[table["group"] == "grid"]
    axes = settings.get("axes", {})
    md_table = partial(_table, exact=frozenset(axes))
    lines = [f"# Study: {settings['name']}", ""]
    if settings.get("description"):
        lines += [settings["description"].strip(), ""]
    if settings.get("question"):
        lines += [f"**Question.** {settings['question'].strip()}", ""]
    left_out = sum(rule["points"] for rule in settings.get("excluded") or [])
    note = [f"- {left_out} more grid points are left out on purpose (see \"Left out on purpose\")."] if left_out else []
    lines += ["## Answer", ""] + answer(grid, axes) + note + [""]
    lines += _claims_section(grid, settings, out_dir / "plots")
    lines += _tables_section(grid, settings, md_table)
    lines += _plots_section(out_dir / "plots")
    lines += _verdicts_section(grid, axes, md_table)
    lines += _sensitivity_section(table[table["group"] == "sensitivity"], settings)
    lines += _left_out_section(table, settings, md_table)
    lines += _settings_section(settings, out_dir)
    path = out_dir / "report.md"
    write_atomic(path, "\n".join(lines))
    write_study_html(out_dir)  # report.html beside it: the same report, plots inlined
    return path


def _claims_section(grid: pd.DataFrame, settings: dict, plots: Path) -> list[str]:
    """One figure per claim, each with its answer in one line of numbers."""
    claims = [c for c in settings["study"].get("plots", {}).get("claims") or []
              if (plots / f"claim-{c['name']}.png").is_file()]
    if not claims:
        return []
    lines = ["## Claims, one figure each", ""]
    for claim in claims:
        name = f"claim-{claim['name']}"
        lines += [f"### {claim['title']}", "", f"![{claim['title']}](plots/{name}.png)", f"([SVG](plots/{name}.svg))",
                  ""]
        lines += [f"- {line}" for line in claim_answer(claim_panels(grid, settings, claim), claim)] + [""]
    return lines


def claim_answer(panels, claim: dict) -> list[str]:
    """A claim figure's answer in words: per panel, how many rows meet the target (latency)
    or the median change against the baseline (any other metric)."""
    out = []
    latency = metric_columns(claim) == [LATENCY]
    names = [", ".join(f"{a}={v}" for a, v in variant.items()) for variant in variants(claim)]
    for panel in panels:
        where = ", ".join(f"{a}={v}" for a, v in panel.at.items())
        head = f"At {where}: " if where else ""
        rows = panel.rows
        if latency:
            meets = sum(any(c.meets for c in r.claimed) for r in rows)
            base = sum(r.baseline.meets for r in rows)
            out.append(f"{head}the claimed setting meets the target in {meets} of {len(rows)} rows, the baseline "
                       f"in {base}.")
        parts = _median_changes(rows, names)
        if parts:
            out.append(f"{head if not latency else ''}{metric_label(claim)} against the baseline: "
                       + "; ".join(parts) + ".")
        missing = sum(r.baseline.status != "ok" or any(c.status != "ok" for c in r.claimed) for r in rows)
        if missing:
            out.append(f"{missing} of {len(rows)} rows lack a point (does not fit, failed or left out: the figure "
                       "says which).")
    return out


def _median_changes(rows, names: list[str]) -> list[str]:
    """Per claimed variant: the median change against the baseline over the rows where both have a value."""
    parts = []
    for k, label in enumerate(names):
        changes = [100 * (r.claimed[k].value / r.baseline.value - 1) for r in rows
                   if r.claimed[k].status == "ok" and r.baseline.status == "ok" and r.baseline.value]
        if changes:
            parts.append(f"{label}: median {pd.Series(changes).median():+.1f}% over {len(changes)} rows")
    return parts


def _tables_section(grid: pd.DataFrame, settings: dict, md_table) -> list[str]:
    """summary_by, focus, compare and the frontier tables."""
    axes = settings.get("axes", {})
    study = settings["study"]
    lines: list[str] = []
    if study.get("summary_by"):
        table_by = summary_by(grid, axes, study["summary_by"])
        lines += [f"### By {', '.join(study['summary_by'])}", ""] + md_table(table_by, list(table_by.columns)) + [""]
    for item in study.get("focus", []):
        met, total, frame = focus(grid, axes, item["where"], item.get("by", []))
        cond = ", ".join(f"{a} in {v}" if isinstance(v, list) else f"{a}={v}" for a, v in item["where"].items())
        lines += [f"### {item['title']}", "", f"Points with {cond}: {met} of {total} meet the target.", ""]
        if not frame.empty:
            lines += md_table(frame, list(frame.columns)) + [""]
    for comp in study.get("compare", []):
        frame = compare(grid, axes, comp["axis"], comp["baseline"], comp.get("by", []))
        if not frame.empty:
            lines += [f"### `{comp['axis']}` against `{comp['baseline']}` (every other axis equal)", ""]
            lines += md_table(frame, list(frame.columns)) + [""]
    x, front = frontier(grid, axes)
    if x is not None and not front.empty and len(front) <= 60:
        lines += [f"### Where the target holds, along `{x}`", ""]
        lines += md_table(front, list(front.columns)) + [""]
    elif x is not None and not front.empty:
        lines += [f"(The frontier along `{x}` has {len(front)} rows: see results.csv.)", ""]
    return lines


def _plots_section(plots: Path) -> list[str]:
    """Every other plot the folder holds (a feasibility map may be split into several)."""
    lines: list[str] = []
    for name, title in PICTURES:
        files = sorted(plots.glob(f"{name}.png")) + sorted(plots.glob(f"{name}-*.png"))
        for file in files:
            part = file.stem[len(name) + 1:]
            heading = f"{title} ({part})" if part else title
            lines += [f"### {heading}", "", f"![{heading}](plots/{file.name})", f"([SVG](plots/{file.stem}.svg))", ""]
    return ["## Plots", ""] + lines if lines else []


def _verdicts_section(grid: pd.DataFrame, axes: dict, md_table) -> list[str]:
    lines = ["## Verdicts", ""]
    varying = [a for a, v in axes.items() if len(v) > 1]
    cols = varying + (["seed"] if grid["seed"].nunique() > 1 else []) + [
        "per_token_ms_p50", LATENCY, "bound", "verdict", "capacity_needed_bytes", "error"]
    view = grid.head(MAX_ROWS).copy()
    if "error" in view:
        view["error"] = view["error"].map(lambda e: relative_text(e) if isinstance(e, str) else e)
    if "capacity_needed_bytes" in view:
        view["capacity_needed_bytes"] = view["capacity_needed_bytes"] / GB
        view = view.rename(columns={"capacity_needed_bytes": "memory GB/chip"})
        cols = [c if c != "capacity_needed_bytes" else "memory GB/chip" for c in cols]
    lines += md_table(view, cols)
    if len(grid) > MAX_ROWS:
        lines += ["", f"({len(grid) - MAX_ROWS} more rows in [results.csv](results.csv).)"]
    return lines + [""]


def _sensitivity_section(sens: pd.DataFrame, settings: dict) -> list[str]:
    swings = sensitivity_swings(sens)
    if swings is None:
        return []
    base, bars = swings
    pct = settings["study"].get("sensitivity", {}).get("percent")
    lines = [f"## Sensitivity (each knob -{pct:g}% / +{pct:g}%, base p99 {base:.3f} ms)", "",
             "| knob | p99 at -X% (ms) | p99 at +X% (ms) | swing (ms) |", "|---|---|---|---|"]
    rows = [(abs(hi_v - lo_v), knob, lo_v, hi_v) for knob, lo_v, hi_v in bars]
    for swing, knob, lo_v, hi_v in sorted(rows, reverse=True):
        idle = " (no effect)" if no_effect(base, lo_v, hi_v) else ""
        lines.append(f"| `{knob}`{idle} | {lo_v:.3f} | {hi_v:.3f} | {swing:.3f} |")
    return lines + [""]


def _left_out_section(table: pd.DataFrame, settings: dict, md_table) -> list[str]:
    """Points that failed, and grid combinations the study leaves out on purpose."""
    lines: list[str] = []
    varying = [a for a, v in settings.get("axes", {}).items() if len(v) > 1]
    excluded = settings.get("excluded") or []
    if excluded:
        lines += ["## Left out on purpose (sweep.exclude)", "", "| where | points | reason |", "|---|---|---|"]
        for rule in excluded:
            where = ", ".join(f"{a}={v}" for a, v in rule["where"].items())
            lines.append(f"| {where} | {rule['points']} | {rule['reason']} |")
        lines.append("")
    failed = table[table["status"] != "ok"].copy()
    if not failed.empty:
        failed["error"] = failed["error"].map(lambda e: relative_text(e) if isinstance(e, str) else e)
        lines += ["## Failed points", ""] + md_table(failed, ["point", *varying, "error"]) + [""]
    return lines


def _settings_section(settings: dict, out_dir: Path) -> list[str]:
    """The resolved settings: files (relative paths), base spec, axes, runs, hardware sources."""
    def shown(path):
        return relative_text(display_path(path, out_dir) or "")

    axes = settings.get("axes", {})
    lines = ["## Resolved settings", "", f"- Study file: `{shown(settings['file'])}`",
             f"- Simulator: `{settings['simulator']}`",
             f"- Hardware file (base): `{shown(settings['hardware_file'])}`; model file: "
             f"`{shown(settings['model_file'])}`",
             "- Base run spec (overrides applied to every point included):", "", "```json",
             relative_text(json.dumps(settings["base_spec"], indent=1)), "```", "", "- Swept axes:", ""]
    for axis, values in axes.items():
        lines.append(f"  - `{axis}`: {', '.join(_val(v) for v in values)}")
    timing = json.loads((out_dir / "timing.json").read_text()) if (out_dir / "timing.json").is_file() else {}
    if timing:
        lines += ["", f"- Runs: {timing['points']} points ({settings.get('unique_runs')} unique), "
                      f"{timing['simulated']} simulated now, {timing['cached']} from the cache, "
                      f"{timing['failed']} failed; {timing['wall_s']:.1f} s wall, "
                      f"{timing['points_per_s']:.1f} points/s ({timing['executor']}, {timing['jobs']} workers)."]
    head = settings.get("hardware_headline", {})
    lines += ["", "- Base hardware: " + ", ".join(f"{k} {_fmt(v)}" for k, v in head.items()), "",
              "<details><summary>Every hardware number of the base profile, with its source</summary>", "",
              "| path | value | source | estimate |", "|---|---|---|---|"]
    for path, value, source, estimate in settings.get("hardware_sources", []):
        lines.append(f"| `{path}` | {_fmt(value)} | {str(source).replace('|', '/')} | {'yes' if estimate else ''} |")
    return lines + ["", "</details>", ""]
