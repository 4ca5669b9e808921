"""Self-contained HTML: a view of the explorer (``decodesim run --html``, the page's export)
and a study report beside its Markdown (``report.html``).

A file written here opens offline: plotly.js (the copy the ``plotly`` package bundles) is
inlined once in a ``<script>`` element, the figures are Plotly JSON in the page, and a
study report's PNG plots are inlined as ``data:`` URIs. Nothing is fetched when it opens.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import importlib.util
import json
import re
from functools import lru_cache
from pathlib import Path

from sim.errors import ConfigError
from sim.explore import figures
from sim.io import write_atomic
from sim.units import GB

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px}h3{font-size:15px}
code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;background:#f4f4f4}
pre{padding:8px;overflow-x:auto}code{padding:1px 3px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 7px;text-align:left}
th{background:#f0f0f0}.cards{display:flex;gap:16px;flex-wrap:wrap}
.card{border:1px solid #ccc;border-radius:6px;padding:12px 16px;min-width:320px;flex:1}
.ms{font-size:30px;font-weight:600}.meets-target{color:#1a7f37}.misses-target{color:#b35900}
.does-not-fit{color:#b00020}.muted{color:#666;font-size:12px}.plots{display:grid;
grid-template-columns:repeat(auto-fit,minmax(480px,1fr));gap:12px}img{max-width:100%}
"""


def plotly_js_path() -> Path:
    """The plotly.min.js the ``plotly`` package bundles (found without importing plotly)."""
    spec = importlib.util.find_spec("plotly")
    path = Path(spec.origin).parent / "package_data" / "plotly.min.js" if spec and spec.origin else None
    if path is None or not path.is_file():
        raise ConfigError("plotly", None, "the explorer and HTML exports need the plotly package "
                          "(pip install 'plotly>=5'), which bundles plotly.min.js")
    return path


@lru_cache(maxsize=1)
def plotly_js() -> str:
    return plotly_js_path().read_text(encoding="utf-8")


def _script_json(obj) -> str:
    """JSON safe inside a ``<script>`` element."""
    return json.dumps(obj, allow_nan=False).replace("</", "<\\/")


# Plotly's own buttons that could send a chart off the machine stay off ("Edit in Chart
# Studio", "Share chart"), and so does its logo link: the page and its exports are local only.
PLOTLY_CONFIG = {"displaylogo": False, "showSendToCloud": False, "showLink": False, "showEditInChartStudio": False,
                 "responsive": True}


def document(title: str, body: str, plots: dict[str, dict] | None = None) -> str:
    """A whole HTML file: ``body`` and the Plotly ``plots`` (element id -> figure), with
    plotly.js inlined when there is a plot."""
    plots = plots or {}
    scripts = ""
    if plots:
        draw = "".join(f"Plotly.newPlot({json.dumps(k)},F[{json.dumps(k)}].data,F[{json.dumps(k)}].layout,C);"
                       for k in plots)
        scripts = (f"<script>{plotly_js()}</script>\n<script>const F={_script_json(plots)};"
                   f"const C={_script_json(PLOTLY_CONFIG)};{draw}"
                   "document.body.dataset.ready='1';</script>")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>\n<body>\n{body}\n{scripts}\n"
            f"</body></html>\n")


# -- a view of the explorer ----------------------------------------------------------------------


def headline(view: dict) -> str:
    """A view's answer as an HTML card: ms per token, bound, verdict, memory, command line."""
    s = view["summary"]
    e = html.escape
    cap = s["capacity"]
    mem = (f"memory per chip: {cap['needed_bytes'] / GB:.2f} GB needed (weights {cap['weights_bytes'] / GB:.2f} GB, "
           f"KV {cap['kv_bytes'] / GB:.2f} GB) of {cap['available_bytes'] / GB:.2f} GB")
    parts = [f"<div class=\"card\" data-label=\"{e(view['label'])}\"><h3>{e(view['label'])}: {e(s['model'])} on "
             f"{e(s['hardware'])}, weights {e(s['weights'])}, KV {e(s['kv'])}</h3>"]
    if s["verdict"] == "does-not-fit":
        parts.append(f"<div class=\"ms does-not-fit verdict\">DOES NOT FIT</div><p>{e(s.get('reason', ''))}</p>")
    else:
        parts.append(f"<div><span class=\"ms {e(s['verdict'])}\" data-ms=\"{s['per_token_ms_p50']!r}\">"
                     f"{s['per_token_ms_p50']:.3f} ms</span> per token (p50), p99 {s['per_token_ms_p99']:.3f} ms</div>"
                     f"<div class=\"verdict {e(s['verdict'])}\"><b>{e(s['bound'])}-bound</b>; "
                     f"{'MEETS' if s['meets_target'] else 'MISSES'} the {s['target_ms']:g} ms target "
                     f"(margin {s['margin_ms']:+.3f} ms)</div>"
                     f"<div class=\"muted\">byte floor {s['byte_floor_ms']:.3f} ms at peak bandwidth; achieved "
                     f"{s['hbm_achieved_GBps']:.0f} GB/s = {100 * s['hbm_fraction_of_peak']:.1f}% of "
                     f"{s['hbm_peak_GBps']:.0f} GB/s</div>" + _energy_line(s))
    parts.append(f"<div class=\"muted\">batch {s['batch']}, context {s['context']}, {s['steps']} steps, "
                 f"{e(s['engine'])} engine, {'graph' if s['graph'] else 'eager'} launch, stack {e(s['software'])}, "
                 f"tp {s['tp']} x pp {s['pp']}; {mem}</div>"
                 f"<div class=\"muted\">same figure from the CLI: <code>{e(view['command'])}</code></div></div>")
    return "".join(parts)


def _energy_line(s: dict) -> str:
    """The energy per token, where the profile has an energy section (else nothing)."""
    energy = s.get("energy") or {}
    if not energy.get("J_per_token"):
        return ""
    limit = energy.get("power_limit_W")
    over = " <b>above the power limit</b>" if energy.get("above_power_limit") else ""
    return (f"<div class=\"muted energy\" data-j=\"{energy['J_per_token']!r}\">energy {energy['J_per_token']:.3g} J per "
            f"token ({energy.get('tokens_per_J', 0):.3g} tokens/J), average {energy.get('avg_W', 0):.0f} W"
            + (f" of a {limit:.0f} W limit" if limit else "") + f"{over}</div>")


SUMMARY_COLUMNS = (("label", "setup"), ("hardware", "hardware"), ("model", "model"), ("weights", "weights"),
                   ("kv", "KV"), ("software", "stack"), ("batch", "batch"), ("context", "context"),
                   ("tp", "tp"), ("pp", "pp"), ("per_token_ms_p50", "ms/token p50"),
                   ("per_token_ms_p99", "ms/token p99"), ("bound", "bound"), ("verdict", "verdict"),
                   ("throughput_tokens_per_s", "tokens/s"), ("hbm_fraction_of_peak", "HBM fraction of peak"),
                   ("J_per_token", "J/token"))


def summary_rows(views: list[dict]) -> list[dict]:
    """One row per setup: the summary's headline figures (``SUMMARY_COLUMNS``), as the CSV has them."""
    rows = []
    for view in views:
        s = view["summary"]
        row = {key: s.get(key) for key, _title in SUMMARY_COLUMNS}
        row["label"] = view["label"]
        row["J_per_token"] = (s.get("energy") or {}).get("J_per_token")
        rows.append(row)
    return rows


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def summary_table(views: list[dict]) -> str:
    """The setups' headline figures side by side (one row each)."""
    head = "".join(f"<th>{html.escape(title)}</th>" for _key, title in SUMMARY_COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(r[k]))}</td>" for k, _t in SUMMARY_COLUMNS) + "</tr>"
                   for r in summary_rows(views))
    return f"<table class=\"summary\"><tr>{head}</tr>{body}</table>"


def _csv(header: list[str], rows: list[list]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([["" if v is None else (repr(v) if isinstance(v, float) else v) for v in r] for r in rows])
    return out.getvalue()


def summary_csv(views: list[dict]) -> str:
    """``summary_table`` as CSV (full precision, the JSON's keys as column names)."""
    return _csv([k for k, _t in SUMMARY_COLUMNS], [[r[k] for k, _t in SUMMARY_COLUMNS] for r in summary_rows(views)])


def breakdown_csv(views: list[dict]) -> str:
    """``breakdown_table`` as CSV: one row per breakdown row, one ``<label>_ms`` column per setup."""
    rows = [[name, *((v["summary"].get("breakdown_ms") or {}).get(name) for v in views)]
            for name in figures.breakdown_rows(views)]
    return _csv(["row", *(f"{v['label']}_ms" for v in views)], rows)


def breakdown_table(views: list[dict]) -> str:
    """The breakdown rows (ms per step) of each view, side by side."""
    rows = []
    for name in figures.breakdown_rows(views):
        cells = "".join(f"<td>{v['summary']['breakdown_ms'].get(name, 0.0):.4f}</td>" if v["summary"].get("breakdown_ms")
                        else "<td>does not fit</td>" for v in views)
        rows.append(f"<tr><td>{html.escape(name)}</td>{cells}</tr>")
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(v['label'])} (ms)</th>" for v in views)
    return f"<table><tr><th>breakdown row</th>{head}</tr>{''.join(rows)}</table>"


def view_plots(views: list[dict], serving: dict | None = None) -> dict[str, dict]:
    """The figures of a view (one or two configurations; a serving sweep), by element id."""
    plots = {"fig-breakdown": figures.breakdown(views)}
    for i, view in enumerate(views):
        plots[f"fig-roofline-{i}"] = figures.roofline(view)
    if any(v.get("curves") for v in views):
        plots["fig-batch"] = figures.curve(views, "batch")
        plots["fig-context"] = figures.curve(views, "context")
    return {**plots, **serving_plots(serving)}


def serving_plots(serving: dict | None) -> dict[str, dict]:
    """TPOT and TTFT against rate of a serving sweep (``{"rows": [...], "target_ms": t}``)."""
    if not serving or not serving.get("rows"):
        return {}
    return {"fig-tpot": figures.serving(serving["rows"], serving["target_ms"], "tpot"),
            "fig-ttft": figures.serving(serving["rows"], serving["target_ms"], "ttft")}


def view_document(views: list[dict], serving: dict | None = None, title: str = "decodesim view") -> str:
    """A view as one self-contained HTML file."""
    plots = view_plots(views, serving)
    body = [f"<h1>{html.escape(title)}</h1>", "<div class=\"cards\">", *(headline(v) for v in views), "</div>",
            summary_table(views), breakdown_table(views), "<div class=\"plots\">",
            *(f"<div id=\"{k}\" class=\"plot\"></div>" for k in plots), "</div>"]
    if serving and serving.get("rows"):
        body.append(f"<p class=\"muted\">serving: <code>{html.escape(serving.get('command', ''))}</code></p>")
        body.append(serving_table(serving["rows"]))
    body.append("<p class=\"muted\">Written by decodesim; plotly.js is inlined, so this file opens offline.</p>")
    return document(title, "\n".join(body), plots)


SERVING_COLUMNS = (("setup", "setup"), ("rate_request", "requested (req/s)"), ("rate_per_s", "offered (req/s)"),
                   ("throughput_req_per_s", "achieved (req/s)"), ("ttft_ms_p50", "TTFT p50 (ms)"),
                   ("ttft_ms_p99", "TTFT p99 (ms)"), ("tpot_ms_p50", "TPOT p50 (ms)"),
                   ("tpot_ms_p99", "TPOT p99 (ms)"), ("throughput_tokens_per_s", "tokens/s"),
                   ("J_per_output_token", "J/output token"), ("verdict", "verdict"))


def serving_table(rows: list[dict]) -> str:
    """The serving sweep's rows: requested, offered (arrivals in the window) and achieved
    (completed) rates side by side, with TTFT, TPOT, throughput, energy and verdict."""
    head = "".join(f"<th>{html.escape(t)}</th>" for _k, t in SERVING_COLUMNS)
    lines = []
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"<tr><td>{html.escape(str(r.get('setup', '')))}</td><td>{_cell(r.get('rate_request'))}</td>"
                         f"<td colspan=\"{len(SERVING_COLUMNS) - 2}\">{html.escape(str(r.get('status')))}: "
                         f"{html.escape(str(r.get('reason')))}</td></tr>")
            continue
        lines.append("<tr>" + "".join(f"<td>{html.escape(_cell(r.get(k)))}</td>" for k, _t in SERVING_COLUMNS)
                     + "</tr>")
    return f"<table class=\"serving\"><tr>{head}</tr>{''.join(lines)}</table>"


def records_csv(rows: list[dict]) -> str:
    """Records as CSV, one column per key any of them has (in first-seen order)."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return _csv(keys, [[r.get(k) if not isinstance(r.get(k), (dict, list)) else json.dumps(r.get(k)) for k in keys]
                       for r in rows])


def serving_csv(rows: list[dict]) -> str:
    """``serving_table`` as CSV (full precision, with each row's status and reason)."""
    keys = [k for k, _t in SERVING_COLUMNS] + ["status", "reason"]
    return _csv(keys, [[r.get(k) for k in keys] for r in rows])


# -- a study report as HTML ----------------------------------------------------------------------


def _inline(text: str, base: Path) -> str:
    """Markdown inline marks (code, images, links, bold) as HTML; local images inlined."""
    out, pos = [], 0
    for m in re.finditer(r"`([^`]*)`", text):
        out.append(_marks(text[pos:m.start()], base))
        out.append(f"<code>{html.escape(m.group(1))}</code>")
        pos = m.end()
    out.append(_marks(text[pos:], base))
    return "".join(out)


def _marks(text: str, base: Path) -> str:
    text = html.escape(text, quote=False)

    def image(m):
        src = m.group(2)
        target = (base / src).resolve()
        if target.suffix.lower() == ".png" and target.is_file() and target.is_relative_to(base.resolve()):
            src = "data:image/png;base64," + base64.b64encode(target.read_bytes()).decode()
        return f"<img alt=\"{m.group(1)}\" src=\"{src}\">"

    text = re.sub(r"!\[([^\]]*)\]\(([^)\s]+)\)", image, text)
    text = re.sub(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', text)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", text)


def markdown_html(markdown: str, base: Path) -> str:
    """The Markdown the study report writes (headings, paragraphs, nested lists, pipe tables,
    fenced code, raw ``<details>`` lines) as HTML; images under ``base`` inlined."""
    lines, out, i = markdown.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            out.append("<pre><code>" + html.escape("\n".join(lines[i + 1:j])) + "</code></pre>")
            i = j + 1
            continue
        if re.match(r"#{1,6} ", stripped):
            level = len(stripped) - len(stripped.lstrip("#"))
            out.append(f"<h{level}>{_inline(stripped[level + 1:], base)}</h{level}>")
        elif stripped.startswith("|"):
            j = i
            while j < len(lines) and lines[j].strip().startswith("|"):
                j += 1
            out.append(_table(lines[i:j], base))
            i = j
            continue
        elif re.match(r"\s*- ", line):
            j = i
            while j < len(lines) and (re.match(r"\s*- ", lines[j]) or (lines[j].startswith("  ") and lines[j].strip())):
                j += 1
            out.append(_list(lines[i:j], base))
            i = j
            continue
        elif re.match(r"</?(details|summary)", stripped):
            out.append(re.sub(r"<summary>(.*)</summary>", lambda m: f"<summary>{html.escape(m.group(1))}</summary>",
                              stripped))
        elif stripped:
            j = i
            while j < len(lines) and lines[j].strip() and not re.match(r"(#|\||- |```|<)", lines[j].strip()):
                j += 1
            out.append("<p>" + _inline(" ".join(x.strip() for x in lines[i:j]), base) + "</p>")
            i = max(j, i + 1)
            continue
        i += 1
    return "\n".join(out)


def _table(rows: list[str], base: Path) -> str:
    cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
    body = [r for r in cells if not all(re.fullmatch(r":?-{3,}:?", c) for c in r)]
    if not body:
        return ""
    head = "".join(f"<th>{_inline(c, base)}</th>" for c in body[0])
    rest = "".join("<tr>" + "".join(f"<td>{_inline(c, base)}</td>" for c in r) + "</tr>" for r in body[1:])
    return f"<table><tr>{head}</tr>{rest}</table>"


def _list(rows: list[str], base: Path) -> str:
    out, depth = [], -1
    for row in rows:
        if not re.match(r"\s*- ", row):  # a continuation line of the item before
            out[-1] = out[-1][:-5] + " " + _inline(row.strip(), base) + "</li>"
            continue
        indent = (len(row) - len(row.lstrip())) // 2
        while depth < indent:
            out.append("<ul>")
            depth += 1
        while depth > indent:
            out.append("</ul>")
            depth -= 1
        out.append(f"<li>{_inline(row.strip()[2:], base)}</li>")
    out += ["</ul>"] * (depth + 1)
    return "".join(out)


def write_study_html(out_dir: str | Path) -> Path:
    """``<out_dir>/report.html`` from ``report.md`` beside it (plots inlined), written atomically."""
    out_dir = Path(out_dir)
    markdown = (out_dir / "report.md").read_text(encoding="utf-8")
    title = markdown.splitlines()[0].lstrip("# ").strip() if markdown.strip() else "decodesim study"
    body = markdown_html(markdown, out_dir) + (
        "\n<p class=\"muted\">Written by decodesim beside report.md; plots are inlined, so this file opens offline "
        "(links to results.csv and the SVG plots point at files beside it).</p>")
    path = out_dir / "report.html"
    write_atomic(path, document(title, body))
    return path


__all__ = ["plotly_js", "plotly_js_path", "document", "headline", "view_plots", "serving_plots", "serving_table", "view_document", "markdown_html",
           "write_study_html", "PLOTLY_CONFIG", "summary_table", "summary_csv", "breakdown_csv", "serving_csv",
           "summary_rows", "records_csv"]
