"""Kernel classes: the one declaration of the kinds of kernel a software stack runs.

A kernel class groups kernels that cost alike on a chip: a profile measures each class's
start-up and stream rate (``kernels.classes`` in sim.config.hardware), a stack prices each
class's eager launch (``dispatch_ns`` in sim.config.software). Everything that depends on
which classes exist reads this module: the schemas (the classes a kernel may name, the keys of
those two tables), the lowering (the class an op no stack names runs as, which kernels take an
op's matrix work and its dequantization) and the costs (which kernels dequantize a quantized
cache at their implementation's measured rate). Adding a class is one entry in ``CLASSES``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ClassSpec:
    """One kernel class and the parts of the pipeline it plays a role in (all off by default:
    a plain vector kernel that moves its bytes and does an even share of the op's vector work)."""

    name: str
    what: str
    matrix: bool = False  # takes the op's matrix FLOPs (by the share of the main operand it reads), in the op's dtype
    gemm: bool = False  # a matmul's GEMM: an FP8 linear's activation quantization runs before it, a bias epilogue after
    default_for: tuple[str, ...] = ()  # op kinds (Work.kind) that run as one kernel of it when no stack names them
    unfused_dequant: bool = False  # reading the op's weights or cache, it takes the op's dequantization (a cast)
    cache_dequant: bool = False  # reads the KV cache: dequantizes it at its implementation's measured rate


CLASSES: dict[str, ClassSpec] = {c.name: c for c in (
    ClassSpec("matrix", "a GEMM or GEMV on the matrix unit", matrix=True, gemm=True, default_for=("matmul",)),
    ClassSpec("attention", "decode or prefill attention over the KV cache", matrix=True, cache_dequant=True,
              default_for=("attention",)),
    ClassSpec("elementwise", "a vector kernel over elements (norm, activation, RoPE)", default_for=("vector",)),
    ClassSpec("reduction", "a reduction over rows (argmax, top-k, softmax statistics)"),
    ClassSpec("index", "a gather or scatter by index (embedding, cache append, expert routing)"),
    ClassSpec("copy", "a plain copy (a layout change, staging weights between tiers)"),
    ClassSpec("cast", "a dtype conversion: an unfused quantize or dequantize", unfused_dequant=True),
    ClassSpec("collective", "a collective or point-to-point transfer over the chip links",
              default_for=("collective", "p2p")),
    ClassSpec("host", "work the host does between kernels", default_for=("host",)),
)}
FALLBACK = "elementwise"  # the class of an op kind no class claims


def names() -> tuple[str, ...]:
    """The declared classes, in order (the schemas build their choices from it when imported)."""
    return tuple(CLASSES)


def default_class(kind: str) -> str:
    """The class an op of ``kind`` runs as when the stack names no kernels for it."""
    return next((c.name for c in CLASSES.values() if kind in c.default_for), FALLBACK)


def check(given, allowed_extra: tuple[str, ...] = ()) -> None:
    """Raise ValueError naming the first of ``given`` that is no kernel class (nor one of
    ``allowed_extra``), with the classes listed; the schemas' validators call it."""
    unknown = [n for n in given if n not in CLASSES and n not in allowed_extra]
    if unknown:
        raise ValueError(f"unknown kernel class {unknown[0]!r}; classes: {', '.join((*allowed_extra, *CLASSES))}")


@dataclass(frozen=True, slots=True)
class KVQuant:
    """What a dequantizing attention kernel's cost depends on for a quantized KV format (its
    implementation prices each value by these: sim.config.software.AttentionImpl)."""

    bits: float  # mean value bits of K and V
    group_size: int  # values per scale group (0: one scale per row or channel)
    outlier_fraction: float  # of the values kept in high precision (the larger of K's and V's)
    k_per_channel: bool  # K quantized per channel (KIVI)
    codebook: bool  # K or V looks its levels up in a codebook
