"""The software-stack stage: each op of the lowering becomes the kernels that run it.

``expand(stack, op fields)`` reads the stack's entry for the op (sim.config.software) and
returns ``KernelWork`` records: each kernel's class, the op bytes it moves (by role, with
shares such as ``w:0.5`` for one of two projections that split a weight), intermediate
temporaries, and its part of the op's work:

* matrix FLOPs go to the kernels of matrix classes (``matrix``, ``attention``), in proportion
  to the weight (or KV) share each reads;
* dequantization goes to the kernel that reads the weights or the cache (fused) or to an
  unfused-dequantizing (``cast``) kernel that reads them;
* other vector work is split evenly between the other kernels.

What each class takes is its declaration in sim.kernel_classes.

Temporaries: ``temp: k`` writes and reads back ``k`` times a size (``temp_of``, the op's
output bytes by default) in the kernel itself; ``makes`` writes a named temporary that a later
kernel of the op reads (``uses``), e.g. a dequantized bf16 copy of the KV cache that SDPA then
reads. A size is a role of the op (its bytes, read and written) or one of the sizes the op
knows besides (``sizes``: ``kv_dense``, the KV the op reads at bf16; ``new_kv``, the new
token's K and V at bf16), with an optional share. A temporary lives where the role it is
sized by lives (KV-sized ones in the backing store), else at the activations' level.

An op the stack does not name runs as one kernel of its default class that moves its bytes
once, which is the byte model. ``calls_ns`` prices a kernel's kernel-less framework calls
(the stack's ``calls``), paid on the host before each eager launch. ``per_expert`` kernels
are launched once per expert the op touches (a per-expert loop); their bytes are the op's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sim.config.software import Kernel
from sim.errors import ConfigError
from sim.kernel_classes import CLASSES, KVQuant, default_class
from sim.lowering.graph import Access, KernelWork

_new = tuple.__new__  # a record from all its fields in order, without the named tuple's keyword handling


@functools.lru_cache(maxsize=1024)
def _parse_share(spec: str) -> tuple[str, str, float | None]:
    """``w`` -> (w, "", 1); ``w:0.5`` -> (w, "0.5", 0.5); ``w:q`` -> (w, "q", None): a part of the op."""
    role, _, share = spec.partition(":")
    if not share:
        return role, "", 1.0
    try:
        value = float(share)
    except ValueError:
        return role, share, None
    return role, share, value


def _share(spec: str, parts: dict[str, float]) -> tuple[str, float]:
    """``w`` -> (w, 1); ``w:0.5`` -> (w, 0.5); ``w:q`` -> (w, the op's q part)."""
    role, share, value = _parse_share(spec)
    if not share:
        return role, 1.0
    if share in parts:
        return role, parts[share]
    if value is None:
        raise ConfigError("software stack", spec, f"a share is a number or one of the op's parts "
                          f"({', '.join(parts) or 'none'})")
    if not 0 < value <= 1:
        raise ConfigError("software stack", spec, "a share must lie in (0, 1]", value)
    return role, value


def _scaled(accesses, share: float) -> list[Access]:
    """``accesses`` (of one role), each scaled by ``share`` (those it leaves with no bytes dropped)."""
    if share == 1.0:
        return accesses  # records are immutable: the op's own accesses
    out = []
    for a in accesses:
        n = round(a.bytes * share)
        if n:
            out.append(Access(a.level, n, a.category, a.write, a.granule, a.role))
    return out


def _size(spec: str, accesses, sizes: dict[str, tuple[str, int]], act_level: str) -> tuple[str, int]:
    """(level, bytes) of a temporary's size spec (``kv_dense:0.5``, ``y``, ``kv``)."""
    name, _, share = spec.partition(":")
    factor = float(share) if share else 1.0
    if name in sizes:
        level, n = sizes[name]
        return level or act_level, round(n * factor)
    own = [a for a in accesses if a.role == name and a.bytes]
    if name == "y":
        own = [a for a in own if a.write]
    level = own[0].level if own else act_level
    if level in ("noc", "link", "pcie"):
        level = act_level
    return level, round(sum(a.bytes for a in own) * factor)


def expand(specs: tuple[Kernel, ...] | None, kind: str, accesses: tuple[Access, ...], *, matrix_flops: int,
           matrix_m: int, vector_ops: int, dequant_ops: int, dtype: str, parallelism: float,
           parts: dict[str, float] | None = None, active: int = 1, values: int = 0, quant: KVQuant | None = None,
           act_level: str = "", calls_ns=None, sizes: dict[str, tuple[str, int]] | None = None
           ) -> tuple[KernelWork, ...]:
    """The kernels of one op (see the module docstring). ``sizes`` maps the size names an op
    knows besides its roles to (level, bytes)."""
    return Plan(specs, kind, parts, calls_ns).kernels(
        accesses, matrix_flops=matrix_flops, matrix_m=matrix_m, vector_ops=vector_ops, dequant_ops=dequant_ops,
        dtype=dtype, parallelism=parallelism, active=active, values=values, quant=quant, act_level=act_level,
        sizes=sizes)


FLOOR_CATEGORIES = ("weights", "expert", "kv", "outliers")  # what a step's byte floor reads: its weights and cache


class Plan:
    """What of an op's expansion its kernels' specs, its kind and its parts fix, the same for
    the op in every layer and step (a caller that keeps one expands the op again without
    working it out): per kernel the op roles (and shares) it reads and writes, its class and its
    host time, and how the op's work divides between the kernels (``_Split``)."""

    __slots__ = ("specs", "kind", "roles", "classes", "host_ns", "split", "temps", "_fixed", "_default", "_whole")

    def __init__(self, specs: tuple[Kernel, ...] | None, kind: str, parts: dict[str, float] | None = None,
                 calls_ns=None):
        self.specs, self.kind = specs, kind
        self._default = default_class(kind) if specs is None else None  # the one kernel's class of an unnamed op
        parts, kernels = parts or {}, specs or ()
        self.roles = tuple(tuple((*_share(spec, parts), write) for names, write in ((k.reads, False), (k.writes, True))
                                 for spec in names) for k in kernels)
        self._whole = tuple(map(_whole_roles, self.roles))
        self.classes = tuple(CLASSES[k.kclass] for k in kernels)
        self.host_ns = tuple(calls_ns(k) if calls_ns is not None and k.calls else 0.0 for k in kernels)
        self.split = _Split.of(self.roles, self.classes, "kv" if kind == "attention" else "w")
        self.temps = any(k.temp or k.uses or k.makes for k in kernels)  # does any kernel have temporaries
        # per kernel, what its KernelWork takes from the spec alone: (name, class, launches, per
        # expert, implementation, a matrix class, a cache-dequantizing class, dispatched)
        self._fixed = tuple((k.name, k.kclass, k.launches, k.per_expert, k.impl, spec.matrix, spec.cache_dequant,
                             k.dispatched) for k, spec in zip(kernels, self.classes, strict=True))

    def kernels(self, accesses: tuple[Access, ...], *, matrix_flops: int, matrix_m: int, vector_ops: int,
                dequant_ops: int, dtype: str, parallelism: float, active: int = 1, values: int = 0,
                quant: KVQuant | None = None, act_level: str = "", sizes: dict[str, tuple[str, int]] | None = None
                ) -> tuple[KernelWork, ...]:
        """The kernels of the op over ``accesses`` with this work (see ``expand``)."""
        kind, specs, split = self.kind, self.specs, self.split
        if specs is None:
            return (_new(KernelWork, (  # every field, in order: one launch, dispatched, no implementation
                kind, self._default, accesses, matrix_flops, matrix_m, vector_ops, dequant_ops, dtype,
                parallelism, 1, None, values, quant, True, 0.0)),)
        by_role: dict[tuple[str, bool], list[Access]] = {}  # the op's accesses that move bytes, by (role, write)
        for a in accesses:
            if a.bytes:
                by_role.setdefault((a.role, a.write), []).append(a)
        temps = (_Temps(accesses, sizes or {}, act_level or next((a.level for a in accesses if a.role in ("y", "x")), ""))
                 if self.temps else None)
        out = []
        for i, (name, kclass, launches, per_expert, impl, matrix, cache_dequant, dispatched) in enumerate(self._fixed):
            acc = self._accesses(i, by_role)
            if temps is not None:
                acc += temps.of(specs[i])
            share, flops, vec, deq = split.work(i, matrix_flops, vector_ops, dequant_ops)
            out.append(_new(KernelWork, (  # every field, in order
                name, kclass, tuple(acc), flops, matrix_m, vec, deq, dtype if matrix else "bf16",
                max(1.0, parallelism * (share if i in split.matrix else 1.0)),
                launches * (max(1, active) if per_expert else 1), impl, values if cache_dequant else 0,
                quant if cache_dequant else None, dispatched, self.host_ns[i])))
        return tuple(out)

    def uncovered(self, accesses: tuple[Access, ...], store: str) -> tuple[str, bool, int, float] | None:
        """(role, write, bytes, share) for the first of the op's roles of weights or cache in the
        backing store ``store`` that its kernels move less than whole (their shares of it sum below 1),
        else None. Physics: a stack cannot make an op cheaper than its byte floor by not moving
        its weights or cache (an attention that skips the KV cache); what a fused stack keeps on
        chip (an intermediate it never writes out) is its own choice."""
        if self.specs is None:
            return None
        cover: dict[tuple[str, bool], float] = {}
        for kernel in self.roles:
            for role, share, write in kernel:
                cover[role, write] = cover.get((role, write), 0.0) + share
        for a in accesses:
            if a.bytes and a.level == store and a.category in FLOOR_CATEGORIES \
                    and cover.get((a.role, a.write), 0.0) < 1.0 - 2.0 ** -30:  # shares that sum to 1, up to float rounding
                moved = sum(b.bytes for b in accesses if (b.role, b.write) == (a.role, a.write))
                return a.role, a.write, moved, cover.get((a.role, a.write), 0.0)
        return None

    def _accesses(self, i: int, by_role: dict[tuple[str, bool], list[Access]]) -> list[Access]:
        """Kernel ``i``'s share of the op's accesses (``by_role``: by (role, write)), in its roles' order."""
        whole = self._whole[i]
        if whole is not None:  # the op's accesses of each role as they are (_scaled by 1.0 keeps them)
            return [a for key in whole for a in by_role.get(key, ())]
        return [a for role, share, write in self.roles[i] for a in _scaled(by_role.get((role, write), ()), share)]


def _whole_roles(roles: tuple[tuple[str, float, bool], ...]) -> tuple[tuple[str, bool], ...] | None:
    """A kernel's (role, write) pairs when it takes every role of its op whole (no share to
    scale by), else None."""
    if all(share == 1.0 for _role, share, _write in roles):
        return tuple((role, write) for role, _share, write in roles)
    return None


@dataclass(frozen=True)
class _Split:
    """How an op's work divides between its kernels: matrix FLOPs (and the parallelism) by
    the share of the main operand each matrix kernel reads; dequantization to the unfused
    casts that read the main operand, else with the matrix work, else evenly; other vector
    work evenly between the non-matrix kernels, else with the matrix work."""

    matrix: dict[int, float]  # kernel index -> its share of the op's matrix work
    casts: tuple[int, ...]  # unfused dequantizing kernels that read the main operand
    others: tuple[int, ...]  # kernels that are not matrix kernels
    kernels: int

    @classmethod
    def of(cls, roles, classes, main_role: str) -> _Split:
        """The split between kernels that read and write ``roles`` (per kernel: (role, share,
        write) triples) and are of ``classes``."""
        main = {i: [share for role, share, write in kernel if role == main_role and not write]
                for i, kernel in enumerate(roles)}
        matrix = {i: sum(main[i]) if main[i] else 1.0 for i, spec in enumerate(classes) if spec.matrix}
        total = sum(matrix.values()) or 1.0
        casts = tuple(i for i, spec in enumerate(classes) if spec.unfused_dequant and main[i])
        others = tuple(i for i in range(len(classes)) if i not in matrix)
        return cls({i: m / total for i, m in matrix.items()}, casts, others, len(classes))

    def work(self, i: int, matrix_flops: int, vector_ops: int, dequant_ops: int) -> tuple[float, int, int, int]:
        """(matrix share, matrix FLOPs, vector ops with the dequantization, dequantization ops) of kernel ``i``."""
        share = self.matrix.get(i, 0.0)
        flops = round(matrix_flops * share) if self.matrix else (matrix_flops if i == 0 else 0)
        base = max(0, vector_ops - dequant_ops)
        if self.others:
            vec = base // len(self.others) if i in self.others else 0
        else:
            vec = round(base * share)
        deq = self._dequant(i, share, dequant_ops)
        return share, flops, vec + deq, deq

    def _dequant(self, i: int, share: float, dequant_ops: int) -> int:
        if self.casts:
            return dequant_ops // len(self.casts) if i in self.casts else 0
        if self.matrix:
            return round(dequant_ops * share)
        return dequant_ops // self.kernels


class _Temps:
    """The temporaries of an op's kernels: each kernel's own (``temp``) and the named ones
    earlier kernels make and later ones use."""

    def __init__(self, accesses, sizes: dict[str, tuple[str, int]], level: str):
        self.accesses, self.sizes, self.level = accesses, sizes, level
        self.y_bytes = sum(a.bytes for a in accesses if a.role == "y" and a.write)
        self.made: dict[str, tuple[str, int]] = {}

    def of(self, k: Kernel) -> list[Access]:
        """Kernel ``k``'s temporary accesses, in order: its own, those it uses, those it makes."""
        acc = self._own(k)
        for name in k.uses:
            level, n = self.made[name]
            if n and level:
                acc.append(_new(Access, (level, n, "act", False, None, "temp")))
        for name, spec in k.makes.items():
            level, n = self.made[name] = _size(spec, self.accesses, self.sizes, self.level)
            if n and level:
                acc.append(_new(Access, (level, n, "act", True, None, "temp")))
        return acc

    def _own(self, k: Kernel) -> list[Access]:
        """``temp`` times a size, written and read back by the kernel itself."""
        if not k.temp:
            return []
        if k.temp_of == "y":  # the op's output bytes
            level, n = self.level, self.y_bytes
            tmp = round(k.temp * n)
            kept = n and level
        else:
            level, n = _size(k.temp_of, self.accesses, self.sizes, self.level)
            tmp = round(k.temp * n)
            kept = tmp and level
        if not kept:
            return []
        return [_new(Access, (level, tmp, "act", False, None, "temp")), _new(Access, (level, tmp, "act", True, None, "temp"))]


def with_prologue(specs: tuple[Kernel, ...] | None, prologue: tuple[Kernel, ...], kind: str,
                  epilogue: tuple[Kernel, ...] = ()) -> tuple[Kernel, ...] | None:
    """``specs`` with ``prologue`` (e.g. an FP8 linear's activation quantization) before each
    matrix kernel and ``epilogue`` (a bias add the GEMM cannot fuse) after it; an op without
    specs is one matrix kernel first."""
    if (not prologue and not epilogue) or kind != "matmul":
        return specs
    if specs is None:
        specs = (Kernel.model_validate({"name": "gemm", "class": default_class("matmul"), "reads": ["x", "w", "res"],
                                        "writes": ["y"]}),)
    out: list[Kernel] = []
    for k in specs:
        gemm = CLASSES[k.kclass].gemm
        if gemm:
            out.extend(prologue)
        out.append(k)
        if gemm:
            out.extend(epilogue)
    return tuple(out)


def role_bytes(accesses, write: bool | None = None) -> dict[str, int]:
    """Bytes by role (the conservation check of a stack: kernels move at least the op's)."""
    out: dict[str, int] = {}
    for a in accesses:
        if write is None or a.write == write:
            out[a.role] = out.get(a.role, 0) + a.bytes
    return out
