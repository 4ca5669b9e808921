"""Error bands (issue 44): `run --band` gives p10 < p50 < p90 from the uncertainty of the
profile's figures; a chip whose kernel costs are borrowed gets a wider band than the chip they
were measured on, and the band names the groups that decide it."""

from __future__ import annotations

import json

from sim.cli import main


def _band(capsys, hw: str) -> dict:
    assert main(["run", "--hardware", hw, "--model", "llama-3.2-1b", "--batch", "8", "--context", "2048",
                 "--engine", "analytic", "--band", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    return out["band"] | {"p50": out["per_token_ms_p50"]}


def test_borrowed_costs_widen_the_band(capsys):
    h200, h100 = _band(capsys, "h200-sxm"), _band(capsys, "h100-sxm")
    for b in (h200, h100):
        assert b["p10_ms"] < b["p50_ms"] == round(b["p50"], 4) < b["p90_ms"]
        assert abs(sum(g["variance_share"] for g in b["groups"]) - 1) < 0.02
    assert h200["kernel_costs"] == "measured" and h100["kernel_costs"] == "borrowed"
    assert h100["sigma_ms"] / h100["p50_ms"] > h200["sigma_ms"] / h200["p50_ms"]
    rate = {g["group"]: g for g in h100["groups"]}["kernel stream rate"]
    assert rate["sigma_rel"] == 0.15 and rate["why"].startswith("borrowed")
