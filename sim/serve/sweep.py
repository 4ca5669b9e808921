"""Rate sweeps and the serving study: many replays, one table, the crossing rates, a report.

A sweep is the product hardware x (model, weights) x KV format x request rate of one
``ServeSpec`` base; each point is one replay (sim.serve.replay.serve), run in worker
processes. Every distinct setup is resolved before any replay (``check_setups``): an unknown
name or a setup that cannot be resolved is bad input, one error. A point that resolves but
cannot run (for example the weights leave no memory for the KV cache) becomes a row with
``status: does-not-fit`` or ``error`` and the reason.

The serving study file (``workloads/studies/serving-rate-vs-kv.yaml``), read by
``decodesim serve --study FILE``::

    kind: serve                       # marks a serving study (sim.study runs the other kind)
    name: serving-rate-vs-kv          # the report folder: reports/<name>/
    description: "..."
    question: "..."
    hardware: [h200-sxm, h200-sxm-x8]
    models:                           # model and weight format pairs
      - {model: llama-3-8b, weights: bf16}
      - {model: llama-3-70b, weights: fp8}
    kv: [fp16, int8, kivi-2]
    rates: [2, 4, 8, 16]              # requests per second (or rate_scales: [0.5, 1, 2])
    base: {requests: azure-conv, duration_s: 1200, policy: chunked, target_ms: 10}  # ServeSpec fields
    notes: |                          # Markdown kept verbatim in the report
      ...

For each (hardware, model, weights, KV format) the report gives the rate at which p99 TPOT
crosses the target (sim.serve.metrics.crossing_rate: the bracketing sweep rates and a linear
interpolation between them).
"""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import ConfigDict, Field, model_validator

from sim.config.loader import load_yaml, validate
from sim.config.quantity import Strict
from sim.errors import COMMAND_LINE, ConfigError, SimulationError
from sim.io import write_frame
from sim.paths import resolve as resolve_path
from sim.paths import studies_dir
from sim.serve.metrics import crossing_rate
from sim.serve.replay import serve
from sim.serve.spec import ServeSpec
from sim.serve.stepmodel import serve_resolved

GROUP = ["hardware", "model", "weights", "kv"]
REPORT_COLUMNS = [("rate_per_s", "rate (req/s)", "{:.3g}"), ("tpot_ms_p50", "TPOT p50 (ms)", "{:.2f}"),
                  ("tpot_ms_p99", "TPOT p99 (ms)", "{:.2f}"), ("ttft_ms_p99", "TTFT p99 (ms)", "{:.0f}"),
                  ("step_ms_p50", "step p50 (ms)", "{:.2f}"), ("mean_batch_busy", "mean batch", "{:.1f}"),
                  ("max_batch_seen", "largest batch", "{:.0f}"), ("mean_kv_occupancy", "mean KV occ.", "{:.1%}"),
                  ("preemptions", "preempt.", "{:.0f}"), ("throughput_tokens_per_s", "tok/s", "{:.0f}"),
                  ("verdict", "verdict", "{}")]


class ModelEntry(Strict):
    model: str
    weights: str = "bf16"


class ServeStudySpec(Strict):
    """A serving study file (strictly typed: ``"1"`` is not a rate)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    kind: Literal["serve"]
    name: str = Field(min_length=1)
    description: str = ""
    question: str = ""
    hardware: list[str] = Field(min_length=1)
    models: list[ModelEntry] = Field(min_length=1)
    kv: list[str] = Field(min_length=1)
    rates: list[float] | None = None
    rate_scales: list[float] | None = None
    base: dict[str, Any] = Field(default_factory=dict)
    notes: str = ""

    @model_validator(mode="after")
    def _base_sets_no_axis(self):
        taken = sorted(set(self.base) & {"hardware", "model", "weights", "kv", "rate", "rate_scale"})
        if taken:
            raise ValueError(f"base may not set {taken[0]!r}: the study's hardware, models, kv and rates (or "
                             "rate_scales) lists set it for every point")
        return self

    @model_validator(mode="after")
    def _one_rate_axis(self):
        if (self.rates is None) == (self.rate_scales is None):
            raise ValueError("give exactly one of rates (requests per second) or rate_scales")
        values = self.rates if self.rates is not None else self.rate_scales
        if not values or any(not (v > 0 and math.isfinite(v)) for v in values):
            raise ValueError("rates must be a non-empty list of numbers > 0")
        return self


def load_study(name_or_path: str) -> tuple[ServeStudySpec, str]:
    """A serving study by bundled name or path; ConfigError naming the file and key if bad."""
    path = str(resolve_path(name_or_path, studies_dir(), "study"))
    raw = load_yaml(path)
    if not isinstance(raw, dict) or raw.get("kind") != "serve":
        raise ConfigError(path, "kind", "a serving study starts with `kind: serve` (other studies run with "
                          "`decodesim study`)", raw.get("kind") if isinstance(raw, dict) else raw)
    return validate(ServeStudySpec, raw, path), path


def study_points(study: ServeStudySpec, file: str = "study") -> list[ServeSpec]:
    """Every point of the study as a validated ServeSpec (ConfigError on a bad field)."""
    axis = "rate" if study.rates is not None else "rate_scale"
    values = study.rates if study.rates is not None else study.rate_scales
    points = []
    for hardware, entry, kv, value in itertools.product(study.hardware, study.models, study.kv, values):
        data = {**study.base, "hardware": hardware, "model": entry.model, "weights": entry.weights, "kv": kv,
                axis: value}
        points.append(validate(ServeSpec, data, file))
    return points


STUDY_KEYS = {"hardware": "hardware", "model": "models", "weights": "models", "kv": "kv"}  # setup key -> study key


def study_key(key: str | None) -> str:
    """The serving-study key that sets the run key ``key`` (the axes, else ``base``)."""
    return STUDY_KEYS.get(key or "", f"base.{key}" if key else "base")


def check_setups(points: list[ServeSpec], file: str = COMMAND_LINE, key_of=lambda key: key) -> None:
    """Resolve each distinct setup of ``points`` before any replay: an unknown hardware, model,
    format or stack, or a setup that cannot be resolved, is bad input and one ConfigError now
    (naming ``file`` and ``key_of`` the key that gave it), not a row of errors after the others
    ran. A setup that resolves but leaves no memory for the KV cache stays a row (does-not-fit)."""
    seen = set()
    for point in points:
        spec = point.run_spec()
        text = spec.model_dump_json()
        if text in seen:
            continue
        seen.add(text)
        try:
            serve_resolved(spec)
        except ConfigError as err:
            if err.file is not None:  # a file that is there but bad says its own path and key
                raise
            raise ConfigError(file, key_of(err.key_path), err.expected, err.got) from None


def grid(base: ServeSpec, *, hardware=None, models=None, kv=None, rates=None, rate_scales=None,
         splits=None) -> list[ServeSpec]:
    """The product of the given axes around ``base`` (each axis defaults to base's value);
    ``splits``: (prefill chips, decode chips) pool splits of disaggregated serving."""
    axis, values = ("rate", rates) if rates else ("rate_scale", rate_scales) if rate_scales else (None, [None])
    out = []
    for hw, (model, weights), fmt, value, split in itertools.product(
            hardware or [base.hardware], models or [(base.model, base.weights)], kv or [base.kv], values,
            splits or [(base.prefill_chips, base.decode_chips)]):
        data = {**base.model_dump(), "hardware": hw, "model": model, "weights": weights, "kv": fmt,
                "prefill_chips": split[0], "decode_chips": split[1]}
        if axis:
            data.update({"rate": None, "rate_scale": None, axis: value})
        out.append(validate(ServeSpec, data, COMMAND_LINE))
    return out


def run_point(spec_json: str) -> dict:
    """One replay as a table row (worker entry point; never raises for bad setups)."""
    spec = ServeSpec.model_validate_json(spec_json)
    row = {"hardware": spec.hardware, "model": spec.model, "weights": spec.weights, "kv": spec.kv,
           "rate_request": spec.rate, "rate_scale_request": spec.rate_scale}
    if spec.prefill_chips is not None:
        row.update(prefill_chips=spec.prefill_chips, decode_chips=spec.decode_chips)
    try:
        summary = serve(spec)
    except (ConfigError, SimulationError) as err:
        status = "does-not-fit" if "no memory is left" in str(err) else "error"
        return {**row, "status": status, "reason": str(err)}
    summary.pop("step_model", None)
    return {**row, **summary, "status": "ok", "reason": ""}


POLL_S = 0.2  # how often a sweep waiting on its workers checks ``stop``


def run_sweep(points: list[ServeSpec], jobs: int | None = None, progress=None, stop=None) -> pd.DataFrame:
    """Replay every point (in ``jobs`` worker processes; 1 runs in this process). ``stop`` (a
    callable, checked between points and every ``POLL_S`` while waiting) ends the sweep early:
    the workers are terminated and the table holds the points that finished, in order. Workers
    ignore SIGINT, so a Ctrl-C reaches only this process, which decides."""
    payloads = [p.model_dump_json() for p in points]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(payloads)))
    rows = []
    if jobs == 1:
        for payload in payloads:
            if stop is not None and stop():
                break
            rows.append(run_point(payload))
            if progress:
                progress(rows[-1])
        return pd.DataFrame(rows)
    import multiprocessing

    pool = multiprocessing.get_context("fork").Pool(jobs, initializer=_ignore_sigint)
    try:
        results = pool.imap(run_point, payloads)
        while len(rows) < len(payloads):
            if stop is not None and stop():
                break
            try:
                row = results.next(timeout=POLL_S)
            except multiprocessing.TimeoutError:
                continue
            rows.append(row)
            if progress:
                progress(row)
    finally:
        if len(rows) < len(payloads):
            pool.terminate()
        else:
            pool.close()
        pool.join()
    return pd.DataFrame(rows)


def _ignore_sigint() -> None:
    """Worker start: ignore SIGINT (the parent decides), and die on SIGTERM (a forked worker
    inherits the parent's handlers, which would only set a flag there and keep it running)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def crossings(table: pd.DataFrame, target_ms: float) -> pd.DataFrame:
    """Per (hardware, model, weights, kv): where p99 TPOT crosses ``target_ms`` along rate."""
    rows = []
    ok = table[table["status"] == "ok"] if "status" in table else table
    for key, group in table.groupby(GROUP, sort=False):
        fine = ok.loc[ok.index.intersection(group.index)]
        found = crossing_rate(fine["rate_per_s"], fine["tpot_ms_p99"], target_ms) if len(fine) else {"kind": "none"}
        rows.append({**dict(zip(GROUP, key, strict=True)), **found, "text": describe_crossing(found, group)})
    return pd.DataFrame(rows)


def describe_crossing(found: dict, group: pd.DataFrame) -> str:
    kind = found["kind"]
    if kind == "between":
        return f"{found['rate']:.3g} req/s (between {found['low']:.3g} and {found['high']:.3g})"
    if kind == "below":
        return f"below {found['rate']:.3g} req/s (misses at every rate swept)"
    if kind == "above":
        return f"above {found['rate']:.3g} req/s (meets at every rate swept)"
    reasons = sorted(set(group.get("reason", pd.Series(dtype=str)).dropna()) - {""})
    return "not run: " + (reasons[0] if reasons else "no finished requests")


def write_table(table: pd.DataFrame, out: Path) -> None:
    """``table.parquet`` and ``table.csv`` in ``out``, each written atomically."""
    write_frame(table, out / "table")


__all__ = ["ServeStudySpec", "load_study", "study_points", "grid", "run_point", "run_sweep", "crossings",
           "write_table"]
