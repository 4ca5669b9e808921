"""Confirming a finalist: the serving replay at its operating rate, and a DES step.

The replay (sim.serve.replay.serve) runs the traffic's first arrivals (``replay_window``:
several request lifetimes, so that the batch reaches its steady state) at the
finalist's operating rate (the search's rate, ``load`` x the deployment's screened
capacity, or in a goodput search each rate sim.search.runner.confirm_goodput tries) through the vLLM-like scheduler with the deployment's ``max_batch`` and chunk
budget, on the same step model the screen used (shared in-process, so the rows it learned
are not lowered again). It measures the SLO percentile of TTFT and TPOT, throughput,
preemptions and rejections.

The replay's step model is the contention-free analytic model. To see what contention
adds, one decode step at the replay's mean batch and the traffic's mean decode context is
run on the discrete-event engine and on the analytic model (``sim.run.simulate``); the
ratio (>= 1 when the DES sees contention) scales the replay's TPOT percentile before it is
held against the target, and the DES step's bound (which resource bounds it) is reported.

A finalist meets its SLOs when no request was rejected, TTFT pXX <= the TTFT target and
TPOT pXX x max(1, DES / analytic) <= the TPOT target.
"""

from __future__ import annotations

import math
import time

from sim.errors import ConfigError, SimulationError
from sim.run import simulate
from sim.search.screen import run_spec
from sim.search.space import Deployment
from sim.search.workload import Workload, replay_window
from sim.serve.replay import serve
from sim.serve.spec import ServeSpec, build
from sim.units import MS_PER_S


def verify(d: Deployment, model: str, overrides: tuple, rate: float, work: Workload, slo: dict, traffic: dict,
           step_model=None, tpot_ms: float = 0.0) -> dict:
    """The replay and DES figures of finalist ``d`` at ``rate`` req/s, and its verdict."""
    wall = time.perf_counter()
    pct = slo["percentile"]
    spec = ServeSpec(hardware=d.hardware, model=model, weights=d.weights, kv=d.kv, software=d.software, tp=d.tp,
                     pp=d.pp, chips=d.chips, overrides=overrides, requests=traffic["requests"],
                     **replay_window(traffic, rate, work, tpot_ms), seed=traffic["seed"],
                     max_batch=d.max_batch,
                     block_tokens=traffic["block_tokens"], max_tokens_per_step=d.max_tokens_per_step,
                     policy=traffic["policy"], target_ms=slo["tpot_ms"], ttft_target_ms=slo["ttft_ms"])
    try:
        setup = build(spec)
        summary = serve(setup, step_model=step_model)
    except (ConfigError, SimulationError) as err:
        return {"verdict": "error", "verdict_reason": str(err), "replay_wall_s": time.perf_counter() - wall}
    batch = max(1, round(summary["mean_batch_busy"])) if math.isfinite(summary["mean_batch_busy"]) else 1
    des = simulate(run_spec(d, model, overrides, engine="des", batch=batch, context=work.decode_context),
                   check_capacity=False)
    ana = simulate(run_spec(d, model, overrides, engine="analytic", batch=batch, context=work.decode_context),
                   check_capacity=False)
    ratio = des.summary["per_token_ms_p50"] / ana.summary["per_token_ms_p50"]
    ttft, tpot = summary[f"ttft_ms_p{pct}"], summary[f"tpot_ms_p{pct}"]
    row = {
        "replay_duration_s": spec.duration_s, "replay_rate_per_s": rate, "replay_requests": summary["requests_done"],
        "replay_rejected": summary["requests_rejected"], "replay_steps": summary["steps"],
        f"ttft_ms_p{pct}": ttft, f"tpot_ms_p{pct}": tpot, "tpot_ms_mean": summary["tpot_ms_mean"],
        "ttft_ms_mean": summary["ttft_ms_mean"], "replay_mean_batch": summary["mean_batch_busy"],
        "replay_preemptions": summary["preemptions"],
        "replay_tokens_per_s_per_chip": summary["throughput_tokens_per_s"] / d.chips,
        # goodput over the arrival window: the good output tokens of the requests that arrived in
        # it, per second of it (the steady state the screen estimates; the drain after it excluded)
        "replay_goodput_tokens_per_s_per_chip": summary["goodput_tokens_per_s"] * summary["simulated_s"]
        / spec.duration_s / d.chips,
        "replay_tokens_per_s_per_user": MS_PER_S / summary["tpot_ms_mean"] if summary["tpot_ms_mean"] > 0 else math.nan,
        "des_step_ms": des.summary["per_token_ms_p50"], "analytic_step_ms": ana.summary["per_token_ms_p50"],
        "des_over_analytic": ratio, "bound": des.summary["bound"],
        "step_model_exact": summary.get("step_model", {}).get("exact"),
    }
    reasons = []
    if summary["requests_rejected"]:
        reasons.append(f"{summary['requests_rejected']} requests rejected")
    if not ttft <= slo["ttft_ms"]:
        reasons.append(f"TTFT p{pct} {ttft:,.1f} ms > {slo['ttft_ms']:g} ms")
    claimed = tpot * max(1.0, ratio)
    if not claimed <= slo["tpot_ms"]:
        reasons.append(f"TPOT p{pct} {claimed:,.2f} ms > {slo['tpot_ms']:g} ms")
    row.update(tpot_ms_claimed=claimed, verdict="meets-slo" if not reasons else "misses-slo",
               verdict_reason="; ".join(reasons) or None, replay_wall_s=time.perf_counter() - wall)
    return row


__all__ = ["verify"]
