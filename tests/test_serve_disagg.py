"""Disaggregated prefill and decode (sim.serve.disagg): time to first token = queue + prefill +
transfer, by hand on one case; every token sampled once across the two pools."""

from __future__ import annotations

import pytest

from sim.serve.clients import Client
from sim.serve.disagg import Pool, Transfer, replay_disagg
from sim.serve.requests import Request
from sim.serve.scheduler import KVPool, Scheduler

BYTES_PER_TOKEN = 1000


class Fake:
    """4 ms a step plus 20 us per decode row and 5 us per prefill token."""

    def step_ns(self, decode_contexts, prefill=()):
        return 4e6 + 2e4 * len(decode_contexts) + 5e3 * sum(c for c, _ in prefill)


def pool():
    return Pool(Scheduler(KVPool(10**9, 16, lambda t: t * BYTES_PER_TOKEN), max_batch=64, max_tokens_per_step=512),
                Fake())


def run(requests, tmp=None):
    link = Transfer(bandwidth_GBps=1.0, pairs=1, fixed_ns=1000.0)  # 100 tokens: 1e5 bytes in 0.1 ms, + 1 us
    return replay_disagg(Client(requests), pool(), pool(), lambda tokens: tokens * BYTES_PER_TOKEN, link)


def test_time_to_first_token_is_queue_plus_prefill_plus_transfer_by_hand():
    # two prompts at 0 share one prefill step: 4 ms + 200 x 5 us = 5 ms; then 0.101 ms to move
    # each one's KV: TTFT 5.101 ms. The third arrives at 1 ms, waits for that step (4 ms of
    # queue), prefills alone (4 ms + 100 x 5 us = 4.5 ms) and moves (0.101 ms): 8.601 ms.
    requests = [Request(0, 0.0, 100, 1), Request(1, 0.0, 100, 1), Request(2, 0.001, 100, 1)]
    summary = run(requests)
    assert summary["requests_done"] == 3
    assert summary["ttft_ms_p50"] == pytest.approx(5.101)
    assert summary["ttft_ms_mean"] == pytest.approx((5.101 * 2 + 8.601) / 3)
    assert summary["kv_moved_bytes"] == 3 * 100 * BYTES_PER_TOKEN
    assert summary["kv_transfer_ms_mean"] == pytest.approx(0.101)
    assert summary["prefill_pool_steps"] == 2


def test_the_decode_pool_decodes_the_rest_without_prefill():
    requests = [Request(i, 0.002 * i, 300 + 50 * (i % 3), 10 + i % 4) for i in range(20)]
    summary = run(requests)
    assert summary["requests_done"] == 20 and summary["requests_rejected"] == 0
    assert summary["output_tokens"] == sum(r.output_tokens for r in requests)
    # the decode pool's steps carry no prompt tokens: each is 4 ms + 20 us per sequence
    assert summary["prefill_tokens"] == 0
    assert 4.0 < summary["tpot_ms_p50"] < 4.0 + 0.02 * 20 + 1e-9


def test_cli_sweeps_the_pool_split_and_refuses_a_split_that_leaves_no_decode_chip():
    import json

    from tests.conftest import run_cli

    code, out, err = run_cli("serve", "--hardware", "h200-sxm-x8", "--requests", "synthetic", "--rate", "2",
                             "--duration-s", "4", "--prefill-chips", "1,2", "--jobs", "1", "--json")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [(r["prefill_chips"], r["decode_chips"]) for r in rows] == [(1, 7), (2, 6)]
    assert all(r["status"] == "ok" and r["kv_moved_bytes"] > 0 for r in rows)
    code, _, err = run_cli("serve", "--hardware", "h200-sxm-x8", "--prefill-chips", "8")
    assert code == 2 and "--prefill-chips" in err and "decode pool" in err
