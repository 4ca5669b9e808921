"""Human words for what plots show: axis names with units, tick text, resource names.

A study's axes are dotted paths (``hardware.hbm.channel_bandwidth_GBps``) and RunSpec
fields (``batch``); plots show them as "HBM bandwidth per channel (GB/s)" and "batch
(sequences)". Known paths come from ``AXES``; any other path is named from its parts: the
memory level upper-cased, underscores as spaces, the unit suffix of the leaf (``_GBps``,
``_MB``, ``_ns``, ...) as the unit in brackets. Numbers are written in engineering form
(12580 -> "12.6k", 0.00042 -> "420µ"), never as 1.258e+04.
"""

from __future__ import annotations

import math

# dotted path or run field -> (name, unit or None)
AXES: dict[str, tuple[str, str | None]] = {
    "batch": ("batch", "sequences"),
    "context": ("context", "tokens"),
    "steps": ("decode steps", None),
    "tp": ("tensor-parallel chips", None),
    "pp": ("pipeline stages", None),
    "chips": ("chips", None),
    "kv": ("KV-cache format", None),
    "weights": ("weight format", None),
    "model": ("model", None),
    "hardware": ("hardware", None),
    "dispatch": ("MoE dispatch path", None),
    "placement": ("expert placement", None),
    "routing": ("MoE routing", None),
    "routing_skew": ("routing skew", "Zipf exponent"),
    "routing_locality": ("routing locality", "probability"),
    "software": ("software stack", None),
    "graph": ("graph launch", None),
    "engine": ("engine", None),
    "target_ms": ("latency target", "ms"),
    "hardware.hbm.channel_bandwidth_GBps": ("HBM bandwidth per channel", "GB/s"),
    "hardware.hbm.latency_ns": ("HBM access latency", "ns"),
    "hardware.hbm.capacity_GB": ("HBM capacity", "GB"),
    "hardware.l2.capacity_MB": ("L2 capacity", "MB"),
    "hardware.l2.bandwidth_GBps": ("L2 bandwidth", "GB/s"),
    "hardware.host.kernel_gap_ns": ("gap between kernels", "ns"),
    "hardware.host.sync_round_trip_ns": ("host sync round trip", "ns"),
    "hardware.system.links.bandwidth_GBps": ("chip-to-chip link bandwidth", "GB/s"),
    "hardware.system.links.latency_ns": ("chip-to-chip link latency", "ns"),
    "hardware.compute.tile_load_GBps": ("load bandwidth per compute tile", "GB/s"),
    "hardware.compute.clock_GHz": ("compute clock", "GHz"),
    "hardware.compute.vector_efficiency": ("vector-unit efficiency", "fraction of peak"),
    "hardware.compute.matrix_efficiency": ("matrix-unit efficiency", "fraction of peak"),
}

UNIT_SUFFIXES = (("_GBps", "GB/s"), ("_TBps", "TB/s"), ("_TFLOPs", "TFLOP/s"), ("_GiB", "GiB"), ("_MiB", "MiB"),
                 ("_KiB", "KiB"), ("_GB", "GB"), ("_MB", "MB"), ("_KB", "KB"), ("_bytes", "bytes"), ("_GHz", "GHz"),
                 ("_ns", "ns"), ("_us", "µs"), ("_ms", "ms"), ("_s", "s"), ("_percent", "%"))

RESOURCES = {"hbm": "HBM", "l2": "L2", "smem": "SMEM", "sram": "SRAM", "noc": "on-chip network", "pcie": "PCIe",
             "link": "chip-to-chip links", "scaleout": "scale-out links", "ddr": "DDR", "pmu": "PMU SRAM", "compute": "compute", "host": "host", "kernels": "kernels"}

ROWS = {"kv": "KV cache", "expert_weights": "expert weights", "staged_weights": "staged weights (SRAM buffer)", "expert_compute": "expert compute",
        "launch_sync": "launch + sync", "host_link": "host link", "latency": "access latency", "links": "chip links",
        "dequant": "dequantization"}

_PREFIXES = ((12, "T"), (9, "G"), (6, "M"), (3, "k"), (0, ""), (-3, "m"), (-6, "µ"), (-9, "n"))


def eng(value: float, digits: int = 3) -> str:
    """``value`` in engineering form with ``digits`` significant digits: 12580 -> "12.6k"."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if value == 0:
        return "0"
    if 1e-3 <= abs(value) < 1e3:
        return _trim(f"{value:.{digits}g}")
    exponent = max(-9, min(12, 3 * math.floor(math.log10(abs(value)) / 3)))
    text = f"{value / 10 ** exponent:.{digits}g}"
    if abs(float(text)) >= 1000 and exponent < 12:  # 999.96k rounds to 1000k: write 1M
        exponent += 3
        text = f"{value / 10 ** exponent:.{digits}g}"
    return _trim(text) + dict(_PREFIXES)[exponent]


def _trim(text: str) -> str:
    if "e" in text:  # %g fell back to scientific: spell it out
        return f"{float(text):f}".rstrip("0").rstrip(".")
    return text


def tick(value) -> str:
    """A swept value as a tick label: words as they are, whole numbers exactly (up to
    999,999), other numbers in engineering form."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if float(value).is_integer() and abs(value) < 1e6:
        return str(int(value))
    return eng(float(value), 4)


def axis_tick(value) -> str:
    """A swept value as an axis tick: as ``tick``, but other numbers with 3 significant digits
    (a geometric sweep's 99.78 / 199.1 / 397.4 read 99.8 / 199 / 397), except a quarter that 4
    digits write exactly (18.75 stays 18.75)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not float(value).is_integer():
        number = float(value)
        quarter = float(f"{number:.4g}") == number and (number * 4).is_integer()
        return eng(number, 4 if quarter else 3)
    return tick(value)


def name(path: str) -> str:
    """What a dotted path or run field is, without its unit: "HBM bandwidth per channel"."""
    if path.endswith(".value"):
        path = path[: -len(".value")]
    if path in AXES:
        return AXES[path][0]
    parts = path.split(".")
    if parts[0] in ("hardware", "model") and len(parts) > 1:
        parts = parts[1:] if parts[0] == "hardware" else parts
    if parts[0] in ("memory", "system") and len(parts) > 2:
        parts = parts[1:]
    leaf = parts[-1]
    for suffix, _unit in UNIT_SUFFIXES:
        if leaf.endswith(suffix) and len(leaf) > len(suffix):
            leaf = leaf[: -len(suffix)]
            break
    words = [RESOURCES.get(p, p) for p in parts[:-1]] + [leaf.replace("_", " ")]
    return " ".join(words)


def unit(path: str) -> str | None:
    """The unit of a dotted path or run field, or None."""
    if path.endswith(".value"):
        path = path[: -len(".value")]
    if path in AXES:
        return AXES[path][1]
    leaf = path.split(".")[-1]
    for suffix, text in UNIT_SUFFIXES:
        if leaf.endswith(suffix) and len(leaf) > len(suffix):
            return text
    return None


def label(path: str) -> str:
    """An axis label: the name and the unit in brackets, "HBM bandwidth per channel (GB/s)"."""
    u = unit(path)
    return f"{name(path)} ({u})" if u else name(path)


def setting(path: str, value) -> str:
    """One held or faceted setting, short: "kv=fp16", "HBM bandwidth per channel 25 GB/s"."""
    if "." not in path:
        return f"{path}={tick(value)}"
    u = unit(path)
    return f"{name(path)} {tick(value)}" + (f" {u}" if u else "")


def resource(name_: str) -> str:
    """A resource of the event log in words: "hbm" -> "HBM", "link" -> "chip-to-chip links"."""
    return RESOURCES.get(name_, name_)


def row(name_: str) -> str:
    """A breakdown row in words: "launch_sync" -> "launch + sync"."""
    return ROWS.get(name_, name_.replace("_", " "))


def join_pairs(paths: list[str]) -> str:
    """Paired axes named as a pair: "batch x context"."""
    return " x ".join(name(p) for p in paths)
