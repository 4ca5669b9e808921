"""Kernel classes on a chip: what one kernel costs beyond its bytes and its work.

A profile that measures its kernel classes (``kernels.classes``, sim.config.hardware) gives
each class a start-up (the kernel's launch-to-first-work and tail inside a captured graph)
and the rate its reads of the backing store reach, as a fraction of the store's sustained
rate; a class whose grid is one CTA per row is further capped at its rows' CTA bandwidth.
The software stack's implementations scale that rate by their measured efficiency (and may
bring their own start-up); a cache-dequantizing kernel's implementation prices each value it
dequantizes (``ps_per_value``), which replaces the work the lowering counted. A profile
without measured classes keeps the byte model: the kernel gap plus the first-byte latency.
The eager host dispatch of a kernel is the stack's figure for its class, else the profile's
launch overhead.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from sim.config.hardware import HardwareProfile
from sim.units import PS_PER_NS


class _Class(NamedTuple):
    """A measured kernel class's figures, read once: the rate its store accesses reach, what one
    row's CTA pulls (None unless its grid is one CTA per row) and one launch's start-up."""

    store_cap: float
    per_cta: float | None
    startup_ns: float


class KernelClasses:
    """The profile's measured kernel classes and the stack's implementations."""

    def __init__(self, hw: HardwareProfile, stack=None):
        self.hw, self.stack = hw, stack
        self.store = hw.store
        self._classes = {name: _measured(hw, klass) for name, klass in hw.kernels.classes.items()} if hw.kernels else {}
        impls = stack.impls if stack is not None else {}
        self._attention = stack.attention if stack is not None else {}
        self._impl_startup = {name: i.startup_ns.value for name, i in impls.items() if i.startup_ns is not None}
        self._impl_efficiency = {name: i.efficiency.value for name, i in impls.items()}
        self._dispatch: dict[str, float] = {}  # kclass -> the stack's eager dispatch (0: none)
        self._launch_ns = hw.host.launch_overhead_ns.value

    def store_cap(self, k) -> float:
        """The rate kernel ``k``'s accesses to the backing store reach together (bytes/ns)."""
        klass = self._classes.get(k.kclass)
        if klass is None:
            return math.inf
        if klass.per_cta is None:
            return klass.store_cap
        return min(klass.store_cap, k.parallelism * klass.per_cta)

    def implemented(self, k, vector: float, dequant: float) -> tuple[float, float]:
        """(vector ns, dequant ns) of ``k`` under its implementation: a cache-dequantizing
        one's measured per-value cost replaces the counted dequantization."""
        impl = self._attention.get(k.impl) if k.quant else None
        if impl is None:
            return vector, dequant
        measured = k.values * impl.ps_per_value(k.quant) / PS_PER_NS
        return vector + (measured - dequant), measured

    def scaled(self, k, store_cap: float) -> float:
        """The rate ``k``'s accesses to the backing store reach together, ``store_cap`` without its
        implementation: each implementation's efficiency scales it (a cache-dequantizing one's,
        then the kernel's)."""
        if not k.impl:
            return store_cap
        if k.quant and k.impl in self._attention:
            store_cap = store_cap * self._attention[k.impl].efficiency.value
        efficiency = self._impl_efficiency.get(k.impl)
        return store_cap if efficiency is None else store_cap * efficiency

    def startup_ns(self, k) -> float | None:
        """One launch's start-up of ``k`` by its measured class (its implementation's own where
        it has one); None without a measured class."""
        klass = self._classes.get(k.kclass)
        if klass is None:
            return None
        own = self._impl_startup.get(k.impl) if k.impl else None
        return klass.startup_ns if own is None else own

    def dispatch_ns(self, kclass: str, default: float | None = None) -> float:
        """Host time to launch one kernel of ``kclass`` eagerly: the stack's measured figure,
        else ``default`` (the profile's launch overhead)."""
        value = self._dispatch.get(kclass)
        if value is None:
            value = self._dispatch[kclass] = self.stack.dispatch(kclass) if self.stack is not None else 0.0
        if value:
            return value
        return self._launch_ns if default is None else default


def _measured(hw: HardwareProfile, klass) -> _Class:
    """A measured class's figures (sim.config.hardware.KernelClass) on ``hw``."""
    per_cta = None
    if klass.parallel == "rows":
        per_cta = (klass.cta_bandwidth_GBps if klass.cta_bandwidth_GBps is not None else hw.kernels.cta_bandwidth_GBps).value
    return _Class(klass.stream_fraction.value * hw.store.sustained_GBps, per_cta, klass.startup_ns.value)


def breakdown(by_row: dict[str, float], body: float, compute: float, matrix: float, vector: float,
              dequant: float) -> list[tuple[str, float]]:
    """The rows of a kernel's ``body`` ns: compute and dequantization where the compute bounds
    it, else the loads' rows (``by_row``: each row's load time, sim.costs.records.loads) in
    proportion to their time."""
    if compute >= max(by_row.values(), default=0.0):
        total = matrix + vector
        rows = [("dequant", body * dequant / total)] if total and dequant else []
        rows.append(("compute", body * (1 - (dequant / total if total else 0.0))))
        return rows
    total = sum(by_row.values())
    return [(row, body * t / total) for row, t in by_row.items()]
