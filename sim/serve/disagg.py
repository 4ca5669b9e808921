"""Disaggregated prefill and decode: two pools, each a deployment, and the KV moved between them.

A request arrives at the **prefill pool** (its own scheduler, KV pool and step model: a
deployment of ``prefill_chips`` chips, tensor parallel over them), which computes its prompt
and samples its first token; its prompt's KV is then **moved** to the **decode pool** (a
deployment of ``decode_chips`` chips), where it decodes the rest of its output. Each pool
runs the same policy (sim.serve.scheduler) on its own clock; the replay advances whichever
pool's next event comes first, so prefill and decode overlap in time as on separate GPUs.

The move: the prompt's KV in the KV format's bytes (``sim.run.kv_bytes``: the fullest chip's
share, times tp x pp chips for the whole sequence) crosses the links between the pools,
each of the ``min(prefill_chips, decode_chips)`` chip pairs carrying its share in parallel
at the profile's chip-to-chip bandwidth (``system.links``: NVLink inside a node; the
``scaleout`` links when the two pools do not fit one group), after the links' latency and
per-message overhead. Transfers do not contend with each other (one flow per request).

Time to first token = queue at the prefill pool + prefill + transfer: the first token
reaches the client with the decode pool, which streams the rest (as NVIDIA Dynamo and
vLLM's disaggregated serving return it). TPOT and the rest of the metrics are the decode
pool's; the prefill pool's steps are counted apart (``prefill_pool_*`` in the summary).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from sim.errors import COMMAND_LINE, ConfigError
from sim.run import kv_bytes
from sim.serve.clients import Client
from sim.serve.metrics import Metrics
from sim.serve.scheduler import Scheduler, Sequence
from sim.serve.spec import ServeSpec, build
from sim.serve.stepmodel import SimulatorStepModel, StepModel
from sim.setup import load_profile
from sim.units import GB, NS_PER_S, ns_to_ms


@dataclass(frozen=True)
class Transfer:
    """The links between the pools: ``bandwidth_GBps`` per chip pair and direction, ``pairs``
    chip pairs in parallel, and the fixed cost of one message."""

    bandwidth_GBps: float
    pairs: int
    fixed_ns: float

    def ns(self, total_bytes: float) -> int:
        """Time to move ``total_bytes`` between the pools."""
        return round(self.fixed_ns + total_bytes / (self.bandwidth_GBps * GB * self.pairs) * NS_PER_S)


class Pool:
    """One pool's scheduler, step model and clock."""

    def __init__(self, scheduler: Scheduler, model: StepModel):
        self.scheduler, self.model, self.clock = scheduler, model, 0
        self.steps = 0
        self.busy_ns = 0

    def step(self, metrics: Metrics | None = None) -> tuple[int, list[Sequence]]:
        """Run one step at the pool's clock; returns (its end, the sequences that finished)."""
        sched = self.scheduler
        work = sched.schedule(self.clock)
        if not work.work:
            raise RuntimeError("a pool made no progress with requests waiting")
        decode, prefill = work.split()
        dt = max(1, round(self.model.step_ns(decode, prefill)))
        running, waiting, occupancy = len(sched.running), len(sched.waiting), sched.pool.occupancy
        sampled, finished = sched.complete(work, self.clock + dt)
        if metrics is not None:
            metrics.step(dt, len(work.work), running + waiting, waiting, occupancy,
                         sum(c for c, _ in prefill), sampled, work.itl_ns)
        self.clock += dt
        self.steps += 1
        self.busy_ns += dt
        return self.clock, finished


def replay_disagg(client: Client, prefill: Pool, decode: Pool, kv_total_bytes, transfer: Transfer, *,
                  target_ms: float = 10.0, ttft_target_ms: float | None = None, max_context: int | None = None,
                  window_s: float | None = None) -> dict:
    """Replay ``client``'s requests through the two pools (module docstring); returns the
    metrics summary with the prefill pool's and the transfers' figures.
    ``kv_total_bytes(tokens)``: the bytes of a sequence's KV moved between the pools."""
    metrics = Metrics(target_ms, ttft_target_ms)
    handoffs: list[tuple[int, int, Sequence]] = []  # (arrival at the decode pool, rid, its sequence)
    outputs: dict[int, int] = {}  # rid -> output tokens, while its prompt is in the prefill pool
    moved_bytes, transfer_ns = 0, []
    p_sched, d_sched = prefill.scheduler, decode.scheduler
    while not client.exhausted or p_sched.busy or d_sched.busy or handoffs:
        p_next = prefill.clock if p_sched.busy else client.next_ns()
        d_next = decode.clock if d_sched.busy else (handoffs[0][0] if handoffs else None)
        if d_next is not None and (p_next is None or d_next <= p_next):
            decode.clock = max(decode.clock, d_next)
            while handoffs and handoffs[0][0] <= decode.clock:
                d_sched.arrive(heapq.heappop(handoffs)[2])
            for seq in decode.step(metrics)[1]:
                metrics.finished(seq)
                client.finished(seq.finish_ns)
            continue
        if p_next is None:
            break
        prefill.clock = max(prefill.clock, p_next)
        _arrive_all(client, prefill, metrics, max_context, outputs)
        if not p_sched.busy:
            continue
        end, done = prefill.step()
        for seq in done:
            size = kv_total_bytes(seq.prompt)
            moved = transfer.ns(size)
            moved_bytes += size
            transfer_ns.append(moved)
            full = _decoding(seq, outputs.pop(seq.rid), end + moved)
            if full.generated >= full.output:  # one output token: done when it arrives
                metrics.finished(full)
                client.finished(full.finish_ns)
            else:
                heapq.heappush(handoffs, (end + moved, full.rid, full))
    summary = metrics.summary(window_s=window_s)
    summary.update(prefill_pool_steps=prefill.steps, prefill_pool_busy_s=prefill.busy_ns / NS_PER_S,
                   prefill_pool_preemptions=p_sched.preemptions, kv_moved_bytes=moved_bytes,
                   kv_transfer_ms_mean=ns_to_ms(sum(transfer_ns) / len(transfer_ns)) if transfer_ns else math.nan)
    return summary


def _arrive_all(client: Client, prefill: Pool, metrics: Metrics, max_context, outputs: dict[int, int]) -> None:
    """Requests due by the prefill pool's clock join it: only their prompt (and first token)."""
    pool = prefill.scheduler.pool
    while True:
        due = client.next_ns()
        if due is None or due > prefill.clock:
            return
        t, request = client.pop()
        metrics.arrived(t)
        longest = request.prompt_tokens + request.output_tokens - 1
        if (max_context is not None and longest > max_context) or not pool.fits_alone(request.prompt_tokens):
            metrics.rejected += 1
            client.finished(t)
            continue
        outputs[request.rid] = request.output_tokens  # the decode pool's share
        prefill.scheduler.arrive(Sequence(request.rid, t, request.prompt_tokens, 1))


def _decoding(seq: Sequence, output: int, arrive_ns: int) -> Sequence:
    """The decode pool's sequence of a prefilled request: its prompt cached, its first token
    sampled when its KV arrives (time to first token = queue + prefill + transfer)."""
    full = Sequence(seq.rid, seq.arrival_ns, seq.prompt, output)
    full.computed = full.max_computed = seq.prompt
    full.generated = 1
    full.first_token_ns = full.last_token_ns = arrive_ns
    full.admitted_ns = seq.admitted_ns
    if full.output == 1:
        full.finish_ns = arrive_ns
    return full


def pool_spec(spec: ServeSpec, chips: int) -> ServeSpec:
    """One pool's deployment: ``spec`` on ``chips`` chips, tensor parallel over them."""
    return spec.model_copy(update={"chips": chips, "tp": chips, "pp": 1, "prefill_chips": None, "decode_chips": None})


def transfer_of(spec: ServeSpec, profile) -> Transfer:
    """The links between the two pools of ``spec`` on ``profile`` (module docstring)."""
    system = profile.system
    p, d = spec.prefill_chips, spec.decode_chips
    scale = system.scaleout
    links = scale if scale is not None and p + d > scale.chips_per_group.value else system.links
    if links is None:
        raise ConfigError(spec.hardware, "system.links", "disaggregated serving moves the KV between chips: "
                          "expected a profile of several chips with links")
    fixed = links.latency_ns.value + links.per_message_overhead_ns.value
    return Transfer(links.bandwidth_GBps.value, min(p, d), fixed)


def serve_disagg(spec: ServeSpec) -> dict:
    """Build both pools of ``spec`` and replay its requests through them; the summary."""
    if spec.speculate_k:
        raise ConfigError(COMMAND_LINE, "--speculate-k", "not modelled with disaggregated pools yet", spec.speculate_k)
    pre, dec = build(pool_spec(spec, spec.prefill_chips)), build(pool_spec(spec, spec.decode_chips))
    res = dec.resolved
    transfer = transfer_of(spec, load_profile(spec.hardware))

    def pool(setup) -> Pool:
        return Pool(Scheduler(setup.pool(), max_batch=spec.max_batch, max_tokens_per_step=spec.max_tokens_per_step,
                              policy=spec.policy), SimulatorStepModel(setup.resolved))

    figures = replay_disagg(Client(pre.source, spec.client, spec.concurrency), pool(pre), pool(dec),
                            lambda tokens: kv_bytes(res, tokens) * res.tp * res.pp, transfer,
                            target_ms=spec.target_ms, ttft_target_ms=spec.ttft_target_ms,
                            max_context=res.model.max_context,
                            window_s=pre.source.window_s if spec.client == "open-loop" else None)
    return {**dec.describe(), "prefill_chips": spec.prefill_chips, "decode_chips": spec.decode_chips,
            "kv_link_GBps": transfer.bandwidth_GBps, "kv_link_pairs": transfer.pairs, **figures}


__all__ = ["Pool", "Transfer", "pool_spec", "replay_disagg", "serve_disagg", "transfer_of"]
