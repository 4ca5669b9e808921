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
kernel in eager mode is the stack's (the framework's) cost, measured on the host it names.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from sim.config.quantity import Num, Share, Strict

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

    @field_validator("reads", "writes")
    @classmethod
    def _roles(cls, roles: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [r for r in roles if r not in ROLES]
        if unknown:
            raise ValueError(f"unknown role {unknown[0]!r}; roles: {', '.join(ROLES)}")
        return roles


class OpKernels(Strict):
    """The kernels of one op (or group of ops)."""

    kernels: tuple[Kernel, ...] = Field(min_length=1)
    source: str = ""


class AttentionImpl(Strict):
    """A decode-attention kernel implementation and its measured quality on dequantizing
    formats: ``efficiency`` is the fraction of the stream bandwidth its KV reads reach,
    ``dequant_ns_per_kib`` the extra time per KiB of quantized KV it reads."""

    efficiency: Num
    dequant_ns_per_kib: Num = Field(default_factory=lambda: Num(value=0.0, source="no dequantization"))
    formats: tuple[str, ...] = ()  # formats it supports (empty: any)


class SoftwareStack(Strict):
    """A software stack: launch mode, host dispatch costs, and the kernels of each op."""

    name: str
    description: str
    source: str
    launch: Literal["eager", "graph"]
    dispatch_ns: dict[str, Num] = Field(default_factory=dict)  # host time per eager kernel launch, by class
    overlap: Share | None = None  # fraction of each kernel's start-up hidden under its predecessor
    groups: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    ops: dict[str, OpKernels]
    attention: dict[str, AttentionImpl] = Field(default_factory=dict)
    moe: Literal["loop", "grouped", "dense_all"] = "grouped"  # how routed experts execute

    @field_validator("dispatch_ns")
    @classmethod
    def _classes(cls, table: dict) -> dict:
        unknown = [k for k in table if k not in (*KERNEL_CLASSES, "default")]
        if unknown:
            raise ValueError(f"unknown kernel class {unknown[0]!r}; classes: default, {', '.join(KERNEL_CLASSES)}")
        return table

    @model_validator(mode="after")
    def _names(self):
        for key, entry in self.ops.items():
            for kernel in entry.kernels:
                if kernel.impl is not None and kernel.kclass == "attention" and kernel.impl not in self.attention:
                    raise ValueError(f"ops.{key}: attention impl {kernel.impl!r} is not in attention: "
                                     f"{', '.join(self.attention) or '(none)'}")
        return self

    def kernels_for(self, op_name: str) -> tuple[Kernel, ...] | None:
        """The kernels of op ``op_name``: its own entry, else its group's, else None."""
        entry = self.ops.get(op_name)
        if entry is None:
            for group, members in self.groups.items():
                if op_name in members and group in self.ops:
                    entry = self.ops[group]
                    break
        return entry.kernels if entry is not None else None

    def dispatch(self, kclass: str) -> float:
        """Host time to launch one kernel of ``kclass`` eagerly (ns)."""
        q = self.dispatch_ns.get(kclass) or self.dispatch_ns.get("default")
        return q.value if q is not None else 0.0
