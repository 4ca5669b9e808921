"""kernels.py's castred and bcast sections: casts between dtypes and layouts, int4 pack/unpack,
reductions over rows of many widths; broadcast scale/zero arithmetic, casts and bit ops on
sliced caches, stacking of codes.
"""
from __future__ import annotations

import math

import torch
from sweep import coverage_order

from sections.bench import Bench, Config, FP8, dtype_name, esize, round_to

def _cast_pairs():
    bf, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    pairs = [(bf, f32), (f32, bf), (bf, f16), (f16, bf), (f16, f32), (bf, torch.int8), (torch.int8, bf)]
    if FP8 is not None:
        pairs += [(bf, FP8), (FP8, bf), (f32, FP8)]
    return pairs


def castred_configs(b: Bench) -> list:
    """Casts and reductions over many sizes, layouts and dtypes."""
    cfgs = []
    for size in coverage_order(b.axis("castred", "cast_sizes_bytes")):
        for src, dst in _cast_pairs():
            cfgs.append(_cast_cfg(b, size, src, dst, "contiguous"))
        for src, dst in ((torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
                         (torch.bfloat16, FP8 or torch.float16)):
            cfgs.append(_cast_cfg(b, size, src, dst, "transpose"))
        for src, dst in ((torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16)):
            cfgs.append(_cast_cfg(b, size, src, dst, "slice"))
        for impl in ("int4_pack", "int4_unpack"):
            cfgs.append(_int4_cfg(b, size, impl))
    widths = b.axis("castred", "reduce_widths")
    for size in coverage_order(b.axis("castred", "reduce_sizes_bytes")):
        for W in widths:
            for impl in ("sum", "amax", "mean_fp32", "argmax", "softmax", "topk8", "colsum"):
                if impl == "topk8" and W > 1024:
                    continue
                if impl == "colsum" and W not in (64, 8192):
                    continue
                c = _reduce_cfg(b, size, W, impl)
                if c is not None:
                    cfgs.append(c)
        for impl in ("full_sum", "full_amax"):
            c = _reduce_cfg(b, size, b.axis("castred", "whole_tensor_width"), impl)
            if c is not None:
                cfgs.append(c)
    return cfgs


def _cast_cfg(b: Bench, size, src, dst, layout) -> Config:
    """y.copy_(x) from dtype src to dst; layout contiguous, transpose (x read through .t()) or
    slice (x = the first half of each row of a [R, 2W] tensor); size = bytes read + written."""
    per = esize(src) + esize(dst)
    n = round_to(size // per, 256)
    W = 256 if n >= 256 * 256 else 16
    R = max(1, n // W)
    n = R * W
    read_specs = [((R, 2 * W), src)] if layout == "slice" else [((R, W), src)]
    out_shape = (W, R) if layout == "transpose" else (R, W)
    specs = read_specs + [(out_shape, dst)]
    per_slot = math.prod(read_specs[0][0]) * esize(src) + n * esize(dst)
    n_slots = b.slots_for(per_slot)
    impl = f"cast_{dtype_name(src)}_{dtype_name(dst)}" + ("" if layout == "contiguous" else f"_{layout}")
    meta = dict(impl=impl, kclass="cast", dtype=dtype_name(src), elements=n, rows=R, row_width=W, size_bytes=size,
                bytes_read=n * esize(src), bytes_written=n * esize(dst), flops=0,
                note=f"y.copy_(x) {dtype_name(src)} -> {dtype_name(dst)}, layout {layout}")

    def build():
        slots = b.carve(specs, n_slots)
        if layout == "transpose":
            return lambda i: slots[i % n_slots][1].copy_(slots[i % n_slots][0].t())
        if layout == "slice":
            return lambda i: slots[i % n_slots][1].copy_(slots[i % n_slots][0][:, :W])
        return lambda i: slots[i % n_slots][1].copy_(slots[i % n_slots][0])
    return Config(f"castred:{impl}:n{n}", "castred", meta, build, est_us=3.0 + per_slot / 2.5e12 * 1e6,
                  n_slots=n_slots, bytes_per_slot=per_slot)


def _int4_cfg(b: Bench, size, impl) -> Config:
    """int4 pack (uint8 codes -> two per byte: slice, shift, or) or unpack (bytes -> two bf16
    values: and, shift, stack, cast), as plain PyTorch writes them (several kernels)."""
    if impl == "int4_pack":
        n = round_to(size // 2 * 2 // 3, 512)  # read n, write n/2
        rd, wr = n, n // 2
        specs = [((n,), torch.uint8), ((n // 2,), torch.uint8)]
    else:
        n = round_to(size // 5, 256)  # read n bytes, write 2n bf16
        rd, wr = n, 4 * n
        specs = [((n,), torch.uint8), ((2 * n,), torch.bfloat16)]
    per_slot = rd + wr
    n_slots = b.slots_for(per_slot)
    meta = dict(impl=impl, kclass="cast_int4", dtype="int4", elements=n, size_bytes=size, bytes_read=rd,
                bytes_written=wr, flops=n, note="plain PyTorch, several kernels (see kernel_names.csv)")

    def build():
        slots = b.carve(specs, n_slots)
        if impl == "int4_pack":
            def f(i):
                q, out = slots[i % n_slots]
                torch.bitwise_or(q[0::2] & 15, (q[1::2] & 15) << 4, out=out)
            return f

        def g(i):
            p, out = slots[i % n_slots]
            torch.stack(((p & 15), (p >> 4)), dim=-1).view(-1).to(torch.bfloat16)
        return g
    return Config(f"castred:{impl}:n{n}", "castred", meta, build, est_us=6.0 + per_slot / 1.5e12 * 1e6,
                  n_slots=n_slots, bytes_per_slot=per_slot)


def _reduce_cfg(b: Bench, size, W, impl):
    """A reduction over rows of width W (or over the whole tensor, or over columns) of a bf16
    (mean_fp32: fp32) [R, W] tensor whose input bytes are ``size``; None if R < 1."""
    dt = torch.float32 if impl == "mean_fp32" else torch.bfloat16
    R = size // (W * esize(dt))
    if R < 1:
        return None
    n = R * W
    rd = n * esize(dt)
    out_b = {"sum": R * 2, "amax": R * 2, "mean_fp32": R * 4, "argmax": R * 8, "softmax": rd, "topk8": R * 8 * 10,
             "colsum": W * 2, "full_sum": 2, "full_amax": 2}[impl]
    n_slots = b.slots_for(rd)
    kclass = "reduction"
    meta = dict(impl=f"reduce_{impl}", kclass=kclass, dtype=dtype_name(dt), elements=n, rows=R, row_width=W,
                size_bytes=size, bytes_read=rd, bytes_written=out_b, flops=n,
                note={"colsum": "x.sum(0): a strided (column) reduction", "full_sum": "x.sum(): whole tensor",
                      "full_amax": "x.amax(): whole tensor"}.get(impl, "over the last dim"))
    ops = {"sum": lambda x: x.sum(-1), "amax": lambda x: x.amax(-1), "mean_fp32": lambda x: x.mean(-1),
           "argmax": lambda x: x.argmax(-1), "softmax": lambda x: torch.softmax(x, -1),
           "topk8": lambda x: torch.topk(x, 8, dim=-1), "colsum": lambda x: x.sum(0),
           "full_sum": lambda x: x.sum(), "full_amax": lambda x: x.amax()}
    op = ops[impl]

    def build():
        xs = [s[0] for s in b.carve([((R, W), dt)], n_slots)]
        return lambda i: op(xs[i % n_slots])
    return Config(f"castred:reduce_{impl}:R{R}_W{W}", "castred", meta, build,
                  est_us=4.0 + (rd + out_b) / 2.5e12 * 1e6, n_slots=n_slots, bytes_per_slot=rd)


# ---- broadcast and sliced elementwise (the kernels of a dequantizing cache), added after the first call

def bcast_configs(b: Bench) -> list:
    """bf16 [R, W] times / plus a [R, 1] or [R, W/32, 1] broadcast operand; int8/uint8 -> bf16 casts
    and uint8 bit ops on a slice of the rows (x[:, :, :n] of a cache longer than n), 1 MiB .. 1 GiB."""
    cfgs = []
    for size in coverage_order(b.axis("bcast", "sizes_bytes")):
        for impl in ("mul_rowscale", "mul_groupscale", "add_groupzero", "cast_int8_bf16_sliced",
                     "cast_uint8_bf16_sliced", "and15_sliced", "shr4_sliced", "stack2_uint8"):
            cfgs.append(_bcast_cfg(b, size, impl))
    return cfgs


def _bcast_cfg(b: Bench, size, impl) -> Config:
    bf, u8, i8 = torch.bfloat16, torch.uint8, torch.int8
    if impl in ("mul_rowscale", "mul_groupscale", "add_groupzero"):
        n = round_to(size // 4, 4096)  # read n bf16, write n bf16
        D = 128
        R = n // D
        scale_shape = (R, 1) if impl == "mul_rowscale" else (R, D // 32, 1)
        x_shape = (R, D) if impl == "mul_rowscale" else (R, D // 32, 32)
        specs = [(x_shape, bf), (scale_shape, bf), (x_shape, bf)]
        rd, wr = 2 * n + 2 * math.prod(scale_shape), 2 * n
        op = (lambda s: torch.mul(s[0], s[1], out=s[2])) if impl != "add_groupzero" else (
            lambda s: torch.add(s[0], s[1], out=s[2]))
        kclass, note = "elementwise", f"x {x_shape} bf16 with a broadcast {scale_shape} operand"
    elif impl in ("cast_int8_bf16_sliced", "cast_uint8_bf16_sliced"):
        n = round_to(size // 3, 4096)
        D, R = 128, n // 128
        src = i8 if impl.startswith("cast_int8") else u8
        specs = [((R + R // 64 + 1, D), src), ((R, D), bf)]
        rd, wr = n, 2 * n
        op = lambda s, R=R: s[1].copy_(s[0][:R])  # noqa: E731
        kclass, note = "cast", "rows [:R] of a longer cache, to bf16 (contiguous slice of the rows)"
    elif impl in ("and15_sliced", "shr4_sliced"):
        n = round_to(size // 2, 4096)
        D, R = 64, n // 64
        specs = [((4, R // 4 + 16, D), u8), ((4, R // 4, D), u8)]
        rd, wr = n, n
        if impl == "and15_sliced":
            op = lambda s, R=R: torch.bitwise_and(s[0][:, :R // 4], 15, out=s[1])  # noqa: E731
        else:
            op = lambda s, R=R: torch.bitwise_right_shift(s[0][:, :R // 4], 4, out=s[1])  # noqa: E731
        kclass, note = "elementwise", "uint8 codes of 4 heads, [:, :L] of a longer cache (strided over heads)"
    else:  # stack2_uint8: torch.stack((lo, hi), -1)
        n = round_to(size // 4, 4096)
        specs = [((n,), u8), ((n,), u8), ((n, 2), u8)]
        rd, wr = 2 * n, 2 * n
        op = lambda s: torch.stack((s[0], s[1]), dim=-1, out=s[2])  # noqa: E731
        kclass, note = "copy", "torch.stack of two uint8 code tensors along a new last dim"
    per_slot = rd + wr
    n_slots = b.slots_for(per_slot)
    meta = dict(impl=impl, kclass=kclass, dtype="bf16" if kclass == "elementwise" and "mul" in impl else "uint8",
                elements=n, size_bytes=size, bytes_read=rd, bytes_written=wr, flops=n, note=note)

    def build():
        slots = b.carve(specs, n_slots)
        return lambda i: op(slots[i % n_slots])
    return Config(f"bcast:{impl}:n{n}", "bcast", meta, build, est_us=3.0 + per_slot / 2e12 * 1e6,
                  n_slots=n_slots, bytes_per_slot=per_slot)
