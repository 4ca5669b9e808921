"""The numpy reference quantizer and dequantizer of every format.

``fake_quant(quant, x)`` stores a [rows x columns] float matrix in a ``Quant`` and returns
what a kernel would read back (float64), following the same layout the byte accounting
counts (sim.formats.base): groups along rows or columns, scales and zero points rounded to
their dtype, codes clipped to their levels, dense-and-sparse outliers restored in their
value dtype. ``fake_quant_kv(fmt, k, v, rope)`` applies a format to one layer's K and V with
its full-precision window and, for a pre-RoPE K format, quantizes K before the rotation.

Choices the byte accounting does not fix, made here and documented:

* symmetric int: levels -(2^(b-1)-1)..(2^(b-1)-1) x absmax / (2^(b-1)-1); 1 bit: sign x mean |x|;
* asymmetric int: (q - z) codes 0..2^b-1 over [min, max]; a float zero point stores the
  minimum, an int8 zero point is round(-min / scale) (clipped to int8);
* codebook: symmetric maps [-absmax, absmax] onto the table, asymmetric maps [min, max];
  ``kmeans`` fits the table to the tensor (unweighted Lloyd iterations from the NF table);
* int8 scales are quantized linearly against one fp32 second-level scale (double quant);
* NVFP4: the fp32 tensor scale is (largest group scale) / 448, so the fp8 group scales use
  E4M3's whole range (NVIDIA's two-level recipe); group scale = group absmax / 6;
* MXFP4: the E8M0 scale is 2^(floor(log2 absmax) - 2) (2 = E2M1's largest exponent), values
  above 6 after scaling saturate (OCP MX v1.0, section 6.3);
* outliers are chosen by their distance from the centre of their quantization group in
  units of its spread (median and standard deviation along the group's axis), so for a
  per-channel K they are the values that stretch a channel's range; at most
  ``ceil(fraction x columns)`` per row; outlier channels are the columns of largest absmax.
"""

from __future__ import annotations

import math
import warnings
from functools import lru_cache
from statistics import NormalDist

import numpy as np

from sim.formats.spec import Quant

# -- minifloats ------------------------------------------------------------------------------

# (mantissa bits, minimum normal exponent, largest finite value)
MINIFLOATS = {"e4m3": (3, -6, 448.0), "e5m2": (2, -14, 57344.0), "fp16": (10, -14, 65504.0),
              "e2m1": (1, 0, 6.0)}  # e2m1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 (OCP MX v1.0, section 5.3.3)


def round_minifloat(x: np.ndarray, fmt: str) -> np.ndarray:
    """Round to the nearest value of a minifloat (saturating; subnormals included)."""
    if fmt == "bf16":
        return round_bf16(x)
    if fmt == "fp32":
        return np.asarray(x, dtype=np.float32).astype(np.float64)
    mant, emin, top = MINIFLOATS[fmt]
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), top)
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    e = np.maximum(e, emin)
    step = np.exp2(e - mant)
    return np.sign(x) * np.minimum(np.round(a / step) * step, top)


def round_bf16(x: np.ndarray) -> np.ndarray:
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def round_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round metadata or outlier values to a stored dtype (fp8 means e4m3; e8m0 is a power of
    two, rounded down as the MX scale rule does)."""
    if dtype == "e8m0":
        x = np.asarray(x, dtype=np.float64)
        with np.errstate(divide="ignore"):
            return np.exp2(np.clip(np.floor(np.log2(np.where(x > 0, x, 1.0))), -127, 127))
    return round_minifloat(x, {"fp8": "e4m3"}.get(dtype, dtype))


# -- levels ----------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def nf_levels(bits: int) -> tuple[float, ...]:
    """Normal-float levels (QLoRA's construction): 2^(b-1) positive and 2^(b-1)-1 negative
    normal quantiles, zero, normalised to [-1, 1]. For 4 bits this is the NF4 table."""
    if bits == 1:
        return (-1.0, 1.0)
    offset = 0.9677083
    inv = NormalDist().inv_cdf
    pos_n, neg_n = 2 ** (bits - 1), 2 ** (bits - 1) - 1
    pos = [inv(p) for p in np.linspace(offset, 0.5, pos_n + 1)[:-1]]
    neg = [-inv(p) for p in np.linspace(offset, 0.5, neg_n + 1)[:-1]]
    table = np.array(sorted(pos + [0.0] + neg))
    return tuple(float(v) for v in table / np.abs(table).max())


def fit_kmeans(normalised: np.ndarray, bits: int, iters: int = 25, sample: int = 200_000,
               seed: int = 0) -> np.ndarray:
    """A 2^b-entry table in [-1, 1] fitted by Lloyd iterations (started from the NF table)."""
    values = normalised[np.isfinite(normalised)].ravel()
    if values.size > sample:
        values = np.random.default_rng(seed).choice(values, sample, replace=False)
    table = np.array(nf_levels(bits))
    for _ in range(iters):
        codes = nearest(values, table)
        for i in range(table.size):
            hit = values[codes == i]
            if hit.size:
                table[i] = hit.mean()
        table = np.sort(np.clip(table, -1, 1))
    return round_dtype(table, "fp16")


def nearest(values: np.ndarray, table: np.ndarray) -> np.ndarray:
    mids = (table[1:] + table[:-1]) / 2
    return np.searchsorted(mids, values)


# -- groups ----------------------------------------------------------------------------------


def _grouped(q: Quant, x: np.ndarray) -> tuple[np.ndarray, callable]:
    """x as [groups, group_len] (NaN padded) and the inverse map back to x's shape."""
    rows, cols = x.shape
    if q.per == "tensor" or not q.scaled:
        return x.reshape(1, -1), lambda g: g.reshape(rows, cols)
    if q.per == "row":
        size = q.group_size or cols
        pad = (-cols) % size
        padded = np.pad(x, ((0, 0), (0, pad)), constant_values=np.nan)
        return padded.reshape(-1, size), lambda g: g.reshape(rows, cols + pad)[:, :cols]
    size = q.group_size or rows  # per column: groups of tokens along each channel
    pad = (-rows) % size
    padded = np.pad(x, ((0, pad), (0, 0)), constant_values=np.nan).T  # [cols, rows+pad]
    return padded.reshape(-1, size), lambda g: g.reshape(cols, rows + pad).T[:rows]


def _scale(q: Quant, s: np.ndarray) -> np.ndarray:
    if q.scale_dtype == "int8":  # double quantization against one fp32 scale
        top = float(np.nanmax(s)) if np.isfinite(s).any() else 1.0
        step = top / 255 if top > 0 else 1.0
        s = np.maximum(np.ceil(s / step - 1e-9), 1) * step
    elif q.tensor_scale_dtype != "none":  # NVFP4: fp8 group scales relative to one fp32 tensor scale
        top = float(np.nanmax(s)) if np.isfinite(s).any() else 1.0
        meta_top = MINIFLOATS["e4m3"][2] if q.scale_dtype == "fp8" else 65504.0
        tensor = top / meta_top if top > 0 else 1.0
        s = np.maximum(round_dtype(s / tensor, q.scale_dtype), 2.0 ** -9) * tensor
    elif q.scale_dtype != "none":
        tiny = {"fp16": 2.0 ** -24, "bf16": 2.0 ** -133, "fp8": 2.0 ** -9, "fp32": 1e-38}[q.scale_dtype]
        s = np.maximum(round_dtype(s, q.scale_dtype), tiny)
    return s


def _quantize_groups(q: Quant, g: np.ndarray, table: np.ndarray | None) -> np.ndarray:
    """Quantize and dequantize each row of ``g`` (one group per row, NaN = not in the group)."""
    with np.errstate(all="ignore"):
        if q.encoding == "float":
            if not q.scaled:
                return round_minifloat(g, q.float_format)
            top = MINIFLOATS.get(q.float_format, (0, 0, 3.0e38))[2]
            amax = np.nanmax(np.abs(g), axis=1, keepdims=True)
            if q.scale_dtype == "e8m0":  # MX: 2^(floor(log2 amax) - emax of the element type), values saturate
                s = np.exp2(np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - np.floor(np.log2(top)))
            else:
                s = _scale(q, np.where(amax > 0, amax / top, 1.0))
            return round_minifloat(g / s, q.float_format) * s
        if q.symmetric:
            amax = np.nanmax(np.abs(g), axis=1, keepdims=True)
            if q.encoding == "codebook":
                s = _scale(q, np.where(amax > 0, amax, 1.0))
                return table[nearest(np.clip(g / s, -1, 1), table)] * s
            if q.bits == 1:
                s = _scale(q, np.nanmean(np.abs(g), axis=1, keepdims=True))
                return np.where(g >= 0, 1.0, -1.0) * s
            top = 2 ** (q.bits - 1) - 1
            s = _scale(q, np.where(amax > 0, amax / top, 1.0))
            return np.clip(np.round(g / s), -top, top) * s
        lo = np.nanmin(g, axis=1, keepdims=True)
        hi = np.nanmax(g, axis=1, keepdims=True)
        if q.encoding == "codebook":
            half = (hi - lo) / 2
            s = _scale(q, np.where(half > 0, half, 1.0))
            c = round_dtype(lo, q.zero_dtype) + s if q.zero_dtype != "int8" else lo + s
            return table[nearest(np.clip((g - c) / s, -1, 1), table)] * s + c
        top = 2 ** q.bits - 1
        s = _scale(q, np.where(hi > lo, (hi - lo) / top, 1.0))
        if q.zero_dtype == "int8":
            z = np.clip(np.round(-lo / s), -128, 127)
            return (np.clip(np.round(g / s) + z, 0, top) - z) * s
        z = round_dtype(lo, q.zero_dtype)
        return np.clip(np.round((g - z) / s), 0, top) * s + z


def _spread_score(q: Quant, x: np.ndarray) -> np.ndarray:
    """|x - centre| / spread, with centre and spread along the quantization group's axis."""
    axis = {"row": 1, "column": 0}.get(q.per if q.scaled else "tensor")
    centre = np.median(x, axis=axis, keepdims=axis is not None)
    spread = np.std(x, axis=axis, keepdims=axis is not None)
    spread = np.where(spread > 0, spread, 1.0)
    return np.abs(x - centre) / spread


def outlier_mask(q: Quant, x: np.ndarray) -> np.ndarray:
    o = q.outliers
    mask = np.zeros(x.shape, dtype=bool)
    if o is None or o.fraction <= 0:
        return mask
    rows, cols = x.shape
    n = min(cols, math.ceil(o.fraction * cols))
    if o.placement == "channels":
        mask[:, np.argsort(-np.abs(x).max(axis=0), kind="stable")[:n]] = True
        return mask
    score = _spread_score(q, x)
    top = np.argpartition(-score, n - 1, axis=1)[:, :n]
    np.put_along_axis(mask, top, True, axis=1)
    if o.select == "threshold":
        mask &= score > o.threshold
    return mask


def fake_quant(q: Quant, x: np.ndarray, seed: int = 0) -> tuple[np.ndarray, dict]:
    """Quantize and dequantize a [rows x columns] matrix; returns (x_hat, stats)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError("fake_quant expects a 2-D [rows x columns] matrix")
    if x.size == 0:
        return x.copy(), {"outlier_fraction": 0.0}
    mask = outlier_mask(q, x)
    dense = np.where(mask, np.nan, x)  # outliers do not stretch their group's range
    groups, back = _grouped(q, dense)
    table = None
    if q.encoding == "codebook":
        if q.levels == "kmeans":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                table = _kmeans_table(q, groups, seed)
        else:
            table = np.array(nf_levels(q.bits) if q.levels == "nf" else q.levels, dtype=np.float64)
    # NaN marks outliers and padding only; a group made of them alone yields NaN codes at
    # positions that are replaced by the outlier values or cut off below
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        xhat = back(_quantize_groups(q, groups, table))
    if mask.any():
        xhat = np.where(mask, round_dtype(x, q.outliers.value_dtype), xhat)
    return xhat, {"outlier_fraction": float(mask.mean())}


def _kmeans_table(q: Quant, groups: np.ndarray, seed: int) -> np.ndarray:
    with np.errstate(all="ignore"):
        if q.symmetric:
            amax = np.nanmax(np.abs(groups), axis=1, keepdims=True)
            norm = groups / np.where(amax > 0, amax, 1.0)
        else:
            lo = np.nanmin(groups, axis=1, keepdims=True)
            hi = np.nanmax(groups, axis=1, keepdims=True)
            half = np.where(hi > lo, (hi - lo) / 2, 1.0)
            norm = (groups - lo - half) / half
    return fit_kmeans(norm, q.bits, seed=seed)


def fake_quant_kv(fmt, k_pre: np.ndarray, v: np.ndarray, rope=None, seed: int = 0) -> tuple[np.ndarray, np.ndarray, dict]:
    """One layer's K and V through ``fmt``: [tokens x channels] each (all KV heads side by
    side). ``k_pre`` is K before RoPE; ``rope(k)`` applies it (identity when None). Returns
    (K after RoPE as read back, V as read back, stats). The most recent
    ``fmt.window_tokens`` rows are kept in the window dtype (after RoPE)."""
    rope = rope or (lambda a: a)
    k_post = rope(k_pre)
    tokens = k_pre.shape[0]
    window = min(tokens, fmt.window_tokens)
    cut = tokens - window
    if fmt.k_rope == "pre":
        k_q, k_stats = fake_quant(fmt.k, k_pre[:cut], seed)
        k_hat_body = rope(np.concatenate([k_q, np.zeros((window, k_pre.shape[1]))]))[:cut]
    else:
        k_hat_body, k_stats = fake_quant(fmt.k, k_post[:cut], seed)
    v_hat_body, v_stats = fake_quant(fmt.v, v[:cut], seed)
    k_hat = np.concatenate([k_hat_body, round_minifloat(k_post[cut:], fmt.window_dtype)])
    v_hat = np.concatenate([v_hat_body, round_minifloat(v[cut:], fmt.window_dtype)])
    return k_hat, v_hat, {"k_outlier_fraction": k_stats["outlier_fraction"],
                          "v_outlier_fraction": v_stats["outlier_fraction"]}
