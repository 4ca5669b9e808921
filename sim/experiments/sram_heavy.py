"""Derive the hypothetical ``sram-heavy-10ms`` profile: what on-chip SRAM (capacity and
bandwidth) would let one chip decode llama-3-70b in bf16 under 10 ms per token?

The design keeps everything of ``h200-sxm`` (132 SMs, their clocks and peaks, L2, shared
memory, host and launch costs) and replaces the HBM with on-chip SRAM as the backing store;
the store's stream efficiency is h200-sxm's HBM figure and its latency (the start-up a kernel
sees) is h200-sxm's L2 figure, both measured on the H200 (calibration/).
Two numbers are then derived with the simulator, nothing is tuned by hand:

1. capacity: the bytes the run needs per chip (weights + KV + activations, as
   ``sim.run.capacity`` counts them) for llama-3-70b, bf16 weights, fp16 KV, batch 1,
   context 4096, rounded up to the next 10 GB;
2. bandwidth: the smallest SRAM bandwidth at which the discrete-event engine predicts at
   most 10 ms per token for that run, by bisection on a log scale (the step time is
   monotone in the store bandwidth: tests/test_profiles.py checks it for every profile),
   rounded up to the next 100 GB/s. Each SM's load rate scales with it by h200-sxm's rule
   (2x one SM's fair share), or the SMs, not the SRAM, would bound the step.

``python -m sim.report.sram_heavy`` (sim/report/sram_heavy.py) prints the derivation;
``--write`` also (re)writes hardware_profiles/sram-heavy-10ms.yaml atomically.
"""

from __future__ import annotations

import copy
import math
import tempfile
from pathlib import Path

import yaml

from sim.config.hardware import borrow
from sim.config.loader import load_yaml
from sim.paths import hardware_dir
from sim.run import simulate
from sim.units import GB, GB_PER_TB, MB_PER_GB

NAME = "sram-heavy-10ms"
TARGET_MS = 10.0
RUN = dict(model="llama-3-70b", weights="bf16", kv="fp16", batch=1, context=4096, steps=1, engine="des",
           software="fused", graph=True)
DERIVED = "derived by `python -m sim.report.sram_heavy`"


def design(bandwidth_GBps: float, capacity_GB: float, base: str = "h200-sxm") -> dict:
    """The raw profile: ``base`` with its HBM replaced by an SRAM store of this size and rate,
    without an energy section (energy does not change the step time the derivation bisects on)."""
    raw = copy.deepcopy(load_yaml(hardware_dir() / f"{base}.yaml"))
    tiles = raw["compute"]["tiles"]["value"]
    hbm = raw["memory"][0]
    l2 = next(level for level in raw["memory"][1:] if level.get("scope") == "chip")
    store = {
        "kind": "sram", "name": "sram", "scope": "chip",
        "count": {"value": 1, "source": "one chip-wide SRAM backing store (hypothetical design)"},
        "capacity_MB": {"value": capacity_GB * MB_PER_GB, "estimate": True,
                        "source": f"{DERIVED}: llama-3-70b bf16 weights + fp16 KV (batch 1, context 4096) "
                                  "+ activations, rounded up to 10 GB"},
        "bandwidth_GBps": {"value": bandwidth_GBps, "estimate": True,
                           "source": f"{DERIVED}: bisection for <= {TARGET_MS:g} ms per token on that run "
                                     "(DES engine), rounded up to 100 GB/s"},
        "latency_ns": {"value": l2["latency_ns"]["value"], "estimate": True,
                       "source": f"what a kernel reading on-chip SRAM sees on {base}: its {l2['name']} latency "
                                 f"({l2['latency_ns']['source']})"},
        "resident_fraction": {"value": 1.0, "source": "the store itself: everything in it is resident"},
        "stream_efficiency": {"value": hbm["stream_efficiency"]["value"], "estimate": True,
                              "source": f"as the {base} HBM stream efficiency ({hbm['stream_efficiency']['source']})"},
        "gather_efficiency": {"points": [[32, 1.0]], "estimate": True,
                              "source": "SRAM has no row activations: gathers at the stream rate"},
    }
    raw["memory"][0] = store
    raw["name"] = NAME
    raw["description"] = (f"Hypothetical: an H200-class chip whose HBM is replaced by {capacity_GB:g} GB of "
                          f"on-chip SRAM at {bandwidth_GBps / GB_PER_TB:g} TB/s, so llama-3-70b bf16 decodes under "
                          f"{TARGET_MS:g} ms")
    raw["compute"]["tile_load_GBps"] = {
        "value": round(2 * bandwidth_GBps / tiles, 1), "estimate": True,
        "source": f"h200-sxm's rule, 2x one SM's fair share of the store bandwidth: 2 x {bandwidth_GBps:g} / {tiles}"}
    raw["system"] = {"chips": {"value": 1, "source": "one chip (hypothetical)"}}
    # the base's energy figures name its HBM, not this store; the design's own (estimates by
    # calibration/energy/SOURCES.md's rules) are kept by hand in the profile (sim.report.sram_heavy)
    raw.pop("energy", None)
    return borrow(raw, base, "NVIDIA H200", "calibration/data/h200",
                  "a hypothetical H200-class chip: the base's die, host and kernel classes taken as is")


def _predict(raw: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{NAME}.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return simulate(hardware=str(path), **RUN).summary


def derive(lo_GBps: float = 1e3, hi_GBps: float = 1e6, iterations: int = 30) -> dict:  # 1 TB/s to 1 PB/s
    """Capacity from the run's needs; bandwidth by bisection. Returns the derivation."""
    probe = _predict(design(hi_GBps, 1e4))
    needed_GB = probe["capacity"]["needed_bytes"] / GB
    capacity_GB = 10 * math.ceil(needed_GB / 10)
    if _predict(design(hi_GBps, capacity_GB))["per_token_ms_p99"] > TARGET_MS:
        raise RuntimeError(f"even {hi_GBps:g} GB/s of SRAM misses {TARGET_MS} ms: the step is not memory-bound")
    lo, hi = lo_GBps, hi_GBps
    for _ in range(iterations):
        mid = math.sqrt(lo * hi)
        if _predict(design(mid, capacity_GB))["per_token_ms_p99"] <= TARGET_MS:
            hi = mid
        else:
            lo = mid
    bandwidth = 100 * math.ceil(hi / 100)
    final = _predict(design(bandwidth, capacity_GB))
    below = _predict(design(bandwidth * 0.98, capacity_GB))
    return {"needed_GB": needed_GB, "capacity_GB": capacity_GB, "bisection_GBps": hi, "bandwidth_GBps": bandwidth,
            "per_token_ms": final["per_token_ms_p99"], "per_token_ms_at_98pct": below["per_token_ms_p99"],
            "bound": final["bound"], "breakdown_ms": final["breakdown_ms"]}
