"""Links and topology: what a transfer over the chip links, the scale-out links, the on-chip
network or the host link costs.

A collective's wire bytes follow its algorithm (ring all-reduce ``2 (n - 1) S / n`` per chip,
all-to-all ``(n - 1) S / n``, all-gather ``(n - 1) S``, point-to-point ``S``); its latency
is one hop per step of the topology's algorithm (a mesh's all-reduce in 2 steps, a 2-D
torus's in ``4 (side - 1)``, a ring's or a switch's in ``2 (n - 1)``) plus the per-message
overhead; over the scale-out links (a group that spans nodes or wafers) a ring of the groups'
hops. The NoC and the host link add their latency for each hop or message before an op's body.
Reads the profile's ``system.links``, ``system.scaleout``, ``noc`` and ``host``; ignores
congestion inside the topology (links are one shared capacity each).
"""

from __future__ import annotations

import math

from sim.config.hardware import HardwareProfile
from sim.costs.records import Flow

LINKS = ("link", "scaleout")  # the levels a collective moves over


class Links:
    """The profile's links and topology."""

    def __init__(self, hw: HardwareProfile):
        self.hw = hw
        self._noc_latency_ns = hw.noc.latency_ns.value
        self._pcie_latency_ns = hw.host.pcie_latency_ns.value

    def capacity(self) -> dict[str, float]:
        """The NoC's, the host link's, the chip links' and the scale-out links' bandwidth (bytes/ns)."""
        links, scaleout = self.hw.system.links, self.hw.system.scaleout
        link = links.bandwidth_GBps.value if links else 1.0
        return {"noc": self.hw.noc.bandwidth_GBps.value, "pcie": self.hw.host.pcie_bandwidth_GBps.value,
                "link": link, "scaleout": scaleout.bandwidth_GBps.value if scaleout else link}

    def flow(self, op, access) -> Flow:
        """``access`` of ``op`` on a link: its wire bytes at full efficiency, uncapped."""
        return Flow(access.level, self.wire_bytes(op, access), 1.0, math.inf, access.category, access.write)

    def wire_bytes(self, op, access) -> int:
        """The bytes ``access`` puts on the wire: a collective's per chip by its algorithm, else its own."""
        if op.collective is None or access.level not in LINKS:
            return access.bytes
        kind, size, n = op.collective
        if kind == "alltoall_by_link":  # the lowering split the rows by the links they cross
            return access.bytes
        if kind == "allreduce":
            return math.ceil(2 * (n - 1) * size / n)
        if kind in ("allgather", "alltoall"):
            return math.ceil((n - 1) * size / n) if kind == "alltoall" else (n - 1) * size
        return size  # p2p

    def collective_latency_ns(self, op) -> float:
        """Latency steps of a collective: per step one hop, by the topology's algorithm; over the
        scale-out links (a group that spans nodes or wafers) a ring of the groups' hops."""
        links = self.hw.system.links
        kind, _size, n = op.collective
        if links is None or n <= 1:
            return 0.0
        scaleout = self.hw.system.scaleout
        if scaleout is not None and any(a.level == "scaleout" for a in op.accesses):
            groups = max(2, math.ceil(n / scaleout.chips_per_group.value))
            steps = 1 if kind == "p2p" else (2 * (groups - 1) if kind == "allreduce" else groups - 1)
            inner = 0.0 if kind == "p2p" else links.latency_ns.value * (2 if kind == "allreduce" else 1)
            return scaleout.per_message_overhead_ns.value + steps * scaleout.latency_ns.value + inner
        return links.per_message_overhead_ns.value + _steps(links.topology, kind, n) * links.latency_ns.value

    def fill_ns(self, op) -> float:
        """The on-chip network's latency for each NoC hop and the host link's for each message to the host."""
        return op.noc_hops * self._noc_latency_ns + op.pcie_messages * self._pcie_latency_ns


def _steps(topology: str, kind: str, n: int) -> int:
    """Latency steps of a collective of ``kind`` over ``n`` chips on one ``topology``."""
    if kind == "p2p":
        return 1
    if topology == "mesh":
        return 2 if kind == "allreduce" else 1
    if topology == "torus2d":
        side = math.ceil(math.sqrt(n))
        return (4 if kind == "allreduce" else 2) * (side - 1)
    return 2 * (n - 1) if kind == "allreduce" else (n - 1)  # ring, or a switch running ring collectives
