"""Study YAML: a base run, overrides, sweeps and seeds -> a list of independent points.

A study file (``workloads/studies/*.yaml``)::

    name: hbm-bandwidth-what-if            # the report folder is reports/<name>/
    description: "..."
    base: {model: llama-3-70b, hardware: h200-sxm, batch: 8, context: 8192}   # RunSpec fields
    overrides:                             # applied to every point, same dotted paths as --set
      hardware.hbm.channel_bandwidth_GBps: {scale: 2}
    sweep:
      grid:                                # Cartesian product of every axis
        batch: [1, 8, 32]
        hardware.hbm.channel_bandwidth_GBps: {from: 12.5, to: 50, steps: 4, spacing: log}
      zip:                                 # zipped lists (equal length) form ONE grid axis
        hardware: [h200-sxm, b200]
        tp: [1, 1]
      exclude:                             # grid combinations left out on purpose (the report says why)
        - {where: {model: deepseek-v3, kv: int2-asym-outlier}, reason: "groups of 128 do not divide 576"}
    seeds: [0, 1]                          # every point is run once per seed
    sensitivity: {percent: 20, knobs: [hardware.hbm.channel_bandwidth_GBps, batch]}
    plots: {feasibility: [batch, context], facet: kv, breakdown: batch}

A study expands to at most ``max_points`` points (``MAX_POINTS`` by default; ``decodesim study
--max-points N`` raises it): the size is computed from the axes before anything is expanded,
so a typo such as ``steps: 1000000000`` is an error at once, not gigabytes of points.

Dotted paths are ``hardware.<path>`` (a memory level may be named directly), ``model.<path>``
and the RunSpec fields. A value is absolute or ``{scale: f}`` / ``{add: x}``. Every point is
resolved (``sim.run.resolve``) before anything runs, so a misspelt path, a wrong type, an
empty sweep or a duplicate axis is one ConfigError naming the study file and the path. A
format whose quantization groups do not divide a point's row width (or whose outlier indices
cannot address it) is rejected here too, for every point at once, never padded silently:
leave such combinations out with ``sweep.exclude``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from sim.config.loader import load_yaml, validate
from sim.config.quantity import Strict
from sim.config.spec import RUN_FIELDS, RunSpec, canonical
from sim.errors import COMMAND_LINE, ConfigError
from sim.formats.base import check_widths
from sim.paths import resolve as resolve_path
from sim.paths import studies_dir
from sim.setup import RunSetup, resolve
from sim.study.keys import content_hash

MAX_POINTS = 100_000  # points in one study unless raised (each is resolved before anything runs)


class Sensitivity(Strict):
    percent: float = Field(default=10.0, gt=0, lt=100)
    knobs: list[str] = Field(min_length=1)


class Claim(Strict):
    """One claim the study tests, drawn as one figure (``plots/claim-<name>.png``): per row
    (a combination of the ``rows`` axes) the ``metric`` of the ``claimed`` setting against
    the ``baseline``, every other axis equal (sim.report.claims)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    title: str
    claimed: dict[str, Any] = Field(min_length=1)  # axis -> value, or a list of values (one marker each)
    baseline: dict[str, Any] = Field(min_length=1)  # axis -> value
    metric: str | list[str] = "per_token_ms_p99"  # a result column, or columns summed
    rows: list[str] = Field(min_length=1)  # one figure row per combination of these axes
    where: dict[str, Any] = Field(default_factory=dict)  # only points matching these (axis -> value or list)
    at: list[dict[str, Any]] = Field(default_factory=list, max_length=3)  # one panel per entry
    expect_cut_percent: tuple[float, float] | None = None  # the cut the claim promises, shaded


class Plots(Strict):
    claims: list[Claim] = Field(default_factory=list)
    feasibility: tuple[str, str] | None = None  # (x axis, y axis) of the heatmap
    facet: str | list[str] | None = None  # one heatmap panel per value (combination) of these axes
    breakdown: str | None = None  # the axis the stacked bars run along (default: every point)
    detail: dict[str, Any] = Field(default_factory=dict)  # assignments of the point whose DES log is plotted


class Compare(Strict):
    """Report how each value of one axis changes latency, KV bytes and verdicts against a
    baseline value, matching every other axis (optionally per group of ``by`` axes)."""

    axis: str
    baseline: Any
    by: list[str] = Field(default_factory=list)


class Focus(Strict):
    """Report: the points matching ``where`` (axis -> value or list of values), e.g. the
    settings a claim names, with the (batch, context) at which each group meets the target."""

    title: str
    where: dict[str, Any]
    by: list[str] = Field(default_factory=list)


class Exclude(Strict):
    """Grid combinations left out of a study on purpose, with the reason the report prints:
    every point whose labels match all of ``where`` (axis -> value or list of values)."""

    where: dict[str, Any] = Field(min_length=1)
    reason: str = Field(min_length=1)


class Sweep(Strict):
    grid: dict[str, Any] = Field(default_factory=dict)
    zip: dict[str, Any] = Field(default_factory=dict)
    exclude: list[Exclude] = Field(default_factory=list)


class StudySpec(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    base: dict[str, Any] = Field(default_factory=dict)
    overrides: dict[str, Any] = Field(default_factory=dict)
    sweep: Sweep = Field(default_factory=Sweep)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    sensitivity: Sensitivity | None = None
    plots: Plots = Field(default_factory=Plots)
    question: str = ""  # what the report must answer, shown at its top
    compare: list[Compare] = Field(default_factory=list)
    summary_by: list[str] = Field(default_factory=list)  # report: one answer row per value of these axes
    focus: list[Focus] = Field(default_factory=list)

    @field_validator("base")
    @classmethod
    def _base_fields(cls, value: dict) -> dict:
        unknown = sorted(set(value) - RUN_FIELDS)
        if unknown:
            raise ValueError(f"unknown run field {unknown[0]!r}; allowed: {', '.join(sorted(RUN_FIELDS))}")
        _strict_types(value)
        return value

    @model_validator(mode="after")
    def _asks_something(self):
        if not (self.base or self.overrides or self.sweep.grid or self.sweep.zip or self.sensitivity):
            raise ValueError("the study asks nothing: give at least one of base, overrides, sweep or sensitivity "
                             "(a study of only a name would run one default point)")
        return self


def _strict_types(base: dict) -> None:
    """A base value of the wrong type (text ``"8"`` for a number, ``8.5`` for a count, ``"yes"``
    for a flag) is an error here, as it is on the command line; pydantic's lax mode would
    read ``"8"`` as 8."""
    try:
        RunSpec.model_validate(base, strict=True)
    except ValidationError as err:
        for problem in err.errors(include_url=False):
            if problem["type"].endswith("_type") or problem["type"] in ("int_from_float", "int_parsing"):
                key = ".".join(str(p) for p in problem["loc"])
                raise ValueError(f"{key}: {problem['msg'][0].lower() + problem['msg'][1:]} (not text or another "
                                 f"type), got {problem['input']!r}") from None


Group = Literal["grid", "sensitivity"]


@dataclass(frozen=True)
class Point:
    """One run of a study: the base spec with ``assignments`` applied (in order)."""

    index: int
    group: str  # "grid" or "sensitivity"
    assignments: tuple[tuple[str, Any], ...]
    seed: int
    spec: RunSpec
    knob: str | None = None  # sensitivity: the knob moved, and by how much (percent)
    delta_percent: float = 0.0
    labels: dict[str, Any] = field(default_factory=dict)  # axis -> the value as written (for tables)


@dataclass
class Study:
    spec: StudySpec
    file: str
    axes: list[str]  # every swept dotted path, grid axes then zipped ones
    points: list[Point]
    hashes: list[str] | None = None  # each point's content hash, once check_points has resolved it
    excluded: list[tuple[Exclude, int]] = field(default_factory=list)  # sweep.exclude rules, points each left out

    @property
    def grid_points(self) -> list[Point]:
        return [p for p in self.points if p.group == "grid"]


def study_path(name_or_path: str) -> Path:
    return resolve_path(name_or_path, studies_dir(), "study")


def load_study(name_or_path: str | Path, check: bool = True, max_points: int = MAX_POINTS) -> Study:
    """Read, validate and expand a study (at most ``max_points`` points); with ``check``
    every point is resolved first."""
    path = study_path(str(name_or_path))
    file = str(path)
    raw = load_yaml(path)  # duplicate keys (a duplicate axis) are the loader's error
    if raw.get("kind") == "serve":
        raise ConfigError(file, "kind", f"this is a serving study (kind: serve): run it with "
                          f"`decodesim serve --study {name_or_path}`")
    spec = validate(StudySpec, raw, file)
    study = expand(spec, file, max_points)
    if check:
        check_points(study)
    return study


def axis_values(value: Any, file: str, where: str, max_points: int = MAX_POINTS) -> list[Any]:
    """A list of values, or ``{from, to, steps, spacing: linear|log, integer: bool}`` (at
    most ``max_points`` steps)."""
    if isinstance(value, dict) and "from" in value:
        return _range_values(value, *_range_bounds(value, file, where, max_points))
    if not isinstance(value, list):
        raise ConfigError(file, where, "expected a list of values or a range {from, to, steps}", value)
    if not value:
        raise ConfigError(file, where, "empty sweep: give at least one value")
    return list(value)


def _range_bounds(value: dict, file: str, where: str, max_points: int) -> tuple[float, float, int, str]:
    """A range's (from, to, steps, spacing), each checked."""
    extra = set(value) - {"from", "to", "steps", "spacing", "integer"}
    if extra:
        raise ConfigError(file, where, f"unknown range key {sorted(extra)[0]!r}; allowed: from, to, steps, spacing, integer")
    try:
        lo, hi, n = float(value["from"]), float(value["to"]), value.get("steps", 0)
        if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n) or n != int(n):
            raise ValueError("steps")
        n = int(n)
    except (KeyError, TypeError, ValueError, OverflowError):
        raise ConfigError(file, where, "a range needs numbers from, to and an integer steps >= 1", value) from None
    if n < 1:
        raise ConfigError(file, where, "a range needs steps >= 1 (an empty sweep runs nothing)", value)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ConfigError(file, where, "a range needs finite from and to", value)
    if n > max_points:
        raise ConfigError(file, f"{where}.steps", f"at most {max_points:,} points in a study{RAISE}", n)
    spacing = value.get("spacing", "linear")
    if spacing not in ("linear", "log"):
        raise ConfigError(file, f"{where}.spacing", "must be linear or log", spacing)
    if spacing == "log" and (lo <= 0 or hi <= 0):
        raise ConfigError(file, where, "a log range needs from and to > 0", value)
    return lo, hi, n, spacing


def _range_values(value: dict, lo: float, hi: float, n: int, spacing: str) -> list[float | int]:
    """The ``n`` values of a checked range, rounded to 12 places (and to integers, once each,
    with ``integer: true``)."""
    if n == 1:
        out = [lo]
    elif spacing == "log":  # four significant figures, so the values read well in tables
        out = [float(f"{lo * (hi / lo) ** (i / (n - 1)):.4g}") for i in range(n)]
    else:
        out = [lo + (hi - lo) * i / (n - 1) for i in range(n)]
    out = [round(v, 12) for v in out]
    if value.get("integer"):
        out = sorted({int(round(v)) for v in out})
    return out


RAISE = " (raise the limit with decodesim study --max-points N, or max_points= in load_study)"


def study_size(spec: StudySpec, axes: list[tuple[str, list]], zipped: dict[str, list]) -> int:
    """Points the study expands to: the grid product x zipped rows x seeds, plus sensitivity."""
    size = math.prod(len(values) for _, values in axes)
    if zipped:
        size *= len(next(iter(zipped.values())))
    size *= len(spec.seeds)
    if spec.sensitivity:
        size += 1 + 2 * len(spec.sensitivity.knobs)
    return size


def expand(spec: StudySpec, file: str, max_points: int = MAX_POINTS) -> Study:
    """The study's points (a ConfigError before expanding if there would be more than ``max_points``)."""
    names = _axis_names(spec, file)
    axes = [(path, _distinct(axis_values(value, file, f"sweep.grid.{path}", max_points), value, file,
                             f"sweep.grid.{path}")) for path, value in spec.sweep.grid.items()]
    zipped = _zipped(spec, file, max_points)
    _check_size(spec, axes, zipped, file, max_points)
    _check_seeds(spec, file)
    _check_axis_references(spec, names, file)
    values = {**dict(axes), **zipped}
    _check_excludes(spec, values, file)
    _check_claims(spec, values, file)
    fixed = tuple(spec.overrides.items())
    points: list[Point] = []
    excluded = _grid_points(spec, file, axes, zipped, fixed, points)
    detail = _detail_assignments(spec, axes, zipped, file)  # checks plots.detail
    if _excluded_by(spec, dict(detail)) is not None:
        raise ConfigError(file, "plots.detail", "names a point that sweep.exclude leaves out", dict(detail))
    if spec.sensitivity:
        _sensitivity_points(spec, file, detail, fixed, points)
    return Study(spec, file, names, points, excluded=[(rule, n) for rule, n in zip(spec.sweep.exclude, excluded,
                                                                                     strict=True)])


def _distinct(values: list, given: Any, file: str, where: str) -> list:
    """A grid axis's listed values, each once: a value listed twice would run its points twice
    under one label (a range's rounded values are its own business)."""
    if isinstance(given, list):
        seen: set[str] = set()
        for i, value in enumerate(values):
            key = repr(value)
            if key in seen:
                raise ConfigError(file, f"{where}.{i}", "duplicate value: each value of a grid axis once", value)
            seen.add(key)
    return values


def _axis_names(spec: StudySpec, file: str) -> list[str]:
    """The swept paths, grid then zip; a path set twice (also by ``overrides``) is an error."""
    where = {canonical(path): f"overrides.{path}" for path in spec.overrides}
    names: list[str] = []
    for section in ("grid", "zip"):
        for path in getattr(spec.sweep, section):
            key = canonical(path)
            if key in where:
                raise ConfigError(file, f"sweep.{section}.{path}", f"duplicate axis: already set by {where[key]}")
            where[key] = f"sweep.{section}.{path}"
            names.append(path)
    return names


def _zipped(spec: StudySpec, file: str, max_points: int) -> dict[str, list]:
    """The zip group's values per path (one axis of tuples: the lists must be equally long)."""
    zipped = {p: axis_values(v, file, f"sweep.zip.{p}", max_points) for p, v in spec.sweep.zip.items()}
    if len({len(v) for v in zipped.values()}) > 1:
        detail = ", ".join(f"{p}: {len(v)}" for p, v in zipped.items())
        raise ConfigError(file, "sweep.zip", f"zipped lists must have equal lengths ({detail})")
    return zipped


def _check_size(spec: StudySpec, axes: list[tuple[str, list]], zipped: dict[str, list], file: str,
                max_points: int) -> None:
    size = study_size(spec, axes, zipped)
    if size > max_points:
        shape = " x ".join([str(len(v)) for _, v in axes] + ([f"{len(next(iter(zipped.values())))} zipped"]
                                                             if zipped else []) + [f"{len(spec.seeds)} seeds"])
        raise ConfigError(file, "sweep", f"the study has {size:,} points ({shape}); at most {max_points:,}{RAISE}")


def _check_seeds(spec: StudySpec, file: str) -> None:
    seen: set[int] = set()
    for seed in spec.seeds:
        if seed in seen:
            raise ConfigError(file, "seeds", "duplicate seed", seed)
        seen.add(seed)


def _check_axis_references(spec: StudySpec, names: list[str], file: str) -> None:
    """``compare``, ``focus``, ``summary_by`` and the plots' axes name swept axes only."""
    named = [(f"compare.{i}.axis", axis) for i, comp in enumerate(spec.compare) for axis in [comp.axis, *comp.by]]
    named += [(f"focus.{i}", axis) for i, focus in enumerate(spec.focus) for axis in [*focus.where, *focus.by]]
    named += [("summary_by", axis) for axis in spec.summary_by]
    plots = spec.plots
    named += [(f"plots.feasibility.{i}", axis) for i, axis in enumerate(plots.feasibility or ())]
    facet = [plots.facet] if isinstance(plots.facet, str) else plots.facet or []
    named += [("plots.facet", axis) for axis in facet]
    named += [("plots.breakdown", axis) for axis in ([plots.breakdown] if plots.breakdown else [])]
    for key, axis in named:
        if axis not in names:
            raise ConfigError(file, key, f"{axis!r} is not a swept axis; axes: {', '.join(names)}")


def _grid_points(spec: StudySpec, file: str, axes: list[tuple[str, list]], zipped: dict[str, list], fixed: tuple,
                 points: list[Point]) -> list[int]:
    """Append the grid's points (every grid combination x zipped row x seed that no
    ``sweep.exclude`` rule leaves out) to ``points``; returns the points each rule left out."""
    zip_rows = list(zip(*zipped.values(), strict=False)) if zipped else [()]
    excluded = [0] * len(spec.sweep.exclude)
    for combo in itertools.product(*(vals for _, vals in axes)):
        for zrow in zip_rows:
            assigned = tuple(zip([p for p, _ in axes], combo, strict=False)) + tuple(zip(zipped, zrow, strict=False))
            rule = _excluded_by(spec, dict(assigned))
            if rule is not None:
                excluded[rule] += len(spec.seeds)
                continue
            for seed in spec.seeds:
                points.append(_point(spec, file, len(points), "grid", fixed, assigned, seed))
    return excluded


def _sensitivity_points(spec: StudySpec, file: str, base_assigned: tuple, fixed: tuple, points: list[Point]) -> None:
    """Append the sensitivity points: the base (the detail point), then each knob moved down
    and up by ``sensitivity.percent``."""
    knobs = spec.sensitivity.knobs
    for knob in knobs:
        if knob in spec.sweep.zip:
            raise ConfigError(file, f"sensitivity.knobs.{knob}", "a sensitivity knob cannot be a zipped axis")
    pct = spec.sensitivity.percent
    seed = spec.seeds[0]
    points.append(_point(spec, file, len(points), "sensitivity", fixed, base_assigned, seed, knob=None))
    for knob in knobs:
        for sign in (-1, 1):
            moved = tuple((p, v) for p, v in base_assigned if canonical(p) != canonical(knob))
            change = _moved(knob, dict(base_assigned).get(knob), 1 + sign * pct / 100, file)
            points.append(_point(spec, file, len(points), "sensitivity", fixed, moved + (change,), seed,
                                 knob=knob, delta=sign * pct))


def _moved(knob: str, current: Any, factor: float, file: str) -> tuple[str, Any]:
    """The assignment that moves ``knob`` by ``factor``: a swept knob from its value at the
    sensitivity base, any other as a scale of the profile's value."""
    if current is None:
        return knob, {"scale": factor}
    if not isinstance(current, (int, float)) or isinstance(current, bool):
        raise ConfigError(file, f"sensitivity.knobs.{knob}", "must be a numeric axis", current)
    return knob, _scaled(current, factor)


def _matches(value: Any, wanted: Any) -> bool:
    """An axis value against one ``where`` entry (a value or a list of values); 25 == 25.0."""
    options = wanted if isinstance(wanted, list) else [wanted]
    return any(value == w or str(value) == str(w) for w in options)


def _excluded_by(spec: StudySpec, labels: dict[str, Any]) -> int | None:
    """The index of the first ``sweep.exclude`` rule matching a grid point's labels, or None."""
    for i, rule in enumerate(spec.sweep.exclude):
        if all(axis in labels and _matches(labels[axis], wanted) for axis, wanted in rule.where.items()):
            return i
    return None


def _check_claims(spec: StudySpec, values: dict[str, list], file: str) -> None:
    """Every axis a claim names is swept, and every value it names is one the axis takes."""
    for i, claim in enumerate(spec.plots.claims):
        base = f"plots.claims.{i}"
        for axis in claim.rows:
            if axis not in values:
                raise ConfigError(file, f"{base}.rows", f"{axis!r} is not a swept axis; axes: {', '.join(values)}")
        parts = [("claimed", claim.claimed), ("baseline", claim.baseline), ("where", claim.where)]
        parts += [(f"at.{k}", at) for k, at in enumerate(claim.at)]
        for part, where in parts:
            for axis, wanted in where.items():
                if axis not in values:
                    raise ConfigError(file, f"{base}.{part}", f"{axis!r} is not a swept axis; axes: "
                                      f"{', '.join(values)}")
                for w in wanted if isinstance(wanted, list) else [wanted]:
                    if not any(_matches(v, w) for v in values[axis]):
                        raise ConfigError(file, f"{base}.{part}.{axis}", "must be a value of the axis "
                                          f"({', '.join(str(v) for v in values[axis])})", w)


def _check_excludes(spec: StudySpec, values: dict[str, list], file: str) -> None:
    """Every ``sweep.exclude`` rule names swept axes and values those axes take (a typo
    would otherwise exclude nothing, silently)."""
    for i, rule in enumerate(spec.sweep.exclude):
        for axis, wanted in rule.where.items():
            if axis not in values:
                raise ConfigError(file, f"sweep.exclude.{i}.where", f"{axis!r} is not a swept axis; axes: "
                                  f"{', '.join(values)}")
            for w in wanted if isinstance(wanted, list) else [wanted]:
                if not any(_matches(v, w) for v in values[axis]):
                    raise ConfigError(file, f"sweep.exclude.{i}.where.{axis}", "must be a value of the axis "
                                      f"({', '.join(str(v) for v in values[axis])})", w)


def _scaled(value, factor):
    out = value * factor
    return int(round(out)) if isinstance(value, int) else out


def _detail_assignments(spec: StudySpec, axes, zipped, file) -> tuple[tuple[str, Any], ...]:
    """The point plots.detail names (missing axes: each axis's middle value)."""
    chosen = dict(spec.plots.detail)
    swept = {p for p, _ in axes} | set(zipped)
    for key in chosen:
        if key not in swept:
            raise ConfigError(file, f"plots.detail.{key}", f"not a swept axis; axes: {', '.join(sorted(swept))}")
    out = []
    for path, values in axes:
        if path in chosen and chosen[path] not in values:
            raise ConfigError(file, f"plots.detail.{path}", f"must be one of the axis values {values}", chosen[path])
        out.append((path, chosen.get(path, values[(len(values) - 1) // 2])))
    if zipped:
        n = len(next(iter(zipped.values())))
        rows = [r for r in range(n) if all(values[r] == chosen[path] for path, values in zipped.items()
                                           if path in chosen)]
        if not rows:
            named = {p: chosen[p] for p in zipped if p in chosen}
            raise ConfigError(file, "plots.detail", f"no zipped row has {named}")
        row = rows[0] if any(p in chosen for p in zipped) else (n - 1) // 2
        out.extend((path, values[row]) for path, values in zipped.items())
    return tuple(out)


def detail_assignments(study: Study) -> tuple[tuple[str, Any], ...]:
    spec = study.spec
    axes = [(p, axis_values(v, study.file, p)) for p, v in spec.sweep.grid.items()]
    zipped = {p: axis_values(v, study.file, p) for p, v in spec.sweep.zip.items()}
    return _detail_assignments(spec, axes, zipped, study.file)


def _point(spec: StudySpec, file, index, group, fixed, assigned, seed, knob=None, delta=0.0) -> Point:
    data = dict(spec.base)
    data["overrides"] = list(fixed) + list(assigned)
    data["seed"] = seed
    run = validate(RunSpec, data, file, "base")
    labels = {p: v for p, v in assigned}
    return Point(index, group, tuple(assigned), seed, run, knob, delta, labels)


def check_points(study: Study) -> None:
    """Resolve every point (and key it by its content hash) and check its formats against
    its row widths; the first point that fails to resolve is one ConfigError naming the
    study file and the study key it comes from. Width failures are collected over every
    point and reported as one error (how many points, which format and model, the fix)."""
    seen: dict = {}
    hashes = []
    misfits: dict[tuple, list[Point]] = {}
    for point in study.points:
        key = point.spec.model_dump_json()
        if key in seen:
            hashes.append(seen[key])
            continue
        try:
            res = resolve(point.spec)
            seen[key] = content_hash(point.spec, res=res)
            hashes.append(seen[key])
        except ConfigError as err:
            where = ", ".join(f"{p}={v!r}" for p, v in point.assignments) or "the base point"
            raise ConfigError(study.file, study_key(study.spec, err, point),
                              f"{err.expected} ({_origin(err)}at {where})", err.got) from None
        misfit = _width_misfit(res)
        if misfit is not None:
            misfits.setdefault(misfit, []).append(point)
    study.hashes = hashes
    if misfits:
        raise _width_error(study, misfits)


def _origin(err: ConfigError) -> str:
    """Where a point's error arose, for the study's message: the file and key it names, leaving
    out the overrides' own label (a study point's assignments are applied as ``--set``)."""
    parts = [p for p in (err.file, err.key_path) if p and p not in ("--set", COMMAND_LINE)]
    return f"from {': '.join(parts)}; " if parts else ""


def _width_misfit(res: RunSetup) -> tuple | None:
    """(format name, model name, message) when a format does not fit the point's row widths."""
    m = res.model
    try:
        check_widths(res.kv, res.weights, res.k_width, res.v_width, (m.hidden, res.q_width, -(-m.ffn // res.tp)))
    except ConfigError as err:
        fmt = res.kv if err.file == res.kv.file else res.weights
        return fmt.name, m.name, f"{err.key_path} {err.got!r} {err.expected}"
    return None


def _width_error(study: Study, misfits: dict[tuple, list[Point]]) -> ConfigError:
    """One error for every point whose format does not fit its row widths."""
    total = sum(len(points) for points in misfits.values())
    (fmt, model, message), points = next(iter(misfits.items()))
    axis = next((p for p, v in points[0].assignments if v == fmt), None)
    key = next((k for p, k in _axis_keys(study.spec) if p == axis), "base")
    combos = "; ".join(f"{f} with {m}" for f, m, _ in misfits)
    return ConfigError(study.file, key, f"{total} points cannot run: format {fmt!r} on {model}: {message}. "
                       f"Combinations: {combos}. Leave them out with sweep.exclude (a where: and a reason:) "
                       "or choose a format whose groups divide the row")


def _axis_keys(spec: StudySpec) -> list[tuple[str, str]]:
    return [(p, f"sweep.grid.{p}") for p in spec.sweep.grid] + [(p, f"sweep.zip.{p}") for p in spec.sweep.zip]


def study_key(spec: StudySpec, err: ConfigError, point: Point | None = None) -> str:
    """The key in the study file that an error from resolving one of its points comes from."""
    keys = [(p, f"overrides.{p}") for p in spec.overrides]
    keys += [(p, f"sweep.grid.{p}") for p in spec.sweep.grid] + [(p, f"sweep.zip.{p}") for p in spec.sweep.zip]
    keys += [(p, f"sensitivity.knobs.{p}") for p in (spec.sensitivity.knobs if spec.sensitivity else [])]
    inner = err.key_path or ""
    found = _key_of_path(keys, inner) or (_key_of_value(keys, err, point) if point is not None else None)
    if found:
        return found
    return f"base.{inner}" if inner in RUN_FIELDS else "base"


def _key_of_path(keys: list[tuple[str, str]], inner: str) -> str | None:
    """The key that sets the erring path (as given, or under hardware. / model.), else the
    deepest key the path lies below (an error inside an overridden quantity)."""
    guesses = {canonical(inner), canonical("hardware." + inner), canonical("model." + inner)}
    for path, key in keys:
        if canonical(path) in guesses:
            return key
    below = [(len(path), key) for path, key in keys
             if any(g.startswith(canonical(path) + ".") for g in guesses if g)]
    return max(below)[1] if below else None


def _key_of_value(keys: list[tuple[str, str]], err: ConfigError, point: Point) -> str | None:
    """The key of the point's last assignment whose value the message quotes (e.g. an unknown
    format name), ``base`` when no study key sets that path."""
    text = f"{err.expected} {err.got!r}"
    for path, value in reversed(point.assignments):
        if isinstance(value, str) and repr(value) in text:
            return next((key for p, key in keys if p == path), "base")
    return None


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
