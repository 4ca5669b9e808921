"""The op graph: what one decode step asks of the hardware.

An ``Op`` is one operation of the step (a norm, a projection, attention, a collective, ...)
placed in the program: its name, layer, stream, pipeline stage, dependencies and whether
the host waits for it. What it asks of the hardware is its ``Work``: the bytes it reads and
writes at each memory level (``Access``), its matrix FLOPs and vector operations, its dtype,
its parallelism (independent work units, which bounds how many tiles it can use) and how
many kernels run it. ``Work`` is hashable, and the same ``Work`` object is shared by the op
of every layer that asks the same, so costs are computed once per distinct work. Byte
counts are exact integers; time is not known here.

Access categories name what the bytes are: ``weights``, ``kv``, ``act`` (activations),
``outliers`` (sparse outlier gathers), ``expert`` (MoE expert weights), ``link``
(chip-to-chip), ``pcie`` (host link).

Records are immutable: ``Access``, ``KernelWork`` and ``Op`` are named tuples (cheap to build
and hash, a changed copy is ``_replace``; the hottest builders pass every field in order);
``Work`` is a frozen dataclass that computes its hash once (a changed copy is
``dataclasses.replace``). A step's ops are a ``Program``: the ops of a layer copied from another
(``Repeat``) become ``Op`` records only when read. What ``make_graph`` derives from a program's
shape is kept per shape and process.
"""

from __future__ import annotations

from abc import abstractmethod
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from typing import NamedTuple

from sim.kernel_classes import KVQuant


class Access(NamedTuple):
    """``bytes`` read (or written) at memory ``level`` ("link", "pcie" and "noc" are links)."""

    level: str
    bytes: int
    category: str
    write: bool = False
    granule: int | None = None  # None: a long stream; else gathers of this many bytes
    role: str = ""  # which tensor of the op: x, w, y, res, kv, cache, idx, link, pcie, noc, fetch


def read(level: str, size: int, category: str, role: str, granule: int | None = None) -> Access:
    """An access that reads ``size`` bytes of ``role`` at ``level`` (a stream; ``granule``: gathers
    of that many bytes). Made from its fields in order: the lowering makes a few per op."""
    return tuple.__new__(Access, (level, size, category, False, granule, role))


def write(level: str, size: int, category: str, role: str) -> Access:
    """An access that writes ``size`` bytes of ``role`` at ``level`` (a stream)."""
    return tuple.__new__(Access, (level, size, category, True, None, role))


class KernelWork(NamedTuple):
    """One kernel of an op, as the software stack runs it: its class (and implementation),
    the bytes it moves, its work, its parallelism and how many times it is launched."""

    name: str
    kclass: str  # a class of sim.kernel_classes
    accesses: tuple[Access, ...]
    matrix_flops: int = 0
    matrix_m: int = 1
    vector_ops: int = 0
    dequant_ops: int = 0
    dtype: str = "bf16"
    parallelism: float = 1
    launches: int = 1
    impl: str | None = None  # a measured implementation (attention kernels)
    values: int = 0  # quantized values it dequantizes (attention over a quantized cache)
    quant: KVQuant | None = None  # the quantized KV format it dequantizes (attention)
    dispatched: bool = True  # the host launches it itself in eager mode
    host_ns: float = 0.0  # eager host time of the kernel-less framework calls before each launch


_SET = object.__setattr__  # how the frozen records' own __init__ sets their fields


@dataclass(frozen=True, slots=True)
class Work:
    """What an op asks of the hardware, independent of where it sits in the program."""

    kind: str  # matmul | vector | attention | collective | p2p | host
    accesses: tuple[Access, ...]
    matrix_flops: int = 0  # useful FLOPs on the matrix unit (2 per multiply-add)
    matrix_m: int = 1  # rows (tokens) of the matmul; the unit pads M to its tile
    vector_ops: int = 0  # vector-unit operations (element-wise, softmax, dequantization)
    dequant_ops: int = 0  # the part of vector_ops that is dequantization
    dtype: str = "bf16"
    parallelism: float = 1  # independent work units (bounds the tiles used)
    kernels: int = 1  # kernel launches this op costs
    collective: tuple[str, int, int] | None = None  # (kind, bytes per chip, group size)
    host_ns: float = 0.0  # host-side work after a sync (e.g. building a dispatch)
    host_launches: int = 0  # kernels the host launches after a sync (host-synced MoE dispatch)
    host_syncs: int = 0  # further host syncs after the first (a plain PyTorch MoE block per touched expert)
    noc_hops: int = 0  # on-chip network traversals before the body (zero-copy expert dispatch)
    pcie_messages: int = 0  # host-link round trips before the body (routing read back to the host)
    kernels_run: tuple[KernelWork, ...] = ()  # the kernels the software stack runs it as
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __init__(self, kind: str, accesses: tuple[Access, ...], matrix_flops: int = 0, matrix_m: int = 1,
                 vector_ops: int = 0, dequant_ops: int = 0, dtype: str = "bf16", parallelism: float = 1,
                 kernels: int = 1, collective: tuple[str, int, int] | None = None, host_ns: float = 0.0,
                 host_launches: int = 0, host_syncs: int = 0, noc_hops: int = 0, pcie_messages: int = 0,
                 kernels_run: tuple[KernelWork, ...] = ()):
        # the dataclass's frozen __init__, written out: each field set once through a local
        # object.__setattr__ (the generated one looks it up per field; a work is made per op)
        put = _SET
        put(self, "kind", kind)
        put(self, "accesses", accesses)
        put(self, "matrix_flops", matrix_flops)
        put(self, "matrix_m", matrix_m)
        put(self, "vector_ops", vector_ops)
        put(self, "dequant_ops", dequant_ops)
        put(self, "dtype", dtype)
        put(self, "parallelism", parallelism)
        put(self, "kernels", kernels)
        put(self, "collective", collective)
        put(self, "host_ns", host_ns)
        put(self, "host_launches", host_launches)
        put(self, "host_syncs", host_syncs)
        put(self, "noc_hops", noc_hops)
        put(self, "pcie_messages", pcie_messages)
        put(self, "kernels_run", kernels_run)
        # of the fields the kernels are made from, not of the kernels (equal works hash alike;
        # hashing the kernels' accesses again costs as much as building the work)
        put(self, "_hash", hash((kind, accesses, matrix_flops, matrix_m, vector_ops, dequant_ops, parallelism, kernels,
                                 collective)))

    def __hash__(self) -> int:  # computed once: works are dictionary keys in every step
        return self._hash

    def __eq__(self, other) -> bool:  # works of unequal hashes differ: compared field by field only when needed
        if self is other:
            return True
        if other.__class__ is not Work:
            return NotImplemented
        return self._hash == other._hash and self._fields() == other._fields()

    def _fields(self) -> tuple:
        return (self.kind, self.accesses, self.matrix_flops, self.matrix_m, self.vector_ops, self.dequant_ops,
                self.dtype, self.parallelism, self.kernels, self.collective, self.host_ns, self.host_launches,
                self.host_syncs, self.noc_hops, self.pcie_messages, self.kernels_run)

    def bytes(self, category: str | None = None, level: str | None = None, write: bool | None = None) -> int:
        return sum(
            a.bytes
            for a in self.accesses
            if (category is None or a.category == category)
            and (level is None or a.level == level)
            and (write is None or a.write == write)
        )


class Op(NamedTuple):
    """One op of a step in program order: its ``work`` plus where it runs and what it waits for."""

    idx: int
    name: str
    layer: int  # -1 for ops outside the layer stack
    work: Work
    deps: tuple[int, ...] = ()
    stream: str = "main"
    stage: int = 0  # pipeline stage (chip group) it runs on
    host_sync: bool = False  # the host waits for this op before issuing more
    row: str = ""  # breakdown row the whole op belongs to ("" = split by what bounds it)
    compute_row: str = "compute"  # breakdown row of its compute time
    tags: tuple[tuple[str, object], ...] = ()

    # shorthands for the work's fields, so tables and tests read naturally
    @property
    def kind(self) -> str:
        return self.work.kind

    @property
    def accesses(self) -> tuple[Access, ...]:
        return self.work.accesses

    @property
    def matrix_flops(self) -> int:
        return self.work.matrix_flops

    @property
    def vector_ops(self) -> int:
        return self.work.vector_ops

    @property
    def kernels(self) -> int:
        return self.work.kernels

    @property
    def collective(self):
        return self.work.collective

    def with_work(self, work: Work, tags: tuple) -> "Op":
        """This op, asking ``work`` of the hardware instead (same place in the program)."""
        return self._replace(work=work, tags=tags)

    def tag(self, key: str, default=None):
        return dict(self.tags).get(key, default)

    def bytes(self, category: str | None = None, level: str | None = None, write: bool | None = None) -> int:
        return self.work.bytes(category, level, write)


class LazyOps(Sequence):
    """A read-only sequence of ops some of which are made when first read (``_op(i)``, for an
    index in range): indexing and slicing (slices are tuples) are written once here."""

    __slots__ = ()

    @abstractmethod
    def _op(self, i: int) -> Op:
        """The op at index ``i`` (0 <= i < len), made if it has not been."""

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self._op(j) for j in range(*i.indices(len(self))))
        if i < 0:
            i += len(self)
            if i < 0:
                raise IndexError("op index out of range")
        return self._op(i)

    def __iter__(self):
        for i in range(len(self)):
            yield self._op(i)


class Program(LazyOps):
    """A step's ops in program order, as a ``Builder`` appends them, with each run of copied
    layers (``Builder.append_copies``) kept as the ops it copies: a copy becomes its ``Op``
    record (its proto's, index and waits moved, with its own layer) when something first reads
    it, and is kept from then on. A new configuration pays for the copies its readers read
    (the timers and counters read a handful of them), not for every layer of the model.
    Read-only once the graph is made."""

    __slots__ = ("_ops", "_regions", "_starts")

    def __init__(self, ops=()):
        self._ops: list[Op | None] = list(ops)  # None: a copy not made yet
        self._regions: list[tuple[int, int, int, tuple[int, ...]]] = []  # (start, length, first proto, layers)
        self._starts: list[int] = []  # each region's start, for bisect

    def __len__(self) -> int:
        return len(self._ops)

    def _op(self, i: int) -> Op:
        op = self._ops[i]
        if op is None:
            op = self._ops[i] = self._copy(i)
        return op

    def layer_of(self, i: int) -> int:
        """Op ``i``'s layer (0 <= i < len), without making it if it is a copy not made yet."""
        op = self._ops[i]
        if op is not None:
            return op.layer
        start, length, _first, layers = self._regions[bisect_right(self._starts, i) - 1]
        return layers[(i - start) // length]

    def __iter__(self):  # the ops made so far without a call each
        ops = self._ops
        for i in range(len(ops)):
            op = ops[i]
            yield op if op is not None else self._op(i)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None

    def append(self, op: Op) -> None:
        self._ops.append(op)

    def __setitem__(self, i: int, op: Op) -> None:
        """Replace op ``i`` (the copies of it made so far keep what they copied, as a list's would)."""
        if any(first <= i % len(self._ops) < first + length for _start, length, first, _layers in self._regions):
            self._make_all()  # a proto of copies not made yet: make them from the op as it was
        self._ops[i] = op

    def copies(self, first: int, length: int, layers) -> None:
        """Append a copy of ops ``first .. first+length-1`` as each of ``layers``."""
        start = len(self._ops)
        self._regions.append((start, length, first, tuple(layers)))
        self._starts.append(start)
        self._ops.extend([None] * (length * len(layers)))

    def _copy(self, i: int) -> Op:
        start, length, first, layers = self._regions[bisect_right(self._starts, i) - 1]
        k, j = divmod(i - start, length)
        proto = self[first + j]
        shift = start + k * length - first
        deps = proto.deps
        return tuple.__new__(Op, (proto.idx + shift, proto.name, layers[k], proto.work,
                                  (deps[0] + shift,) if len(deps) == 1 else tuple([d + shift for d in deps]),
                                  proto.stream, proto.stage, proto.host_sync, proto.row, proto.compute_row, proto.tags))

    def _make_all(self) -> None:
        for i, op in enumerate(self._ops):
            if op is None:
                self._op(i)


@dataclass(frozen=True, slots=True)
class OpGraph:
    """The ops of one decode step, in program order (the order the host issues them)."""

    ops: Sequence[Op]  # a Program (copies made when read) or a tuple
    step: int = 0
    batch: int = 0
    contexts: tuple[int, ...] = ()
    stages: int = 1
    streams: tuple[tuple[int, str], ...] = field(default=())  # (stage, stream) pairs in first-use order
    watched: tuple[bool, ...] = field(default=())  # per op: does another stream or the host wait for it
    lanes: tuple["Lane", ...] = field(default=())  # per (stage, stream): its ops in order and their waits
    syncs: tuple[int, ...] = field(default=())  # ops the host waits for, in program order
    # per op: the end (exclusive) of the run of ops after it that each wait only for the op just
    # before them on the same stream (a chain the timers walk without looking at dependencies)
    chains: tuple[int, ...] = field(default=())
    watched_ops: tuple[int, ...] = field(default=())  # the ops ``watched`` marks, in order
    repeats: tuple["Repeat", ...] = field(default=())  # runs of ops that copy the span before them

    def __init__(self, ops: Sequence[Op], step: int = 0, batch: int = 0, contexts: tuple[int, ...] = (),
                 stages: int = 1, streams: tuple[tuple[int, str], ...] = (), watched: tuple[bool, ...] = (),
                 lanes: tuple["Lane", ...] = (), syncs: tuple[int, ...] = (), chains: tuple[int, ...] = (),
                 watched_ops: tuple[int, ...] = (), repeats: tuple["Repeat", ...] = ()):
        # the frozen __init__ written out, as Work's (a graph is made per step)
        put = _SET
        put(self, "ops", ops)
        put(self, "step", step)
        put(self, "batch", batch)
        put(self, "contexts", contexts)
        put(self, "stages", stages)
        put(self, "streams", streams)
        put(self, "watched", watched)
        put(self, "lanes", lanes)
        put(self, "syncs", syncs)
        put(self, "chains", chains)
        put(self, "watched_ops", watched_ops)
        put(self, "repeats", repeats)

    def with_ops(self, ops: tuple[Op, ...], *, step: int, contexts: tuple[int, ...]) -> "OpGraph":
        """The same program (streams, dependencies, syncs) over ``ops``: ops whose work
        changed but not their place in it (re-lowered attention)."""
        return OpGraph(ops, step=step, batch=len(contexts), contexts=contexts, stages=self.stages,
                       streams=self.streams, watched=self.watched, lanes=self.lanes, syncs=self.syncs,
                       chains=self.chains, watched_ops=self.watched_ops, repeats=self.repeats)

    def bytes(self, category: str | None = None, level: str | None = None, write: bool | None = None) -> int:
        return sum(op.work.bytes(category, level, write) for op in self.ops)

    def flops(self) -> int:
        return sum(op.work.matrix_flops for op in self.ops)

    @property
    def kernels(self) -> int:
        return sum(op.work.kernels for op in self.ops)


class Repeat(NamedTuple):
    """``count`` copies of the ``length`` ops just before ``start``, one after another from
    ``start``: op ``start + k*length + j`` is op ``start - length + j`` with its index and
    dependencies moved by ``(k+1)*length`` (another layer), asking the very same Work object.
    Counters may read the span once for every copy; ``make_graph`` shifts what it derived for
    the span (lanes, waits, watched marks) where the span stands to the ops before it as each
    copy does to the one before, and walks the copies otherwise."""

    start: int
    length: int
    count: int

    @property
    def end(self) -> int:
        return self.start + self.count * self.length


class Lane(NamedTuple):
    """One stream of one pipeline stage as the engine walks it: its ops in program order and,
    per op, the dependencies other than the op before it on the same stream."""

    stage: int
    stream: str
    ops: tuple[int, ...]
    external: tuple[tuple[int, ...], ...]


_LANE_OF, _SYNCED, _IDX = attrgetter("stage", "stream"), attrgetter("host_sync"), attrgetter("idx")


def make_graph(ops, *, step: int, contexts: tuple[int, ...], stages: int, repeats: tuple[Repeat, ...] = ()) -> OpGraph:
    """An OpGraph over ``ops`` with its streams, watched ops, lanes and chains derived from them;
    the ops of each of ``repeats`` (runs of copies, in program order) are derived by shifting
    what was derived for the span they copy (the same result, without walking every copy).
    A program with repeats is derived once per shape (``_shape``) and process: the graphs of
    a sweep over batch or context share it."""
    ops = ops if isinstance(ops, Program) else tuple(ops)
    repeats = tuple(repeats)
    shape = _shape(ops, repeats) if repeats else None
    derived = _DERIVED.get(shape) if shape is not None else None
    if derived is None:
        derived = _derive(ops, repeats)
        if shape is not None:
            if len(_DERIVED) >= _DERIVED_LIMIT:
                _DERIVED.clear()
            _DERIVED[shape] = derived
    streams, watched, lanes, syncs, chains, watched_ops = derived
    return OpGraph(ops, step=step, batch=len(contexts), contexts=tuple(contexts), stages=stages, streams=streams,
                   watched=watched, lanes=lanes, syncs=syncs, chains=chains, watched_ops=watched_ops,
                   repeats=repeats)


_DERIVED: dict[tuple, tuple] = {}  # a program's shape -> what make_graph derives from it
_DERIVED_LIMIT = 64


def _shape(ops: tuple[Op, ...], repeats: tuple[Repeat, ...]) -> tuple:
    """All that ``make_graph`` derives from: each op's index, dependencies, stage, stream and
    host sync, read for the ops outside the runs of copies (each copy is the span before its
    run, moved: ``Repeat``), with the runs and the op count."""
    outside, at = [], 0
    for repeat in (*repeats, Repeat(len(ops), 0, 0)):
        outside.extend((op.idx, op.deps, op.stage, op.stream, op.host_sync) for op in ops[at:repeat.start])
        at = repeat.end
    return len(ops), repeats, tuple(outside)


def _derive(ops: tuple[Op, ...], repeats: tuple[Repeat, ...]) -> tuple:
    """(streams, watched, lanes, syncs, chains, watched ops) of ``ops``: see ``make_graph``."""
    lane_of = list(map(_LANE_OF, ops))
    synced = list(map(_SYNCED, ops))
    walk = _Walk(ops, lane_of, synced.copy())
    at = 0
    for repeat in repeats:
        walk.ops_in(at, repeat.start)
        walk.copies(repeat)
        at = repeat.end
    walk.ops_in(at, len(ops))
    lanes, watched = walk.lanes, walk.watched
    return (tuple(lanes), tuple(watched),
            tuple(Lane(stage, stream, tuple(members), tuple(external))
                  for (stage, stream), (members, external) in lanes.items()),
            tuple(compress(map(_IDX, ops), synced)), _chains(walk.follows),
            tuple(compress(range(len(ops)), watched)))


class _Walk:
    """What ``make_graph`` derives, op by op: per (stage, stream) its ops and their waits other
    than the op before them on the stream, which ops another stream or the host waits for
    (``watched``), and per op whether it waits only for the op just before it on its stream
    (``follows``); ``marks`` keeps, per op that watched others, the ops it marked."""

    __slots__ = ("ops", "lane_of", "watched", "lanes", "follows", "external", "marks")

    def __init__(self, ops, lane_of, watched):
        self.ops, self.lane_of, self.watched = ops, lane_of, watched
        self.lanes: dict[tuple[int, str], tuple[list[int], list[tuple[int, ...]]]] = {}  # key -> (its ops, their waits)
        self.follows: list[bool] = []
        self.external: list[tuple[int, ...]] = []  # per op walked: its waits other than the op before it on its stream
        self.marks: dict[int, tuple[int, ...]] = {}

    def ops_in(self, lo: int, hi: int) -> None:
        ops, lane_of, watched, lanes, follows = self.ops, self.lane_of, self.watched, self.lanes, self.follows
        externals, marks = self.external, self.marks
        for i in range(lo, hi):
            op, key = ops[i], lane_of[i]
            entry = lanes.get(key)
            if entry is None:
                entry = lanes[key] = ([], [])
            members, external = entry
            deps = op.deps
            if members and deps == (members[-1],):  # the usual op: it waits for the one before it on its stream
                waits = ()
            else:
                previous = members[-1] if members else None
                waits = tuple(d for d in deps if d != previous)
                marked = tuple(d for d in deps if lane_of[d] != key)
                for dep in marked:
                    watched[dep] = True
                if marked:
                    marks[i] = marked
            external.append(waits)
            externals.append(waits)
            members.append(op.idx)
            follows.append(i > 0 and deps == (i - 1,) and lane_of[i - 1] == key)

    def copies(self, repeat: Repeat) -> None:
        """Derive the ops of ``repeat`` from the span it copies, shifted, where that span stands
        to the ops before it as each copy does to the one before (``_shiftable``); else walk them."""
        n, lo = repeat.length, repeat.start - repeat.length
        ref = range(lo, repeat.start)
        per_lane: dict[tuple[int, str], tuple[list[int], list[tuple[int, ...]]]] = {}
        for i in ref:
            members, waits = per_lane.setdefault(self.lane_of[i], ([], []))
            members.append(i)
            waits.append(self.external[i])
        if not self._shiftable(lo, n, per_lane):
            self.ops_in(repeat.start, repeat.end)
            return
        marks = [(i, self.marks[i]) for i in ref if i in self.marks]
        follows = self.follows[lo:repeat.start]
        shifts = range(n, (repeat.count + 1) * n, n)
        for key, (members, waits) in per_lane.items():
            own_members, own_waits = self.lanes[key]
            own_members.extend([i + shift for shift in shifts for i in members])
            own_waits.extend(_moved(waits, shifts))
        for shift in shifts:
            for i, marked in marks:
                for dep in marked:
                    self.watched[dep + shift] = True
                self.marks[i + shift] = tuple([d + shift for d in marked])
        self.external.extend(_moved(self.external[lo:repeat.start], shifts))
        self.follows.extend(follows * repeat.count)


    def _shiftable(self, lo: int, n: int, per_lane: dict) -> bool:
        """Whether the span ``lo .. lo+n-1`` (walked last) relates to the ops before it as a copy
        right after it would to the span: the op before it is on the stream of the span's last op,
        each stream's op before the span is its last op in the span moved back by ``n``, and
        each wait for an op before the span is for one on the stream of that op moved by ``n``."""
        lane_of = self.lane_of
        if lo == 0 or lane_of[lo - 1] != lane_of[lo + n - 1]:
            return False
        for key, (members, _waits) in per_lane.items():
            walked = self.lanes[key][0]
            if len(walked) <= len(members) or walked[-len(members) - 1] + n != walked[-1]:
                return False
        return all(lane_of[d] == lane_of[d + n] for i in range(lo, lo + n) for d in self.ops[i].deps if d < lo)


def _moved(waits: list[tuple[int, ...]], shifts) -> list[tuple[int, ...]]:
    """``waits`` (op indices) once per shift, moved by it (most ops wait for nothing else)."""
    if not any(waits):
        return [()] * (len(waits) * len(shifts))
    return [tuple([d + shift for d in w]) if w else () for shift in shifts for w in waits]


def _chains(follows: list[bool]) -> tuple[int, ...]:
    """Per op ``i``: the largest ``j`` such that every op of ``i+1 .. j-1`` ``follows`` (is on
    the stream and stage of the op before it and depends on that op and nothing else)."""
    n = len(follows)
    chains = [0] * n
    end = n
    for i in range(n - 1, -1, -1):
        chains[i] = end
        if not follows[i]:
            end = i
    return tuple(chains)


def live(accesses) -> tuple[Access, ...]:
    """The accesses that move bytes."""
    return tuple([a for a in accesses if a.bytes > 0])


_EXPAND_ONLY = ("values", "quant", "active")  # fields of an op's ask that only its expansion reads


def make_work(expand, name: str, kind: str, accesses: tuple[Access, ...], work: dict, parts=None) -> Work:
    """The ``Work`` of op ``name`` of ``kind`` over ``accesses`` (``live`` ones) with the other
    fields ``work`` (plus ``values``, ``quant`` and ``active``, which only ``expand`` reads),
    run through ``expand`` (name, kind, accesses, fields -> the kernels that run it) if given."""
    fields = dict(work)
    extra = {k: fields.pop(k) for k in _EXPAND_ONLY if k in fields}
    if expand is not None:
        kernels = expand(name, kind, accesses, fields, parts=parts, **extra)
        fields["kernels_run"] = kernels
        fields["kernels"] = kernels[0].launches if len(kernels) == 1 else sum([k.launches for k in kernels])
    return Work(kind, accesses, **fields)


class Builder:
    """Appends ops in program order; by default each op depends on the previous op of its
    stream (a GPU stream runs kernels in order)."""

    def __init__(self, ops: Program | None = None, stage: int = 0, expand=None, streams=None):
        self.ops: Program = Program() if ops is None else ops
        self._last: dict[tuple[int, str], int] = {}
        self.stage = stage
        self.expand = expand  # (name, kind, accesses, fields) -> the kernels that run the op
        self.streams = streams  # op name -> (side stream, op that joins it) or None
        self._joins: dict[str, list[int]] = {}  # op name -> side ops it must wait for
        self._works: dict[tuple, Work] = {}  # what an op asked -> its Work (see _work)
        self._equal: dict[Work, Work] = {}  # each distinct Work built, by value
        self.repeats: list[Repeat] = []  # runs of copies appended by ``append_copies``

    def add(self, name: str, layer: int, kind: str, accesses, *, deps=None, stream: str = "main",
            host_sync: bool = False, row: str = "", compute_row: str = "compute", tags=(), **work) -> Op:
        """Append one op; ``work`` holds the ``Work`` fields other than kind and accesses."""
        idx = len(self.ops)
        side = self.streams(name) if self.streams is not None and deps is None else None
        if side is not None:  # fork from the main stream's tail onto the side stream
            stream, join = side
            main = self._last.get((self.stage, "main"))
            previous = self._last.get((self.stage, stream))
            deps = tuple(d for d in (main, previous) if d is not None)
            self._joins.setdefault(join, []).append(idx)
        key = (self.stage, stream)
        if deps is None:
            deps = (self._last[key],) if key in self._last else ()
        if name in self._joins:
            deps = tuple(deps) + tuple(self._joins.pop(name))
        op = tuple.__new__(Op, (idx, name, layer, self._work(name, kind, accesses, work), tuple(deps), stream,  # in order
                                self.stage, host_sync, row, compute_row, tuple(tags)))
        self.ops.append(op)
        self._last[key] = idx
        return op

    def _work(self, name: str, kind: str, accesses, work: dict) -> Work:
        """The ``Work`` of an op; an op asked again the same (the same op of the next layer)
        gets the same object without running ``expand`` again (a pure function of the op), and
        ops of other names that ask the same of the hardware (two norms) share one object too."""
        accesses = live(accesses)
        parts = work.pop("parts", None)
        key = (name, kind, accesses, tuple(work.items()), parts and tuple(parts.items()))
        made = self._works.get(key)
        if made is None:
            work = make_work(self.expand, name, kind, accesses, work, parts)
            made = self._works[key] = self._equal.setdefault(work, work)
        return made

    def append_copies(self, protos: list[Op], layers: list[int], repeat: bool = False) -> None:
        """Append a copy of ``protos`` (a contiguous run of this builder's ops) as each of
        ``layers``, one after another, indices and dependencies moved (made when read:
        ``Program``); ``repeat``: the ops just before the first copy are themselves ``protos``
        moved (and follow a span of their shape), so the run is kept as a ``Repeat``."""
        if not layers:
            return
        n, start = len(protos), len(self.ops)
        self.ops.copies(protos[0].idx, n, layers)
        shift = start + (len(layers) - 1) * n - protos[0].idx  # the last copy's
        self._last.update({(op.stage, op.stream): op.idx + shift for op in protos})
        if repeat:
            self.repeats.append(Repeat(start, n, len(layers)))

    def copyable(self) -> bool:
        """Whether an op appended now on the main stream would wait for the op just before it
        and nothing else: that op is the main stream's last and no side stream waits to be joined."""
        return not self._joins and bool(self.ops) and self._last.get((self.stage, "main")) == len(self.ops) - 1

    def last(self, stream: str = "main") -> int | None:
        return self._last.get((self.stage, stream))

    def unjoined(self) -> dict[str, str]:
        """Side-stream ops still waiting for the op that joins them: join op name -> the name of
        the first such op (empty once every side stream met its join)."""
        return {join: self.ops[idxs[0]].name for join, idxs in self._joins.items() if idxs}
