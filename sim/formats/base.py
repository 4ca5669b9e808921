"""Formats at run time: exact byte accounting, dequantization work and the access pattern.

A ``Format`` is built by the loader from a validated ``FormatSpec`` (sim.formats.spec) and
answers the lowering through ``Traffic``-returning methods:

* ``weight_read(rows, cols)`` / ``weight_bytes(rows, cols)``: a [rows x cols] weight matrix;
* ``kv_read(tokens, k_width, v_width)``: reading one sequence's K and V in one layer;
* ``kv_append(k_width, v_width)``: writing one new token's K and V (amortised, see below);
* ``kv_footprint(tokens, k_width, v_width)``: bytes resident for one sequence and layer.

Byte accounting (all exact integers; bits are packed, each component rounded up to a byte):

* the most recent ``min(L, window_tokens)`` tokens are kept whole in ``window_dtype``;
* the other ``Q = L - window`` tokens: ``ceil(Q x W x bits / 8)`` bytes of codes (W = row
  width: KV heads x head_dim on one chip); metadata ``ceil(groups x (scale + zero bits) / 8)``
  where ``per: row`` has ``Q x ceil(W / G)`` groups and ``per: column`` with a group size has
  ``W x ceil(Q / G)`` groups (a partial group carries full metadata);
* sparse outliers: ``n = ceil(fraction x W)`` slots per token, each value + column index
  (COO: + row index); CSR adds one row pointer per token. Outlier channels: ``n`` dense
  columns per token in ``value_dtype``;
* per-layer constants (a per-tensor scale, calibrated per-channel scales, a fitted codebook,
  the list of outlier channels, the fp32 second-level scale of int8 scales or of NVFP4's fp8
  group scales) are shared by all
  sequences of a layer; ``layer_constant_bytes`` reports them and they are not in the
  per-sequence footprint (they are at most a few KiB per layer).

Access pattern: codes, metadata, the window, outlier channels and CSR row pointers are long
streams; the sparse outlier slots of one token are one gather of ``granule`` bytes.

Dequantization work, in vector operations per value (an estimate of the instruction mix,
``DEQUANT_OPS``): unpack sub-byte codes (shift and mask, e2m1 included; 3 when codes straddle bytes),
convert or look up the level, scale (multiply; asymmetric adds the zero point: an FMA, 2 ops);
per group, decoding a scale (int8 against its fp32 scale: 2; e8m0 exponent to float: 1) and
applying a per-tensor second-level scale (1);
plus ``MERGE_OPS`` per outlier slot (index decode and scatter-add) and, for K kept before
RoPE, ``ROPE_OPS`` per cached K value (the rotation applied at read time; the full-precision
window is stored after RoPE).

Appending a token (``kv_append``): without a window the new row is written quantized (codes,
its share of the metadata, its outlier slots); with a window it is written in the window
dtype, and the row it pushes out of the window is written quantized by the same fused
kernel (which already read it for attention), so both writes are counted and no extra read.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import NamedTuple

from sim.config.loader import load_yaml, validate
from sim.errors import ConfigError
from sim.formats.spec import META_BITS, FormatSpec, Quant
from sim.paths import formats_dir, resolve

# Vector operations per dequantized value (estimates of the instruction mix, not measured).
DEQUANT_OPS = {
    "unpack_aligned_subbyte": 2,  # shift + mask, codes of 1, 2 or 4 bits
    "unpack_straddling": 3,  # 3, 5, 6, 7-bit codes cross byte boundaries: one more shift/or
    "convert": 1,  # int (or fp8) code to fp32
    "lookup": 1,  # codebook table lookup (replaces the convert)
    "scale": 1,  # multiply by the scale
    "zero": 1,  # asymmetric: the multiply becomes an FMA with the zero point (2 ops)
}
MERGE_OPS = 4  # per sparse outlier slot: load index, address, load value, add
META_DECODE_OPS = 2  # per group when scales are int8 (second-level dequantization)
SCALE_DECODE_OPS = {"int8": META_DECODE_OPS, "e8m0": 1}  # per group: int8 against its fp32 scale; e8m0: exponent to float
TENSOR_SCALE_OPS = 1  # per group: the group scale times the per-tensor scale (NVFP4's two levels)
ROPE_OPS = 6  # per K value kept before RoPE (same estimate as the lowering's rope kernel)
WINDOW_BITS = {"fp16": 16, "bf16": 16}
KMEANS_TABLE_BITS = 16  # a fitted codebook is stored as fp16 entries


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
        mine, theirs = self.gather_granule_bytes, other.gather_granule_bytes
        granule = min(mine, theirs) if mine and theirs else mine or theirs  # the smaller of those there are
        return Traffic(self.stream_bytes + other.stream_bytes, self.gather_bytes + other.gather_bytes, granule,
                       self.dequant_ops + other.dequant_ops)


ZERO = Traffic(0, 0, 0, 0)


class TensorBytes(NamedTuple):
    """The bytes of one tensor (K or V of one sequence and layer, or one weight matrix)."""

    values: int = 0  # the dense low-bit codes
    metadata: int = 0  # scales and zero points
    window: int = 0  # full-precision recent tokens
    outlier_stream: int = 0  # dense outlier channels, CSR row pointers
    outlier_gather: int = 0  # sparse outlier values and indices
    granule: int = 0  # bytes of one token's sparse outlier slots
    dequant_ops: int = 0

    @property
    def total(self) -> int:
        return self.values + self.metadata + self.window + self.outlier_stream + self.outlier_gather

    @property
    def stream(self) -> int:
        return self.total - self.outlier_gather

    def traffic(self) -> Traffic:
        return Traffic(self.stream, self.outlier_gather, self.granule if self.outlier_gather else 0,
                       self.dequant_ops)


def ops_per_value(q: Quant) -> int:
    """Vector operations to turn one stored code into an fp32 value."""
    if q.encoding == "float":
        if q.bits >= 16:
            return 0
        unpack = DEQUANT_OPS["unpack_aligned_subbyte"] if q.bits < 8 else 0  # e2m1: two codes per byte
        return unpack + DEQUANT_OPS["convert"] + (DEQUANT_OPS["scale"] if q.scaled else 0)
    if q.bits in (8, 16):
        unpack = 0
    elif q.bits in (1, 2, 4):
        unpack = DEQUANT_OPS["unpack_aligned_subbyte"]
    else:
        unpack = DEQUANT_OPS["unpack_straddling"]
    first = DEQUANT_OPS["lookup"] if q.encoding == "codebook" else DEQUANT_OPS["convert"]
    zero = 0 if q.symmetric else DEQUANT_OPS["zero"]
    return unpack + first + DEQUANT_OPS["scale"] + zero


def outlier_slots(q: Quant, width: int) -> int:
    o = q.outliers
    if o is None or o.fraction <= 0:
        return 0
    return math.ceil(o.fraction * width)


BLOCK_SCALED = {("fp8", 16): "nvfp4", ("e8m0", 32): "mxfp4"}  # e2m1 block scales -> the matrix dtype


def code_dtype(q: Quant) -> str | None:
    """The matrix-unit dtype that takes ``q``'s stored codes as they are (see Format.code_dtype)."""
    if q.encoding == "float":
        if q.bits == 16:
            return q.float_format
        if q.float_format == "e4m3":
            return "fp8"
        if q.float_format == "e2m1" and q.per == "row":
            return BLOCK_SCALED.get((q.scale_dtype, q.group_size))
        return None
    whole_rows = q.per == "tensor" or (q.per == "row" and q.group_size is None)
    if q.encoding == "int" and q.bits == 8 and q.symmetric and whole_rows and q.outliers is None:
        return "int8"
    return None


_TENSORS = {"k": "k", "v": "v", "weight": "weight"}  # a tensor's name -> the Format field of its Quant
_LABELS = {"k": "K row width", "v": "V row width", "weight": "weight row length"}


@dataclass(frozen=True, eq=False)
class Format:
    """A number format for weights (``weight``) and the KV cache (``k``, ``v``)."""

    name: str
    description: str
    role: str
    matmul_dtype: str
    weight: Quant
    k: Quant
    v: Quant
    window_tokens: int = 0
    window_dtype: str = "fp16"
    k_rope: str = "post"
    file: str = "<inline>"
    patched: dict = field(default_factory=dict)  # tensor -> keys its patch set (for error paths)
    spec: FormatSpec | None = None
    conversion: str = ""  # set by on_chip: how a chip without this matrix dtype runs the weights
    _kv_memo: dict = field(default_factory=dict, repr=False, compare=False)  # kv_read results (derived data)
    _bytes_memo: dict = field(default_factory=dict, repr=False, compare=False)  # tensor_bytes results (derived data)
    _constants_memo: dict = field(default_factory=dict, repr=False, compare=False)  # constant_bytes (derived data)

    @property
    def bits(self) -> int:
        return self.weight.bits

    def quant(self, tensor: str) -> Quant:
        return getattr(self, _TENSORS[tensor])

    # -- checks that need the tensor width -------------------------------------------------
    def _key(self, tensor: str, key: str) -> str:
        head = key.split(".")[0]
        return f"{tensor}.{key}" if tensor in ("k", "v") and head in self.patched.get(tensor, ()) else key

    def check_width(self, tensor: str, width: int) -> None:
        q = self.quant(tensor)
        label = _LABELS[tensor]
        if tensor != "weight" and q.per == "row" and q.group_size and width % q.group_size:
            raise ConfigError(self.file, self._key(tensor, "group_size"),
                              f"must divide the {label} {width} (one token's values in one layer on one "
                              "chip), so that no group straddles a head", q.group_size)
        o = q.outliers
        if o is not None and o.fraction > 0 and 2 ** o.index_bits < width:
            raise ConfigError(self.file, self._key(tensor, "outliers.index_bits"),
                              f"{o.index_bits}-bit indices cannot address the {width} columns of the {label}",
                              o.index_bits)

    # -- exact accounting ------------------------------------------------------------------
    def tensor_bytes(self, tensor: str, tokens: int, width: int) -> TensorBytes:
        """Bytes of ``tokens`` rows of ``width`` values of ``tensor`` ("k", "v" or "weight"),
        memoized (a configuration asks for each weight matrix's bytes several times: capacity,
        lowering, staging; the memo is bounded)."""
        key = (tensor, tokens, width)
        memo = self._bytes_memo
        hit = memo.get(key)
        if hit is None:
            if len(memo) > 200_000:
                memo.clear()
            hit = memo[key] = self._tensor_bytes(tensor, tokens, width)
        return hit

    def _tensor_bytes(self, tensor: str, tokens: int, width: int) -> TensorBytes:
        if tokens <= 0 or width <= 0:
            return TensorBytes()
        self.check_width(tensor, width)
        q = self.quant(tensor)
        window_rows = min(tokens, self.window_tokens) if tensor != "weight" else 0
        rows = tokens - window_rows
        window = math.ceil(window_rows * width * WINDOW_BITS[self.window_dtype] / 8)
        if rows == 0:
            return TensorBytes(window=window)
        values = math.ceil(rows * width * q.bits / 8)
        groups = self._groups(q, rows, width)
        metadata = math.ceil(groups * q.meta_bits_per_group / 8)
        n = outlier_slots(q, width)
        stream = gather = granule = 0
        if n:
            o = q.outliers
            if o.placement == "channels":
                stream = math.ceil(rows * n * o.value_bits / 8)
            elif o.layout == "csr":
                slot_bits = n * (o.value_bits + o.index_bits)
                gather = math.ceil(rows * slot_bits / 8)
                stream = math.ceil(rows * o.pointer_bits / 8)
                granule = math.ceil(slot_bits / 8)
            else:  # coo: value, row index, column index
                slot_bits = n * (o.value_bits + 2 * o.index_bits)
                gather = math.ceil(rows * slot_bits / 8)
                granule = math.ceil(slot_bits / 8)
        ops = rows * width * ops_per_value(q)
        if n and q.outliers.placement == "sparse":
            ops += rows * n * MERGE_OPS
        ops += groups * (SCALE_DECODE_OPS.get(q.scale_dtype, 0)
                         + (TENSOR_SCALE_OPS if q.tensor_scale_dtype != "none" else 0))
        if tensor == "k" and self.k_rope == "pre":
            ops += rows * width * ROPE_OPS
        return TensorBytes(values, metadata, window, stream, gather, granule, ops)

    @staticmethod
    def _groups(q: Quant, rows: int, width: int) -> int:
        if not q.scaled:
            return 0
        if q.per == "row":
            return rows * math.ceil(width / (q.group_size or width))
        if q.per == "column" and q.group_size:
            return width * math.ceil(rows / q.group_size)
        return 0  # per tensor, or per channel calibrated offline: per-layer constants

    def constant_bytes(self, tensor: str, width: int) -> int:
        """Per-layer constants of one tensor (shared by every sequence), memoized (every weight
        read of a lowering asks for them; a tensor has few widths)."""
        hit = self._constants_memo.get((tensor, width))
        if hit is None:
            hit = self._constants_memo[tensor, width] = self._constant_bytes(tensor, width)
        return hit

    def _constant_bytes(self, tensor: str, width: int) -> int:
        q = self.quant(tensor)
        bits = 0
        if q.scaled and (q.per == "tensor" or (q.per == "column" and not q.group_size)):
            bits += (1 if q.per == "tensor" else width) * q.meta_bits_per_group
        if q.scale_dtype == "int8":
            bits += META_BITS["fp32"]  # the second-level scale of the int8 scales
        if q.tensor_scale_dtype != "none":
            bits += META_BITS[q.tensor_scale_dtype]  # NVFP4's per-tensor scale above the fp8 group scales
        if q.encoding == "codebook" and q.levels == "kmeans":
            bits += 2 ** q.bits * KMEANS_TABLE_BITS
        if q.outliers is not None and q.outliers.placement == "channels":
            bits += outlier_slots(q, width) * q.outliers.index_bits
        return math.ceil(bits / 8)

    def layer_constant_bytes(self, k_width: int, v_width: int) -> int:
        return self.constant_bytes("k", k_width) + self.constant_bytes("v", v_width)

    def k_bytes(self, tokens: int, width: int) -> int:
        return self.tensor_bytes("k", tokens, width).total

    def v_bytes(self, tokens: int, width: int) -> int:
        return self.tensor_bytes("v", tokens, width).total

    def kv_bytes_per_token(self, tokens: int, k_width: int, v_width: int) -> tuple[float, float]:
        """Mean bytes per token of one layer's K and V at context ``tokens``."""
        return self.k_bytes(tokens, k_width) / tokens, self.v_bytes(tokens, v_width) / tokens

    def effective_bits(self, tokens: int, width: int, tensor: str = "k") -> float:
        return 8 * self.tensor_bytes(tensor, tokens, width).total / (tokens * width)

    # -- the interface the lowering uses ---------------------------------------------------
    def weight_bytes(self, rows: int, cols: int) -> int:
        return self.tensor_bytes("weight", rows, cols).total + (self.constant_bytes("weight", cols) if rows else 0)

    def weight_read(self, rows: int, cols: int) -> Traffic:
        """A weight matrix read once. When the matrix unit takes the stored codes directly
        (fp8 codes on an fp8 unit, symmetric int8 on an int8 unit) the scale is applied to the
        output and there is no per-value dequantization."""
        t = self.tensor_bytes("weight", rows, cols)
        ops = 0 if self.native_matmul else t.dequant_ops
        return Traffic(t.stream + (self.constant_bytes("weight", cols) if rows else 0), t.outlier_gather,
                       t.granule if t.outlier_gather else 0, ops)

    @property
    def native_matmul(self) -> bool:
        """The matrix unit takes the stored weight codes as they are: 16-bit weights, or codes
        whose ``code_dtype`` is the format's ``matmul_dtype``."""
        return self.weight.bits == 16 and self.weight.encoding == "float" or (
            self.code_dtype is not None and self.code_dtype == self.matmul_dtype)

    @property
    def code_dtype(self) -> str | None:
        """The matrix-unit dtype that consumes the stored weight codes without per-value
        dequantization (the scales applied to the output, or by a block-scaled unit itself):
        ``fp8`` (e4m3), ``int8`` (symmetric, one scale per row or tensor), ``nvfp4`` (e2m1 with
        fp8 scales per 16), ``mxfp4`` (e2m1 with e8m0 scales per 32), ``fp16``/``bf16``; None
        when every matrix unit needs them dequantized (int4, codebooks, asymmetric, grouped int8)."""
        return code_dtype(self.weight)

    def on_chip(self, native: frozenset, chip: str, native_codes: bool = False) -> "Format":
        """These weights as a chip whose matrix unit executes the dtypes ``native`` runs them
        (see ``matrix_plan``): the same format when it runs as written, else a copy whose
        ``matmul_dtype`` is the dtype the chip multiplies in and whose ``conversion`` says why."""
        dtype, note = matrix_plan(self, native, chip, native_codes)
        if dtype == self.matmul_dtype and not note:
            return self
        return replace(self, matmul_dtype=dtype, conversion=note, _kv_memo={}, _bytes_memo={}, _constants_memo={})

    def kv_footprint(self, tokens: int, k_width: int, v_width: int) -> int:
        return self.k_bytes(tokens, k_width) + self.v_bytes(tokens, v_width)

    def kv_read(self, tokens: int, k_width: int, v_width: int) -> Traffic:
        """One sequence's K and V of one layer read once (memoized: serving replays ask for
        the same context lengths over and over; the memo is bounded)."""
        key = (tokens, k_width, v_width)
        memo = self._kv_memo
        hit = memo.get(key)
        if hit is None:
            if len(memo) > 200_000:
                memo.clear()
            hit = memo[key] = (self.tensor_bytes("k", tokens, k_width).traffic()
                               + self.tensor_bytes("v", tokens, v_width).traffic())
        return hit

    def kv_append(self, k_width: int, v_width: int) -> Traffic:
        total = 0
        for tensor, width in (("k", k_width), ("v", v_width)):
            self.check_width(tensor, width)
            total += self._row_bytes(tensor, width)
            if self.window_tokens:
                total += math.ceil(width * WINDOW_BITS[self.window_dtype] / 8)
        return Traffic(total, 0, 0, 0)

    def _row_bytes(self, tensor: str, width: int) -> int:
        """Amortised bytes of one quantized row: codes, its share of metadata, outlier slots."""
        q = self.quant(tensor)
        bits = width * q.bits
        if q.scaled and q.per == "row":
            bits += math.ceil(width / (q.group_size or width)) * q.meta_bits_per_group
        elif q.scaled and q.per == "column" and q.group_size:
            bits += width * q.meta_bits_per_group / q.group_size
        n = outlier_slots(q, width)
        if n:
            o = q.outliers
            if o.placement == "channels":
                bits += n * o.value_bits
            elif o.layout == "csr":
                bits += n * (o.value_bits + o.index_bits) + o.pointer_bits
            else:
                bits += n * (o.value_bits + 2 * o.index_bits)
        return math.ceil(bits / 8)


WIDE_FLOATS = ("bf16", "fp16", "fp32")  # what a chip converts narrow weights to, in order of preference
FP4_ANY = "fp4"  # a chip listing fp4 executes E2M1 with either block scale (nvfp4 and mxfp4)


def executes(native: frozenset, dtype: str) -> bool:
    """Whether a matrix unit listing ``native`` executes ``dtype`` (``fp4`` covers both FP4 block scales)."""
    return dtype in native or (dtype in BLOCK_SCALED.values() and FP4_ANY in native)


def matrix_plan(fmt: Format, native: frozenset, chip: str, native_codes: bool = False) -> tuple[str, str]:
    """(the dtype the matrix unit multiplies in, a note when that is not what the format asks).

    * 16-bit weights, and codes the chip executes in the dtype the format asks (fp8 on an fp8
      unit, NVFP4 on an FP4 unit), run as written;
    * ``native_codes`` (a compiler that quantizes activations at their producer): weights whose
      codes the matrix unit executes run in that dtype, not dequantized (int8 on Groq's MXM);
    * a format that asks for a dtype the chip executes dequantizes to it on the vector units
      (weight-only int8 or int4 to bf16: the format's own recipe, no note);
    * a format that asks for a dtype the chip does not execute (fp8 on a chip without an fp8
      matrix unit, FP4 on Hopper) is converted on the vector units, at its dequantization cost,
      to the chip's widest float type and multiplied at that type's rate."""
    want, code = fmt.matmul_dtype, fmt.code_dtype
    if fmt.native_matmul and (fmt.weight.bits == 16 or executes(native, want)):
        return want, ""
    if native_codes and code is not None and executes(native, code):
        return code, (f"{fmt.name} weights run on {chip}'s {code} matrix unit as stored "
                      f"(activations quantized to {code}), not dequantized")
    if executes(native, want):
        return want, ""
    wide = next((d for d in WIDE_FLOATS if d in native), want)
    return wide, (f"{chip}'s matrix unit has no {want}: {fmt.name} weights are converted to {wide} on the "
                  f"vector units ({ops_per_value(fmt.weight)} ops per weight, plus per-group scale work) "
                  f"and multiplied at the {wide} rate")


def check_widths(kv: Format, weights: Format, k_width: int, v_width: int, weight_cols: tuple[int, ...]) -> None:
    """Every check that needs a tensor width, run before anything is simulated: the KV
    format against one chip's K and V row widths, the weight format against the row
    lengths of the matrices it stores. A format whose groups do not divide a row width is
    rejected (ConfigError naming the format file and key), never padded silently."""
    kv.check_width("k", k_width)
    kv.check_width("v", v_width)
    for cols in weight_cols:
        weights.check_width("weight", cols)


# -- loading -------------------------------------------------------------------------------


def build_format(data: dict, file: str = "<inline>") -> Format:
    """Validate a format's raw data (as read from YAML) and build the run-time object."""
    spec = validate(FormatSpec, data, file)
    common = spec.quant_fields()
    quants, patched = {}, {}
    for tensor in ("k", "v"):
        patch = getattr(spec, tensor) or {}
        merged = {k: (v.model_dump() if hasattr(v, "model_dump") else v) for k, v in common.items()}
        if "outliers" in patch and patch["outliers"] is not None and merged.get("outliers") and isinstance(
                patch["outliers"], dict):
            merged["outliers"] = {**merged["outliers"], **patch["outliers"]}
            patch = {**patch, "outliers": merged["outliers"]}
        merged.update(patch)
        quants[tensor] = validate(Quant, merged, file, prefix=tensor)
        patched[tensor] = frozenset(patch)
    if (spec.window_tokens or spec.k_rope == "pre") and spec.role == "weights":
        key = "window_tokens" if spec.window_tokens else "k_rope"
        raise ConfigError(file, key, "is a KV-cache setting; a role: weights format cannot have it")
    return Format(spec.name, spec.description, spec.role, spec.matmul_dtype, Quant(**common),
                  quants["k"], quants["v"], spec.window_tokens, spec.window_dtype, spec.k_rope, file,
                  patched, spec)


@lru_cache(maxsize=None)
def _load(path: str) -> Format:
    return build_format(load_yaml(path), path)


def get_format(name_or_path: str) -> Format:
    path = resolve(name_or_path, formats_dir(), "format")
    fmt = _load(str(path))
    if fmt.name != name_or_path and os.path.splitext(name_or_path)[1] == "" and "/" not in name_or_path:
        raise ConfigError(str(path), "name", f"must match the file name {name_or_path!r}", fmt.name)
    return fmt


def list_formats(role: str | None = None) -> list[Format]:
    """Bundled formats; ``role="kv"`` or ``"weights"`` keeps those meant for it."""
    out = [get_format(p.stem) for p in sorted(formats_dir().glob("*.yaml"))]
    return [f for f in out if role is None or f.role in (role, "both")]
