"""Plotly figure dicts for the explorer and its HTML exports (plain JSON, no plotly import).

Each function takes views (``sim.explore.views``: a run's ``--json`` summary, its
roofline points and its curves) and returns ``{"data": [...], "layout": {...}}``, the form
``Plotly.newPlot`` takes. The page and an exported file draw the same dicts. Units: ms per
decode step (= per token of each sequence), operations per byte, T operations per second,
requests per second.
"""

from __future__ import annotations

from sim.units import GFLOP_PER_TFLOP

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
DASHES = ("solid", "dash")
LEVEL_SYMBOLS = ("circle", "square", "triangle-up", "diamond", "triangle-down", "cross", "x")


def _layout(title: str, **extra) -> dict:
    base = {"title": {"text": title, "font": {"size": 14}, "x": 0.01, "xanchor": "left"}, "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
            "legend": {"orientation": "h", "y": -0.25, "yanchor": "top"}, "template": "plotly_white", "height": 360}
    base.update(extra)
    return base


def _target_line(target_ms: float) -> dict:
    return {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": target_ms, "y1": target_ms,
            "line": {"color": "#444", "dash": "dot", "width": 1.5}}


def _target_note(target_ms: float) -> dict:
    return {"xref": "paper", "x": 1, "y": target_ms, "xanchor": "right", "yanchor": "bottom",
            "text": f"{target_ms:g} ms target", "showarrow": False, "font": {"size": 11, "color": "#444"}}


def _target(layout: dict, target_ms: float, ys: list) -> None:
    """The target line on ``layout``, or, where every point lies far below it (a wafer at
    0.3 ms against 10 ms), a note instead, so the axis is not stretched to the target and the
    curves flattened against zero."""
    top = max((y for y in ys if isinstance(y, (int, float))), default=None)
    if top is not None and target_ms > 2.5 * top:
        layout["annotations"] = [{"xref": "paper", "yref": "paper", "x": 1, "y": 1.0, "xanchor": "right",
                                  "yanchor": "bottom", "showarrow": False, "font": {"size": 11, "color": "#444"},
                                  "text": f"{target_ms:g} ms target: above every point (off this scale)"}]
        return
    layout["shapes"], layout["annotations"] = [_target_line(target_ms)], [_target_note(target_ms)]


def breakdown_rows(views: list[dict]) -> list[str]:
    """The breakdown rows any view spends time on (>= 0.1 us), largest first."""
    rows: list[str] = []
    for view in views:
        for name, ms in sorted((view["summary"].get("breakdown_ms") or {}).items(), key=lambda kv: -kv[1]):
            if ms >= 1e-4 and name not in rows:
                rows.append(name)
    return rows


def breakdown(views: list[dict]) -> dict:
    """The step breakdown (ms per step, by row) of each view, as grouped horizontal bars."""
    rows = breakdown_rows(views)
    data = []
    for i, view in enumerate(views):
        b = view["summary"].get("breakdown_ms") or {}
        data.append({"type": "bar", "orientation": "h", "name": view["label"], "y": rows,
                     "x": [b.get(r, 0.0) for r in rows], "marker": {"color": COLOURS[i % len(COLOURS)]},
                     "hovertemplate": "%{y}: %{x:.4f} ms<extra>" + view["label"] + "</extra>"})
    layout = _layout("Breakdown of one decode step (ms)", barmode="group",
                     xaxis={"title": {"text": "ms per step"}},
                     yaxis={"autorange": "reversed", "automargin": True},
                     height=max(260, 60 + 26 * len(rows) * max(1, len(views))))
    if not rows:
        layout.update(xaxis={"visible": False}, yaxis={"visible": False}, annotations=[{
            "text": "no breakdown: the setup does not fit", "showarrow": False, "xref": "paper", "yref": "paper",
            "x": 0.5, "y": 0.5}])
    return {"data": data, "layout": layout}


def roofline(view: dict) -> dict:
    """Every op of the view's first step, placed once per memory level it moved bytes at,
    under that level's bandwidth roof, the matrix peak and the vector-unit ceiling."""
    roof = view.get("roofline")
    title = f"Roofline of one step: {view['label']}"
    if not roof or not roof["points"]:
        return {"data": [], "layout": _layout(title, xaxis={"visible": False}, yaxis={"visible": False}, annotations=[{
            "text": "no roofline: the setup does not fit" if roof is None else "no op moved bytes",
            "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}])}
    intensities = [p for level in roof["points"].values() for p in level["intensity"]]
    lo, hi = min(intensities) / 4, max(intensities) * 4
    lo, hi = min(lo, 0.01), max(hi, 1e4)
    xs = [lo * (hi / lo) ** (k / 60) for k in range(61)]
    matrix = roof["matrix_peak_TFLOPs"]
    data = []
    for i, (level, gbps) in enumerate(roof["peaks_GBps"].items()):
        roof_y = [min(matrix, x * gbps / GFLOP_PER_TFLOP) for x in xs]
        data.append({"type": "scatter", "mode": "lines", "x": xs, "y": roof_y,
                     "name": f"{level} roof ({gbps:,.0f} GB/s)",
                     "line": {"color": COLOURS[i % len(COLOURS)], "width": 1.5}, "hoverinfo": "name"})
    sustained = roof.get("vector_sustained_Tops") or roof["vector_peak_Tops"]
    data.append({"type": "scatter", "mode": "lines", "x": [lo, hi], "y": [sustained] * 2,
                 "name": f"vector units, sustained ({sustained:,.1f} T ops/s; peak {roof['vector_peak_Tops']:,.1f})",
                 "line": {"color": "#9467bd", "width": 1.2}, "hoverinfo": "name"})
    for i, (level, pts) in enumerate(roof["points"].items()):
        colour = COLOURS[list(roof["peaks_GBps"]).index(level) % len(COLOURS)] if level in roof["peaks_GBps"] \
            else "#555"
        data.append({"type": "scatter", "mode": "markers", "x": pts["intensity"], "y": pts["rate"],
                     "text": pts["name"], "name": f"ops, bytes at {level}",
                     "marker": {"symbol": LEVEL_SYMBOLS[i % len(LEVEL_SYMBOLS)], "size": 7, "color": colour,
                                "opacity": 0.7},
                     "hovertemplate": "%{text}<br>%{x:.3g} ops/byte, %{y:.3g} T ops/s<extra>" + level + "</extra>"})
    return {"data": data, "layout": _layout(
        title, xaxis={"type": "log", "title": {"text": "arithmetic intensity (operations per byte at that level)"}},
        yaxis={"type": "log", "title": {"text": "achieved work rate (T ops/s)"}}, height=420)}


def curve(views: list[dict], axis: str) -> dict:
    """p99 ms per token against ``axis`` (``batch`` or ``context``) for each view, with the
    target line; points that do not fit are left out and counted in the legend."""
    data, target = [], None
    for i, view in enumerate(views):
        points = (view.get("curves") or {}).get(axis) or []
        target = view["summary"]["target_ms"] if target is None else target
        ok = [p for p in points if p["ms_p99"] is not None]
        lost = len(points) - len(ok)
        name = view["label"] + (f" ({lost} point{'s do' if lost > 1 else ' does'} not fit)" if lost else "")
        data.append({"type": "scatter", "mode": "lines+markers", "name": name, "x": [p["x"] for p in ok],
                     "y": [p["ms_p99"] for p in ok], "text": [p["bound"] for p in ok],
                     "line": {"color": COLOURS[i % len(COLOURS)]},
                     "hovertemplate": axis + " %{x}: %{y:.3f} ms (p99), %{text}-bound<extra>" + view["label"]
                                      + "</extra>"})
    word = "sequences per step" if axis == "batch" else "tokens in each cache at the first step"
    layout = _layout(f"Latency against {axis} (p99 ms per token)",
                     xaxis={"type": "log", "title": {"text": f"{axis} ({word})"}},
                     yaxis={"title": {"text": "p99 ms per token"}, "rangemode": "tozero"}, showlegend=True)
    if target is not None:
        _target(layout, target, [y for trace in data for y in trace["y"]])
    return {"data": data, "layout": layout}


def serving(rows: list[dict], target_ms: float, metric: str) -> dict:
    """``metric`` (``tpot`` or ``ttft``) p50 (dashed) and p99 (solid) against the offered
    request rate, one colour per setup (the rows' ``setup``), from the serve sweep's rows
    (those that ran)."""
    ok = sorted((r for r in rows if r.get("status") == "ok"), key=lambda r: r["rate_per_s"])
    setups = list(dict.fromkeys(r.get("setup", "") for r in ok))
    data = []
    for i, setup in enumerate(setups):
        mine = [r for r in ok if r.get("setup", "") == setup]
        for q, dash in (("p50", "dash"), ("p99", "solid")):
            name = f"{setup + ': ' if setup else ''}{metric.upper()} {q}"
            data.append({"type": "scatter", "mode": "lines+markers", "name": name,
                         "x": [r["rate_per_s"] for r in mine], "y": [r[f"{metric}_ms_{q}"] for r in mine],
                         "line": {"color": COLOURS[i % len(COLOURS)], "dash": dash},
                         "hovertemplate": "%{x:.3g} req/s offered: %{y:.2f} ms<extra>" + name + "</extra>"})
    title = "time per output token" if metric == "tpot" else "time to first token"
    layout = _layout(f"{metric.upper()} ({title}) against request rate",
                     xaxis={"title": {"text": "offered rate (requests per second arriving)"}},
                     yaxis={"title": {"text": f"{metric.upper()} (ms)"}, "rangemode": "tozero"}, showlegend=True)
    if metric == "tpot":
        _target(layout, target_ms, [y for trace in data for y in trace["y"]])
    return {"data": data, "layout": layout}


def search_front(front: list[dict], chosen: dict | None) -> dict:
    """A search's Pareto front: output tokens/s per chip against tokens/s per user, each
    deployment as the search judged it (confirmed by replay where it was), the chosen one ringed."""
    data = []
    for i, verdict in enumerate(sorted({str(r.get("verdict")) for r in front})):
        mine = [r for r in front if str(r.get("verdict")) == verdict]
        data.append({"type": "scatter", "mode": "markers", "name": verdict,
                     "x": [_first(r, "replay_tokens_per_s_per_user", "tokens_per_s_per_user") for r in mine],
                     "y": [_first(r, "replay_tokens_per_s_per_chip", "tokens_per_s_per_chip") for r in mine],
                     "text": [r.get("label", "") for r in mine], "customdata": [r.get("index") for r in mine],
                     "marker": {"size": 10, "color": COLOURS[i % len(COLOURS)]},
                     "hovertemplate": "%{text}<br>%{x:.0f} tok/s per user, %{y:.0f} tok/s per chip<extra>"
                                      + verdict + "</extra>"})
    if chosen:
        data.append({"type": "scatter", "mode": "markers", "name": "chosen",
                     "x": [_first(chosen, "replay_tokens_per_s_per_user", "tokens_per_s_per_user")],
                     "y": [_first(chosen, "replay_tokens_per_s_per_chip", "tokens_per_s_per_chip")],
                     "text": [chosen.get("label", "")], "hovertemplate": "chosen: %{text}<extra></extra>",
                     "marker": {"size": 18, "color": "rgba(0,0,0,0)", "line": {"color": "#111", "width": 2}}})
    layout = _layout("Search: the Pareto front (replayed where confirmed)",
                     xaxis={"title": {"text": "output tokens/s per user"}, "rangemode": "tozero"},
                     yaxis={"title": {"text": "output tokens/s per chip"}, "rangemode": "tozero"}, showlegend=True)
    if not front:
        layout["annotations"] = [{"text": "no deployment meets the targets", "showarrow": False, "xref": "paper",
                                  "yref": "paper", "x": 0.5, "y": 0.5}]
    return {"data": data, "layout": layout}


def _first(row: dict, *keys):
    """The first of ``keys`` that ``row`` has a number for (a replayed figure before its estimate)."""
    return next((row[k] for k in keys if isinstance(row.get(k), (int, float))), None)


__all__ = ["breakdown_rows", "breakdown", "roofline", "curve", "serving", "search_front"]
