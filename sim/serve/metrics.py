"""Serving metrics: latency percentiles, throughput, batch, KV occupancy and the verdict.

Definitions (as vLLM's serving benchmark reports them):

* TTFT, time to first token: first token sampled - arrival (queueing and prefill included);
* TPOT, time per output token: (finish - first token) / (output tokens - 1), per request
  (requests with one output token have none);
* ITL, inter-token latency: the gap between consecutive output tokens of a request, one
  sample per output token after the first (a preempted request's recompute lands in one gap);
* end-to-end latency (E2EL, ``e2e_ms``): finish - arrival;
* each of TTFT, TPOT, ITL, E2EL and the step time is reported as ``_mean``, ``_std`` (population)
  and the percentiles ``_p50`` (the median), ``_p90``, ``_p99``, in milliseconds;
* offered rate (``rate_per_s``): the requests that arrived in the replayed arrival window
  divided by its length (``window_s``: the ``duration_s`` asked, else the span from the
  first to the last arrival, counting ``arrivals - 1`` gaps); a replay stopped early counts
  the arrivals up to the stop over the time to the stop. ``nominal_rate_per_s`` (the
  source's mean rate: the Poisson parameter, or a trace's native rate x the scale) is kept
  beside it;
* throughput: output tokens (``throughput_tokens_per_s``), prompt + output tokens
  (``total_tokens_per_s``) and finished requests (``throughput_req_per_s``, the achieved
  rate) per second of the window from the first arrival to the last finish (to the stop, for a
  partial replay);
* goodput, as vLLM's ``--goodput``: the requests that met the SLOs (TPOT <= ``target_ms``
  and, when given, TTFT <= ``ttft_target_ms``; a one-token request has no TPOT and meets that
  part) per second of the same window (``goodput_req_per_s``), and their output tokens
  (``goodput_tokens_per_s``);
* per-step figures are time-weighted (each step counts for its duration; idle gaps count as
  zero batch and zero occupancy); ``mean_batch_per_step`` is the plain mean over steps;
* ``mean_in_system``: time-average number of requests arrived and not finished (running or
  waiting), from the per-step rows; Little's law says it equals
  ``throughput_req_per_s x mean_e2e_s`` (tests hold them within 2%).

The verdict: ``meets-target`` when the p99 TPOT is at most ``target_ms`` at this request
rate, else ``misses-target``. Memory: three floats per finished request and one per step
(for the percentiles); everything else is running sums.
"""

from __future__ import annotations

import math
from array import array

import numpy as np

from sim.units import ms_to_s, ns_to_ms, ns_to_s

PERCENTILES = (50, 90, 99)


class Metrics:
    """Running sums over the replay's steps and finished requests."""

    def __init__(self, target_ms: float, ttft_target_ms: float | None = None):
        self.target_ms = target_ms
        self.ttft_target_ms = ttft_target_ms
        self.good_requests = self.good_tokens = 0
        self.itl_ms = array("f")
        self.ttft_ms = array("d")
        self.tpot_ms = array("d")
        self.e2e_ms = array("d")
        self.step_ms = array("f")
        self.first_arrival_ns: int | None = None
        self.last_arrival_ns = 0
        self.arrivals = 0
        self.last_finish_ns = 0
        self.requests_done = self.rejected = self.preemptions = self.recomputed_tokens = 0
        self.output_tokens = self.prompt_tokens = 0
        self.steps = self.batch_sum = self.max_batch = self.max_waiting = 0
        self.busy_ns = self.batch_ns = self.in_system_ns = self.waiting_ns = self.occupancy_ns = 0.0
        self.max_occupancy = 0.0
        self.prefill_tokens = self.sampled_tokens = 0

    def arrived(self, arrival_ns: int) -> None:
        if self.first_arrival_ns is None:
            self.first_arrival_ns = arrival_ns
        self.last_arrival_ns = arrival_ns
        self.arrivals += 1

    def offered_rate(self, window_s: float | None, stopped_s: float | None) -> float:
        """Requests per second that arrived in the replayed window (see the module docstring)."""
        if stopped_s is not None:
            span = min(stopped_s, window_s) if window_s else stopped_s
            return self.arrivals / span if span > 0 else math.nan
        if window_s:
            return self.arrivals / window_s
        span_s = ns_to_s(self.last_arrival_ns - (self.first_arrival_ns or 0))
        return (self.arrivals - 1) / span_s if self.arrivals > 1 and span_s > 0 else math.nan

    def step(self, dt_ns: int, batch: int, in_system: int, waiting: int, occupancy: float, prefill_tokens: int,
             sampled: int, itl_ns=()) -> None:
        self.steps += 1
        if itl_ns:
            self.itl_ms.extend([ns_to_ms(gap) for gap in itl_ns])
        self.step_ms.append(ns_to_ms(dt_ns))
        self.busy_ns += dt_ns
        self.batch_sum += batch
        self.batch_ns += batch * dt_ns
        self.in_system_ns += in_system * dt_ns
        self.waiting_ns += waiting * dt_ns
        self.occupancy_ns += occupancy * dt_ns
        self.max_batch = max(self.max_batch, batch)
        self.max_waiting = max(self.max_waiting, waiting)
        self.max_occupancy = max(self.max_occupancy, occupancy)
        self.prefill_tokens += prefill_tokens
        self.sampled_tokens += sampled

    def finished(self, seq) -> None:
        self.requests_done += 1
        self.output_tokens += seq.output
        self.prompt_tokens += seq.prompt
        self.preemptions += seq.preemptions
        self.recomputed_tokens += seq.recomputed_tokens
        self.last_finish_ns = max(self.last_finish_ns, seq.finish_ns)
        ttft = ns_to_ms(seq.first_token_ns - seq.arrival_ns)
        self.ttft_ms.append(ttft)
        self.e2e_ms.append(ns_to_ms(seq.finish_ns - seq.arrival_ns))
        tpot = 0.0
        if seq.output > 1:
            tpot = ns_to_ms(seq.finish_ns - seq.first_token_ns) / (seq.output - 1)
            self.tpot_ms.append(tpot)
        if tpot <= self.target_ms and (self.ttft_target_ms is None or ttft <= self.ttft_target_ms):
            self.good_requests += 1
            self.good_tokens += seq.output

    def summary(self, window_s: float | None = None, stopped_ns: int | None = None) -> dict:
        """The replay's figures (see the module docstring). ``window_s``: the arrival window
        replayed; ``stopped_ns``: where a replay stopped early ended (ns after the first arrival)."""
        stopped_s = None if stopped_ns is None else ns_to_s(stopped_ns)
        end_ns = self.last_finish_ns - (self.first_arrival_ns or 0)
        window_ns = max(1, end_ns if stopped_ns is None else max(stopped_ns, end_ns))
        out = {"partial": stopped_ns is not None, "stopped_at_s": stopped_s,
               "arrivals": self.arrivals, "window_s": window_s,
               "rate_per_s": self.offered_rate(window_s, stopped_s),
               "requests_done": self.requests_done, "requests_rejected": self.rejected, "steps": self.steps,
               "simulated_s": ns_to_s(window_ns), "busy_fraction": self.busy_ns / window_ns}
        window_s = ns_to_s(window_ns)
        for name, values in (("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms), ("itl_ms", self.itl_ms),
                             ("e2e_ms", self.e2e_ms), ("step_ms", self.step_ms)):
            out.update(_percentiles(name, values))
        mean_e2e_s = ms_to_s(sum(self.e2e_ms) / len(self.e2e_ms)) if self.e2e_ms else math.nan
        out.update({
            "throughput_tokens_per_s": self.output_tokens / window_s,
            "prefill_tokens_per_s": self.prefill_tokens / window_s,
            "throughput_req_per_s": self.requests_done / window_s,
            "total_tokens_per_s": (self.prompt_tokens + self.output_tokens) / window_s,
            "goodput_req_per_s": self.good_requests / window_s, "goodput_tokens_per_s": self.good_tokens / window_s,
            "ttft_target_ms": self.ttft_target_ms,
            "output_tokens": self.output_tokens, "prompt_tokens": self.prompt_tokens,
            "sampled_tokens": self.sampled_tokens, "prefill_tokens": self.prefill_tokens,
            "mean_batch": self.batch_ns / window_ns, "mean_batch_busy": self.batch_ns / max(1.0, self.busy_ns),
            "mean_batch_per_step": self.batch_sum / max(1, self.steps), "max_batch_seen": self.max_batch,
            "mean_waiting": self.waiting_ns / window_ns, "max_waiting": self.max_waiting,
            "mean_in_system": self.in_system_ns / window_ns, "mean_e2e_s": mean_e2e_s,
            "mean_kv_occupancy": self.occupancy_ns / window_ns, "max_kv_occupancy": self.max_occupancy,
            "preemptions": self.preemptions, "recomputed_tokens": self.recomputed_tokens,
            "target_ms": self.target_ms,
        })
        p99 = out["tpot_ms_p99"]
        meets = bool(p99 <= self.target_ms) if math.isfinite(p99) else False
        out.update({"meets_target": meets, "verdict": "meets-target" if meets else "misses-target"})
        return out


def _percentiles(name: str, values) -> dict:
    if not len(values):
        return {f"{name}_p{q}": math.nan for q in PERCENTILES} | {f"{name}_mean": math.nan, f"{name}_std": math.nan}
    data = np.frombuffer(values, dtype=np.float64 if values.typecode == "d" else np.float32)
    result = {f"{name}_p{q}": float(np.percentile(data, q)) for q in PERCENTILES}
    result[f"{name}_mean"] = float(data.mean(dtype=np.float64))
    result[f"{name}_std"] = float(data.std(dtype=np.float64))
    return result


def crossing_rate(rates, values, target: float) -> dict:
    """Where ``values`` (e.g. p99 TPOT, non-decreasing in rate, NaN allowed) first exceeds
    ``target`` along ``rates``: the bracketing rates and a linear interpolation between them,
    or ``below``/``above`` when the target is crossed before the first or never."""
    pairs = sorted((r, v) for r, v in zip(rates, values, strict=True) if v is not None and math.isfinite(v))
    if not pairs:
        return {"kind": "none"}
    if pairs[0][1] > target:
        return {"kind": "below", "rate": pairs[0][0]}
    for (r0, v0), (r1, v1) in zip(pairs, pairs[1:], strict=False):
        if v0 <= target < v1:
            return {"kind": "between", "low": r0, "high": r1,
                    "rate": r0 + (target - v0) * (r1 - r0) / (v1 - v0)}
    return {"kind": "above", "rate": pairs[-1][0]}


__all__ = ["Metrics", "crossing_rate", "PERCENTILES"]
