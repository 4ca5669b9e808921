"""Sourced numbers.

Every hardware figure is written ``{value: 4.8e3, source: "NVIDIA H200 datasheet",
estimate: false}``. The classes differ only in the range they accept. ``Table`` is a sourced
piecewise-linear curve (e.g. HBM efficiency against gather granule).
"""

from __future__ import annotations

import bisect
import math

from pydantic import BaseModel, ConfigDict, field_validator, model_validator


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class _Sourced(Strict):
    source: str
    estimate: bool = False

    @field_validator("source")
    @classmethod
    def _named(cls, text: str) -> str:
        if not text.strip():
            raise ValueError("source must name a datasheet, paper or calibration file")
        return text


class Num(_Sourced):
    """A finite number, zero or more."""

    value: float

    @field_validator("value", mode="before")
    @classmethod
    def _number(cls, v):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError("must be a number (not a boolean or text)")
        return v

    @field_validator("value")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        if v < 0 and cls is Num:  # the subclasses state their own ranges
            raise ValueError("must be >= 0")
        return v


class Pos(Num):
    """A number > 0."""

    @field_validator("value")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be > 0")
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
    """A whole number >= 1."""

    value: int

    @field_validator("value", mode="before")
    @classmethod
    def _whole(cls, v):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or float(v) != int(v):
            raise ValueError("must be a whole number")
        if v < 1:
            raise ValueError("must be >= 1")
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
