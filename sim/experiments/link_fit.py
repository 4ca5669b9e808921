"""Fit the chip-link figures of a multi-chip profile from measured collectives (issue 7).

Input: a CSV of NCCL collective timings, one row per (op, world size, message size), with
at least the columns ``op`` (``allreduce`` or ``alltoall``), ``world_size``, ``bytes``
(the message per GPU: for an all-reduce, batch x hidden x 2 bytes) and ``median_us``
(median over repetitions, device time). Other columns (machine facts, p10/p90, graph mode)
are kept but not used. The measurement script that writes it belongs in
calibration/collectives (not written here).

Model: the simulator's own cost of a collective (sim/costs.py) on a ``switch`` topology
running ring collectives, with ``n`` chips and a message of ``s`` bytes:

    all-reduce:  t = o + 2(n-1) L + (2(n-1)/n) s / B
    all-to-all:  t = o +  (n-1) L + ((n-1)/n)  s / B

with ``o`` = ``per_message_overhead_ns``, ``L`` = ``latency_ns`` (per algorithm step) and
``B`` = ``bandwidth_GBps`` (bytes/ns) per chip per direction. The three unknowns enter
linearly (o, L, 1/B), so they come from one non-negative least-squares fit over all rows;
the report gives the fit's residuals so a bad model shows. Times in ns, sizes in bytes.

``python -m sim.report.link_fit CSV`` (sim/report/link_fit.py) prints the fitted ``system.links``
block, each number with the CSV as its source.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.errors import ConfigError
from sim.units import us_to_ns

STEPS = {"allreduce": lambda n: 2 * (n - 1), "alltoall": lambda n: n - 1}
WIRE = {"allreduce": lambda n: 2 * (n - 1) / n, "alltoall": lambda n: (n - 1) / n}


@dataclass(frozen=True)
class LinkFit:
    per_message_overhead_ns: float
    latency_ns: float
    bandwidth_GBps: float
    rows: int
    median_abs_residual_pct: float
    worst_abs_residual_pct: float
    source: str

    def predict_ns(self, op: str, world_size: int, size_bytes: float) -> float:
        n = world_size
        return (self.per_message_overhead_ns + STEPS[op](n) * self.latency_ns
                + WIRE[op](n) * size_bytes / self.bandwidth_GBps)

    def yaml_block(self, kernel_gap_ns: float = 0.0) -> str:
        """The ``system.links`` block. The engine adds the profile's ``host.kernel_gap_ns`` before
        every collective kernel, so that much comes off the fitted constant term."""
        src = f"measured: {self.source} (sim/report/link_fit.py, {self.rows} rows, median residual " \
              f"{self.median_abs_residual_pct:.1f}%)"
        overhead = max(0.0, self.per_message_overhead_ns - kernel_gap_ns)
        return "\n".join([
            "  links:",
            "    topology: switch",
            f"    bandwidth_GBps: {{value: {self.bandwidth_GBps:.1f}, source: \"{src}\"}}",
            f"    latency_ns: {{value: {self.latency_ns:.0f}, source: \"{src}\"}}",
            f"    per_message_overhead_ns: {{value: {overhead:.0f}, source: \"{src}, less the kernel gap "
            f"{kernel_gap_ns:.0f} ns\"}}",
        ])


def read_rows(path: Path | str, mode: str | None = "graph", min_rows: int = 3) -> list[dict]:
    """Rows with world_size >= 2. With a ``mode`` column (calibration/collectives.py writes eager and
    graph rows), only rows of ``mode`` (decode steps run as graphs); ``median_us_max_over_ranks``
    (the collective ends when its slowest rank does) is preferred over ``median_us``."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), None, "collectives CSV not found")
    rows = []
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        fields = reader.fieldnames or ()
        missing = {"op", "world_size", "bytes", "median_us"} - set(fields)
        if missing:
            raise ConfigError(str(path), None, f"missing columns {sorted(missing)}; expected op, world_size, bytes, "
                                               "median_us")
        time_key = "median_us_max_over_ranks" if "median_us_max_over_ranks" in fields else "median_us"
        wanted = mode if "mode" in fields else None
        for i, row in enumerate(reader, start=2):
            parsed = _row(path, i, row, time_key, wanted)
            if parsed is not None:
                rows.append(parsed)
    if len(rows) < min_rows:
        raise ConfigError(str(path), None, f"need at least {min_rows} rows with world_size >= 2"
                                           f"{f' in mode {mode}' if mode else ''} to fit 3 figures, got {len(rows)}")
    return rows


def _row(path: Path, line: int, row: dict, time_key: str, mode: str | None) -> dict | None:
    """One CSV row as (op, world_size, bytes, t_ns), or None for a row that says nothing about
    links: another mode, no time, or a world size of 1 (a plumbing check)."""
    if mode is not None and row["mode"].strip().lower() != mode:
        return None
    if not (row.get(time_key) or "").strip() or row[time_key].strip().lower() == "nan":
        return None
    op = row["op"].strip().lower().replace("_", "").replace("-", "")
    if op not in STEPS:
        raise ConfigError(str(path), f"line {line}.op", f"expected allreduce or alltoall, got {row['op']!r}")
    try:
        n, size, us = int(row["world_size"]), float(row["bytes"]), float(row[time_key])
    except ValueError as err:
        raise ConfigError(str(path), f"line {line}", f"expected numbers ({err})") from None
    if n < 2 or size <= 0 or us <= 0:
        return None
    return {"op": op, "world_size": n, "bytes": size, "t_ns": us_to_ns(us)}


def fit(rows: list[dict], source: str = "collectives CSV") -> LinkFit:
    """Non-negative least squares, relative (each row weighted by 1/t so small messages,
    where latency rules, count as much as large ones)."""
    a = np.array([[1.0, STEPS[r["op"]](r["world_size"]), WIRE[r["op"]](r["world_size"]) * r["bytes"]]
                  for r in rows])
    t = np.array([r["t_ns"] for r in rows])
    w = 1.0 / t
    coef = _nnls(a * w[:, None], t * w)
    o, lat, inv_bw = coef
    if inv_bw <= 0:
        raise ConfigError(source, None, "the fit found no bandwidth term: use message sizes large enough that "
                                        "bandwidth shows (MB and up)")
    residual = 100 * np.abs(a @ coef - t) / t
    return LinkFit(float(o), float(lat), float(1.0 / inv_bw), len(rows), float(np.median(residual)),
                   float(residual.max()), source)


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0 by active-set elimination (3 unknowns: exhaustive is exact)."""
    best, best_err = np.zeros(a.shape[1]), float(np.sum(b ** 2))
    k = a.shape[1]
    for mask in range(1, 2 ** k):
        cols = [j for j in range(k) if mask >> j & 1]
        x_sub, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
        if np.any(x_sub < 0):
            continue
        x = np.zeros(k)
        x[cols] = x_sub
        err = float(np.sum((a @ x - b) ** 2))
        if err < best_err - 1e-12 * max(1.0, best_err):
            best, best_err = x, err
    return best
