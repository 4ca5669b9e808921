"""Hardware profiles: one chip's memory hierarchy, compute, host and the links between chips.

The memory hierarchy is an ordered list of typed levels (tiers), outermost first. Off-chip
tiers (``kind: hbm``, ``kind: ddr``) come before on-chip SRAM (``kind: sram``): per-tile
scratchpads (``scope: tile``) and chip-wide SRAM or L2 (``scope: chip``). The first level is
the home tier (``store``): where weights and the KV cache live unless ``placement`` says
otherwise: HBM on a GPU, on-chip SRAM on an SRAM-only chip such as a Groq LPU.

``placement`` says where weights, MoE experts and the KV cache are: ``resident`` in a tier
(read from it by the op that uses them), or ``streamed`` from an off-chip tier into an on-chip
staging buffer ahead of use (double-buffered: two buffers of the largest layer's bytes, counted
against that SRAM). Without it everything is resident in the home tier.

A system of several chips has ``links`` between the chips of a group (a node, a wafer's
neighbours) and, where groups are joined by a slower network, ``scaleout`` links between
groups (``chips_per_group`` chips each). Every number is a sourced quantity
(sim.config.quantity). Derived figures (peak bandwidth, peak FLOP/s) are properties, never YAML.

Units are in the key names: GBps = 1e9 bytes/s, GB = 1e9 bytes, MB = 1e6 bytes, ns.
"""

from __future__ import annotations

import functools
import re
from typing import Annotated, Literal, Union

from pydantic import Field, field_validator, model_validator

from sim.config.energy import Energy, energy_tiers
from sim.config.quantity import Count, Frac, Num, Pos, Share, Strict, Table, by_dtype
from sim.kernel_classes import check as check_classes
from sim.units import GB, GFLOP_PER_TFLOP, MB


class HBM(Strict):
    """Off-chip DRAM stacks: stacks x channels (pseudo-channels) of ``channel_bandwidth_GBps``.

    ``stream_efficiency`` is the fraction of pin bandwidth a long sequential read reaches;
    ``gather_efficiency`` is the fraction, relative to that stream, reached by gathers of
    contiguous pieces of the given size in bytes (row activations dominate small pieces).
    ``refresh_overhead`` is the share of time the banks are refreshing.
    """

    kind: Literal["hbm"]
    name: str
    stacks: Count
    channels_per_stack: Count
    channel_bandwidth_GBps: Pos
    capacity_GB: Pos
    latency_ns: Num
    stream_efficiency: Frac
    gather_efficiency: Table
    refresh_overhead: Share
    interleave_bytes: Count

    @property
    def channels(self) -> int:
        return self.stacks.value * self.channels_per_stack.value

    @property
    def peak_GBps(self) -> float:
        return self.channels * self.channel_bandwidth_GBps.value

    @property
    def capacity_bytes(self) -> float:
        return self.capacity_GB.value * GB

    @property
    def sustained_GBps(self) -> float:
        """What a long stream reaches: pin peak x stream efficiency x (1 - refresh)."""
        return self.peak_GBps * self.stream_efficiency.value * (1 - self.refresh_overhead.value)

    def efficiency(self, granule_bytes: float | None) -> float:
        """Fraction of pin peak an access of ``granule_bytes`` pieces reaches (None: stream)."""
        stream = self.stream_efficiency.value * (1 - self.refresh_overhead.value)
        if granule_bytes is None:
            return stream
        return stream * self.gather_efficiency.at(granule_bytes)


class SRAM(Strict):
    """On-chip SRAM. ``scope: tile`` is one scratchpad per compute tile (``count`` of them);
    ``scope: chip`` is chip-wide SRAM or L2. Capacity and bandwidth are per instance.
    ``resident_fraction`` is the share that software can keep data resident in across ops
    (0 for a cache that cannot be pinned); ``stream_efficiency`` and ``gather_efficiency``
    play the HBM roles when this level is the backing store."""

    kind: Literal["sram"]
    name: str
    scope: Literal["tile", "chip"]
    count: Count
    capacity_MB: Pos
    bandwidth_GBps: Pos
    latency_ns: Num
    resident_fraction: Num
    stream_efficiency: Frac | None = None
    gather_efficiency: Table | None = None

    @field_validator("resident_fraction")
    @classmethod
    def _fraction(cls, q: Num) -> Num:
        if q.value > 1:
            raise ValueError("resident_fraction must be a fraction in [0, 1]")
        return q

    @property
    def capacity_bytes(self) -> float:
        return self.capacity_MB.value * MB * self.count.value

    @property
    def resident_bytes(self) -> float:
        return self.capacity_bytes * self.resident_fraction.value

    @property
    def peak_GBps(self) -> float:
        return self.bandwidth_GBps.value * self.count.value

    @property
    def sustained_GBps(self) -> float:
        return self.peak_GBps * (self.stream_efficiency.value if self.stream_efficiency else 1.0)

    def efficiency(self, granule_bytes: float | None) -> float:
        stream = self.stream_efficiency.value if self.stream_efficiency else 1.0
        if granule_bytes is None or self.gather_efficiency is None:
            return stream
        return stream * self.gather_efficiency.at(granule_bytes)


class DDR(Strict):
    """Off-chip DDR DRAM behind or beside HBM (a capacity tier: SambaNova's 1.5 TB per socket):
    ``channels`` of ``channel_bandwidth_GBps``; ``stream_efficiency`` is what a long stream
    reaches; gathers of small pieces reach ``gather_efficiency`` of that (optional: a tier
    that only streams staged weights never gathers)."""

    kind: Literal["ddr"]
    name: str
    channels: Count
    channel_bandwidth_GBps: Pos
    capacity_GB: Pos
    latency_ns: Num
    stream_efficiency: Frac
    gather_efficiency: Table | None = None

    @property
    def peak_GBps(self) -> float:
        return self.channels.value * self.channel_bandwidth_GBps.value

    @property
    def capacity_bytes(self) -> float:
        return self.capacity_GB.value * GB

    @property
    def sustained_GBps(self) -> float:
        return self.peak_GBps * self.stream_efficiency.value

    def efficiency(self, granule_bytes: float | None) -> float:
        if granule_bytes is None or self.gather_efficiency is None:
            return self.stream_efficiency.value
        return self.stream_efficiency.value * self.gather_efficiency.at(granule_bytes)


Level = Annotated[Union[HBM, DDR, SRAM], Field(discriminator="kind")]
OFF_CHIP = (HBM, DDR)


class Place(Strict):
    """Where one kind of data lives: ``tier`` (a memory level's name), ``resident`` there or
    ``streamed`` from it (an off-chip tier) into the on-chip ``buffer`` level (default: the
    chip-wide SRAM, else the tile scratchpads)."""

    tier: str
    mode: Literal["resident", "streamed"] = "resident"
    buffer: str | None = None


@functools.lru_cache(maxsize=256)
def _place(tier: str, mode: str = "resident", buffer: str | None = None) -> Place:
    """A Place made once per (tier, mode, buffer) (it is frozen: every lowering and capacity check asks)."""
    return Place(tier=tier, mode=mode, buffer=buffer)


class Placement(Strict):
    """Placement of weights, MoE expert weights (default: as ``weights``) and the KV cache
    (default: the home tier). ``source`` says why (the architecture's dataflow, a paper).
    ``policy: fit`` chooses instead, per run (sim.setup.fit_placement): the KV cache and
    activations in the home tier; dense weights resident in the fastest tier that holds them
    beside what is already there, else streamed from the fastest off-chip tier that does; then
    the experts the same way with what is left. (Which experts sit in SRAM inside a tier is the
    MoE plan's placement: ``--placement static`` pins the hottest.)"""

    policy: Literal["given", "fit"] = "given"
    weights: Place | None = None
    experts: Place | None = None
    kv: Place | None = None
    source: str = ""


class Compute(Strict):
    """``tiles`` compute tiles (SMs, cores) at ``clock_GHz``. Matrix and vector peaks are
    FLOPs (2 per multiply-add) per cycle per tile, by dtype. A matrix unit works on M
    (rows, i.e. tokens) in multiples of ``matrix_tile_m``: a batch of 1 costs as much as
    ``matrix_tile_m`` rows. ``tile_load_GBps`` caps what one tile can pull from memory
    (outstanding requests / latency), so a kernel on few tiles cannot reach full HBM rate.
    ``small_tile_m`` and ``small_tile_efficiency`` describe a second, narrower matrix path
    where the chip has one (Hopper's mma.sync at M = 16 beside wgmma at M = 64): an op with
    few rows (decode attention's query heads per KV head) takes the cheaper of the two."""

    tiles: Count
    clock_GHz: Pos
    matrix_flops_per_cycle: dict[str, Pos]
    vector_flops_per_cycle: dict[str, Pos]
    matrix_tile_m: Count
    matrix_efficiency: Frac
    small_tile_m: Count | None = None
    small_tile_efficiency: Frac | None = None
    vector_efficiency: Frac
    tile_load_GBps: Pos

    @model_validator(mode="after")
    def _small_path(self):
        if (self.small_tile_m is None) != (self.small_tile_efficiency is None):
            raise ValueError("small_tile_m and small_tile_efficiency go together")
        return self

    @field_validator("matrix_flops_per_cycle", "vector_flops_per_cycle")
    @classmethod
    def _dtypes(cls, table: dict) -> dict:
        if not table:
            raise ValueError("must list at least one dtype")
        unknown = set(table) - DTYPES
        if unknown:
            raise ValueError(f"unknown dtype {sorted(unknown)[0]!r}; expected one of {sorted(DTYPES)}")
        return table

    def matrix_peak_TFLOPs(self, dtype: str) -> float:
        return self.tiles.value * self.matrix_rate(dtype) * self.clock_GHz.value / GFLOP_PER_TFLOP

    def matrix_rate(self, dtype: str) -> float:
        """FLOPs per cycle per tile for ``dtype``; falls back to the widest listed type (an FP4
        block format to ``fp4`` where the chip lists that)."""
        table = self.matrix_flops_per_cycle
        if dtype in FP4_BLOCK and dtype not in table and "fp4" in table:
            dtype = "fp4"
        return by_dtype(table, dtype)

    def vector_rate(self, dtype: str = "fp32") -> float:
        table = self.vector_flops_per_cycle
        if dtype in table:
            return table[dtype].value
        return min(q.value for q in table.values())


# the matrix unit's datatypes: each one listed is executed natively at its rate; a weight format
# whose dtype is not listed is converted on the vector units (sim.formats.base.matrix_plan).
# nvfp4 / mxfp4: E2M1 with E4M3 scales per 16 / E8M0 scales per 32; fp4 covers both.
DTYPES = {"fp32", "tf32", "bf16", "fp16", "fp8", "int8", "int4", "fp4", "nvfp4", "mxfp4"}
FP4_BLOCK = ("nvfp4", "mxfp4")


class NoC(Strict):
    """On-chip network between SRAM levels and tiles and from tile to tile."""

    bandwidth_GBps: Pos
    latency_ns: Num


class Host(Strict):
    """The host CPU and its link. ``launch_overhead_ns`` is host time to issue one kernel
    (the framework's dispatch included); ``kernel_gap_ns`` is the GPU-side gap between two
    dependent kernels (also inside a captured graph); ``graph_launch_ns`` is the cost of
    launching one captured graph; ``sync_round_trip_ns`` is a host wait for the device."""

    launch_overhead_ns: Num
    kernel_gap_ns: Num
    graph_launch_ns: Num
    sync_round_trip_ns: Num
    pcie_bandwidth_GBps: Pos
    pcie_latency_ns: Num


class Links(Strict):
    """Chip-to-chip links. ``bandwidth_GBps`` is per chip per direction; a collective step
    costs ``latency_ns`` (wire and switch) plus ``per_message_overhead_ns`` (software,
    synchronisation); ``topology`` picks the collective algorithm."""

    topology: Literal["switch", "ring", "torus2d", "mesh"]
    bandwidth_GBps: Pos
    latency_ns: Num
    per_message_overhead_ns: Num


class ScaleOut(Strict):
    """Links between groups of chips (nodes, wafers, systems): ``chips_per_group`` chips share
    the fast ``links``; traffic between groups crosses these, per chip per direction."""

    chips_per_group: Count
    bandwidth_GBps: Pos
    latency_ns: Num
    per_message_overhead_ns: Num


class System(Strict):
    """The chips of a deployment and how they are joined. ``partition`` is how layers are split
    over pipeline stages: ``layers`` (whole layers, as evenly as possible, as GPU serving stacks
    do) or ``balanced`` (contiguous half-layer units, attention or FFN, balanced by the bytes each
    chip must hold, as spatial compilers place a model over many chips: a stage may hold a
    fraction of a layer or many layers)."""

    chips: Count
    links: Links | None = None
    scaleout: ScaleOut | None = None
    partition: Literal["layers", "balanced"] = "layers"
    tensor_parallel: Count | None = None  # the deployment's tp unless the run says (with its source)

    @model_validator(mode="after")
    def _links_when_many(self):
        if self.chips.value > 1 and self.links is None:
            raise ValueError("a system of more than one chip needs links (system.links: topology, bandwidth_GBps, "
                             "latency_ns, per_message_overhead_ns)")
        if self.tensor_parallel is not None and self.chips.value % self.tensor_parallel.value:
            raise ValueError(f"tensor_parallel ({self.tensor_parallel.value}) must divide chips ({self.chips.value})")
        if self.scaleout is not None and self.chips.value % self.scaleout.chips_per_group.value:
            raise ValueError(f"scaleout.chips_per_group ({self.scaleout.chips_per_group.value}) must divide "
                             f"chips ({self.chips.value})")
        return self

    def group_of(self, chip: int) -> int:
        """The group (node, wafer) that chip number ``chip`` belongs to."""
        return chip // self.scaleout.chips_per_group.value if self.scaleout is not None else 0


class KernelClass(Strict):
    """What one kernel of a class costs on this chip beyond its bytes and work: the start-up
    and tail of a kernel in a captured graph (``startup_ns``, the inter-kernel gap included)
    and the rate its reads from the backing store reach at large sizes, as a fraction of the
    store's sustained stream rate (``stream_fraction``; so a profile derived with another
    store keeps the kernels' quality).
    ``parallel: rows`` marks classes whose grid is one CTA per row (a row reduction over few
    rows cannot spread over the chip)."""

    startup_ns: Num
    stream_fraction: Pos
    parallel: Literal["elements", "rows"] = "elements"
    cta_bandwidth_GBps: Pos | None = None  # with parallel: rows, what one row's CTA pulls


class Provenance(Strict):
    """Where a profile's kernel costs come from, said once for the whole ``kernels:`` section.

    ``measured``: on this chip, ``device`` (the name the driver reports), raw data under
    ``data`` (e.g. calibration/data/h100). ``borrowed``: measured on another chip (``device``,
    ``data``) and carried here by ``rule``. ``transferred``: computed for this chip by ``rule``
    (the kernel-class efficiencies fitted across the measured GPUs, calibration/transfer.json)
    from its own figures, ``uncertainty_pct`` being the rule's leave-one-GPU-out error.
    ``estimate`` marks figures nobody measured for this chip (borrowed and transferred ones)."""

    kind: Literal["measured", "borrowed", "transferred"]
    device: str
    data: str
    rule: str = ""
    uncertainty_pct: float | None = None

    @model_validator(mode="after")
    def _rule(self):
        if self.kind != "measured" and not self.rule:
            raise ValueError(f"a {self.kind} kernels: section must say by which rule (provenance.rule)")
        return self

    @property
    def chip_key(self) -> str:
        """The measured chip's data folder name (``h200`` for calibration/data/h200)."""
        return self.data.rstrip("/").rsplit("/", 1)[-1]


class KernelCosts(Strict):
    """Kernel-class costs of this chip (calibration/fit_kernels.py, ``decodesim calibrate``):
    per class, and the bandwidth one CTA can pull (``cta_bandwidth_GBps``: outstanding loads
    over latency), which caps kernels with few CTAs. ``provenance`` says whether they were
    measured on this chip, borrowed from another or transferred by rule. Attention
    implementations' dequantization rates live in the software stacks (they are the kernels'
    quality, not the chip's)."""

    cta_bandwidth_GBps: Pos
    classes: dict[str, KernelClass]
    provenance: Provenance | None = None

    @field_validator("classes")
    @classmethod
    def _known(cls, table: dict) -> dict:
        check_classes(table)
        return table


class HardwareProfile(Strict):
    name: str
    description: str
    software: str | None = None  # the stack this machine runs (a compiler's static schedule); runs say when another is used
    memory: list[Level]
    compute: Compute
    noc: NoC
    host: Host
    system: System
    placement: Placement | None = None  # where weights, experts and KV live; without it: the home tier
    kernels: KernelCosts | None = None  # measured kernel-class costs; without it: derived (KERNEL_RULE)
    energy: Energy | None = None  # pJ/bit per tier, pJ/FLOP, static W (sim.config.energy)

    @model_validator(mode="after")
    def _fractions(self):
        for name, c in (self.kernels.classes.items() if self.kernels else ()):
            if c.stream_fraction.value > 1.2:
                raise ValueError(f"kernels.classes.{name}.stream_fraction must be at most 1.2 (a kernel "
                                 f"cannot stream much faster than the store's measured stream rate)")
        return self

    @model_validator(mode="after")
    def _hierarchy(self):
        if not self.memory:
            raise ValueError("memory must list at least the backing store")
        names = [level.name for level in self.memory]
        if len(set(names)) != len(names):
            raise ValueError(f"memory level names must be unique, got {names}")
        on_chip_seen = False
        for level in self.memory:
            if isinstance(level, OFF_CHIP) and on_chip_seen:
                raise ValueError(f"off-chip tier {level.name!r} ({level.kind}) must come before the on-chip SRAM "
                                 "levels (tiers are listed outermost first)")
            on_chip_seen = on_chip_seen or isinstance(level, SRAM)
        store = self.memory[0]
        if isinstance(store, SRAM) and store.stream_efficiency is None:
            raise ValueError("an SRAM backing store needs stream_efficiency")
        for level in self.memory:
            if isinstance(level, SRAM) and level.scope == "tile" and level.count.value != self.compute.tiles.value:
                raise ValueError(f"tile-scope SRAM {level.name!r} count must equal compute.tiles")
        return self

    @model_validator(mode="after")
    def _placement(self):
        if self.placement is None:
            return self
        names = {level.name: level for level in self.memory}
        for what in ("weights", "experts", "kv"):
            place = getattr(self.placement, what)
            if place is None:
                continue
            if place.tier not in names:
                raise ValueError(f"placement.{what}.tier {place.tier!r} is not a memory level; levels: "
                                 f"{', '.join(names)}")
            if place.mode == "streamed":
                if what == "kv":
                    raise ValueError("placement.kv.mode: the KV cache is read where it lives (resident); "
                                     "streaming it through SRAM is not modelled")
                if not isinstance(names[place.tier], OFF_CHIP):
                    raise ValueError(f"placement.{what}: streamed data comes from an off-chip tier (hbm or ddr), "
                                     f"not {place.tier!r} ({names[place.tier].kind})")
                buffer = place.buffer or (self.shared_sram or self.tile_sram or _none()).name
                if buffer not in names or not isinstance(names[buffer], SRAM):
                    raise ValueError(f"placement.{what}.buffer {buffer!r} must be an on-chip SRAM level")
        return self

    def place(self, what: str) -> Place:
        """Where ``what`` (weights, experts, kv) lives: the placement's, else resident in the home
        tier (experts default to the weights' placement)."""
        p = self.placement
        chosen = getattr(p, what) if p is not None else None
        if chosen is None and what == "experts" and p is not None:
            chosen = p.weights
        if chosen is None:
            return _place(self.store.name)
        if chosen.mode == "streamed" and chosen.buffer is None:
            return _place(chosen.tier, "streamed", (self.shared_sram or self.tile_sram).name)
        return chosen

    @property
    def store(self) -> HBM | DDR | SRAM:
        """The backing store: where weights and the KV cache live."""
        return self.memory[0]

    def level(self, name: str) -> HBM | SRAM:
        for level in self.memory:
            if level.name == name:
                return level
        raise KeyError(name)

    @property
    def on_chip(self) -> list[SRAM]:
        return [level for level in self.memory if isinstance(level, SRAM) and level is not self.store]

    @property
    def shared_sram(self) -> SRAM | None:
        chips = [level for level in self.on_chip if level.scope == "chip"]
        return chips[0] if chips else None

    @property
    def tile_sram(self) -> SRAM | None:
        tiles = [level for level in self.on_chip if level.scope == "tile"]
        return tiles[0] if tiles else None

    @property
    def chips(self) -> int:
        return self.system.chips.value

    def headline(self) -> dict:
        store = self.store
        return {
            "name": self.name,
            "chips": self.chips,
            "store": f"{store.kind}",
            "capacity_GB": store.capacity_bytes / GB,
            "peak_GBps": store.peak_GBps,
            "bf16_TFLOPs": self.compute.matrix_peak_TFLOPs("bf16"),
            "on_chip_MB": sum(level.capacity_bytes for level in self.on_chip) / MB
            + (store.capacity_bytes / MB if isinstance(store, SRAM) else 0),
        }

    check_energy_tiers = model_validator(mode="after")(energy_tiers)  # after the hierarchy's own checks


def _none():
    raise ValueError("placement: streamed data needs an on-chip SRAM level to stage into")


KERNEL_RULE = ("derived from this profile's own figures (no kernels: section): each kernel starts after "
               "host.kernel_gap_ns plus the first-byte latency of the level it reads, and streams at that "
               "level's sustained rate (capacity x stream efficiency), capped by tiles x compute.tile_load_GBps")


def kernel_costs_origin(profile: HardwareProfile) -> str:
    """Where a profile's kernel costs come from, in one line that starts with the kind:
    ``measured on <device>``, ``borrowed from <device>``, ``transferred`` (with its uncertainty)
    or ``derived`` (the rule, no ``kernels:`` section)."""
    k = profile.kernels
    if k is None:
        return KERNEL_RULE
    p = k.provenance
    if p is None:
        return "unstated: a kernels: section without provenance (its sources say where each figure comes from)"
    if p.kind == "measured":
        return f"measured on {p.device} ({p.data})"
    if p.kind == "borrowed":
        return f"borrowed from {p.device} ({p.data}): {p.rule}"
    band = f" (+-{p.uncertainty_pct:g}%, leave-one-GPU-out)" if p.uncertainty_pct is not None else ""
    return f"transferred{band}: {p.rule}"


def kernel_costs_kind(profile: HardwareProfile) -> str:
    """measured, borrowed, transferred, derived (or unstated): the first word of the origin."""
    return kernel_costs_origin(profile).split()[0].rstrip(":")


def borrow(raw: dict, base: str, device: str, data: str, rule: str) -> dict:
    """``raw`` (a profile's YAML data, changed in place and returned) with every figure whose
    source is a measurement relabelled as borrowed from ``base`` (measured on ``device``, raw
    data under ``data``) by ``rule``, and its kernels section's provenance saying the same: a
    profile made from another chip's never claims that chip's measurements as its own."""
    prefix = f"borrowed from {base} ({device}, {data}; {rule}): "

    def walk(node):
        if isinstance(node, dict):
            src = node.get("source")
            if isinstance(src, str) and src.startswith(("measured", "measurement")):
                node["source"] = prefix + src
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(raw)
    if isinstance(raw.get("kernels"), dict):
        raw["kernels"]["provenance"] = {"kind": "borrowed", "device": device, "data": data, "rule": rule}
    return raw


def sources(profile: HardwareProfile) -> list[tuple[str, object, str, bool]]:
    """Every sourced number in a profile: (dotted path, value, source, estimate)."""
    out: list[tuple[str, object, str, bool]] = []

    def walk(node, path):
        if isinstance(node, (Num, Count, Table)):
            value = node.points if isinstance(node, Table) else node.value
            out.append((path, value, node.source, node.estimate))
        elif isinstance(node, Strict):
            for key in type(node).model_fields:
                walk(getattr(node, key), f"{path}.{key}" if path else key)
        elif isinstance(node, dict):
            for key, child in node.items():
                walk(child, f"{path}.{key}")
        elif isinstance(node, list):
            for item in node:
                walk(item, f"{path}.{getattr(item, 'name', '?')}")

    walk(profile, "")
    if profile.kernels is None:
        out.append(("kernels", "derived", KERNEL_RULE, True))
    return out


CALIBRATION_CHIP = "h200"  # what calibration/ outside data/<chip>/ holds was measured on the H200 (calibration/README.md)


def foreign_measurements(profile: HardwareProfile) -> list[str]:
    """The figures of ``profile`` that say "measured" for a measurement of another chip: a
    source starting "measured"/"measurement" that cites calibration/ data of a chip other than
    the one its kernels: provenance says was measured here (none: no chip was). Empty for an
    honest profile."""
    p = profile.kernels.provenance if profile.kernels is not None else None
    own = p.chip_key if p is not None and p.kind == "measured" else None
    bad = []
    for path, _value, source, _estimate in sources(profile):
        if not source.startswith(("measured", "measurement")) or "calibration/" not in source:
            continue
        chips = set(re.findall(r"calibration/data/([A-Za-z0-9_.-]+)", source))
        bare = re.sub(r"calibration/data/[A-Za-z0-9_.-]+", "", source)
        if "calibration/" in bare:
            chips.add(CALIBRATION_CHIP)
        if chips - {own}:
            bad.append(f"{path}: measured on {', '.join(sorted(chips))}, not on this chip ({own or 'none measured'})")
    return bad
