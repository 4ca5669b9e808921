"""The only unit conversions in decodesim.

Decimal prefixes by default: GB = 1e9 bytes, TB = 1e12, GBps = 1e9 bytes/s. Binary units are
spelled out (KiB, MiB, GiB). Simulated time is in nanoseconds (ns) everywhere; results and
reports state it in ms (per-token latency) or s (arrivals, spans).

Each converter divides or multiplies by one constant, so ``ns_to_ms(x)`` is bit-identical to
``x / 1e6`` (``x * 1e-6`` is not: it can differ in the last bit).
"""

from __future__ import annotations

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 1024
MiB = 1024**2
GiB = 1024**3
MB_PER_GB = 1e3
GB_PER_TB = 1e3  # also GB/s per TB/s
GFLOP_PER_TFLOP = 1e3  # also G operations per T operations, per second or not

NS_PER_S = 1e9
PS_PER_NS = 1e3
S_PER_NS = 1e-9  # a product by it: x * S_PER_NS (not x / NS_PER_S, which can differ in the last bit)
J_PER_PJ = 1e-12  # likewise, x * J_PER_PJ
NS_PER_US = 1e3
NS_PER_MS = 1e6
MS_PER_S = 1e3
US_PER_MS = 1e3
US_PER_S = 1e6
MW_PER_W = 1e3  # milliwatts (NVML's power unit) per watt
S_PER_MIN = 60.0
S_PER_H = 3600.0


def ns_to_ms(ns: float) -> float:
    return ns / NS_PER_MS


def ns_to_us(ns: float) -> float:
    return ns / NS_PER_US


def us_to_ns(us: float) -> float:
    return us * NS_PER_US


def ms_to_us(ms: float) -> float:
    return ms * US_PER_MS


def ns_to_s(ns: float) -> float:
    return ns / NS_PER_S


def s_to_ns(s: float) -> float:
    return s * NS_PER_S


def ms_to_s(ms: float) -> float:
    return ms / MS_PER_S
