"""Screening: fit, then the steady state of every deployment on the analytic step model.

For one setup (hardware, chips, tp x pp, formats, stack: everything the step model depends
on) and all its ``(max_batch, max_tokens_per_step)`` pairs:

1. **Fit, before anything is timed.** The KV pool of a chip is the backing store's capacity
   minus the weights and the activations of the largest step (``max(max_tokens_per_step,
   max_batch)`` rows), as ``sim.serve.spec.build`` sizes it from ``sim.run.capacity``. A
   deployment fits when the pool holds the longest request of the traffic alone (else the
   replay would reject it); formats whose groups do not divide a row width do not run at
   this split (``sim.formats.base.check_widths``).
2. **The steady-state step** ``T(b)`` (``SteadyStep``): the mean step of ``b`` decodes at
   the traffic's mean decode context when they need ``b x mean prompt / mean output``
   prompt tokens per step, which arrive as chunks of ``min(budget - b, mean prompt)`` tokens
   in a share of the steps. Step times come from the serving step model's decomposition
   (fixed + body(rows) + tail(logit rows) + attention; sim.serve.stepmodel.SimulatorStepModel,
   which checks it against full lowerings): body and tail exact at the ``ANCHORS`` row counts
   (memoised per setup: one full lowering per anchor, shared by every pair) and linear
   between and beyond, attention exact.
3. **The operating point.** At arrival rate ``R`` (req/s) and mean output ``O``, Little's
   law for the decoding sequences gives ``b = R x O x T(b)``: the smallest root in
   ``[1, b_limit]`` is the steady batch, where ``b_limit`` is the least of ``max_batch``,
   the chunk budget (``b (1 + prompt/output) <= max_tokens_per_step``) and the sequences the
   KV pool holds at the mean context. No root: the deployment cannot carry ``R``
   (``saturated``). With a ``load`` and no rate the deployment runs at ``load x`` its
   capacity ``R_max = b_limit / (O T(b_limit))``. With neither (the goodput search) it runs
   at the highest rate whose estimates (step 4, with the TPOT tail widened by the runs of
   chunk-carrying steps a long prompt makes, ``chunk_clustering``) meet the SLOs: a geometric
   bisection between
   ``GOODPUT_FLOOR x R_max`` and ``R_max`` (the estimates grow with the rate); its
   throughput per chip is then its goodput, from the mean output of the requests the replay
   at that rate sees. sim.search.runner confirms it by replay and holds screen and replay to
   agree within 10% on both axes of the front.
4. **Estimates.** TPOT = ``T(b*)``, and its SLO percentile from the spread of the batch
   and of the share of steps that carry a prompt chunk (``tpot_percentile_ns``). TTFT: the
   requests a finalist's replay would see (``sim.search.workload.replay_window``: the same
   window of the trace at the same rate, so its bursts and long requests count) admitted
   first come first served to ``b_limit`` sequence slots, each prefilling its prompt in
   chunks of ``max_tokens_per_step - b*`` tokens and then holding its slot for its output
   at TPOT (``queue_ttft_ns``); the SLO percentile of wait + prefill. Throughput per chip =
   ``R O / chips`` output tokens/s; per-user rate = 1000 / TPOT. A deployment passes the
   screen when the TPOT and TTFT percentiles meet the targets.

The estimates rank deployments and pick the finalists; the serving replay
(sim.search.verify) decides whether a finalist meets its SLOs.
"""

from __future__ import annotations

import dataclasses
import heapq
import math

import numpy as np

from sim import decode_trace as traces
from sim.config.spec import RunSpec
from sim.errors import ConfigError, SimulationError
from sim.formats.base import check_widths
from sim.run import capacity, kv_bytes, kv_pool_bytes
from sim.search.space import Deployment
from sim.search.workload import Workload, replay_window, window_requests
from sim.serve.stepmodel import SimulatorStepModel, serve_resolved
from sim.setup import RunSetup
from sim.units import GB, NS_PER_S, ns_to_ms, s_to_ns

MAX_ANCHOR = 1 << 20  # row anchors stop here (a guard; steps are far smaller in practice)
# Row counts at which a setup's step parts are evaluated exactly. Below 64 rows a step is flat
# (weights dominate), so 8 and 32 are skipped; measured for llama-3-70b on h200-sxm x8/x4 and
# b200 (fp8, bf16, int4-g128): linear interpolation between these is within 0.1% of exact
# except near the kink where compute starts to bind (<= 10% at 256 rows when 128 and 512
# alone are used, hence every power of two from 64 to 2048).
ANCHORS = (1, 2, 4, 16, 64, 128, 256, 512, 1024, 2048)
CHUNK_GRAIN = 32  # prompt chunks are timed at sizes rounded up to this many tokens


def _between(a: tuple, b: tuple, w: float) -> tuple[float, float, float]:
    return a[0], a[1] + (b[1] - a[1]) * w, a[2] + (b[2] - a[2]) * w


def _linear(x: float, y: float, z: float, tol: float = 0.02) -> bool:
    """Whether x, y, z at rows n, 2n, 4n lie on one line (equal slopes within ``tol``)."""
    first, second = (y - x), (z - y) / 2
    return math.isclose(first, second, rel_tol=tol, abs_tol=1e-3 * max(abs(z), 1.0))


def run_spec(d: Deployment, model: str, overrides: tuple, **fields) -> RunSpec:
    """The RunSpec of a deployment's step model (analytic engine unless ``fields`` say)."""
    data = dict(hardware=d.hardware, model=model, weights=d.weights, kv=d.kv, software=d.software, tp=d.tp,
                pp=d.pp, chips=d.chips, overrides=overrides, engine="analytic", batch=1, context=1, steps=1)
    data.update(d.run_fields())  # expert parallelism and attention data-parallel groups, where it has them
    data.update(fields)
    return RunSpec.model_validate(data)


class SteadyStep:
    """Step times of a setup's steady state, in ns (module docstring, step 2).

    ``step_ns(b, s)``: a step of ``b`` decodes at the mean decode context and one prompt chunk
    of ``s`` tokens (after half the rest of a mean prompt): the step model's fixed part,
    body and tail (sim.serve.stepmodel.SimulatorStepModel: exact at row counts 1, 2, 4, ...,
    linear between) plus its attention ops (exact, memoised by whole ``b`` and ``s``).
    ``mean_ns(b, budget)``: the mean step when ``b`` decodes need ``b x prompt / output``
    prompt tokens per step and a step carries at most ``budget`` tokens: a fraction of the
    steps carries a chunk of ``min(budget - b, mean prompt)`` tokens (or all the prompt tokens
    when they are more), the rest decode only; step time is convex in the rows (flat while
    the weights dominate), so this mean is longer than the step of the mean mix. Where the
    step is not a chain of ops (eager launches) whole steps are evaluated instead (slower)."""

    def __init__(self, chain, work: Workload):
        self.chain = chain
        self.context = work.decode_context
        self.ratio = work.prefill_per_decode
        self.prompt = max(1.0, work.prompt_mean)
        self._dec: dict[int, float] = {}
        self._pre: dict[int, float] = {}
        self._whole: dict[tuple[int, int], float] = {}

    def _rows(self, rows: float) -> tuple[float, float, float]:
        """(fixed, body, tail) at ``rows`` token rows: exact at the ``ANCHORS``, linear between,
        and beyond the last anchor linear on the slope of the last two when that slope is the
        one before it too (compute-bound: the ops grow in proportion to the rows), else exact
        at doubling row counts."""
        parts = self.chain.parts_ns
        if rows <= 1:
            return parts(1)
        hi = next((a for a in ANCHORS if a >= rows), None)
        if hi is not None:
            lo = ANCHORS[ANCHORS.index(hi) - 1]
            if hi == rows:
                return parts(hi)
            return _between(parts(lo), parts(hi), (rows - lo) / (hi - lo))
        a, b, c = parts(ANCHORS[-3]), parts(ANCHORS[-2]), parts(ANCHORS[-1])
        last = ANCHORS[-1]
        if all(_linear(x, y, z) for x, y, z in zip(a[1:], b[1:], c[1:], strict=True)):
            return _between(b, c, (rows - ANCHORS[-2]) / (last - ANCHORS[-2]))
        lo = last
        while lo * 2 < rows and lo < MAX_ANCHOR:
            lo *= 2
        return _between(parts(lo), parts(lo * 2), (rows - lo) / lo)

    def _attention_dec(self, n: int) -> float:
        t = self._dec.get(n)
        if t is None:
            t = self._dec[n] = self.chain.attention_ns((self.context,) * n) if n else 0.0
        return t

    def _attention_pre(self, n: int) -> float:
        t = self._pre.get(n)
        if t is None:
            before = max(0, round((self.prompt - n) / 2))
            t = self._pre[n] = self.chain.attention_ns((), ((n, before),)) if n else 0.0
        return t

    def step_ns(self, b: float, s: float = 0.0) -> float:
        """One step: ``b`` decodes (>= 1) and a prompt chunk of ``s`` tokens."""
        n, m = max(1, round(b)), round(s)
        if self.chain.exact:
            key = (n, m)
            if key not in self._whole:
                before = max(0, round((self.prompt - m) / 2))
                self._whole[key] = self.chain.step_ns((self.context,) * n, ((m, before),) if m else ())
            return self._whole[key]
        fixed, body, _ = self._rows(b + s)
        tail = self._rows(b + (1 if m else 0))[2]
        lo = math.floor(b)
        dec = self._attention_dec(max(1, lo))
        if b > lo >= 1:
            dec += (self._attention_dec(lo + 1) - dec) * (b - lo)
        return fixed + body + tail + dec + self._attention_pre(m)

    def mean_ns(self, b: float, budget: int) -> float:
        """The mean steady step at ``b`` decodes under a ``budget`` of tokens per step."""
        tokens = b * self.ratio
        chunk = max(tokens, min(budget - b, self.prompt))
        if chunk < 1:
            return self.step_ns(b)
        share = min(1.0, tokens / chunk)
        return (1 - share) * self.step_ns(b) + share * self.step_ns(b, chunk)

    @property
    def evaluations(self) -> int:
        return self.chain.stats["exact_evaluations"]


def steady_batch(T, rate: float, output_mean: float, limit: float, iterations: int = 24) -> float | None:
    """The smallest ``b`` in [1, limit] with ``rate x output x T(b) <= b`` (T in ns; the first
    sign change over 1, 2, 4, ..., limit, then bisection), or None."""
    def g(b: float) -> float:
        return rate * output_mean * T(b) / NS_PER_S - b

    if g(1.0) <= 0:
        return 1.0
    points = [1.0]
    a = 2.0
    while a < limit:
        points.append(a)
        a *= 2
    points.append(float(limit))
    for lo, hi in zip(points, points[1:], strict=False):
        if g(hi) <= 0:
            for _ in range(iterations):
                mid = (lo + hi) / 2
                if g(mid) <= 0:
                    hi = mid
                else:
                    lo = mid
            return hi
    return None


Z = {50: 0.0, 90: 1.2816, 99: 2.3263}  # standard normal quantiles


def tpot_percentile_ns(steady: SteadyStep, b: float, budget: int, limit: int, work: Workload, percentile: int,
                       clustering: float = 1.0) -> float:
    """The SLO percentile of per-request TPOT, estimated from two sources of spread: the
    batch (Poisson-like: ``b + z sqrt(b)``, at most the batch limit) and, for a short request
    (the 10th percentile output), how many of its steps carry a prompt chunk (binomial over
    its steps: a share ``f`` of steps take ``step(b, chunk)`` instead of ``step(b)``).
    ``clustering`` scales that variance: a long prompt's chunks come in consecutive steps, so
    chunk-carrying steps arrive in runs (``chunk_clustering``)."""
    z = Z[percentile]
    busy = min(float(limit), b + z * math.sqrt(b))
    tokens = busy * steady.ratio
    chunk = max(tokens, min(budget - busy, steady.prompt))
    spread = 0.0
    if chunk >= 1:
        share = min(1.0, tokens / chunk)
        spread = z * math.sqrt(share * (1 - share) * clustering / work.output_low) * (
            steady.step_ns(busy, chunk) - steady.step_ns(busy))
    return steady.mean_ns(busy, budget) + spread


def chunk_clustering(prompts, chunk: int, steps: float) -> float:
    """How much runs of chunk-carrying steps widen the binomial spread over ``steps`` steps:
    a prompt of ``p`` tokens fills ``L = ceil(p / chunk)`` consecutive steps, and a sum of runs
    has ``E[L^2] / E[L]`` times the variance of independent steps (a renewal count), at most
    ``steps`` (a run longer than the request's life adds no more)."""
    if not len(prompts):
        return 1.0
    runs = np.ceil(np.asarray(prompts, dtype=np.float64) / max(1, chunk))
    return float(min(max(1.0, (runs ** 2).mean() / runs.mean()), max(1.0, steps)))


def queue_ttft_ns(arrivals_s, prompts, outputs, slots: int, prefill_ns, tpot_ns: float, percentile: float) -> float:
    """The ``percentile`` TTFT of requests admitted first come first served to ``slots``
    sequence slots: each waits for the earliest free slot, computes its prompt in
    ``prefill_ns`` (an array, one per request) and holds the slot for ``output - 1`` more
    steps of ``tpot_ns``; its TTFT is the wait plus its prefill."""
    free = [0.0] * max(1, slots)  # when each slot is next free (a heap), ns
    ttft = np.empty(len(arrivals_s))
    hold = prefill_ns + (np.maximum(outputs, 1) - 1) * tpot_ns
    for i, (t, pre, busy) in enumerate(zip(s_to_ns(arrivals_s).tolist(), prefill_ns.tolist(), hold.tolist(),
                                           strict=True)):
        start = max(t, heapq.heappop(free))
        heapq.heappush(free, start + busy)
        ttft[i] = start - t + pre
    return float(np.percentile(ttft, percentile)) if len(ttft) else 0.0


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
            self.resolved: RunSetup | None = serve_resolved(run_spec(d, model, overrides))
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
        return kv_bytes(res, blocks * self.block_tokens)

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
            self._steady = SteadyStep(SimulatorStepModel(self.resolved), self.work)
        return self._steady


@dataclasses.dataclass(frozen=True)
class Correction:
    """What a replay taught the screen of one deployment (sim.search.runner's confirmation):
    ``tpot`` scales every step time (so TPOT, the batch it implies and prefill). 1.0: the
    screen as it is."""

    tpot: float = 1.0


GOODPUT_FLOOR = 0.001  # the lowest rate tried, as a fraction of the capacity
GOODPUT_STEPS = 12  # geometric bisection steps between it and the capacity (the rate to 0.2%)


def screen(setup: SetupScreen, d: Deployment, *, rate: float | None, load: float | None, slo: dict, traffic: dict,
           correction: Correction | None = None, window_output: bool = False) -> dict:
    """The screening row of deployment ``d`` of ``setup`` (module docstring). ``rate`` None
    and ``load`` None: the goodput search, the highest rate whose estimates meet the SLOs.
    ``window_output`` (implied by the goodput search): throughput per chip from the mean
    output of the requests the replay at this rate sees, not the traffic's."""
    row: dict = {**d.as_dict(), "status": setup.status, "reason": setup.problem}
    if setup.status != "screened":
        return row
    work = setup.work
    cap = setup.capacity(max(d.max_tokens_per_step, d.max_batch))
    pool = kv_pool_bytes(setup.resolved, cap)
    row.update(weights_GB_per_chip=cap["weights_bytes"] / GB, kv_pool_GB_per_chip=max(0, pool) / GB)
    longest = setup.footprint(work.longest)
    if pool < longest:
        what = ("no memory is left for the KV cache" if pool <= 0 else
                f"the KV pool ({pool / GB:.2f} GB) cannot hold the longest request ({work.longest:,} tokens, "
                f"{longest / GB:.2f} GB)")
        row.update(status="does-not-fit", reason=f"{what}: weights {cap['weights_bytes'] / GB:.1f} GB + "
                   f"activations {cap['activation_bytes'] / GB:.2f} GB of {cap['available_bytes'] / GB:.1f} GB "
                   "per chip")
        return row
    limits = {"max_batch": d.max_batch,
              "chunk": math.floor(d.max_tokens_per_step / (1 + work.prefill_per_decode)),
              "kv": int(pool // setup.footprint(work.decode_context))}
    bound = min(limits, key=lambda k: (limits[k], k))
    b_limit = int(limits[bound])
    row.update(batch_limit=int(b_limit), batch_limit_by=bound)
    if b_limit < 1:
        row.update(status="saturated", reason=f"the {bound} limit leaves no room for one decoding sequence "
                   "with its share of prompt tokens")
        return row
    point = _Point(setup, d, b_limit, slo, traffic, correction or Correction(),
                   goodput=window_output or (rate is None and load is None))
    row.update(capacity_rate_per_s=point.capacity_rate)
    if rate is None and load is None:
        operating, est = point.highest()
    else:
        operating = rate if rate is not None else load * point.capacity_rate
        est = point.at(operating)
    row.update(rate_per_s=operating)
    if est is None:
        row.update(status="saturated", reason=f"cannot carry {operating:.3g} req/s: at most "
                   f"{point.capacity_rate:.3g} (batch limit {b_limit} set by {bound})")
        return row
    row.update(est)
    output_mean = row.pop("window_output_mean")
    if window_output or (rate is None and load is None):  # the requests the replay sees set the output
        row["tokens_per_s_per_chip"] = operating * output_mean / d.chips
    if correction is not None:
        row.update(screen_correction_tpot=correction.tpot)
    return row


class _Point:
    """The estimates of one deployment at any rate (module docstring, steps 3 and 4)."""

    def __init__(self, setup: SetupScreen, d: Deployment, b_limit: int, slo: dict, traffic: dict, k: Correction,
                 goodput: bool = False):
        self.setup, self.d, self.b_limit, self.slo, self.traffic, self.k = setup, d, b_limit, slo, traffic, k
        self.goodput = goodput  # the goodput search's screen: chunk runs widen the TPOT tail
        self.steady = setup.steady
        self.capacity_rate = b_limit * NS_PER_S / (setup.work.output_mean * self.T(b_limit))

    def T(self, b: float) -> float:
        return self.k.tpot * self.steady.mean_ns(b, self.d.max_tokens_per_step)

    def at(self, operating: float) -> dict | None:
        """The estimates at ``operating`` req/s, or None when the deployment cannot carry it."""
        work, steady, slo, budget = self.setup.work, self.steady, self.slo, self.d.max_tokens_per_step
        b = steady_batch(self.T, operating, work.output_mean, self.b_limit)
        if b is None:
            return None
        tpot_ns = self.T(b)
        chunk = max(1, int(budget - b))
        window = replay_window(self.traffic, operating, work, ns_to_ms(tpot_ns))
        arrivals, prompts, outputs = window_requests(self.traffic, window)
        clustering = chunk_clustering(prompts, chunk, work.output_low) if self.goodput else 1.0
        tpot_pct_ns = self.k.tpot * tpot_percentile_ns(steady, b, budget, self.b_limit, work, slo["percentile"],
                                                       clustering)
        # a prompt takes ceil(prompt / chunk) steps, each carrying a chunk of up to `chunk` tokens
        # (timed at the chunk size rounded up to CHUNK_GRAIN tokens: a few hundred distinct steps at most)
        sizes = np.minimum(-(-np.minimum(prompts, chunk) // CHUNK_GRAIN) * CHUNK_GRAIN, chunk).astype(np.int64)
        times = {int(n): self.k.tpot * steady.step_ns(b, int(n)) for n in np.unique(sizes)}
        prefill_ns = np.ceil(prompts / chunk) * np.array([times[int(n)] for n in sizes]) + tpot_ns
        ttft_ns = queue_ttft_ns(arrivals, prompts, outputs, self.b_limit, prefill_ns, tpot_ns, slo["percentile"])
        est = {"est_batch": b, "est_tpot_ms": ns_to_ms(tpot_ns), "est_tpot_pct_ms": ns_to_ms(tpot_pct_ns),
               "est_ttft_ms": ns_to_ms(ttft_ns), "est_requests": len(arrivals),
               "tokens_per_s_per_chip": operating * work.output_mean / self.d.chips,
               "tokens_per_s_per_user": NS_PER_S / tpot_ns,
               "window_output_mean": float(outputs.mean()) if len(outputs) else work.output_mean}
        est["screen_ok"] = bool(est["est_tpot_pct_ms"] <= slo["tpot_ms"] and est["est_ttft_ms"] <= slo["ttft_ms"])
        return est

    def highest(self) -> tuple[float, dict | None]:
        """The highest rate in [GOODPUT_FLOOR, 1) x capacity whose estimates meet the SLOs (a
        geometric bisection: the estimates grow with the rate), with its estimates; when even
        the floor misses, the capacity and its (failing) estimates."""
        hi = self.capacity_rate * 0.999999  # just under it: the steady batch exists
        top = self.at(hi)
        if top is not None and top["screen_ok"]:
            return hi, top
        lo = self.capacity_rate * GOODPUT_FLOOR
        best = self.at(lo)
        if best is None or not best["screen_ok"]:  # no rate meets them: shown where it would run at its capacity
            return hi, top
        for _ in range(GOODPUT_STEPS):
            mid = math.sqrt(lo * hi)
            est = self.at(mid)
            if est is not None and est["screen_ok"]:
                lo, best = mid, est
            else:
                hi = mid
        return lo, best


__all__ = ["Correction", "SetupScreen", "SteadyStep", "run_spec", "screen", "steady_batch"]
