"""Format definitions and exact byte accounting.

Bytes are counted exactly: values at ``bits`` each, packed; one scale (and one zero point
when asymmetric) per group of ``group_size`` values along the quantization axis; a partial
group still carries its metadata. ``group_size: null`` means one scale per tensor (weights)
or per token row (KV), i.e. per ``cols`` values. Dequantization work is counted in vector
operations per value (unpack, scale, zero point).
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import Field, model_validator

from sim.config.loader import load_yaml, validate
from sim.config.quantity import Strict
from sim.errors import ConfigError
from sim.paths import formats_dir, resolve

META_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "none": 0}


class Traffic(NamedTuple):
    """Bytes moved and work added by reading (or writing) a tensor in a format."""

    stream_bytes: int  # long sequential streams
    gather_bytes: int = 0  # scattered small pieces (sparse outliers)
    gather_granule_bytes: int = 0
    dequant_ops: int = 0  # vector operations to produce the compute dtype

    @property
    def total_bytes(self) -> int:
        return self.stream_bytes + self.gather_bytes

    def __add__(self, other: "Traffic") -> "Traffic":  # type: ignore[override]
        granule = self.gather_granule_bytes or other.gather_granule_bytes
        return Traffic(
            self.stream_bytes + other.stream_bytes,
            self.gather_bytes + other.gather_bytes,
            granule,
            self.dequant_ops + other.dequant_ops,
        )


ZERO = Traffic(0, 0, 0, 0)


class Format(Strict):
    name: str
    description: str
    bits: int = Field(ge=1, le=16)
    kind: Literal["float", "int"]
    group_size: int | None = Field(default=None, gt=0)
    scale_dtype: Literal["fp32", "fp16", "bf16", "fp8", "int8", "none"] = "none"
    symmetric: bool = True
    matmul_dtype: Literal["bf16", "fp16", "fp8", "int8"] = "bf16"
    dequant_ops_per_value: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _metadata(self):
        if self.bits < 16 and self.kind == "int" and self.scale_dtype == "none":
            raise ValueError("an integer format below 16 bits needs a scale_dtype")
        return self

    # ---- exact accounting -------------------------------------------------------------
    def _meta_bits_per_group(self) -> int:
        bits = META_BITS[self.scale_dtype]
        return bits if self.symmetric else 2 * bits

    def _packed_bytes(self, n_rows: int, row_len: int) -> int:
        """``n_rows`` rows of ``row_len`` values, groups along the row."""
        if n_rows <= 0 or row_len <= 0:
            return 0
        value_bits = n_rows * row_len * self.bits
        group = self.group_size or row_len
        groups = n_rows * math.ceil(row_len / group)
        meta_bits = groups * self._meta_bits_per_group() if self.scale_dtype != "none" else 0
        return math.ceil(value_bits / 8) + math.ceil(meta_bits / 8)

    def weight_bytes(self, rows: int, cols: int) -> int:
        return self._packed_bytes(rows, cols)

    def weight_read(self, rows: int, cols: int) -> Traffic:
        return Traffic(self.weight_bytes(rows, cols), 0, 0, math.ceil(rows * cols * self.dequant_ops_per_value))

    def kv_footprint(self, tokens: int, k_width: int, v_width: int) -> int:
        return self._packed_bytes(tokens, k_width) + self._packed_bytes(tokens, v_width)

    def kv_read(self, tokens: int, k_width: int, v_width: int) -> Traffic:
        values = tokens * (k_width + v_width)
        return Traffic(self.kv_footprint(tokens, k_width, v_width), 0, 0,
                       math.ceil(values * self.dequant_ops_per_value))

    def kv_append(self, k_width: int, v_width: int) -> Traffic:
        return Traffic(self.kv_footprint(1, k_width, v_width), 0, 0, 0)

    def effective_bits(self, tokens: int, width: int) -> float:
        return 8 * self._packed_bytes(tokens, width) / (tokens * width)


@lru_cache(maxsize=None)
def _load(path: str) -> Format:
    return validate(Format, load_yaml(path), path)


def get_format(name_or_path: str) -> Format:
    path = resolve(name_or_path, formats_dir(), "format")
    fmt = _load(str(path))
    if Path(name_or_path).suffix == "" and fmt.name != name_or_path and "/" not in name_or_path:
        raise ConfigError(str(path), "name", f"must match the file name {name_or_path!r}", fmt.name)
    return fmt


def list_formats() -> list[Format]:
    return [get_format(p.stem) for p in sorted(formats_dir().glob("*.yaml"))]
