"""Memory tiers as the costs see them: what an access to a level consumes and how fast it can go.

An access of ``b`` bytes to a level is a flow on that level's link. It consumes ``b /
efficiency`` of the level's pin bandwidth (the level's efficiency for its piece size: a gather
of 32-byte pieces costs about three times a stream) and is capped by the tiles it runs on
(``tile_load_GBps`` each) and, on HBM, by the channels its addresses cover: a transfer is
striped over the channels in ``interleave_bytes`` granules, so a small one reaches only the
channels its granules land on. The first byte of a level arrives after its ``latency_ns``.
Reads the profile's ``memory`` levels and ``compute.tile_load_GBps``; ignores bank conflicts
and refresh timing (refresh is a constant share inside the efficiency).
"""

from __future__ import annotations

import math

from sim.config.hardware import HBM, HardwareProfile
from sim.costs.records import Flow

_new = tuple.__new__  # a Flow from its fields in order, without the named tuple's keyword handling


class Memory:
    """The profile's memory levels, by name: their capacity, efficiency and striping."""

    def __init__(self, hw: HardwareProfile):
        self.hw = hw
        self.levels = {level.name: level for level in hw.memory}
        self.store = hw.store
        self._specs: dict[tuple[str, int | None], tuple] = {}  # (level, granule) -> (efficiency, weight, striping)
        # per HBM level: (channels, interleave bytes, channel GB/s), the striping its flows' caps follow
        self._striping = {level.name: (level.channels, level.interleave_bytes.value, level.channel_bandwidth_GBps.value)
                          for level in hw.memory if isinstance(level, HBM)}
        self._tile_load = hw.compute.tile_load_GBps.value
        self._latency = {name: level.latency_ns.value for name, level in self.levels.items()}

    def capacity(self) -> dict[str, float]:
        """Each level's pin bandwidth (bytes/ns), the capacity its flows share."""
        return {name: level.peak_GBps for name, level in self.levels.items()}

    def tile_caps(self, tiles: float, store_cap: float = math.inf) -> tuple[float, float]:
        """(cap on a level, cap on the backing store) of all the accesses from ``tiles`` tiles
        together: their load bandwidth, on the store also ``store_cap`` (the kernel class's rate)."""
        tile_cap = tiles * self._tile_load
        return tile_cap, store_cap if store_cap < tile_cap else tile_cap

    def flow(self, access, tile_cap: float) -> Flow:
        """``access`` as a flow, held with the op's other accesses to its level to ``tile_cap``
        (``tile_caps``): it consumes 1 / the level's efficiency for its pieces (a stream: None)
        of the level's pin bandwidth per byte, and reaches only the HBM channels it covers."""
        level, size, category, write, granule, _role = access
        spec = self._specs.get((level, granule))
        if spec is None:
            eff = self.levels[level].efficiency(granule)
            spec = self._specs[level, granule] = (eff, 1.0 / eff, self._striping.get(level))
        eff, weight, striping = spec
        if striping is None:
            return _new(Flow, (level, size, weight, math.inf, category, write, tile_cap))
        channels, interleave, channel_GBps = striping
        cap = min(channels, math.ceil(size / interleave)) * channel_GBps * eff
        return _new(Flow, (level, size, weight, cap, category, write, tile_cap))

    def first_byte_ns(self, flows, first: bool) -> float:
        """The latency before a byte-model kernel's body: the slowest level it reads if it is
        the op's first kernel (nothing of the op is in flight yet), else the nearest level it touches."""
        latency = self._latency
        times = [latency[f.link] for f in flows if f.link in latency and not (first and f.write)]
        return (max if first else min)(times, default=0.0)
