"""The goodput search (sim.search with neither a rate nor a load): each deployment at the
highest rate whose screened percentiles meet the SLOs, confirmed by replay, and screen and
replay agreeing within 10% on both axes of the front at every confirmed point."""

from __future__ import annotations

import pytest

from sim.search import load_space, run_search
from sim.search.front import X, Y
from sim.search.runner import AGREEMENT
from tests.conftest import ROOT

TINY = ROOT / "tests" / "fixtures" / "search" / "tiny-goodput.yaml"


@pytest.fixture(scope="module")
def result():
    return run_search(load_space(TINY), jobs=1, progress=False)


def test_the_goodput_search_finds_a_front_that_meets_the_slos(result):
    slo = result.space.spec.slo
    assert result.space.spec.traffic.goodput and result.front
    for p in result.front:
        assert p["verdict"] == "meets-slo", p.get("verdict_reason")
        assert p["ttft_ms_p99"] <= slo.ttft_ms and p["tpot_ms_claimed"] <= slo.tpot_ms
        # the confirmed rate never exceeds the screen's highest rate (the replay only backs off)
        assert 0 < p["rate_per_s"] <= p["screen_goodput_rate_per_s"] * (1 + 1e-9)


def test_screen_and_replay_agree_within_ten_percent_on_every_confirmed_point(result):
    confirmed = [r for r in result.rows if r.get("verdict") == "meets-slo"]
    assert confirmed
    for r in confirmed:
        gaps = (r[X] / r["replay_goodput_tokens_per_s_per_chip"] - 1, r[Y] / r["replay_tokens_per_s_per_user"] - 1)
        assert max(abs(g) for g in gaps) <= AGREEMENT == 0.10, (r["index"], gaps)
        assert r["screen_replay_gap"] == pytest.approx(max(abs(g) for g in gaps))


def test_a_given_load_keeps_the_load_search(result):
    """With ``load`` each deployment runs at that fraction of its capacity, as before: at 0.9
    above its goodput rate."""
    loaded = run_search(load_space(TINY, {"traffic.load": 0.9, "max_replays": 1}), jobs=1, progress=False)
    assert not loaded.space.spec.traffic.goodput
    by_index = {r["index"]: r for r in loaded.rows}
    for p in result.front:
        assert by_index[p["index"]]["rate_per_s"] == pytest.approx(0.9 * by_index[p["index"]]["capacity_rate_per_s"])
        assert by_index[p["index"]]["rate_per_s"] > p["rate_per_s"]
