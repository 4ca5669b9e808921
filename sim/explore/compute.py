"""What a view computes from a RunSpec: the roofline of a run's first step, latency against
batch and context, the ``decodesim run`` line of a spec, and ``decodesim run --html``.

Everything here runs through ``sim.run.simulate``, the function behind ``decodesim run``, so
each point is the CLI's figure for the same arguments. Used by the explorer's views
(sim.explore.views) and by the run command.
"""

from __future__ import annotations

import json
import shlex

from sim.config.loader import validate
from sim.config.spec import RunSpec, apply_run_overrides
from sim.costs import CostModel
from sim.errors import COMMAND_LINE, ConfigError, SimulationError, error_line
from sim.explore.html import view_document
from sim.io import to_json
from sim.run import simulate
from sim.setup import resolve
from sim.units import GFLOP_PER_TFLOP

MAX_STEPS = 64
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTEXTS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
# RunSpec field -> the run command's option
RUN_FLAGS = {"hardware": "--hardware", "model": "--model", "weights": "--weights", "kv": "--kv",
             "software": "--software", "dispatch": "--dispatch", "placement": "--placement",
             "routing": "--routing", "batch": "--batch", "context": "--context", "steps": "--steps",
             "engine": "--engine", "target_ms": "--target-ms", "tp": "--tp", "pp": "--pp", "chips": "--chips"}


class FormError(Exception):
    """Bad input from the page; ``str()`` is the one line the CLI prints (``decodesim: ...``)."""


def plain(obj):
    """``obj`` as plain JSON data (numpy scalars as numbers, non-finite floats as None)."""
    return json.loads(to_json(obj))


def vector_peak_Tops(hardware) -> float:
    """The vector units' peak (tera operations per second, fp32), the dequantization ceiling."""
    c = hardware.compute
    return c.tiles.value * c.vector_rate("fp32") * c.clock_GHz.value / GFLOP_PER_TFLOP


def roofline_of(result) -> dict | None:
    """The first step's ops placed per memory level, as sim.report.detail_plots.roofline places
    them (work = FLOPs + vector ops, intensity = work / bytes at that level, rate = work /
    duration), with each level's peak, the matrix peak and the vector ceiling."""
    setup = result.resolved
    if setup is None or not result.ops:
        return None
    hardware = setup.hardware
    peaks = {k: v for k, v in CostModel(hardware).capacity.items() if k != "compute"}
    levels = [level.name for level in hardware.memory if level.name in peaks]
    dtype = getattr(setup.weights, "matmul_dtype", None) or "bf16"
    try:
        matrix = hardware.compute.matrix_peak_TFLOPs(dtype)
    except Exception:  # a dtype the profile has no rate for: the bf16 peak, as the study's detail plot does
        matrix = hardware.compute.matrix_peak_TFLOPs("bf16")
    return {"peaks_GBps": {lv: peaks[lv] for lv in levels}, "matrix_peak_TFLOPs": matrix,
            "vector_peak_Tops": vector_peak_Tops(hardware),
            "vector_sustained_Tops": vector_peak_Tops(hardware) * hardware.compute.vector_efficiency.value,
            "matmul_dtype": dtype,
            "points": _level_points(result.ops, levels)}


def _level_points(ops: list[dict], levels: list[str]) -> dict[str, dict]:
    """Per memory level, the first step's ops that move bytes there: name, intensity, rate."""
    first = ops[0]["step"]
    points: dict[str, dict] = {}
    for op in ops:
        if op["step"] != first:
            continue
        work = (op.get("flops") or 0) + (op.get("vector_ops") or 0)
        duration = max(op["t_end_ns"] - op["t_start_ns"], 1e-9)
        for level in levels:
            moved = sum(v for k, v in op.items() if k.endswith(f"_{level}_bytes") and v == v and v)
            if moved > 0 and work > 0:
                p = points.setdefault(level, {"name": [], "intensity": [], "rate": []})
                p["name"].append(op["name"])
                p["intensity"].append(work / moved)
                p["rate"].append(work / duration / GFLOP_PER_TFLOP)
    return points


def curves_for(spec, superseded=lambda: False, axes=("batch", "context")) -> dict:
    """p99 ms per token of ``spec`` at each batch of ``BATCHES`` and each context of
    ``CONTEXTS`` the model holds (the spec's own batch and context included), each the
    CLI's figure for ``--batch B`` (``--context C``) with the other arguments kept; ``axes``
    names the curves to compute. A spec
    that replays a trace has no curves (its batch and context come from the trace)."""
    try:
        effective = apply_run_overrides(spec)
        if effective.trace is not None:
            return {}
        max_context = resolve(effective.model_copy(update={"steps": 1, "context": 1})).model.max_context
    except (ConfigError, SimulationError) as err:
        raise FormError(error_line(err, COMMAND_LINE)) from None
    last = effective.steps - 1
    values_of = {"batch": lambda: sorted(set(BATCHES) | {effective.batch}),
                 "context": lambda: sorted({c for c in CONTEXTS if effective.allow_long_context
                                            or c + last <= max_context} | {effective.context})}
    out: dict[str, list] = {}
    for axis in axes:
        values = values_of[axis]()
        out[axis] = []
        for value in values:
            if superseded():
                return {"superseded": True}
            data = {**effective.model_dump(), axis: value}
            try:
                s = simulate(validate(RunSpec, data, COMMAND_LINE)).summary
            except (ConfigError, SimulationError):
                continue  # a point the CLI would refuse (batch x steps too large): not on the curve
            out[axis].append({"x": value, "ms_p99": s["per_token_ms_p99"], "ms_p50": s["per_token_ms_p50"],
                              "bound": s["bound"], "verdict": s["verdict"]})
    return plain(out)


def spec_command(spec) -> str:
    """``decodesim run ...`` with the options of ``spec`` that differ from the defaults."""
    defaults, words = RunSpec().model_dump(), ["decodesim", "run"]
    for key, value in spec.model_dump().items():
        if key == "overrides":
            for path, v in value:
                words += ["--set", f"{path}={json.dumps(v) if not isinstance(v, str) else v}"]
        elif value != defaults.get(key) and key in RUN_FLAGS:
            words += [RUN_FLAGS[key], str(value)]
        elif value != defaults.get(key) and key in ("graph", "allow_long_context", "trace"):
            words += {"graph": ["--graph" if value else "--no-graph"], "allow_long_context": ["--allow-long-context"],
                      "trace": ["--trace", str(value)]}[key]
        elif value != defaults.get(key):
            words += ["--set", f"{key}={value}"]
    return shlex.join(words)


def run_view(spec, result) -> str:
    """``decodesim run --html``: the run's view (headline, breakdown, roofline, curves) as one
    self-contained HTML file. The curves are left out past ``MAX_STEPS`` steps (each of
    their ~17 points is a run as long as this one)."""
    view = {"label": "A", "command": spec_command(spec), "summary": plain(result.summary),
            "roofline": plain(roofline_of(result))}
    if result.summary["verdict"] != "does-not-fit" and spec.steps <= MAX_STEPS:
        view["curves"] = curves_for(spec)
    return view_document([view], title=f"decodesim: {result.summary['model']} on {result.summary['hardware']}")


__all__ = ["FormError", "plain", "roofline_of", "curves_for", "spec_command", "run_view", "MAX_STEPS", "BATCHES", "CONTEXTS",
           "RUN_FLAGS", "vector_peak_Tops"]
