"""Compute on the tiles: how long an op's matrix and vector work takes on the tiles it uses.

Matrix FLOPs run on the matrix unit with M padded to ``matrix_tile_m`` (or to
``small_tile_m`` on a narrower path, at its efficiency, where that is cheaper), or on the
vector FMA lanes when that is faster (a GEMV at batch 1); vector operations (element-wise,
softmax, dequantization) run on the vector units at the fp32 rate, so dequantization
competes with the matrix work for the op's time. Compute is rounded up to the clock.
Reads the profile's ``compute``; ignores instruction issue and register pressure.
"""

from __future__ import annotations

import math

from sim.config.hardware import Compute


class Tiles:
    """The profile's compute tiles: matrix and vector time of work on some of them."""

    def __init__(self, compute: Compute):
        self.compute = compute
        self._matrix_rate: dict[str, float] = {}  # dtype -> FLOPs per cycle per tile
        self._vector_rate = compute.vector_rate("fp32")
        # the profile's figures, read once
        self._tiles = compute.tiles.value
        self._tile_m = compute.matrix_tile_m.value
        self._clock = compute.clock_GHz.value
        self._matrix_efficiency = compute.matrix_efficiency.value
        self._vector_efficiency = compute.vector_efficiency.value
        small = compute.small_tile_m
        self._small = None if small is None else (small.value, compute.small_tile_efficiency.value)

    def tiles_for(self, work) -> float:
        """The tiles ``work`` spreads over: its independent units, at most the chip's."""
        return max(1.0, min(self._tiles, work.parallelism))

    def matrix_ns(self, work, tiles: float) -> float:
        """``work``'s matrix FLOPs on ``tiles`` tiles: the cheaper of the matrix unit (M padded
        to its tile, or to the small tile) and the vector lanes."""
        flops = work.matrix_flops
        if not flops:
            return 0.0
        m = max(1, work.matrix_m)
        tile_m = self._tile_m
        padded = flops * (math.ceil(m / tile_m) * tile_m) / m
        per_tile = self._matrix_rate.get(work.dtype)
        if per_tile is None:
            per_tile = self._matrix_rate[work.dtype] = self.compute.matrix_rate(work.dtype)
        rate = tiles * per_tile * self._clock * self._matrix_efficiency
        tensor = padded / rate
        if self._small is not None:
            small_m, small_efficiency = self._small
            narrow = flops * (math.ceil(m / small_m) * small_m) / m
            tensor = min(tensor, narrow / (rate * small_efficiency))
        return min(tensor, self.vector_ns(flops, tiles))

    def vector_ns(self, ops: int, tiles: float) -> float:
        """``ops`` vector operations on ``tiles`` tiles."""
        return ops / (tiles * self._vector_rate * self._clock * self._vector_efficiency) if ops else 0.0

    def to_cycles(self, ns: float) -> float:
        """``ns`` rounded up to whole clock cycles."""
        clock = self._clock
        return math.ceil(ns * clock - 1e-9) / clock if ns > 0 else 0.0
