"""Software stacks as data: how each op of the lowering runs as kernels.

A stack (``workloads/software/*.yaml``) says, for each op of a decode step, which kernels
run it: how many, what each reads and writes, and its kernel class. The same model on the
same chip runs at very different speeds under different stacks (plain PyTorch eager, the
same kernels captured in a CUDA graph, a fused serving stack), because the number of kernels
and how good each is belong to the software, not the hardware.

Ops are matched by name (``attn_norm``, ``qkv``, ``rope_append``, ``attention``, ``o_proj``,
``gate_up``, ``silu_mul``, ``down``, ``lm_head``, ``argmax``, the MoE ops, ...) through
``groups`` that name several ops at once (``rmsnorm: [attn_norm, ffn_norm, final_norm]``).
An op no entry names runs as one kernel of its default class that reads and writes its
bytes once (the byte model).

A kernel's traffic is stated in the op's *roles* (the lowering labels each access: ``x``
input activations, ``w`` weights, ``y`` outputs, ``res`` a residual input, ``kv`` the cache
read, ``cache`` the cache write, ``idx`` routing indices, ...): ``reads: [x, w]`` reads
those roles' bytes once; listing a role in two kernels reads it twice. ``temp: k`` adds an
intermediate tensor of ``k`` times the op's output-activation bytes, written by this kernel
and read back by the next (unfused temporaries). Work (matrix FLOPs, vector operations)
goes to the kernels of classes that do it.

Where a stack overlaps kernels (``overlap``: programmatic dependent launch hides part of
each kernel's start-up under its predecessor) it says so with a source. Host dispatch per
kernel in eager mode is the stack's (the framework's) cost, measured on the host it names,
plus the framework calls the modeling code makes before the kernel that launch nothing
(``calls``: an ``nn.Module`` call, a view, a transpose, a slice; each costed from
``host_calls_ns``). Neither is paid when the step replays as a captured graph.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field, field_validator, model_validator

from sim.config.loader import load_yaml, validate
from sim.config.quantity import Num, Share, Strict
from sim.paths import bundled
from sim.paths import resolve as resolve_path

KERNEL_CLASSES = ("matrix", "attention", "elementwise", "reduction", "index", "copy", "cast", "collective", "host")
ROLES = ("x", "w", "y", "res", "kv", "cache", "idx", "link", "pcie", "noc", "fetch")


class Kernel(Strict):
    """One kernel of an op: its class, the roles it reads and writes, its temporaries."""

    name: str
    kclass: Literal["matrix", "attention", "elementwise", "reduction", "index", "copy", "cast", "collective",
                    "host"] = Field(alias="class")
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    temp: float = Field(default=0.0, ge=0, le=64)  # intermediate bytes, in units of the op's output bytes
    impl: str | None = None  # an implementation with measured efficiency (attention kernels)
    launches: int = Field(default=1, ge=1, le=4096)
    per_expert: bool = False  # repeated once per touched expert (a per-expert loop)
    dispatched: bool = True  # the host launches it itself (False: launched by a library call before it)
    calls: tuple[str, ...] = ()  # framework calls the host makes before it that launch no kernel (eager)

    @field_validator("reads", "writes")
    @classmethod
    def _roles(cls, roles: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [r for r in roles if r.partition(":")[0] not in ROLES]
        if unknown:
            raise ValueError(f"unknown role {unknown[0]!r}; roles: {', '.join(ROLES)}")
        return roles


class OpKernels(Strict):
    """The kernels of one op (or group of ops). ``stream`` runs the op on a side stream: it
    forks from the main stream where it is issued and the first later op named ``join``
    waits for it (e.g. a shared expert beside the router and the routed experts)."""

    kernels: tuple[Kernel, ...] = Field(min_length=1)
    source: str = ""
    stream: str | None = None
    join: str | None = None

    @model_validator(mode="after")
    def _join(self):
        if (self.stream is None) != (self.join is None):
            raise ValueError("stream and join go together (a side stream must join the main stream)")
        return self


class AttentionImpl(Strict):
    """A decode-attention kernel implementation and its measured quality on quantized
    caches. ``efficiency`` scales the rate its KV reads reach (of the attention class's
    bandwidth). Dequantization costs picoseconds per value: ``value_ps`` for every value,
    ``unpack_ps`` x (8 / bits - 1) for sub-byte unpacking, ``group_ps`` / group size for the
    scale and zero of each group, ``outlier_ps`` x the outlier fraction for gathering and
    merging outliers, ``channel_ps`` where K is quantized per channel (KIVI), ``codebook_ps``
    for a codebook lookup. The dequantization runs beside the loads: the kernel takes the
    longer of the two."""

    efficiency: Num
    value_ps: Num
    unpack_ps: Num
    group_ps: Num
    outlier_ps: Num
    channel_ps: Num
    codebook_ps: Num | None = None
    source: str = ""

    def ps_per_value(self, quant: tuple) -> float:
        """Picoseconds per dequantized value for a format (sim.lowering.ops.kv_quant)."""
        bits, group, outliers, per_channel, codebook = quant
        ps = self.value_ps.value + self.unpack_ps.value * max(0.0, 8.0 / bits - 1.0)
        ps += self.group_ps.value / group if group else 0.0
        ps += self.outlier_ps.value * outliers + (self.channel_ps.value if per_channel else 0.0)
        if codebook and self.codebook_ps is not None:
            ps += self.codebook_ps.value
        return ps


class MoEHost(Strict):
    """The host's part of a host-synced MoE layer: grouping the routing on the host, and the
    extra syncs a plain PyTorch block makes per touched expert (``bool()``/``.item()`` of
    device values)."""

    grouping_ns: Num
    syncs_per_expert: int = Field(default=0, ge=0, le=16)


class SoftwareStack(Strict):
    """A software stack: launch mode, host dispatch costs, and the kernels of each op."""

    name: str
    description: str
    source: str
    launch: Literal["eager", "graph"]
    dispatch_ns: dict[str, Num] = Field(default_factory=dict)  # host time per eager kernel launch, by class
    host_calls_ns: dict[str, Num] = Field(default_factory=dict)  # host time per kernel-less framework call
    overlap: Share | None = None  # fraction of each kernel's start-up hidden under its predecessor
    groups: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    ops: dict[str, OpKernels]
    attention: dict[str, AttentionImpl] = Field(default_factory=dict)
    moe: Literal["loop", "grouped", "dense_all"] = "grouped"  # how routed experts execute
    moe_host: MoEHost | None = None
    matrix_prologue: dict[str, tuple[Kernel, ...]] = Field(default_factory=dict)  # by matmul dtype (fp8: quantize x)

    @field_validator("dispatch_ns")
    @classmethod
    def _classes(cls, table: dict) -> dict:
        unknown = [k for k in table if k not in (*KERNEL_CLASSES, "default")]
        if unknown:
            raise ValueError(f"unknown kernel class {unknown[0]!r}; classes: default, {', '.join(KERNEL_CLASSES)}")
        return table

    @model_validator(mode="after")
    def _names(self):
        kernels = [(f"ops.{key}", k) for key, entry in self.ops.items() for k in entry.kernels]
        kernels += [(f"matrix_prologue.{key}", k) for key, ks in self.matrix_prologue.items() for k in ks]
        for where, kernel in kernels:
            if kernel.impl is not None and kernel.kclass == "attention" and kernel.impl not in self.attention:
                raise ValueError(f"{where}: attention impl {kernel.impl!r} is not in attention: "
                                 f"{', '.join(self.attention) or '(none)'}")
            unknown = [c for c in kernel.calls if c not in self.host_calls_ns]
            if unknown:
                raise ValueError(f"{where}.{kernel.name}: framework call {unknown[0]!r} is not in host_calls_ns: "
                                 f"{', '.join(self.host_calls_ns) or '(none)'}")
        return self

    def kernels_for(self, op_name: str) -> tuple[Kernel, ...] | None:
        """The kernels of op ``op_name``: its entry for this stack's MoE execution
        (``experts@loop``), its own entry, else its group's, else None."""
        entry = self.ops.get(f"{op_name}@{self.moe}") or self.ops.get(op_name)
        if entry is None:
            for group, members in self.groups.items():
                if op_name in members and group in self.ops:
                    entry = self.ops[group]
                    break
        return entry.kernels if entry is not None else None

    def side_stream(self, op_name: str) -> tuple[str, str] | None:
        """(stream, join op) when the stack runs ``op_name`` on a side stream."""
        entry = self.ops.get(op_name)
        if entry is not None and entry.stream is not None:
            return entry.stream, entry.join
        return None

    def calls_ns(self, kernel: Kernel) -> float:
        """Host time of the kernel-less framework calls made before ``kernel`` (ns)."""
        return sum(self.host_calls_ns[c].value for c in kernel.calls)

    def dispatch(self, kclass: str) -> float:
        """Host time to launch one kernel of ``kclass`` eagerly (ns)."""
        q = self.dispatch_ns.get(kclass) or self.dispatch_ns.get("default")
        return q.value if q is not None else 0.0


def software_dir():
    return bundled("workloads", "software")


@lru_cache(maxsize=32)
def load_stack(name_or_path: str) -> SoftwareStack:
    """A bundled software stack by name, or a stack YAML file, validated."""
    path = resolve_path(name_or_path, software_dir(), "software stack")
    return validate(SoftwareStack, load_yaml(path), path)


def list_stacks() -> list[str]:
    return sorted(p.stem for p in software_dir().glob("*.yaml"))
