"""A hardware profile's energy section: what moving a bit, doing a FLOP and staying on cost.

Read from the profile's top-level ``energy:`` block (appended after the rest of the profile);
every figure is a sourced quantity ({value, source, estimate}). Units are in the key names:
pJ per bit moved, pJ per FLOP (2 per multiply-add, as the compute figures count them), W.

* ``memory_pJ_per_bit``: per memory tier, keyed by the level's name (``l2``, ``smem``) or, for
  every level of that kind, by its kind (``hbm``, ``sram``, ``ddr``). A bit read or written
  at a level costs this from the tier to the compute units (the whole path: array, I/O, the
  controller, the on-chip network and the caches on the way).
* ``noc_pJ_per_bit``, ``host_link_pJ_per_bit`` (PCIe or the host interconnect),
  ``chip_link_pJ_per_bit`` (chip-to-chip links), ``scaleout_pJ_per_bit`` (optional: links
  between chip groups, else the chip-link figure): per bit crossing them.
* ``matrix_pJ_per_flop`` by dtype (the matrix unit; a dtype not listed falls back like the
  compute rates: bf16, fp16, fp32, then the cheapest listed), ``vector_pJ_per_flop``
  (element-wise work and dequantization on the vector units).
* ``static_W``: a chip's power while a step runs with nothing moving (powered, clocked,
  leaking); ``idle_W``: its power with nothing queued at all (at most ``static_W``: the floor
  any step's energy stays above); ``host_W``: the host's power per chip it drives
  (charged over the step's whole time); ``power_limit_W`` (optional): the chip's enforced
  limit, above which it throttles clocks and the prediction is flagged.
"""

from __future__ import annotations

from pydantic import field_validator, model_validator

from sim.config.quantity import Num, Pos, Strict, by_dtype

ENERGY_DTYPES = {"fp32", "tf32", "bf16", "fp16", "fp8", "int8", "int4", "fp4"}


class Energy(Strict):
    """Energy figures of one chip (and its host)."""

    # physics: moving a bit out of a memory tier, a FLOP and a powered chip each cost energy (> 0;
    # a section of zeros would report free tokens, infinitely many per joule); a link or the NoC
    # may be 0 where a tier's figure already covers the path
    memory_pJ_per_bit: dict[str, Pos]
    noc_pJ_per_bit: Num
    host_link_pJ_per_bit: Num
    chip_link_pJ_per_bit: Num
    scaleout_pJ_per_bit: Num | None = None  # links between chip groups; without it: chip_link_pJ_per_bit
    matrix_pJ_per_flop: dict[str, Pos]
    vector_pJ_per_flop: Pos
    static_W: Pos
    idle_W: Num
    host_W: Num
    power_limit_W: Pos | None = None

    @field_validator("memory_pJ_per_bit")
    @classmethod
    def _tiers(cls, table: dict) -> dict:
        if not table:
            raise ValueError("must list at least one memory tier (by level name or kind: hbm, sram, ddr)")
        return table

    @field_validator("matrix_pJ_per_flop")
    @classmethod
    def _dtypes(cls, table: dict) -> dict:
        if not table:
            raise ValueError("must list at least one dtype")
        unknown = sorted(set(table) - ENERGY_DTYPES)
        if unknown:
            raise ValueError(f"unknown dtype {unknown[0]!r}; expected one of {sorted(ENERGY_DTYPES)}")
        return table

    @model_validator(mode="after")
    def _floor(self):
        if self.idle_W.value > self.static_W.value:
            raise ValueError(f"idle_W ({self.idle_W.value:g}) must be at most static_W ({self.static_W.value:g}): "
                             "a running chip draws at least its idle power")
        return self

    def matrix_pJ(self, dtype: str) -> float:
        """pJ per matrix FLOP of ``dtype``; a dtype not listed takes the widest listed one."""
        table = self.matrix_pJ_per_flop
        if dtype in ("nvfp4", "mxfp4") and dtype not in table and "fp4" in table:
            dtype = "fp4"  # an FP4 block format runs on the fp4 matrix unit
        return by_dtype(table, dtype)

    def tier_pJ(self, name: str, kind: str) -> float | None:
        """pJ per bit at a memory level: by its name, else by its kind; None if neither is listed."""
        q = self.memory_pJ_per_bit.get(name) or self.memory_pJ_per_bit.get(kind)
        return None if q is None else q.value


def energy_tiers(profile):
    """A profile's check (a model validator of HardwareProfile): every memory level of a
    profile with an energy section has a pJ/bit figure, by its name or its kind, and every
    tier the section names is a level's name or kind."""
    energy = getattr(profile, "energy", None)
    if energy is None:
        return profile
    names = {level.name for level in profile.memory} | {level.kind for level in profile.memory}
    for level in profile.memory:
        if energy.tier_pJ(level.name, level.kind) is None:
            raise ValueError(f"energy.memory_pJ_per_bit needs an entry for memory level {level.name!r} "
                             f"(by its name, or by its kind {level.kind!r})")
    unknown = sorted(set(energy.memory_pJ_per_bit) - names)
    if unknown:
        raise ValueError(f"energy.memory_pJ_per_bit.{unknown[0]}: not a memory level's name or kind; "
                         f"the profile has {', '.join(sorted(names))}")
    return profile
