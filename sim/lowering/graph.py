"""The op graph: what one decode step asks of the hardware.

An ``Op`` is one kernel (or ``kernels`` launches) with the bytes it reads and writes at
each memory level (``Access``), its matrix FLOPs and vector operations, its dtype, its
parallelism (independent work units, which bounds how many tiles it can use) and its
dependencies. Byte counts are exact integers; time is not known here.

Access categories name what the bytes are: ``weights``, ``kv``, ``act`` (activations),
``outliers`` (sparse outlier gathers), ``expert`` (MoE expert weights), ``link``
(chip-to-chip), ``pcie`` (host link).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Access:
    level: str  # a memory level name, or "link", "pcie", "noc"
    bytes: int
    category: str
    write: bool = False
    granule: int | None = None  # None: a long stream; else gathers of this many bytes


@dataclass(slots=True)
class Op:
    idx: int
    name: str
    layer: int  # -1 for ops outside the layer stack
    kind: str  # matmul | vector | attention | collective | p2p | host
    accesses: tuple[Access, ...]
    matrix_flops: int = 0  # useful FLOPs on the matrix unit (2 per multiply-add)
    matrix_m: int = 1  # rows (tokens) of the matmul; the unit pads M to its tile
    vector_ops: int = 0  # vector-unit operations (element-wise, softmax, dequantization)
    dequant_ops: int = 0  # the part of vector_ops that is dequantization
    dtype: str = "bf16"
    parallelism: float = 1  # independent work units (bounds the tiles used)
    kernels: int = 1  # kernel launches this op costs
    deps: tuple[int, ...] = ()
    stream: str = "main"
    stage: int = 0  # pipeline stage (chip group) it runs on
    host_sync: bool = False  # the host waits for this op before issuing more
    host_ns: float = 0.0  # host-side work after the sync (e.g. building a dispatch)
    collective: tuple[str, int, int] | None = None  # (kind, bytes per chip, group size)
    tags: dict = field(default_factory=dict)

    def bytes(self, category: str | None = None, level: str | None = None, write: bool | None = None) -> int:
        return sum(
            a.bytes
            for a in self.accesses
            if (category is None or a.category == category)
            and (level is None or a.level == level)
            and (write is None or a.write == write)
        )


@dataclass(slots=True)
class OpGraph:
    """The ops of one decode step, in program order (the order the host issues them)."""

    ops: list[Op]
    step: int = 0
    batch: int = 0
    contexts: tuple[int, ...] = ()
    stages: int = 1
    meta: dict = field(default_factory=dict)

    def bytes(self, category: str | None = None, level: str | None = None, write: bool | None = None) -> int:
        return sum(op.bytes(category, level, write) for op in self.ops)

    def flops(self) -> int:
        return sum(op.matrix_flops for op in self.ops)

    @property
    def kernels(self) -> int:
        return sum(op.kernels for op in self.ops)


class Builder:
    """Appends ops in program order; by default each op depends on the previous op of its
    stream (a GPU stream runs kernels in order)."""

    def __init__(self, stage: int = 0):
        self.ops: list[Op] = []
        self._last: dict[tuple[int, str], int] = {}
        self.stage = stage

    def add(self, name: str, layer: int, kind: str, accesses, *, deps=None, stream="main", **fields) -> Op:
        idx = len(self.ops)
        key = (self.stage, stream)
        if deps is None:
            deps = (self._last[key],) if key in self._last else ()
        op = Op(idx, name, layer, kind, tuple(a for a in accesses if a.bytes > 0), deps=tuple(deps),
                stream=stream, stage=self.stage, **fields)
        self.ops.append(op)
        self._last[key] = idx
        return op

    def last(self, stream: str = "main") -> int | None:
        return self._last.get((self.stage, stream))
