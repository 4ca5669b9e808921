"""Rendering a deployment search: the front plot and the Markdown report (sim.search).

``plot_front`` draws every screened deployment at its steady-state estimate (output tokens/s
per user on x, tokens/s per chip on y, log scale; those that miss on the screen by TPOT or
only by TTFT in two greys), the deployments the replay refuted, the
confirmed Pareto front (one marker per hardware profile, joined as a staircase), where the
replay measured each front point (hollow, joined to its estimate) and the chosen point (a
star), with the TPOT target as a floor on the per-user rate. ``write_report`` renders the
search's JSON payload (sim.search.output.payload) as Markdown, with the file's ``notes``.
Both only read what they are given; ``python -m sim.report.search DIR`` redraws both from a
search folder's files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from sim.io import write_atomic, write_with  # noqa: E402
from sim.units import MS_PER_S

MARKERS = ("o", "s", "D", "^", "v", "P", "X", "h")
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
X, Y = "tokens_per_s_per_user", "tokens_per_s_per_chip"


def _ok(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def plot_front(rows: list[dict], front: list[dict], chosen: dict | None, data: dict, path: Path) -> Path:
    """The front figure (module docstring), written atomically to ``path`` (PNG)."""
    hardware = list(data["axes"]["hardware"])
    style = {hw: (MARKERS[i % len(MARKERS)], COLORS[i % len(COLORS)]) for i, hw in enumerate(hardware)}
    fig, ax = plt.subplots(figsize=(12, 6.2))
    screened = [r for r in rows if r.get("status") == "screened" and _ok(r.get(X)) and _ok(r.get(Y))]
    _draw_screened(ax, screened, hardware, style, data["slo"])
    refuted = [r for r in rows if r.get("checked") and r.get("verdict") != "meets-slo"]
    if refuted:
        ax.scatter([r[X] for r in refuted], [r[Y] for r in refuted], marker="x", s=28, color="#c00000", zorder=3,
                   label="replayed: misses the SLOs")
    if front:
        _draw_front(ax, front, style)
    if chosen is not None:
        _draw_chosen(ax, chosen)
    floor = MS_PER_S / data["slo"]["tpot_ms"]
    ax.axvline(floor, color="0.4", ls="--", lw=1)
    ax.text(floor, 1.0, f"  TPOT {data['slo']['tpot_ms']:g} ms", transform=ax.get_xaxis_transform(), va="top",
            fontsize=8, color="0.3")
    for hw in hardware:
        if any(p["hardware"] == hw for p in front):
            marker, color = style[hw]
            ax.scatter([], [], marker=marker, s=60, color=color, edgecolor="black", label=f"front: {hw}")
    _log_y(ax, screened)
    ax.set_xlabel("output tokens/s per user (1000 / TPOT)")
    ax.set_ylabel("output tokens/s per chip")
    ax.set_title(_front_title(data), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), framealpha=0.9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_with(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
    return path


def _log_y(ax, screened: list[dict]) -> None:
    """A log y axis with room above the highest screened point for the legend's corner."""
    if any(_ok(r.get(Y)) for r in screened):
        ax.set_yscale("log")
        top = max(r[Y] for r in screened if _ok(r.get(Y)))
        ax.set_ylim(top=top * 1.8)


def _draw_screened(ax, screened: list[dict], hardware: list[str], style: dict, slo: dict) -> None:
    """The screened deployments: those missing TPOT, those missing only TTFT, and per
    hardware those that meet both on the screen."""
    miss = [r for r in screened if not r.get("screen_ok")]
    slow = [r for r in miss if (r.get("est_tpot_pct_ms") or 0) > slo["tpot_ms"]]
    late = [r for r in miss if (r.get("est_tpot_pct_ms") or 0) <= slo["tpot_ms"]]
    ax.scatter([r[X] for r in slow], [r[Y] for r in slow], s=6, color="#b8b8b8", zorder=1,
               label=f"screen: TPOT p{slo['percentile']} misses")
    ax.scatter([r[X] for r in late], [r[Y] for r in late], s=6, color="#f4cccc", zorder=1,
               label=f"screen: TPOT meets, TTFT p{slo['percentile']} misses")
    for hw in hardware:
        ok = [r for r in screened if r.get("screen_ok") and r["hardware"] == hw]
        if ok:
            ax.scatter([r[X] for r in ok], [r[Y] for r in ok], s=12, color=style[hw][1], alpha=0.6, zorder=2,
                       label=f"{hw}: meets the SLOs on the screen")


def _draw_front(ax, front: list[dict], style: dict) -> None:
    """The Pareto front as a step line, each point with its replayed counterpart."""
    pts = sorted(front, key=lambda r: r[X])
    xs, ys = [p[X] for p in pts], [p[Y] for p in pts]
    ax.step(xs, ys, where="pre", color="black", lw=1.2, zorder=4, label="Pareto front (confirmed by replay)")
    for p in pts:
        marker, color = style[p["hardware"]]
        ax.scatter([p[X]], [p[Y]], marker=marker, s=70, color=color, edgecolor="black", zorder=5)
        rx, ry = p.get("replay_tokens_per_s_per_user"), p.get("replay_tokens_per_s_per_chip")
        if _ok(rx) and _ok(ry):
            ax.plot([p[X], rx], [p[Y], ry], color=color, lw=0.7, ls=":", zorder=4)
            ax.scatter([rx], [ry], marker=marker, s=40, facecolor="none", edgecolor=color, zorder=5)
    ax.scatter([], [], marker="o", s=40, facecolor="none", edgecolor="black", label="the same point as replayed")


def _draw_chosen(ax, chosen: dict) -> None:
    ax.scatter([chosen[X]], [chosen[Y]], marker="*", s=420, color="gold", edgecolor="black", zorder=6,
               label="chosen: most tokens/s per chip")
    ax.annotate("chosen: " + _short(chosen), (chosen[X], chosen[Y]), xytext=(0.98, 0.97),
                textcoords="axes fraction", ha="right", va="top", fontsize=8, zorder=7,
                bbox={"boxstyle": "round", "fc": "white", "ec": "0.6"},
                arrowprops={"arrowstyle": "->", "color": "0.4", "lw": 0.8})


def _front_title(data: dict) -> str:
    slo, traffic = data["slo"], data["traffic"]
    load = (f"{traffic['rate']:g} req/s" if traffic.get("rate") is not None else
            "each deployment at its goodput" if data.get("mode") == "goodput" else
            f"each deployment at {traffic['load']:.0%} of its capacity")
    return (f"{data['model']}: deployments under TTFT p{slo['percentile']} <= {slo['ttft_ms']:g} ms, "
            f"TPOT p{slo['percentile']} <= {slo['tpot_ms']:g} ms\n{data['workload']['requests']}, {load}; "
            f"{data['counts']['deployments']:,} deployments, {data['counts']['front']} on the front")


def _short(p: dict) -> str:
    split = f"tp{p['tp']}" + (f" pp{p['pp']}" if p["pp"] > 1 else "")
    return (f"{p['hardware']} x{p['chips']} {split}\n{p['weights']} weights, {p['kv']} KV, {p['software']}\n"
            f"max_batch {p['max_batch']}, chunk {p['max_tokens_per_step']}")


def _f(v, spec: str) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return format(v, spec)


def write_report(data: dict, path: Path, *, command: str | None = None, notes: str = "",
                 plot: str = "front.png") -> Path:
    """The search's Markdown report (atomic)."""
    slo, c, w, t = data["slo"], data["counts"], data["workload"], data["traffic"]
    pct = slo["percentile"]
    rate = (f"{t['rate']:g} requests/s for every deployment" if t.get("rate") is not None else
            "each deployment at its goodput: the highest rate whose screened percentiles meet the SLOs, the screen "
            "corrected by each finalist's replay until the two agree within 10% on both axes"
            if data.get("mode") == "goodput" else
            f"each deployment at {t['load']:.0%} of the rate its screen says it can carry")
    lines = [f"# Deployment search: {data['model']} on {', '.join(data['axes']['hardware'])}", ""]
    if command:
        lines += ["```", command, "```", ""]
    lines += [
        f"**SLO:** TTFT p{pct} <= {slo['ttft_ms']:g} ms and TPOT p{pct} <= {slo['tpot_ms']:g} ms. "
        f"**Traffic:** {w['description']}; {rate}; each finalist replays the arrivals of "
        f"{t['replay_lifetimes']:g} mean request lifetimes at its screened TPOT (at least {t['replay_requests']} "
        f"requests, "
        f"at most {t['duration_s']:g} s) "
        f"({t['policy']} prefill, KV blocks of {t['block_tokens']} tokens). Mean prompt {w['prompt_mean']:.0f} tokens, "
        f"mean output {w['output_mean']:.0f}, p{pct} prompt {w['prompt_pct']:.0f}, longest request {w['longest']:,}.",
        "",
        "**Space:** " + "; ".join(f"{k} {', '.join(str(v) for v in vals)}" for k, vals in data["axes"].items()) +
        ("" if "chips" in data["axes"] else "; chips: powers of two up to each profile's own") +
        ("" if "tp" in data["axes"] else "; tp x pp: every split of the chips") + ".",
        "",
        f"**Funnel:** {c['deployments']:,} deployments ({c['setups']} step models) -> {c['does_not_fit']:,} do not fit "
        f"(weights + activations + the longest request's KV cache per chip), {c['invalid']:,} cannot run, "
        f"{c['saturated']:,} cannot carry the rate -> {c['screen_ok']:,} meet the SLOs on the analytic screen -> "
        f"{c['replays']} serving replays in {c['rounds']} rounds ({c['replays_failed']} missed the SLOs) -> "
        f"**{c['front']} on the confirmed front**" +
        ("" if data["complete"] else " (PARTIAL: interrupted during the replays)" if data.get("partial")
         else " (incomplete: replay budget spent)") +
        f". Wall time {data['timing']['wall_s']:.1f} s (screen {data['timing']['screen_s']:.1f} s, replays "
        f"{data['timing']['confirm_s']:.1f} s).",
        "",
        f"![front]({plot})",
        "",
        f"| | deployment | req/s | tok/s/chip (screen) | tok/s/user (screen) | tok/s/chip (replay) | "
        f"TTFT p{pct} (ms) | "
        f"TPOT p{pct} (ms) | DES/analytic | bound | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    chosen = data.get("chosen") or {}
    for p in data["front"]:
        mark = "**chosen**" if p["index"] == chosen.get("index") else ""
        lines.append(f"| {mark} | {p['label']} | {_f(p['rate_per_s'], '.3g')} | "
                     f"{_f(p['tokens_per_s_per_chip'], ',.0f')} "
                     f"| {_f(p['tokens_per_s_per_user'], '.1f')} | {_f(p['replay_tokens_per_s_per_chip'], ',.0f')} | "
                     f"{_f(p.get(f'ttft_ms_p{pct}'), ',.0f')} | {_f(p.get(f'tpot_ms_p{pct}'), '.2f')} | "
                     f"{_f(p['des_over_analytic'], '.3f')} | {p.get('bound') or '-'} | {p['verdict']} |")
    if not data["front"]:
        lines.append("| | no deployment meets the SLOs | | | | | | | | | |")
    lines += [
        "",
        "How to read it: a deployment's position is the screen's steady state (sim.search.screen) at the rate shown: "
        "output tokens/s per chip = rate x mean output / chips, per user = 1000 / TPOT. A point is on the front only "
        "if no other deployment that also passes is at least as good on both axes, and the serving replay "
        f"(sim.serve) confirmed its TTFT and TPOT p{pct}; TPOT is scaled by the DES/analytic ratio of one decode step "
        "at the replay's mean batch (1.000: the DES saw no contention). The replayed throughput per chip is the "
        "replay's own: its window's requests (their lengths are not the trace's means) from the first arrival to "
        "the last finish, warm-up and drain included, so it differs from the steady-state figure.",
        "",
    ]
    if notes.strip():
        lines += ["## What the search shows", "", notes.strip(), ""]
    write_atomic(path, "\n".join(lines))
    return Path(path)


def rerender(folder: Path) -> list[Path]:
    """Redraw ``front.png`` and ``report.md`` of a search folder from its ``search.json`` and
    ``deployments.parquet`` (no simulation)."""
    import pandas as pd  # deferred: the search's own plotting path does not need pandas

    folder = Path(folder)
    data = json.loads((folder / "search.json").read_text())
    table = pd.read_parquet(folder / "deployments.parquet")
    rows = [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
            for r in table.to_dict("records")]
    png = plot_front(rows, data["front"], data.get("chosen"), data, folder / "front.png")
    md = write_report(data, folder / "report.md", command=data.get("command"), notes=data.get("notes", ""))
    return [png, md]


if __name__ == "__main__":
    import sys

    for arg in sys.argv[1:]:
        for written in rerender(Path(arg)):
            print(written)


__all__ = ["plot_front", "rerender", "write_report"]
