"""Turn a calibration fit into profile figures, each naming the measurement, and write them.

``figures()`` gives dotted profile paths (``memory.hbm.stream_efficiency``, ``host.kernel_gap_ns``,
``kernels``, ...) with their values and sources; the source of every figure names the device,
driver, PyTorch/CUDA/Triton versions, the date and the raw file. ``apply()`` puts them into a
base profile's raw YAML (the overlay stays a plain JSON of paths too, so a generator such as
sim.report.multichip can apply the same figures). ``write_profile()`` validates and writes
atomically.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml

from sim.config.hardware import HardwareProfile
from sim.config.loader import validate
from sim.io import write_atomic
from sim.units import MB


def measurement(facts: dict, mode: str, raw: str) -> str:
    """The source prefix of every figure of one calibration run."""
    driver = facts.get("driver") or "?"
    return (f"measured: {facts.get('gpu_name', '?')}, driver {driver}, torch {facts.get('torch', '?')} "
            f"(CUDA {facts.get('torch_cuda', '?')}), triton {facts.get('triton', '?')}, "
            f"{str(facts.get('date_utc', '?'))[:10]}, `decodesim calibrate{' --quick' if mode == 'quick' else ''}`; "
            f"raw rows {raw}")


def _class_block(name: str, c: dict, src: str) -> dict:
    how = f"{src} (class {name}: {', '.join(c['impls'])}; fit {c['fit']}, held out {c['held_out']})"
    block = {"startup_ns": {"value": round(max(c["startup_ns"], 0.0), 1), "source": how},
             "stream_fraction": {"value": c["stream_fraction"],
                                 "source": f"{how}: {c['bandwidth_GBps']} GB/s over the measured sustained stream"}}
    if c.get("parallel") == "rows":
        block["parallel"] = "rows"
        block["cta_bandwidth_GBps"] = {"value": c["cta_bandwidth_GBps"], "source": how}
    return block


def figures(fit: dict, facts: dict, mode: str, raw: str, data: str) -> dict:
    """Dotted profile path -> {value, source} (``kernels``: the whole section, provenance included)."""
    src = measurement(facts, mode, raw)
    out: dict = {}
    hbm = fit["hbm"]
    out["memory.hbm.stream_efficiency"] = {
        "value": fit["stream_efficiency"],
        "source": f"{src}: torch.sum read of HBM-cold buffers >= 1 GiB, {hbm['sustained_GBps']} GB/s over the datasheet peak, "
                  f"/ (1 - refresh_overhead)"}
    gap = fit["host"].get("kernel_gap_ns") or 0.0
    if hbm.get("t0_ns") is not None:
        out["memory.hbm.latency_ns"] = {"value": round(max(hbm["t0_ns"] - gap, 0.0), 0),
                                        "source": f"{src}: intercept {hbm['t0_ns']} ns of t = t0 + bytes / BW over the "
                                                  f"read kernel's sizes, less host.kernel_gap_ns"}
    if fit.get("l2_GBps"):
        out["memory.l2.bandwidth_GBps"] = {"value": fit["l2_GBps"], "source": f"{src}: L2-resident re-read in one graph"}
    if facts.get("l2_cache_bytes"):
        out["memory.l2.capacity_MB"] = {"value": round(facts["l2_cache_bytes"] / MB, 6),
                                        "source": f"{src}: L2 size the driver reports"}
    if fit.get("matrix_efficiency"):
        out["compute.matrix_efficiency"] = {"value": fit["matrix_efficiency"],
                                            "source": f"{src}: best square bf16 matmul {fit['matmul_TFLOPs']} TFLOP/s "
                                                      f"over the datasheet peak"}
    what = {"launch_overhead_ns": "host time per eager x.add_(1) behind a busy device",
            "kernel_gap_ns": "per kernel of a CUDA graph replay of tiny kernels",
            "graph_launch_ns": "host time of replay() of a one-kernel graph",
            "sync_round_trip_ns": "torch.cuda.synchronize() on an idle device"}
    for key, text in what.items():
        if fit["host"].get(key) is not None:
            out[f"host.{key}"] = {"value": round(fit["host"][key], 0), "source": f"{src}: {text}"}
    classes = fit["classes"]
    if classes:
        rows = [c for c in classes.values() if c.get("parallel") == "rows"]
        cta = rows[0]["cta_bandwidth_GBps"] if rows else 25.0
        out["kernels"] = {
            "cta_bandwidth_GBps": {"value": cta, "source": f"{src}: the row-parallel classes' per-CTA rate"},
            "classes": {name: _class_block(name, c, src) for name, c in classes.items()},
            "provenance": {"kind": "measured", "device": facts.get("gpu_name", "?"), "data": data}}
    return out


def _level(raw: dict, name: str) -> dict:
    for level in raw["memory"]:
        if level["name"] == name:
            return level
    raise KeyError(name)


def apply(raw: dict, figs: dict) -> dict:
    """A copy of the raw profile ``raw`` with ``figs`` (dotted path -> {value, source}) set."""
    out = copy.deepcopy(raw)
    for path, fig in figs.items():
        parts = path.split(".")
        if parts[0] == "kernels":
            out["kernels"] = copy.deepcopy(fig)
            continue
        node = _level(out, parts[1]) if parts[0] == "memory" else out[parts[0]]
        node[parts[-1]] = {"value": fig["value"], "source": fig["source"]}
    return out


def write_profile(raw: dict, path: Path, header: str) -> None:
    """Validate the raw profile and write it as YAML (atomically)."""
    validate(HardwareProfile, raw, path)
    write_atomic(path, header + yaml.safe_dump(raw, sort_keys=False, default_flow_style=None, width=200))


def write_json(path: Path, obj) -> None:
    """A JSON file, written atomically."""
    write_atomic(path, json.dumps(obj, indent=1, default=str) + "\n")
