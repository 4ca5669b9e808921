"""The search space: what a deployment is, the YAML that spans it, and its enumeration.

A deployment is one way to serve a model: a hardware profile, how many of its chips, the
tensor x pipeline split of those chips, the weight and KV-cache formats, the software stack,
and the scheduler's ``max_batch`` (vLLM ``max_num_seqs``) and ``max_tokens_per_step``
(``max_num_batched_tokens``, the prefill chunk budget). A search file::

    name: llama-3-70b-2gpu-kinds           # the report folder (default reports/search/<name>/)
    description: "..."
    model: llama-3-70b                     # decodesim search --model overrides it
    slo: {ttft_ms: 2000, tpot_ms: 50, percentile: 99}   # targets on that percentile
    traffic:
      requests: azure-conv                 # azure-conv | azure-code | synthetic | a request file
      rate: 4                              # requests/s; omitted: each deployment at `load` x its capacity
      replay_lifetimes: 6                  # each finalist replays the arrivals of 6 mean request lifetimes
      replay_requests: 200                 # (mean output x screened TPOT), or of 200 requests if longer,
      duration_s: 120                      # and at most 120 s
      load: 0.9
    overrides: {hardware.hbm.channel_bandwidth_GBps: {scale: 1.5}}   # as a study's, on every deployment
    space:                                 # a study's sweep syntax: lists or {from, to, steps, spacing, integer}
      grid:
        hardware: [h200-sxm-x8, b200]
        chips: [1, 2, 4, 8]
        weights: [fp8, int4-g128]
        kv: [fp16, fp8-e4m3]
        max_batch: {from: 16, to: 512, steps: 6, spacing: log, integer: true}
      exclude:
        - {where: {hardware: b200, chips: [4, 8]}, reason: "one B200 node of two here"}
    max_replays: 48                        # most serving replays spent confirming the front
    notes: |                               # Markdown kept verbatim in the report
      ...

Axes (``AXES``) left out take ``DEFAULTS``; ``chips`` defaults to every power of two up to a
profile's own chip count, ``tp`` and ``pp`` to every split with ``tp x pp x attention_dp =
chips`` (one stage per layer at most). A combination whose split does not multiply out is no
deployment and is not counted.

Mixture-of-Experts models add two axes (a dense model takes only ``[1]`` on each):
``attention_dp`` (default ``[1]``), attention data-parallel groups of ``tp x pp`` chips that
each decode their share of the sequences (DeepSeek's layout), and ``ep``, the chips the
experts are spread over: 1 (every chip holds a 1/tp shard of every expert) or ``tp x
attention_dp`` (whole experts spread over every chip of a stage: ``placement: spread``); other
values do not multiply out. Left out, ``ep`` is both for a MoE model. A deployment's RunSpec
fields (``Deployment.run_fields``) carry them to the step model (sim.setup.resolve).

Everything is checked before anything is simulated: unknown axes, wrong types, unknown
hardware, format or stack names, and ``exclude`` rules that name no swept value are one
ConfigError naming the search file and the key path (the CLI prints it and exits 2).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from sim.config.loader import load_yaml, validate
from sim.config.quantity import Strict
from sim.errors import COMMAND_LINE, ConfigError
from sim.paths import bundled
from sim.serve.scheduler import POLICIES
from sim.paths import resolve as resolve_path
from sim.setup import load_model
from sim.study.spec import Exclude, axis_values

AXES = ("hardware", "chips", "tp", "pp", "ep", "weights", "kv", "software", "max_batch", "max_tokens_per_step",
        "attention_dp")
INT_AXES = frozenset({"chips", "tp", "pp", "ep", "max_batch", "max_tokens_per_step", "attention_dp"})
CHIP_AXES = ("chips", "tp", "pp", "ep", "attention_dp")  # whole numbers up to MAX_CHIPS
MOE_AXES = ("ep", "attention_dp")  # other than [1] for Mixture-of-Experts models only
NAME_AXES = frozenset({"hardware", "weights", "kv", "software"})
DEFAULTS: dict[str, list] = {
    "hardware": ["h200-sxm"],
    "weights": ["bf16", "fp8", "int4-g128"],
    "kv": ["fp16", "fp8-e4m3", "int8"],
    "software": ["fused"],
    "attention_dp": [1],
    "max_batch": [16, 32, 64, 128, 256],
    "max_tokens_per_step": [512, 2048, 8192],
}
POLICY_PATTERN = "^(" + "|".join(POLICIES) + ")$"  # the scheduler policies by name
MAX_DEPLOYMENTS = 1_000_000  # grid combinations before splits are checked (a typo guard)
MAX_CHIPS = 4096


class Slo(Strict):
    """Latency targets, met when the replay's ``percentile`` of TTFT and TPOT are at most them."""

    ttft_ms: float = Field(gt=0, le=3.6e6)
    tpot_ms: float = Field(gt=0, le=1e5)
    percentile: Literal[50, 90, 99] = 99


class Traffic(Strict):
    """Who arrives: a request source (sim.serve.requests), its rate, and how much of it each
    finalist replays. With ``load`` (and no ``rate``) every deployment runs at ``load`` x its own
    capacity; with neither, at the highest rate that meets the SLOs (``goodput``)."""

    requests: str = "azure-conv"
    rate: float | None = Field(default=None, gt=0, le=1e6)
    duration_s: float = Field(default=120.0, gt=0, le=86_400)  # the most seconds of arrivals a replay runs
    replay_lifetimes: float = Field(default=6.0, gt=0, le=1000)  # ... else this many mean request lifetimes
    replay_requests: int = Field(default=200, ge=10, le=10_000_000)  # ... but at least this many arrivals
    load: float = Field(default=0.9, gt=0, le=1)
    policy: str = Field(default="chunked", pattern=POLICY_PATTERN)  # a name in sim.serve.scheduler.POLICIES
    block_tokens: int = Field(default=16, ge=1, le=4096)
    seed: int = Field(default=0, ge=0)

    @property
    def goodput(self) -> bool:
        """Neither ``rate`` nor ``load`` given: each deployment at the highest rate whose
        screened percentiles meet the SLOs (the goodput search, sim.search.screen)."""
        return self.rate is None and "load" not in self.model_fields_set


class SpaceSpec(Strict):
    grid: dict[str, Any] = Field(default_factory=dict)
    exclude: list[Exclude] = Field(default_factory=list)


class SearchSpec(Strict):
    """A search file (module docstring)."""

    name: str = Field(default="search", pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    model: str | None = None
    slo: Slo | None = None
    traffic: Traffic = Field(default_factory=Traffic)
    overrides: dict[str, Any] = Field(default_factory=dict)
    space: SpaceSpec = Field(default_factory=SpaceSpec)
    max_replays: int = Field(default=48, ge=1, le=10_000)
    notes: str = ""  # Markdown kept verbatim in the report


@dataclass(frozen=True, order=True)
class Deployment:
    """One way to serve the model (module docstring)."""

    hardware: str
    chips: int
    tp: int
    pp: int
    weights: str
    kv: str
    software: str
    max_batch: int
    max_tokens_per_step: int
    ep: int = 1  # chips the experts are spread over (1: none; else tp x attention_dp)
    attention_dp: int = 1  # attention data-parallel groups of tp x pp chips

    @property
    def setup_key(self) -> tuple:
        """What the step model depends on (max_batch and the chunk budget only schedule)."""
        return (self.hardware, self.chips, self.tp, self.pp, self.weights, self.kv, self.software, self.ep,
                self.attention_dp)

    def run_fields(self) -> dict:
        """The RunSpec fields of its expert parallelism and attention data-parallel groups (none
        for a deployment with neither, so a dense model's runs are as before)."""
        out: dict = {"placement": "spread"} if self.ep > 1 else {}
        if self.attention_dp > 1:
            out["attention_dp"] = self.attention_dp
        return out

    @property
    def label(self) -> str:
        split = (f"tp{self.tp}" + (f" pp{self.pp}" if self.pp > 1 else "")
                 + (f" dp{self.attention_dp}" if self.attention_dp > 1 else "") + (f" ep{self.ep}" if self.ep > 1 else ""))
        return (f"{self.hardware} x{self.chips} {split} {self.weights}/{self.kv} {self.software} "
                f"B{self.max_batch} C{self.max_tokens_per_step}")

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Space:
    """The checked search: its spec, the file it came from, every deployment and the count
    each ``exclude`` rule left out."""

    spec: SearchSpec
    file: str
    model: str
    axes: dict[str, list]  # the axis values as swept (chips/tp/pp: as given, or None for the defaults)
    deployments: list[Deployment]
    excluded: list[tuple[Exclude, int]]

    @property
    def setups(self) -> dict[tuple, list[Deployment]]:
        """The deployments grouped by what their step model depends on, in enumeration order."""
        groups: dict[tuple, list[Deployment]] = {}
        for d in self.deployments:
            groups.setdefault(d.setup_key, []).append(d)
        return groups


def load_spec(path: str | Path | None, changes: dict | None = None) -> tuple[SearchSpec, str]:
    """The search file at ``path`` (a path, or a name in workloads/searches/; None: an empty
    one), with ``changes`` (from the command line)
    applied on top: ``model``, ``slo.<key>``, ``traffic.<key>`` and ``space.grid.<axis>``."""
    if path is not None:
        path = resolve_path(str(path), bundled("workloads", "searches"), "search")
    file = str(path) if path is not None else COMMAND_LINE
    raw = load_yaml(path) if path is not None else {}
    if not isinstance(raw, dict):
        raise ConfigError(file, None, "a search file is a mapping (name, model, slo, traffic, space, ...)", raw)
    for key, value in (changes or {}).items():
        node = raw
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(file, key, "must be a mapping to set a value under it", node)
        node[parts[-1]] = value
    return validate(SearchSpec, raw, file), file


def build_space(spec: SearchSpec, file: str, profile_chips, known_names, moe: bool | None = None) -> Space:
    """Check the axes and enumerate the deployments. ``profile_chips(name)`` gives a
    hardware profile's chip count and ``known_names(axis, value)`` raises ConfigError for an
    unknown hardware, format or stack name (injected, so tests can stand in for them);
    ``moe``: whether the model has Mixture-of-Experts layers (None: read from the model)."""
    if spec.model is None:
        raise ConfigError(file, "model", "a search needs a model (model: in the file or --model)")
    if spec.slo is None:
        raise ConfigError(file, "slo", "a search needs latency targets (slo: {ttft_ms, tpot_ms} or "
                          "--ttft-ms and --tpot-ms)")
    grid = spec.space.grid
    for axis in grid:
        if axis not in AXES:
            raise ConfigError(file, f"space.grid.{axis}", f"unknown axis; expected one of: {', '.join(AXES)}")
    axes: dict[str, list] = {}
    for axis in AXES:
        where = f"space.grid.{axis}"
        if axis in grid:
            values = axis_values(grid[axis], file, where, MAX_DEPLOYMENTS)
        elif axis in DEFAULTS:
            values = list(DEFAULTS[axis])
        else:
            axes[axis] = None
            continue
        axes[axis] = _check_values(axis, values, file, where, known_names)
    _check_moe_axes(axes, file, _is_moe(spec.model) if moe is None else moe)
    _check_excludes(spec.space.exclude, axes, profile_chips, file)
    size = 1
    for values in axes.values():
        size *= len(values) if values else 8
    if size > MAX_DEPLOYMENTS * 8:
        raise ConfigError(file, "space.grid", f"about {size:,} combinations; at most {MAX_DEPLOYMENTS:,} deployments")
    deployments, counts = _enumerate(spec, axes, profile_chips, file)
    if not deployments:
        raise ConfigError(file, "space", "no deployment: every combination is excluded or has tp x pp x attention_dp != chips")
    return Space(spec, file, spec.model, axes, deployments, list(zip(spec.space.exclude, counts, strict=True)))


def _is_moe(model: str) -> bool:
    """Whether ``model`` (a bundled name or a path) has Mixture-of-Experts layers."""
    try:
        return load_model(model).moe is not None
    except ConfigError:
        return False  # an unknown model is reported where the search resolves it


def _check_moe_axes(axes: dict, file: str, moe: bool) -> None:
    """``ep`` and ``attention_dp`` other than [1] need a MoE model; a dense model takes [1]."""
    for axis in MOE_AXES:
        if axes[axis] is None:
            axes[axis] = None if moe else [1]  # ep by default: none and over every chip of a stage
        elif axes[axis] != [1] and not moe:
            what = "expert parallelism" if axis == "ep" else "attention data-parallel groups"
            raise ConfigError(file, f"space.grid.{axis}", f"only [1]: {what} needs a Mixture-of-Experts model",
                              axes[axis])
    if axes["attention_dp"] not in (None, [1]):  # the replays that confirm a front cannot time them yet
        raise ConfigError(file, "space.grid.attention_dp", "only [1]: the serving replay that confirms a deployment "
                          "does not model attention data-parallel groups yet (decodesim run --attention-dp times "
                          "a fixed batch)", axes["attention_dp"])
    axes["attention_dp"] = [1]


def _check_values(axis: str, values: list, file: str, where: str, known_names) -> list:
    out = []
    for i, value in enumerate(values):
        if axis in INT_AXES:
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= (
                    MAX_CHIPS if axis in CHIP_AXES else 1_000_000):
                raise ConfigError(file, f"{where}.{i}", "must be a whole number >= 1", value)
        elif not isinstance(value, str) or not value:
            raise ConfigError(file, f"{where}.{i}", "must be a name (text)", value)
        else:
            try:
                known_names(axis, value)
            except ConfigError as err:
                raise ConfigError(file, f"{where}.{i}", err.expected, value) from None
        if value in out:
            raise ConfigError(file, f"{where}.{i}", "duplicate value", value)
        out.append(value)
    return out


def chip_counts(axes: dict, hardware: str, profile_chips) -> list[int]:
    """The chip counts of ``hardware`` searched: as given, or powers of two up to its own."""
    if axes["chips"] is not None:
        return list(axes["chips"])
    own = profile_chips(hardware)
    return [2 ** k for k in range(own.bit_length()) if 2 ** k <= own] + ([own] if own & (own - 1) else [])


def splits(axes: dict, chips: int) -> list[tuple[int, int]]:
    """(tp, pp) pairs with tp x pp = chips from the tp and pp axes (default: every divisor)."""
    tps = axes["tp"] if axes["tp"] is not None else [t for t in range(1, chips + 1) if chips % t == 0]
    pps = axes["pp"] if axes["pp"] is not None else None
    out = []
    for tp in tps:
        for pp in (pps if pps is not None else [chips // tp] if chips % tp == 0 else []):
            if tp * pp == chips:
                out.append((tp, pp))
    return out


def layouts(axes: dict, chips: int) -> list[tuple[int, int, int, int]]:
    """(tp, pp, attention_dp, ep) of ``chips``: each attention data-parallel count that divides
    them, each (tp, pp) split of a group (``splits``), and each ``ep`` that multiplies out (1, or
    tp x attention_dp; ``axes["ep"]`` None: both)."""
    out = []
    for dp in axes["attention_dp"]:
        if chips % dp:
            continue
        for tp, pp in splits(axes, chips // dp):
            spread = tp * dp
            wanted = axes["ep"] if axes["ep"] is not None else [1, spread]
            out.extend((tp, pp, dp, ep) for ep in dict.fromkeys(wanted) if ep == 1 or ep == spread)
    return out


def _enumerate(spec: SearchSpec, axes: dict, profile_chips, file: str) -> tuple[list[Deployment], list[int]]:
    rules = spec.space.exclude
    counts = [0] * len(rules)
    out: list[Deployment] = []
    for hw in axes["hardware"]:
        for chips in chip_counts(axes, hw, profile_chips):
            for (tp, pp, dp, ep), weights, kv, software, batch, chunk in itertools.product(
                    layouts(axes, chips), axes["weights"], axes["kv"], axes["software"], axes["max_batch"],
                    axes["max_tokens_per_step"]):
                d = Deployment(hw, chips, tp, pp, weights, kv, software, batch, chunk, ep, dp)
                rule = _excluded_by(rules, d.as_dict())
                if rule is not None:
                    counts[rule] += 1
                    continue
                out.append(d)
                if len(out) > MAX_DEPLOYMENTS:
                    raise ConfigError(file, "space.grid", f"more than {MAX_DEPLOYMENTS:,} deployments; fix some axes")
    return out, counts


def _matches(value, wanted) -> bool:
    options = wanted if isinstance(wanted, list) else [wanted]
    return any(value == w or str(value) == str(w) for w in options)


def _excluded_by(rules: list[Exclude], labels: dict) -> int | None:
    for i, rule in enumerate(rules):
        if all(_matches(labels[axis], wanted) for axis, wanted in rule.where.items()):
            return i
    return None


def _check_excludes(rules: list[Exclude], axes: dict, profile_chips, file: str) -> None:
    """Every rule names axes and values the search takes (a typo would exclude nothing)."""
    for i, rule in enumerate(rules):
        for axis, wanted in rule.where.items():
            if axis not in AXES:
                raise ConfigError(file, f"space.exclude.{i}.where", f"{axis!r} is not an axis; axes: "
                                  f"{', '.join(AXES)}")
            values = axes[axis]
            if values is None:  # chips / tp / pp / ep by default: every count or split any hardware takes
                chips = sorted({c for hw in axes["hardware"] for c in chip_counts(axes, hw, profile_chips)})
                values = chips if axis == "chips" else list(range(1, max(chips) + 1))
            for w in wanted if isinstance(wanted, list) else [wanted]:
                if not any(_matches(v, w) for v in values):
                    raise ConfigError(file, f"space.exclude.{i}.where.{axis}", "must be a value of the axis "
                                      f"({', '.join(str(v) for v in values)})", w)


__all__ = ["AXES", "DEFAULTS", "Deployment", "SearchSpec", "Slo", "Space", "Traffic", "build_space", "chip_counts",
           "layouts", "load_spec", "splits"]
