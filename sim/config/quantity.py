"""Sourced numbers.

Every hardware figure is written ``{value: 4.8e3, source: "NVIDIA H200 datasheet",
estimate: false}``. The classes differ only in the range they accept. ``Table`` is a sourced
piecewise-linear curve (e.g. HBM efficiency against gather granule).

Every number also lies within a sanity range that no real accelerator leaves (``MAX_VALUE``,
``MIN_POSITIVE``, ``MAX_COUNT``): a profile that says 1e300 ns or 1e-300 GHz is a typo, and
the error states the range instead of printing absurd results.
"""

from __future__ import annotations

import bisect
import math
import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

MAX_VALUE = 1e15  # |value| of any sourced number (1 PB/s is 1e6 GB/s; 1e15 leaves room for any unit)
MIN_POSITIVE = 1e-6  # the smallest positive value (a clock of 1e-300 GHz is a typo, not a chip)
MAX_COUNT = 1_000_000_000  # the largest count (of channels, tiles, chips, cores ...)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


def _not_bool(value):
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    return value


def fmt_range(lo: float, hi: float, lo_open: bool = False) -> str:
    """``[1, 1,000,000]`` or ``(0, 1e6]``: a range as errors state it."""
    return f"{'(' if lo_open else '['}{_fmt(lo)}, {_fmt(hi)}]"


def _in_range(lo: float, hi: float, what: str, lo_open: bool = False):
    text = f"must be {what} in {fmt_range(lo, hi, lo_open)}"

    def check(value):
        if not math.isfinite(value) or value > hi or value < lo or (lo_open and value == lo):
            raise ValueError(text)
        return value

    return check


def _fmt(bound: float) -> str:
    """1,000,000 for an int; 1e15 or 1e-6 for a float."""
    if isinstance(bound, int):
        return f"{bound:,}"
    return f"{bound:g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")


def whole(lo: int, hi: int, *, strict: bool = True):
    """An integer field in [lo, hi], never a boolean; ``strict`` also refuses floats and text
    (``4096.0``, ``"4096"``). The error states the range."""
    return Annotated[int, BeforeValidator(_not_bool), Field(strict=strict), AfterValidator(_in_range(lo, hi, "a whole number"))]


def real(lo: float, hi: float, *, lo_open: bool = False):
    """A finite float field in [lo, hi] (``lo_open``: (lo, hi]), never a boolean."""
    return Annotated[float, BeforeValidator(_not_bool), AfterValidator(_in_range(lo, hi, "a finite number", lo_open))]


class _Sourced(Strict):
    source: str
    estimate: bool = False

    @field_validator("source")
    @classmethod
    def _named(cls, text: str) -> str:
        if not text.strip():
            raise ValueError("source must name a datasheet, paper or calibration file")
        return text


_EXPONENT_WITHOUT_POINT = re.compile(r"[+-]?[0-9]+[eE][+-]?[0-9]+")  # 1e30: text to YAML 1.1


class Num(_Sourced):
    """A finite number, zero or more."""

    value: float

    @field_validator("value", mode="before")
    @classmethod
    def _number(cls, v):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            if isinstance(v, str) and _EXPONENT_WITHOUT_POINT.fullmatch(v.strip()):
                mantissa, exponent = v.strip().lower().split("e")
                raise ValueError(f"must be a number; YAML reads an exponent without a decimal point as text: "
                                 f"write {mantissa}.0e{exponent}")
            raise ValueError("must be a number (not a boolean or text)")
        return v

    @field_validator("value")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        if cls is Num and not 0 <= v <= MAX_VALUE:  # the subclasses state their own ranges
            raise ValueError(f"must be a number in [0, {_fmt(MAX_VALUE)}]")
        return v


class Pos(Num):
    """A number > 0."""

    @field_validator("value")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be > 0")
        if not MIN_POSITIVE <= v <= MAX_VALUE:
            raise ValueError(f"must be a number in [{_fmt(MIN_POSITIVE)}, {_fmt(MAX_VALUE)}]")
        return v


class Frac(Num):
    """A fraction in (0, 1]."""

    @field_validator("value")
    @classmethod
    def _fraction(cls, v: float) -> float:
        if not 0 < v <= 1:
            raise ValueError("must be a fraction in (0, 1]")
        return v


class Share(Num):
    """A fraction in [0, 1)."""

    @field_validator("value")
    @classmethod
    def _share(cls, v: float) -> float:
        if not 0 <= v < 1:
            raise ValueError("must be a fraction in [0, 1)")
        return v


class Count(_Sourced):
    """A whole number in [1, MAX_COUNT]."""

    value: int

    @field_validator("value", mode="before")
    @classmethod
    def _whole(cls, v):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or float(v) != int(v):
            raise ValueError("must be a whole number")
        if v < 1:
            raise ValueError("must be >= 1")
        if v > MAX_COUNT:
            raise ValueError(f"must be a whole number in [1, {MAX_COUNT:,}]")
        return int(v)


class Table(_Sourced):
    """A sourced piecewise-linear curve through ``points`` [[x, y], ...], x increasing.

    Below the first point it takes the first y, above the last the last y.
    """

    points: tuple[tuple[float, float], ...]

    @model_validator(mode="after")
    def _increasing(self):
        xs = [p[0] for p in self.points]
        if not xs:
            raise ValueError("points must not be empty")
        if any(not math.isfinite(x) or abs(x) > MAX_VALUE for x in xs):
            raise ValueError(f"every x must be a finite number in [-{_fmt(MAX_VALUE)}, {_fmt(MAX_VALUE)}]")
        if any(b <= a for a, b in zip(xs, xs[1:], strict=False)):
            raise ValueError("points must have increasing x")
        if any(not (0 < p[1] <= 1) for p in self.points):
            raise ValueError("every y must be a fraction in (0, 1]")
        return self

    def at(self, x: float) -> float:
        """Linear interpolation between the points; flat beyond the ends."""
        xs = [p[0] for p in self.points]
        i = bisect.bisect_right(xs, x)
        if i == 0:
            return float(self.points[0][1])
        if i == len(xs):
            return float(self.points[-1][1])
        (x0, y0), (x1, y1) = self.points[i - 1], self.points[i]
        return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def by_dtype(table: dict, dtype: str) -> float:
    """The value ``table`` (dtype -> sourced number) gives ``dtype``; a dtype not listed takes
    the widest listed of bf16, fp16, fp32, else the smallest value listed."""
    if dtype in table:
        return table[dtype].value
    for fallback in ("bf16", "fp16", "fp32"):
        if fallback in table:
            return table[fallback].value
    return min(q.value for q in table.values())
