"""The YAML schema of a number format (workloads/formats/*.yaml).

A format file describes how one tensor's values are stored (``Quant``) and, for the KV
cache, how K and V differ from that common description (``k:`` and ``v:`` patch the
top-level keys), plus what only the cache has: a full-precision window of the most recent
tokens and whether K is stored before or after RoPE.

Axes. A tensor is a matrix of ``rows`` x ``columns``. In the KV cache a row is one token
(all KV heads of one chip side by side) and a column is one channel; for weights a row is
one output channel and a column one input. ``per`` says which index owns a scale:

* ``per: row``    each row gets its own scales, ``group_size`` columns per group
                  (KIVI's V "per token"; int8 per-output-channel weights; int4-g128 weights);
* ``per: column`` each column gets its own scales, ``group_size`` rows (tokens) per group
                  (KIVI's K "per channel"); ``group_size: null`` means one scale per channel
                  for the whole sequence, calibrated offline (KVQuant's K);
* ``per: tensor`` one scale for the whole tensor of a layer (vLLM's fp8 KV cache).

Levels. ``encoding: int`` is uniform levels (``symmetric``: -(2^(b-1)-1)..2^(b-1)-1 times a
scale; asymmetric: 0..2^b-1 times a scale plus a zero point); ``encoding: codebook`` maps
b-bit codes to a table in [-1, 1] (``levels: nf`` normal-float quantiles as in QLoRA's NF4,
``levels: kmeans`` a per-layer table fitted to the data as in KVQuant's nuq, or an explicit
list); ``encoding: float`` is a minifloat (fp16, bf16, e4m3, e5m2, e2m1), optionally scaled.

Block-scaled FP4 (``float_format: e2m1``: values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives).
NVFP4 is E2M1 with an FP8 E4M3 scale per 16 values (``scale_dtype: fp8``, ``group_size: 16``)
and one FP32 scale per tensor above them (``tensor_scale_dtype: fp32``; NVIDIA, "Introducing
NVFP4 for Efficient and Accurate Low-Precision Inference", 2025); MXFP4 is E2M1 with a power-of-two
E8M0 scale per 32 values (``scale_dtype: e8m0``, ``group_size: 32``; OCP Microscaling Formats (MX)
Specification v1.0, 2023). Exact bits per value, the per-tensor scale left aside (it is a
per-layer constant): NVFP4 4 + 8/16 = 4.5, MXFP4 4 + 8/32 = 4.25.

Outliers (dense-and-sparse). ``outliers.placement: sparse`` keeps, per row, the
``ceil(fraction x columns)`` values farthest from their group's centre in ``value_dtype``
with ``index_bits`` column indices (CSR adds one ``pointer_bits`` row pointer per row, COO a
row index per value); the slots are a fixed capacity per row, so the bytes do not depend on
the data. ``placement: channels`` keeps whole columns (the outlier channels, chosen by
calibration) dense in ``value_dtype``. The dense part keeps its b-bit code at every
position, as KVQuant's dense-and-sparse split does.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from sim.config.quantity import Strict
from sim.kernel_classes import KVQuant  # re-exported: kv_quant() returns it

META_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "e8m0": 8, "none": 0}
FLOAT_BITS = {"fp16": 16, "bf16": 16, "e4m3": 8, "e5m2": 8, "e2m1": 4}
VALUE_BITS = {"fp16": 16, "bf16": 16, "fp32": 32}

MetaDtype = Literal["fp32", "fp16", "bf16", "fp8", "int8", "e8m0", "none"]  # e8m0: a power of two (MX scales)


class Outliers(Strict):
    """High-precision outliers kept beside the dense low-bit part."""

    placement: Literal["sparse", "channels"] = "sparse"
    select: Literal["fraction", "threshold"] = "fraction"
    fraction: float = Field(ge=0, lt=1)
    threshold: float | None = Field(default=None, gt=0)
    value_dtype: Literal["fp16", "bf16", "fp32"] = "fp16"
    index_bits: int = Field(default=16, ge=1, le=32)
    layout: Literal["csr", "coo"] = "csr"
    pointer_bits: int = Field(default=32, ge=1, le=64)

    @model_validator(mode="after")
    def _consistent(self):
        if self.select == "threshold" and self.threshold is None:
            raise ValueError("select: threshold needs a threshold (in spreads from the group centre)")
        if self.select == "fraction" and self.threshold is not None:
            raise ValueError("threshold is only used with select: threshold")
        if self.placement == "channels" and self.select != "fraction":
            raise ValueError("outlier channels are chosen by fraction (calibration), not by threshold")
        return self

    @property
    def value_bits(self) -> int:
        return VALUE_BITS[self.value_dtype]


class Quant(Strict):
    """How the values of one tensor are stored."""

    bits: int = Field(ge=1, le=16)
    encoding: Literal["int", "codebook", "float"] = "int"
    float_format: Literal["fp16", "bf16", "e4m3", "e5m2", "e2m1"] | None = None
    levels: Literal["nf", "kmeans"] | list[float] | None = None
    symmetric: bool = True
    per: Literal["row", "column", "tensor"] = "row"
    group_size: int | None = Field(default=None, gt=0)
    scale_dtype: MetaDtype = "none"
    zero_dtype: MetaDtype = "none"
    tensor_scale_dtype: Literal["fp32", "none"] = "none"  # a second-level scale per tensor above the group scales
    outliers: Outliers | None = None

    @model_validator(mode="after")
    def _consistent(self):
        self._check_float()
        self._check_codebook()
        self._check_scales()
        return self

    def _check_float(self) -> None:
        """A float encoding names its minifloat, of ``bits`` bits, symmetric and without zero point."""
        if self.encoding != "float":
            if self.float_format is not None:
                raise ValueError("float_format is only used with encoding: float")
            return
        if self.float_format is None:
            raise ValueError("encoding: float needs a float_format (fp16, bf16, e4m3, e5m2, e2m1)")
        if FLOAT_BITS[self.float_format] != self.bits:
            raise ValueError(f"float_format {self.float_format} has {FLOAT_BITS[self.float_format]} bits, "
                             f"not bits: {self.bits}")
        if not self.symmetric or self.zero_dtype != "none":
            raise ValueError("a float encoding is symmetric and has no zero point")

    def _check_codebook(self) -> None:
        """A codebook has at most 256 levels: named, or listed as 2^bits increasing values in [-1, 1]."""
        if self.encoding != "codebook":
            if self.levels is not None:
                raise ValueError("levels are only used with encoding: codebook")
            return
        if self.bits > 8:
            raise ValueError(f"a codebook has at most 8 bits (256 levels), got bits: {self.bits}")
        if self.levels is None:
            raise ValueError("encoding: codebook needs levels (nf, kmeans or a list)")
        if isinstance(self.levels, list):
            table = self.levels
            if len(table) != 2 ** self.bits:
                raise ValueError(f"levels must list 2^bits = {2 ** self.bits} values, got {len(table)}")
            if any(b <= a for a, b in zip(table[:-1], table[1:], strict=True)) or min(table) < -1 or max(table) > 1:
                raise ValueError("levels must be strictly increasing values in [-1, 1]")

    def _check_scales(self) -> None:
        """Scales and zero points agree with the encoding, the symmetry and the grouping."""
        if self.encoding in ("int", "codebook") and self.scale_dtype == "none" and self.bits < 16:
            raise ValueError(f"an {self.encoding} encoding below 16 bits needs a scale_dtype")
        if self.symmetric and self.zero_dtype != "none":
            raise ValueError("a symmetric format has no zero point: zero_dtype must be none (or set symmetric: false)")
        if not self.symmetric and self.zero_dtype == "none":
            raise ValueError("an asymmetric format needs a zero_dtype (fp16, bf16, fp32, fp8 or int8)")
        if self.per == "tensor" and self.group_size is not None:
            raise ValueError("per: tensor has one scale per tensor; group_size must be null")
        if self.scale_dtype == "none" and self.per != "tensor" and self.group_size is not None:
            raise ValueError("group_size needs a scale_dtype")
        if self.zero_dtype == "e8m0":
            raise ValueError("e8m0 (a power of two) is a scale dtype; a zero point cannot be e8m0")
        if self.tensor_scale_dtype != "none" and (self.scale_dtype == "none" or self.per == "tensor"):
            raise ValueError("tensor_scale_dtype is a second level above group scales: it needs a scale_dtype "
                             "and per: row or column")

    @property
    def meta_bits_per_group(self) -> int:
        return META_BITS[self.scale_dtype] + META_BITS[self.zero_dtype]

    @property
    def scaled(self) -> bool:
        return self.scale_dtype != "none"


class FormatSpec(Quant):
    """A format file: the common ``Quant`` keys, K and V patches and the KV-only keys."""

    name: str
    description: str
    role: Literal["kv", "weights", "both"] = "both"
    matmul_dtype: Literal["bf16", "fp16", "fp8", "int8", "nvfp4", "mxfp4"] = "bf16"
    k: dict | None = None
    v: dict | None = None
    window_tokens: int = Field(default=0, ge=0)
    window_dtype: Literal["fp16", "bf16"] = "fp16"
    k_rope: Literal["pre", "post"] = "post"
    source: str | None = None

    def quant_fields(self) -> dict:
        return {key: getattr(self, key) for key in Quant.model_fields}


def kv_quant(fmt) -> KVQuant | None:
    """The dequantization a KV format (``fmt.k``, ``fmt.v``: Quant) asks of attention; None for
    a 16-bit cache (nothing to dequantize)."""
    k, v = fmt.k, fmt.v
    if k.bits >= 16 and v.bits >= 16:
        return None
    outliers = max((q.outliers.fraction for q in (k, v) if q.outliers is not None), default=0.0)
    return KVQuant(bits=(k.bits + v.bits) / 2, group_size=k.group_size or v.group_size or 0,
                   outlier_fraction=float(outliers), k_per_channel=k.per == "column",
                   codebook=k.encoding == "codebook" or v.encoding == "codebook")
