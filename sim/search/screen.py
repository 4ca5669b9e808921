"""Screening: fit, then the steady state of every deployment on the analytic step model.

For one setup (hardware, chips, tp x pp, formats, stack: everything the step model depends
on) and all its ``(max_batch, max_tokens_per_step)`` pairs:

1. **Fit, before anything is timed.** The KV pool of a chip is the backing store's capacity
   minus the weights and the activations of the largest step (``max(max_tokens_per_step,
   max_batch)`` rows), as ``sim.serve.spec.build`` sizes it from ``sim.run.capacity``. A
   deployment fits when the pool holds the longest request of the traffic alone (else the
   replay would reject it); formats whose groups do not divide a row width do not run at
   this split (``sim.formats.base.check_widths``).
2. **The steady-state step** ``T(b)``: one step of the serving step model
   (sim.serve.stepmodel.SimulatorStepModel, the analytic model on the lowered op graph) that
   decodes ``b`` sequences at the traffic's mean decode context and computes the prompt
   tokens that keep them replaced, ``b x mean prompt / mean output``, in prompt-sized
   chunks. ``T`` is evaluated exactly at ``b = 1, 2, 4, ...`` (memoised per setup: one full
   lowering per new row count, shared by every pair and, in-process, by the replays) and
   interpolated linearly between.
3. **The operating point.** At arrival rate ``R`` (req/s) and mean output ``O``, Little's
   law for the decoding sequences gives ``b = R x O x T(b)``: the smallest root in
   ``[1, b_limit]`` is the steady batch, where ``b_limit`` is the least of ``max_batch``,
   the chunk budget (``b (1 + prompt/output) <= max_tokens_per_step``) and the sequences the
   KV pool holds at the mean context. No root: the deployment cannot carry ``R``
   (``saturated``). Without a rate the deployment runs at ``load x`` its capacity
   ``R_max = b_limit / (O T(b_limit))``.
4. **Estimates.** TPOT = ``T(b*)``; TTFT = (steps to compute the SLO-percentile prompt at
   ``max_tokens_per_step - b*`` tokens per step, plus one) x the step time with that chunk;
   throughput per chip = ``R O / chips`` output tokens/s; per-user rate = 1000 / TPOT.

The estimates rank deployments and pick the finalists; the serving replay
(sim.search.verify) decides whether a finalist meets its SLOs.
"""

from __future__ import annotations

import dataclasses
import math

from sim import trace as traces
from sim.config.setup import Setup
from sim.config.spec import RunSpec
from sim.errors import ConfigError, SimulationError
from sim.formats.base import check_widths
from sim.run import capacity
from sim.search.space import Deployment
from sim.search.workload import Workload
from sim.serve.stepmodel import SimulatorStepModel, serve_resolved
from sim.units import GB

MAX_ANCHOR = 1 << 20  # batch anchors stop here (a guard; b_limit is far below it in practice)


def run_spec(d: Deployment, model: str, overrides: tuple, **fields) -> RunSpec:
    """The RunSpec of a deployment's step model (analytic engine unless ``fields`` say)."""
    data = dict(hardware=d.hardware, model=model, weights=d.weights, kv=d.kv, software=d.software, tp=d.tp,
                pp=d.pp, chips=d.chips, overrides=overrides, engine="analytic", batch=1, context=1, steps=1)
    data.update(fields)
    return RunSpec.model_validate(data)


class SteadyStep:
    """``T(b)`` of the module docstring, in ns: exact at powers of two, linear between."""

    def __init__(self, step_model, work: Workload):
        self.step_model = step_model
        self.context = work.decode_context
        self.ratio = work.prefill_per_decode
        self.prompt = max(1, round(work.prompt_mean))
        self._exact: dict[int, float] = {}

    def exact(self, b: int) -> float:
        """The step time of ``b`` decodes and their share of prompt tokens (memoised)."""
        t = self._exact.get(b)
        if t is None:
            tokens = round(b * self.ratio)
            chunks = [self.prompt] * (tokens // self.prompt) + ([tokens % self.prompt] if tokens % self.prompt else [])
            t = self._exact[b] = float(self.step_model.step_ns((self.context,) * b, tuple((n, 0) for n in chunks)))
        return t

    def __call__(self, b: float) -> float:
        if b <= 1:
            return self.exact(1)
        lo = 1 << (int(b).bit_length() - 1)
        if lo == b or lo >= MAX_ANCHOR:
            return self.exact(int(lo))
        hi = lo * 2
        t_lo, t_hi = self.exact(lo), self.exact(hi)
        return t_lo + (t_hi - t_lo) * (b - lo) / (hi - lo)

    @property
    def evaluations(self) -> int:
        return len(self._exact)


def steady_batch(T, rate: float, output_mean: float, limit: float) -> float | None:
    """The smallest ``b`` in [1, limit] with ``rate x output x T(b) <= b`` (T in ns), or None."""
    def g(b: float) -> float:
        return rate * output_mean * T(b) / 1e9 - b

    if g(1.0) <= 0:
        return 1.0
    points = [1.0]
    a = 2.0
    while a < limit:
        points.append(a)
        a *= 2
    points.append(float(limit))
    for lo, hi in zip(points, points[1:], strict=False):
        g_lo, g_hi = g(lo), g(hi)
        if g_hi <= 0:
            return lo + g_lo * (hi - lo) / (g_lo - g_hi)
    return None


class SetupScreen:
    """One setup resolved, its fit figures and (lazily) its step model."""

    def __init__(self, d: Deployment, model: str, overrides: tuple, work: Workload, block_tokens: int):
        self.work = work
        self.block_tokens = block_tokens
        self.problem: str | None = None
        self.status = "screened"
        self._caps: dict[int, dict] = {}
        self._steady: SteadyStep | None = None
        self._step_model = None
        try:
            self.resolved: Setup | None = serve_resolved(run_spec(d, model, overrides))
        except (ConfigError, SimulationError) as err:
            self.resolved, self.status, self.problem = None, "invalid", str(err)
            return
        res, m = self.resolved, self.resolved.model
        try:
            check_widths(res.kv, res.weights, res.k_width, res.v_width, (m.hidden, res.q_width, -(-m.ffn // res.tp)))
        except ConfigError as err:
            self.status, self.problem = "invalid", f"formats do not fit the rows at tp {res.tp}: {err}"
        if res.model.max_context < work.longest:
            self.status = "does-not-fit"
            self.problem = (f"the longest request holds {work.longest:,} tokens, beyond {m.name}'s max_context "
                            f"{m.max_context:,}")

    def footprint(self, tokens: int) -> int:
        """KV bytes of one sequence of ``tokens`` tokens on the fullest chip, in whole blocks."""
        res = self.resolved
        blocks = -(-tokens // self.block_tokens)
        return res.kv.kv_footprint(blocks * self.block_tokens, res.k_width, res.v_width) * res.layers_per_stage

    def capacity(self, rows: int) -> dict:
        cap = self._caps.get(rows)
        if cap is None:
            cap = self._caps[rows] = capacity(dataclasses.replace(self.resolved, steps=tuple(traces.fixed(rows, 1, 1))))
        return cap

    @property
    def step_model(self):
        if self._step_model is None:
            self._step_model = SimulatorStepModel(self.resolved)
        return self._step_model

    @property
    def steady(self) -> SteadyStep:
        if self._steady is None:
            self._steady = SteadyStep(self.step_model, self.work)
        return self._steady


def screen(setup: SetupScreen, d: Deployment, *, rate: float | None, load: float, slo: dict) -> dict:
    """The screening row of deployment ``d`` of ``setup`` (module docstring)."""
    row: dict = {**d.as_dict(), "status": setup.status, "reason": setup.problem}
    if setup.status != "screened":
        return row
    work = setup.work
    cap = setup.capacity(max(d.max_tokens_per_step, d.max_batch))
    pool = cap["available_bytes"] - cap["weights_bytes"] - cap["activation_bytes"]
    row.update(weights_GB_per_chip=cap["weights_bytes"] / GB, kv_pool_GB_per_chip=max(0, pool) / GB)
    longest = setup.footprint(work.longest)
    if pool < longest:
        what = ("no memory is left for the KV cache" if pool <= 0 else
                f"the KV pool ({pool / GB:.2f} GB) cannot hold the longest request ({work.longest:,} tokens, "
                f"{longest / GB:.2f} GB)")
        row.update(status="does-not-fit", reason=f"{what}: weights {cap['weights_bytes'] / GB:.1f} GB + "
                   f"activations {cap['activation_bytes'] / GB:.2f} GB of {cap['available_bytes'] / GB:.1f} GB per chip")
        return row
    limits = {"max_batch": d.max_batch,
              "chunk": math.floor(d.max_tokens_per_step / (1 + work.prefill_per_decode)),
              "kv": pool // setup.footprint(work.decode_context)}
    bound = min(limits, key=lambda k: (limits[k], k))
    b_limit = limits[bound]
    row.update(batch_limit=int(b_limit), batch_limit_by=bound)
    if b_limit < 1:
        row.update(status="saturated", reason=f"the {bound} limit leaves no room for one decoding sequence "
                   "with its share of prompt tokens")
        return row
    T = setup.steady
    capacity_rate = b_limit * 1e9 / (work.output_mean * T(b_limit))
    operating = rate if rate is not None else load * capacity_rate
    row.update(capacity_rate_per_s=capacity_rate, rate_per_s=operating)
    b = steady_batch(T, operating, work.output_mean, b_limit)
    if b is None:
        row.update(status="saturated", reason=f"cannot carry {operating:.3g} req/s: at most {capacity_rate:.3g} "
                   f"(batch limit {b_limit} set by {bound})")
        return row
    tpot_ns = T(b)
    chunk = max(1.0, min(work.prompt_pct, d.max_tokens_per_step - b))
    ttft_ns = (math.ceil(work.prompt_pct / chunk) + 1) * T(max(b, (b + chunk) / (1 + work.prefill_per_decode)))
    row.update(est_batch=b, est_tpot_ms=tpot_ns / 1e6, est_ttft_ms=ttft_ns / 1e6,
               tokens_per_s_per_chip=operating * work.output_mean / d.chips, tokens_per_s_per_user=1e9 / tpot_ns)
    row["screen_ok"] = bool(row["est_tpot_ms"] <= slo["tpot_ms"] and row["est_ttft_ms"] <= slo["ttft_ms"])
    return row


__all__ = ["SetupScreen", "SteadyStep", "run_spec", "screen", "steady_batch"]
