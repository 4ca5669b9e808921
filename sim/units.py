"""The only unit conversions in decodesim.

Decimal prefixes by default: GB = 1e9 bytes, TB = 1e12, GBps = 1e9 bytes/s. Binary units are
spelled out (KiB, MiB, GiB). Simulated time is in nanoseconds (ns) everywhere.
"""

from __future__ import annotations

import math

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 1024
MiB = 1024**2
GiB = 1024**3

NS_PER_S = 1e9
NS_PER_US = 1e3
NS_PER_MS = 1e6


def GBps_to_bytes_per_ns(gbps: float) -> float:
    """GB/s (1e9 bytes per second) to bytes per nanosecond: numerically the same."""
    return gbps * GB / NS_PER_S


def bytes_per_ns_to_GBps(rate: float) -> float:
    return rate * NS_PER_S / GB


def ns_to_ms(ns: float) -> float:
    return ns / NS_PER_MS


def ns_to_us(ns: float) -> float:
    return ns / NS_PER_US


def us_to_ns(us: float) -> float:
    return us * NS_PER_US


def cycles_to_ns(cycles: float, clock_GHz: float) -> float:
    """Whole cycles (rounded up) at ``clock_GHz`` to nanoseconds."""
    return math.ceil(cycles - 1e-9) / clock_GHz


def flops_per_ns(ops_per_cycle: float, clock_GHz: float) -> float:
    return ops_per_cycle * clock_GHz


def TFLOPs_from(ops_per_cycle: float, clock_GHz: float, count: int) -> float:
    return ops_per_cycle * clock_GHz * count / 1e3
