#!/usr/bin/env python3
"""Fit the simulator's chip-link figures to measured NCCL collectives (issue 7).

    python calibration/fit_links.py CSV [CSV ...] [--mode graph] [--ops all_reduce,all_to_all]
        [--profile h200-sxm-x8] [--out calibration/links_fit.json]
        [--write-profile hardware_profiles/h200-sxm.yaml --write-profile hardware_profiles/h200-sxm-x8.yaml]

Input: CSVs written by calibration/collectives.py over a world size of 2 or more (columns op,
mode, world_size, plumbing_check, bytes, median_us, median_us_max_over_ranks, ...). A world-size-1
CSV (``plumbing_check`` true: NCCL copies locally, nothing crosses a link) is refused, never fitted.

Model: exactly the collective cost of sim/costs.py on a ``switch`` (or ``ring``) topology, as the
engine (sim/engine/simulation.py) charges it for an op of one kernel:

    t = kernel_gap_ns + per_message_overhead_ns + steps(n) * latency_ns + wire_bytes(n, S) / bandwidth_GBps

    all-reduce : steps = 2(n-1), wire_bytes = ceil(2(n-1) S / n)   (CostModel._link_bytes)
    all-to-all : steps =  n-1,   wire_bytes = ceil((n-1) S / n)
    (S = the ``bytes`` column: the message per GPU; for all-to-all the whole send buffer)

``kernel_gap_ns`` is the profile's ``host.kernel_gap_ns`` (one kernel per collective: the lowering's
KERNELS table and sim/lowering/moe.py), which a CUDA-graph replay of back-to-back collectives also
pays, so it is taken off the measured time before the fit and is not a fitted figure. The three
figures enter linearly (o, L, 1/B): weighted least squares (numpy lstsq, each row divided by its
measured time, so kilobyte messages where latency rules count as much as megabyte ones) over all
sizes, world sizes and ops jointly. Non-negative: a figure that comes out negative is pinned at 0
and the rest refitted; a figure the data cannot separate (latency_ns from one world size of one
op) is pinned at 0 and said so. Graph-mode rows by default (decode steps run under CUDA graphs);
``median_us_max_over_ranks`` (a collective ends when its slowest rank does) over ``median_us``.

Output: a JSON document (default calibration/links_fit.json, written atomically) with the three
figures, each with ``source: "measured: <csv> via calibration/fit_links.py"`` and its ``method``,
plus every row's residual. ``--write-profile`` edits a profile's three ``system.links`` lines in
place (text edit, validated, atomic). h200-sxm-x8.yaml copies its links from h200-sxm.yaml
(sim/report/multichip.py; tests/test_profiles.py checks they match), so a derived profile is only
written together with its base. Units: ns, bytes, GB/s = bytes/ns.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "calibration" / "links_fit.json"
FIGURES = ("per_message_overhead_ns", "latency_ns", "bandwidth_GBps")
OPS = {"all_reduce": "allreduce", "allreduce": "allreduce", "all_to_all": "alltoall", "alltoall": "alltoall"}
TOPOLOGIES = ("switch", "ring")  # the step counts below are these topologies' (sim/costs.py)
TRUE = {"true", "1", "yes"}
PLUMBING = ("a plumbing check (world size 1: NCCL copies locally, no link is measured) cannot be fitted; "
            "measure with calibration/collectives.py --world-size N, N >= 2")


def steps(kind: str, n: int) -> int:
    """Latency steps of a ring/switch collective (CostModel.collective_latency_ns)."""
    return 2 * (n - 1) if kind == "allreduce" else n - 1


def wire_bytes(kind: str, n: int, size_bytes: float) -> int:
    """Bytes each chip puts on its links (CostModel._link_bytes)."""
    if kind == "allreduce":
        return math.ceil(2 * (n - 1) * size_bytes / n)
    return math.ceil((n - 1) * size_bytes / n)


@dataclass(frozen=True)
class Row:
    file: str
    line: int
    op: str  # simulator kind: allreduce | alltoall
    world_size: int
    size_bytes: float
    t_ns: float


@dataclass
class LinkFit:
    per_message_overhead_ns: float
    latency_ns: float
    bandwidth_GBps: float
    kernel_gap_ns: float
    rows: list[Row]
    sources: list[str]
    mode: str
    pinned: dict[str, str] = field(default_factory=dict)

    def predict_ns(self, kind: str, n: int, size_bytes: float) -> float:
        """The simulator's time for this collective (kernel gap included)."""
        return (self.kernel_gap_ns + self.per_message_overhead_ns + steps(kind, n) * self.latency_ns
                + wire_bytes(kind, n, size_bytes) / self.bandwidth_GBps)

    def residuals_pct(self) -> np.ndarray:
        return np.array([100 * (self.predict_ns(r.op, r.world_size, r.size_bytes) - r.t_ns) / r.t_ns
                         for r in self.rows])

    def source(self) -> str:
        return f"measured: {', '.join(self.sources)} via calibration/fit_links.py"

    def method(self) -> str:
        ops = sorted({r.op for r in self.rows})
        ns = sorted({r.world_size for r in self.rows})
        res = np.abs(self.residuals_pct())
        text = (f"{self.mode} rows, {len(self.rows)} of {'/'.join(ops)} over n = {','.join(map(str, ns))}; "
                f"least squares relative to each time, jointly, of t - kernel_gap {self.kernel_gap_ns:.0f} ns "
                f"= o + steps(n) L + wire_bytes/B; median residual {np.median(res):.1f}%, worst {res.max():.1f}%")
        if self.pinned:
            text += "; pinned at 0: " + "; ".join(f"{k} ({v})" for k, v in self.pinned.items())
        return text


# -- input ---------------------------------------------------------------------------------
def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def _columns(reader: csv.DictReader, name: str) -> tuple[set[str], str]:
    """The CSV's columns and the one its times are read from; refuses a CSV without the needed columns."""
    fields = set(reader.fieldnames or ())
    missing = {"op", "world_size", "bytes", "median_us"} - fields
    if missing:
        raise ConfigError(name, None, f"missing columns {sorted(missing)}; expected calibration/collectives.py's "
                                      "CSV (op, mode, world_size, plumbing_check, bytes, median_us, ...)")
    time_key = "median_us_max_over_ranks" if "median_us_max_over_ranks" in fields else "median_us"
    return fields, time_key


def _world_size(raw: dict, name: str, line: int) -> int:
    """The row's world size; a plumbing-check or world-size-1 row refuses the file."""
    if (raw.get("plumbing_check") or "").strip().lower() in TRUE:
        raise ConfigError(name, f"line {line}.plumbing_check", PLUMBING, raw["plumbing_check"])
    try:
        n = int(raw["world_size"])
    except (TypeError, ValueError):
        raise ConfigError(name, f"line {line}.world_size", "expected an integer", raw["world_size"]) from None
    if n == 1:
        raise ConfigError(name, f"line {line}.world_size", PLUMBING, n)
    if n < 1:
        raise ConfigError(name, f"line {line}.world_size", "expected an integer >= 2", n)
    return n


def _size_and_time(raw: dict, name: str, line: int, time_key: str) -> tuple[float, float] | None:
    """The row's message bytes and time in microseconds, or None for a row without a time."""
    text = (raw.get(time_key) or "").strip()
    if not text or text.lower() == "nan":
        return None  # e.g. "graph capture failed" rows carry no time
    try:
        size, us = float(raw["bytes"]), float(text)
    except ValueError as err:
        raise ConfigError(name, f"line {line}", f"expected numbers in bytes and {time_key} ({err})") from None
    if not (size > 0 and us > 0 and math.isfinite(size) and math.isfinite(us)):
        raise ConfigError(name, f"line {line}", f"expected bytes > 0 and {time_key} > 0", (size, us))
    return size, us


def read_csv(path: str | Path, mode: str | None = "graph", ops: tuple[str, ...] = ("allreduce", "alltoall")
             ) -> list[Row]:
    """The rows of ``mode`` (None: all) and ``ops``; a plumbing-check or world-size-1 row refuses the file."""
    path = Path(path)
    name = _display(path)
    if not path.is_file():
        raise ConfigError(name, None, "collectives CSV not found")
    rows = []
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        fields, time_key = _columns(reader, name)
        for line, raw in enumerate(reader, start=2):
            n = _world_size(raw, name, line)
            op = OPS.get((raw["op"] or "").strip().lower())
            if op is None:
                raise ConfigError(name, f"line {line}.op", "expected all_reduce or all_to_all", raw["op"])
            if op not in ops or (mode is not None and "mode" in fields and raw["mode"].strip().lower() != mode):
                continue
            timed = _size_and_time(raw, name, line, time_key)
            if timed is not None:
                rows.append(Row(name, line, op, n, timed[0], timed[1] * 1e3))
    return rows


# -- fit -----------------------------------------------------------------------------------
def fit(rows: list[Row], kernel_gap_ns: float, sources: list[str], mode: str = "graph") -> LinkFit:
    """Relative least squares of the three figures, non-negative by pinning (see the module docstring)."""
    where = ", ".join(sources) or "<input>"
    if len(rows) < 3:
        raise ConfigError(where, None, f"need at least 3 timed rows with world_size >= 2 (mode {mode}) to fit 3 "
                                       f"figures, got {len(rows)}")
    t = np.array([r.t_ns for r in rows])
    a = np.array([[1.0, steps(r.op, r.world_size), wire_bytes(r.op, r.world_size, r.size_bytes)] for r in rows])
    y = (t - kernel_gap_ns) / t
    a = a / t[:, None]
    scale = np.abs(a).max(axis=0)
    a = a / scale
    free, pinned = [0, 1, 2], {}
    if np.linalg.matrix_rank(a) < 3 and np.linalg.matrix_rank(a[:, [0, 2]]) == 2:
        pinned["latency_ns"] = ("not separable from the overhead: every row has the same steps(n); "
                                "measure two or more world sizes")
        free.remove(1)
    if np.linalg.matrix_rank(a[:, free]) < len(free):
        raise ConfigError(where, None, "the rows cannot separate the figures: need two or more message sizes "
                                       "(and world sizes for latency_ns)")
    while True:
        x_free, *_ = np.linalg.lstsq(a[:, free], y, rcond=None)
        negative = [(v, j) for v, j in zip(x_free, free, strict=True) if v < 0]
        if not negative:
            break
        _, j = min(negative)
        if j == 2:
            raise ConfigError(where, None, "the fit found no bandwidth term (1/bandwidth < 0): use message sizes "
                                           "large enough that bandwidth shows (hundreds of kB and up)")
        pinned[FIGURES[j]] = "came out negative"
        free.remove(j)
    x = np.zeros(3)
    x[free] = x_free
    x = x / scale
    if x[2] <= 0:
        raise ConfigError(where, None, "the fit found no bandwidth term")
    return LinkFit(float(x[0]), float(x[1]), float(1.0 / x[2]), kernel_gap_ns, rows, sources, mode, pinned)


def residual_table(result: LinkFit) -> list[dict]:
    res = result.residuals_pct()
    groups: dict[tuple, list[float]] = {}
    for r, e in zip(result.rows, res, strict=True):
        groups.setdefault((r.op, r.world_size), []).append(float(e))
    return [{"op": op, "world_size": n, "rows": len(v), "median_abs_pct": float(np.median(np.abs(v))),
             "worst_abs_pct": float(np.max(np.abs(v))), "mean_pct": float(np.mean(v))}
            for (op, n), v in sorted(groups.items())]


def document(result: LinkFit, profile: str) -> dict:
    res = result.residuals_pct()
    src, method = result.source(), result.method()
    figures = {
        "per_message_overhead_ns": round(result.per_message_overhead_ns, 1),
        "latency_ns": round(result.latency_ns, 1),
        "bandwidth_GBps": round(result.bandwidth_GBps, 2),
    }
    doc = {
        "generated_by": "calibration/fit_links.py",
        "inputs": result.sources,
        "model": "t = kernel_gap_ns + per_message_overhead_ns + steps(n) * latency_ns + wire_bytes(n, S) / "
                 "bandwidth_GBps; all-reduce steps 2(n-1), wire ceil(2(n-1)S/n); all-to-all steps n-1, wire "
                 "ceil((n-1)S/n) (sim/costs.py, switch/ring topology)",
        **{k: {"value": v, "source": src, "method": method} for k, v in figures.items()},
        "kernel_gap_ns": {"value": result.kernel_gap_ns,
                          "source": f"{profile} host.kernel_gap_ns (the engine charges it before each collective "
                                    "kernel; taken off the measured times, not fitted)"},
        "pinned": result.pinned,
        "residuals": {
            "rms_pct": float(np.sqrt(np.mean(res ** 2))), "median_abs_pct": float(np.median(np.abs(res))),
            "worst_abs_pct": float(np.max(np.abs(res))), "by_op_world_size": residual_table(result),
            "rows": [{"file": r.file, "line": r.line, "op": r.op, "world_size": r.world_size,
                      "bytes": r.size_bytes, "measured_ns": r.t_ns,
                      "predicted_ns": result.predict_ns(r.op, r.world_size, r.size_bytes),
                      "residual_pct": float(e)} for r, e in zip(result.rows, res, strict=True)],
        },
    }
    return doc


# -- output --------------------------------------------------------------------------------
def _write_atomic(path: Path, text: str) -> None:
    from sim.io import write_atomic  # the project's one atomic writer

    write_atomic(path, text)


def profile_values(result: LinkFit) -> dict[str, float | int]:
    """The figures as written to a profile (ns to the nanosecond, GB/s to 0.1)."""
    return {"per_message_overhead_ns": round(result.per_message_overhead_ns),
            "latency_ns": round(result.latency_ns), "bandwidth_GBps": round(result.bandwidth_GBps, 1)}


def edit_profile_text(text: str, file: str, values: dict, source: str) -> str:
    """Replace the three one-line entries of ``system.links`` (nothing else changes)."""
    lines = text.splitlines(keepends=True)
    try:
        system = next(i for i, ln in enumerate(lines) if re.match(r"^system:\s*(#.*)?$", ln))
        links = next(i for i in range(system + 1, len(lines)) if re.match(r"^  links:\s*(#.*)?$", lines[i]))
    except StopIteration:
        raise ConfigError(file, "system.links", "a system.links block to update") from None
    end = links + 1
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith("    ")
                                or lines[end].lstrip().startswith("#")):
        end += 1
    block = range(links + 1, end)
    topology = [lines[i] for i in block if re.match(r"^    topology:", lines[i])]
    kind = topology[0].split(":", 1)[1].split("#")[0].strip() if topology else None
    if kind not in TOPOLOGIES:
        raise ConfigError(file, "system.links.topology", f"one of {list(TOPOLOGIES)} (the fitted step counts are "
                                                         "those of ring collectives)", kind)
    for key, value in values.items():
        hits = [i for i in block if re.match(rf"^    {key}:\s*\{{.*\}}\s*(#.*)?$", lines[i])]
        if len(hits) != 1:
            raise ConfigError(file, f"system.links.{key}", "exactly one one-line {value: ..., source: ...} entry "
                                                           "to replace", f"{len(hits)} found")
        newline = "\r\n" if lines[hits[0]].endswith("\r\n") else "\n"
        lines[hits[0]] = f"    {key}: {{value: {value}, source: {json.dumps(source)}}}{newline}"
    return "".join(lines)


def write_profiles(paths: list[Path], result: LinkFit) -> None:
    """Edit every profile, validate each edit, then replace all (each atomically)."""
    from sim.config.hardware import HardwareProfile
    from sim.config.loader import load_yaml, validate
    from sim.report.multichip import SYSTEMS

    resolved = {p.resolve() for p in paths}
    for p in paths:
        spec = next((s for s in SYSTEMS if s.name == p.stem), None)
        base = p.resolve().parent / f"{spec.base}.yaml" if spec else None
        if base is not None and base not in resolved:
            raise ConfigError(_display(p), "system.links", f"also --write-profile {_display(base)}: "
                                                           f"{p.stem} copies its links from {spec.base} "
                                                           "(sim/report/multichip.py; tests/test_profiles.py)")
    values = profile_values(result)
    source = f"{result.source()} ({result.method()})"
    staged = []
    try:
        for p in paths:
            name = _display(p)
            if not p.is_file():
                raise ConfigError(name, None, "profile not found")
            text = edit_profile_text(p.read_text(), name, values, source)
            fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".yaml")
            with os.fdopen(fd, "w") as out:
                out.write(text)
            staged.append((tmp, p))
            links = validate(HardwareProfile, load_yaml(tmp), name).system.links
            got = {k: getattr(links, k).value for k in values}
            if got != values:
                raise ConfigError(name, "system.links", f"the edit to read back as {values}", got)
        for tmp, p in staged:
            os.replace(tmp, p)
        staged = []
    finally:
        for tmp, _ in staged:
            os.unlink(tmp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fit system.links figures from calibration/collectives.py CSVs")
    parser.add_argument("csv", nargs="+", help="collectives CSVs over world sizes >= 2")
    parser.add_argument("--mode", default="graph", choices=("graph", "eager", "any"),
                        help="rows of this mode (default graph: decode steps run under CUDA graphs)")
    parser.add_argument("--ops", default="all_reduce,all_to_all", help="ops to fit jointly (comma separated)")
    parser.add_argument("--profile", default=None,
                        help="profile whose host.kernel_gap_ns is taken off (default: the first --write-profile, "
                             "else h200-sxm-x8)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="JSON to write (default calibration/links_fit.json)")
    parser.add_argument("--write-profile", action="append", default=[], metavar="YAML",
                        help="update this profile's system.links figures and sources in place (repeatable)")
    args = parser.parse_args(argv)
    try:
        from sim.setup import load_profile

        ops = []
        for name in args.ops.split(","):
            if name.strip().lower() not in OPS:
                raise ConfigError("--ops", None, "expected all_reduce and/or all_to_all", name)
            ops.append(OPS[name.strip().lower()])
        mode = None if args.mode == "any" else args.mode
        rows = [r for path in args.csv for r in read_csv(path, mode, tuple(ops))]
        targets = [Path(p) for p in args.write_profile]
        profile = args.profile or (str(targets[0]) if targets else "h200-sxm-x8")
        gap = load_profile(profile).host.kernel_gap_ns.value
        for p in targets:
            other = load_profile(str(p)).host.kernel_gap_ns.value
            if other != gap:
                raise ConfigError(_display(p), "host.kernel_gap_ns", f"the same kernel gap as {profile} ({gap} ns), "
                                                                     "since the fit takes it off", other)
        result = fit(rows, gap, [_display(Path(p)) for p in args.csv], args.mode)
        doc = document(result, profile)
        if targets:
            write_profiles(targets, result)
        _write_atomic(Path(args.out), json.dumps(doc, indent=1) + "\n")
    except ConfigError as err:
        print(f"fit_links: {err}", file=sys.stderr)
        return 2
    print(f"{len(rows)} rows ({result.method()})")
    for key in FIGURES:
        print(f"  {key:24s} {doc[key]['value']:>10}")
    print(f"  (kernel gap {gap:.0f} ns from {profile} taken off; fitted constant = gap + overhead)")
    print(f"residuals: rms {doc['residuals']['rms_pct']:.2f}%, median |r| {doc['residuals']['median_abs_pct']:.2f}%, "
          f"worst {doc['residuals']['worst_abs_pct']:.2f}%")
    print(f"  {'op':10s} {'n':>3s} {'rows':>5s} {'median|r|%':>11s} {'worst%':>7s} {'mean%':>7s}")
    for g in doc["residuals"]["by_op_world_size"]:
        print(f"  {g['op']:10s} {g['world_size']:3d} {g['rows']:5d} {g['median_abs_pct']:11.2f} "
              f"{g['worst_abs_pct']:7.2f} {g['mean_pct']:7.2f}")
    print(f"wrote {_display(Path(args.out))}" + "".join(f", {_display(p)}" for p in targets))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
