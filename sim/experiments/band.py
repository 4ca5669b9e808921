"""An error band on a run's per-token latency from the uncertainty of the constants it depends on.

Linearized propagation: the profile's uncertain figures are taken in a few groups (kernel
start-ups, kernel stream rates, the store's stream efficiency, host launch and gap figures,
the matrix efficiency) and every other float figure marked ``estimate: true`` on its own (but a
per-channel bandwidth, which splits a datasheet peak); each is scaled by (1 + delta) in a copy
of the profile and the run re-evaluated with the analytic engine (the
closed form of the same kernels), which gives the latency's sensitivity to that group. Each
group's relative uncertainty (one standard deviation) comes from where its figures come from:

* measured on this chip: the fit's own scatter, the median over the kernel classes of
  calibration/kernel_fit.json of the held-out error as a standard deviation (median |e| / 0.6745)
  over the square root of the class's rows (the standard error of its fitted parameters);
* borrowed from another chip, transferred by rule, derived by rule or marked estimate: the
  stated defaults of ``SIGMA`` below (themselves estimates, said in the output) unless the
  profile's provenance gives its own ``uncertainty_pct``.

The groups are taken as independent: sigma^2 = sum (sensitivity_g x sigma_g)^2, and the band is
p50 -+ 1.2816 sigma (p10 to p90 of a normal). The groups are listed by their share of the
variance: the estimates that decide the answer. Cheap: one analytic run per group.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
from pathlib import Path

import yaml

from sim.config.hardware import kernel_costs_kind
from sim.config.loader import load_yaml
from sim.paths import bundled, hardware_dir
from sim.run import simulate
from sim.setup import load_profile

Z90 = 1.2816  # the 90th percentile of a standard normal
DELTA = 0.05  # the relative step of each re-evaluation
SIGMA = {"borrowed": 0.15, "transferred": 0.15, "derived": 0.25, "estimate": 0.20, "measured_host": 0.10,
         "measured_store": 0.02, "measured_matrix": 0.05}
GROUPS = ("kernel start-up", "kernel stream rate", "store stream efficiency", "host launch and gap",
          "matrix efficiency")
HOST_KEYS = ("launch_overhead_ns", "kernel_gap_ns", "graph_launch_ns", "sync_round_trip_ns")


def _measured_sigma() -> float:
    """The kernel-class fits' scatter: median held-out |error| over the classes, as a standard deviation."""
    try:
        fit = json.loads((bundled("calibration") / "kernel_fit.json").read_text())
        # each class's parameters: the held-out scatter (median |e| / 0.6745) over the square root of its rows
        errs = [c["held_out"]["median_abs_pct"] / 100 / 0.6745 / math.sqrt(c["held_out"]["n"] + c["fit"]["n"])
                for c in fit["classes"].values() if c["held_out"].get("n")]
        return sorted(errs)[len(errs) // 2] if errs else SIGMA["estimate"]
    except (OSError, KeyError, ValueError):
        return SIGMA["estimate"]


def _scale(node: dict, key: str, factor: float) -> None:
    if isinstance(node.get(key), dict) and "value" in node[key]:
        node[key]["value"] = node[key]["value"] * factor


SPLIT_ONLY = ("channel_bandwidth_GBps",)  # the datasheet peak split over channels: the split is the estimate, not the peak


def estimate_paths(node, path=()) -> list[tuple]:
    """The key paths of every float figure marked ``estimate: true`` (outside the named groups)."""
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        if isinstance(child, dict) and child.get("estimate") and isinstance(child.get("value"), float):
            if key not in ("stream_efficiency", "matrix_efficiency", *HOST_KEYS, *SPLIT_ONLY) and child["value"]:
                out.append((*path, key))
        elif isinstance(child, (dict, list)):
            out += estimate_paths(child, (*path, key))
    return out


def _at(raw: dict, path: tuple) -> dict:
    node = raw
    for key in path:
        node = node[key]
    return node


def perturbed(raw: dict, group: str, factor: float) -> dict:
    """A copy of the raw profile with ``group``'s figures scaled by ``factor`` (rates so that the
    latency moves the same way as for times: a rate is divided)."""
    out = copy.deepcopy(raw)
    classes = (out.get("kernels") or {}).get("classes", {})
    if group == "kernel start-up":
        for c in classes.values():
            _scale(c, "startup_ns", factor)
    elif group == "kernel stream rate":
        for c in classes.values():
            _scale(c, "stream_fraction", 1 / factor)
    elif group == "store stream efficiency":
        _scale(out["memory"][0], "stream_efficiency", 1 / factor)
    elif group == "host launch and gap":
        for key in HOST_KEYS:
            _scale(out["host"], key, factor)
    elif group == "matrix efficiency":
        _scale(out["compute"], "matrix_efficiency", 1 / factor)
    else:  # one estimate figure, by its key path
        _at(out, group)["value"] *= factor
    return out


def sigma_of(group: str, kind: str, raw: dict, measured: float) -> tuple[float, str]:
    """A group's relative standard deviation and where it comes from."""
    prov = (raw.get("kernels") or {}).get("provenance") or {}
    if group in ("kernel start-up", "kernel stream rate"):
        if kind == "measured":
            return measured, "held-out error of the kernel-class fits"
        if prov.get("uncertainty_pct") is not None:
            return prov["uncertainty_pct"] / 100, "the transfer rule's leave-one-GPU-out error"
        return SIGMA.get(kind, SIGMA["derived"]), f"{kind} kernel costs (stated default, an estimate)"
    figure = {"store stream efficiency": raw["memory"][0].get("stream_efficiency", {}),
              "matrix efficiency": raw["compute"].get("matrix_efficiency", {}),
              "host launch and gap": raw["host"].get("kernel_gap_ns", {})}.get(group)
    if figure is None:
        return SIGMA["estimate"], "figures marked estimate: true (stated default, an estimate)"
    source = str(figure.get("source", ""))
    if figure.get("estimate") or not source.startswith("measured"):
        why = "borrowed from another chip" if source.startswith("borrowed") else "estimate"
        return (SIGMA["borrowed"] if why.startswith("borrowed") else SIGMA["estimate"]), f"{why} (stated default)"
    key = {"store stream efficiency": "measured_store", "matrix efficiency": "measured_matrix"}.get(group, "measured_host")
    return SIGMA[key], "measured here (run-to-run spread, stated default)"


def _raw_profile(hardware: str) -> dict:
    path = hardware_dir() / f"{hardware}.yaml"
    return load_yaml(path if path.exists() else Path(hardware))


def band(spec, p50_ms: float) -> dict:
    """The p10-p90 band of ``spec``'s per-token latency around ``p50_ms`` and the groups that decide it."""
    raw = _raw_profile(spec.hardware)
    kind = kernel_costs_kind(load_profile(spec.hardware))
    measured = _measured_sigma()
    fast = spec.model_copy(update={"engine": "analytic", "steps": 1})
    base = simulate(fast).summary["per_token_ms_p50"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for group in (*GROUPS, *estimate_paths(raw)):
            path = Path(tmp) / f"{raw['name']}.yaml"
            path.write_text(yaml.safe_dump(perturbed(raw, group, 1 + DELTA), sort_keys=False))
            moved = simulate(fast.model_copy(update={"hardware": str(path)})).summary["per_token_ms_p50"]
            sensitivity = (moved - base) / DELTA * (p50_ms / base if base else 1.0)  # ms per unit relative change
            if isinstance(group, tuple):
                sigma, why, group = SIGMA["estimate"], "estimate: true (stated default)", ".".join(map(str, group))
            else:
                sigma, why = sigma_of(group, kind, raw, measured)
            rows.append({"group": group, "sensitivity_ms": round(sensitivity, 4), "sigma_rel": round(sigma, 4),
                         "sigma_ms": round(abs(sensitivity) * sigma, 4), "why": why})
    total = math.sqrt(sum(r["sigma_ms"] ** 2 for r in rows))
    for r in rows:
        r["variance_share"] = round(r["sigma_ms"] ** 2 / total ** 2, 3) if total else 0.0
    rows.sort(key=lambda r: -r["sigma_ms"])
    return {"p10_ms": round(max(p50_ms - Z90 * total, 0.0), 4), "p50_ms": round(p50_ms, 4),
            "p90_ms": round(p50_ms + Z90 * total, 4), "sigma_ms": round(total, 4), "kernel_costs": kind,
            "method": "linearized over profile figure groups (sim/experiments/band.py), analytic re-evaluations",
            "groups": rows}
