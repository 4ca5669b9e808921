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


class Memory:
    """The profile's memory levels, by name: their capacity, efficiency and striping."""

    def __init__(self, hw: HardwareProfile):
        self.hw = hw
        self.levels = {level.name: level for level in hw.memory}
        self.store = hw.store
        self._efficiency: dict[tuple[str, int | None], float] = {}  # (level, granule) -> efficiency
        # per HBM level: (channels, interleave bytes, channel GB/s), the striping its flows' caps follow
        self._striping = {level.name: (level.channels, level.interleave_bytes.value, level.channel_bandwidth_GBps.value)
                          for level in hw.memory if isinstance(level, HBM)}
        self._tile_load = hw.compute.tile_load_GBps.value

    def capacity(self) -> dict[str, float]:
        """Each level's pin bandwidth (bytes/ns), the capacity its flows share."""
        return {name: level.peak_GBps for name, level in self.levels.items()}

    def efficiency(self, level: str, granule: int | None) -> float:
        """The fraction of ``level``'s pin bandwidth accesses of ``granule`` pieces reach (None: a stream)."""
        key = (level, granule)
        eff = self._efficiency.get(key)
        if eff is None:
            eff = self._efficiency[key] = self.levels[level].efficiency(granule)
        return eff

    def flow(self, access, tiles: float, store_cap: float = math.inf) -> Flow:
        """``access`` as a flow from ``tiles`` tiles; ``store_cap`` caps an access to the backing
        store (the kernel class's rate)."""
        name = access.level
        eff = self.efficiency(name, access.granule)
        cap = math.inf
        striping = self._striping.get(name)
        if striping is not None:
            channels, interleave, channel_GBps = striping
            cap = min(channels, math.ceil(access.bytes / interleave)) * channel_GBps * eff
        tile_cap = tiles * self._tile_load
        if name == self.store.name and store_cap < tile_cap:
            tile_cap = store_cap
        return Flow(name, access.bytes, 1.0 / eff, cap, access.category, access.write, tile_cap)

    def first_byte_ns(self, flows, first: bool) -> float:
        """The latency before a byte-model kernel's body: the slowest level it reads if it is
        the op's first kernel (nothing of the op is in flight yet), else the nearest level it touches."""
        latency = [self.levels[f.link].latency_ns.value for f in flows
                   if f.link in self.levels and not (first and f.write)]
        return (max if first else min)(latency, default=0.0)
