"""Scheduler policies (sim.serve.scheduler.POLICIES): each one's invariant on a fake step model.

TensorRT-LLM's guaranteed-no-evict never preempts and never commits more KV than the pool
holds (the whole lives of the running requests fit); chunked prefill never exceeds the
token budget; SGLang-like steps never mix prefill and decode; every policy samples every
output token exactly once."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.serve.clients import Client
from sim.serve.replay import replay
from sim.serve.requests import Request
from sim.serve.scheduler import POLICIES, KVPool, Scheduler
from sim.serve.spec import ServeSpec

BYTES_PER_TOKEN = 1000


class Fake:
    """4 ms a step plus 20 us per decode row and 5 us per prefill token; keeps every step."""

    def __init__(self):
        self.seen = []

    def step_ns(self, decode_contexts, prefill=()):
        self.seen.append((decode_contexts, prefill))
        return 4e6 + 2e4 * len(decode_contexts) + 5e3 * sum(c for c, _ in prefill)


class Watched(Scheduler):
    """Checks the pool after every scheduling decision and counts sampled tokens per request."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sampled: dict[int, int] = {}
        self.committed_max = 0

    def schedule(self, now_ns):
        step = super().schedule(now_ns)
        pool = self.pool
        assert pool.used_bytes <= pool.capacity_bytes
        assert pool.used_bytes == sum(s.charge_bytes for s in self.running)
        life = sum(pool.charge(pool.blocks_for(s.prompt + s.output - 1)) for s in self.running)
        self.committed_max = max(self.committed_max, life)
        return step

    def complete(self, step, end_ns):
        before = {id(s): s.generated for s, _ in step.work}
        sampled, finished = super().complete(step, end_ns)
        for seq, _ in step.work:
            self.sampled[seq.rid] = self.sampled.get(seq.rid, 0) + seq.generated - before[id(seq)]
        return sampled, finished


def run(requests, policy, capacity_tokens=6000, budget=None, max_batch=None):
    entry = POLICIES[policy]
    pool = KVPool(capacity_tokens * BYTES_PER_TOKEN, entry.block_tokens, lambda t: t * BYTES_PER_TOKEN)
    sched = Watched(pool, max_batch=max_batch or 64, max_tokens_per_step=budget or 512, policy=policy)
    model = Fake()
    summary = replay(requests, model, sched)
    return summary, sched, model


def pressure(n=60, prompt=400, output=200):
    """Requests arriving faster than a small pool can hold them for their whole life."""
    return [Request(i, 0.005 * i, prompt + 37 * (i % 5), output + 29 * (i % 7)) for i in range(n)]


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_policy_samples_each_output_token_once(policy):
    requests = pressure()
    summary, sched, _ = run(requests, policy)
    assert summary["requests_done"] == len(requests) and summary["requests_rejected"] == 0
    assert sched.sampled == {r.rid: r.output_tokens for r in requests}


def test_max_utilization_and_vllm_preempt_where_no_evict_does_not():
    requests = pressure()
    for policy in ("trtllm-max-util", "chunked"):
        assert run(requests, policy, budget=2048)[0]["preemptions"] > 0, policy  # the pressure is real
    summary, sched, _ = run(requests, "trtllm-no-evict", budget=2048)
    assert summary["preemptions"] == 0 and summary["recomputed_tokens"] == 0
    assert sched.committed_max <= sched.pool.capacity_bytes


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 1500), st.integers(1, 300)), min_size=1, max_size=25),
       st.integers(2000, 8000))
def test_no_evict_never_preempts_nor_overcommits(rows, capacity_tokens):
    requests = [Request(i, gap / 1000 * i, p, o) for i, (gap, p, o) in enumerate(rows)]
    summary, sched, _ = run(requests, "trtllm-no-evict", capacity_tokens=capacity_tokens)
    assert summary["preemptions"] == 0
    assert sched.committed_max <= sched.pool.capacity_bytes
    fits = [r for r in requests if (r.prompt_tokens + r.output_tokens - 1 + 31) // 32 * 32 <= capacity_tokens]
    assert summary["requests_done"] == len(fits)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 3000), st.integers(1, 100)), min_size=1, max_size=25),
       st.sampled_from(["chunked", "vllm-v1"]), st.integers(16, 1024))
def test_chunked_prefill_never_exceeds_the_token_budget(rows, policy, budget):
    requests = [Request(i, gap / 1000 * i, p, o) for i, (gap, p, o) in enumerate(rows)]
    _, _, model = run(requests, policy, capacity_tokens=20000, budget=budget, max_batch=budget)
    assert all(len(d) + sum(c for c, _ in p) <= budget for d, p in model.seen)


def test_sglang_steps_are_prefill_or_decode_and_prefill_goes_first():
    _, _, model = run(pressure(), "sglang")
    assert all(not (d and p) for d, p in model.seen)
    assert sum(1 for d, p in model.seen if p) >= 60  # every prompt had a prefill step


def test_a_policy_brings_its_engine_defaults_unless_given():
    spec = ServeSpec(policy="trtllm-no-evict")
    assert (spec.max_batch, spec.max_tokens_per_step, spec.block_tokens) == (2048, 8192, 32)
    assert ServeSpec(policy="vllm-v1", max_batch=64).max_batch == 64
    assert ServeSpec().max_batch == 256  # chunked keeps the limits the bundled reports used
    with pytest.raises(ValueError, match="expected one of"):
        ServeSpec(policy="fifo")


# -- client modes and metrics -----------------------------------------------------------------


class Counted(Watched):
    """Keeps the largest number of requests in the system (running + waiting)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.most_in_system = 0

    def arrive(self, seq):
        super().arrive(seq)
        self.most_in_system = max(self.most_in_system, len(self.running) + len(self.waiting))


def run_client(mode, concurrency=None, n=40, out_dir=None, target_ms=5.0):
    requests = [Request(i, 0.5 * i, 100 + 10 * (i % 4), 20 + (i % 3)) for i in range(n)]
    pool = KVPool(10**9, 16, lambda t: t * BYTES_PER_TOKEN)
    sched = Counted(pool, max_batch=64, max_tokens_per_step=512, policy="chunked")
    return replay(Client(requests, mode, concurrency), Fake(), sched, target_ms=target_ms,
                  out_dir=out_dir), sched, requests


def test_closed_loop_keeps_n_in_flight_and_offline_sends_all_at_once():
    summary, sched, requests = run_client("closed-loop", 4)
    assert summary["requests_done"] == len(requests) and sched.most_in_system == 4
    open_loop = run_client("open-loop")[0]  # 0.5 s apart: each finishes before the next arrives
    assert open_loop["simulated_s"] > 19 > summary["simulated_s"]
    offline, sched, _ = run_client("offline")
    assert sched.most_in_system == len(requests) and offline["ttft_ms_p99"] > open_loop["ttft_ms_p99"]


def test_benchmark_metrics_itl_goodput_and_throughputs(tmp_path):
    summary, _, requests = run_client("closed-loop", 8, out_dir=tmp_path, target_ms=4.3)
    window = summary["simulated_s"]
    assert summary["total_tokens_per_s"] * window == pytest.approx(sum(r.prompt_tokens + r.output_tokens
                                                                       for r in requests))
    # every output token after a request's first has one inter-token gap, each at least a step (4 ms)
    assert summary["itl_ms_p50"] >= 4.0 and summary["itl_ms_std"] >= 0
    table = pd.read_parquet(tmp_path / "requests.parquet")
    good = table[table["tpot_ms"] <= 4.3]
    assert 0 < len(good) < len(table)  # the SLO splits the requests
    assert summary["goodput_req_per_s"] * window == pytest.approx(len(good))
    assert summary["goodput_tokens_per_s"] * window == pytest.approx(good["output_tokens"].sum())
    assert summary["itl_ms_mean"] * (summary["output_tokens"] - len(table)) == pytest.approx(
        ((table["finish_s"] - table["first_token_s"]) * 1000).sum(), rel=1e-4)
