"""kernels.py's kv_append section: the new token's K and V quantized (bf16, int8 per token, int4
in groups of 32) and appended to the cache with plain torch ops.
"""
from __future__ import annotations


import torch

from sections.bench import Bench, Config

# ---- KV quantize-and-append (the new token's K and V into the cache), per format

def kv_append_bf16(cache, new, pos):
    """bf16 cache: index_copy_ of the new token's rows (K or V)."""
    cache["q"].index_copy_(2, pos, new)


def kv_append_int8(cache, new, pos):
    """int8 per-token symmetric: scale = amax(|x|) / 127 per (token, head); q = round(x / s)."""
    s = new.abs().amax(-1, keepdim=True).float().clamp_(min=1e-8) / 127.0
    q = (new.float() / s).round_().clamp_(-127, 127).to(torch.int8)
    cache["q"].index_copy_(2, pos, q)
    cache["s"].index_copy_(2, pos, s.to(torch.bfloat16))


def kv_append_int4(cache, new, pos, group=32):
    """int4 asymmetric, groups of 32 along head_dim: min/max per group, 15 levels, two codes
    per byte; codes, scales and zeros each index_copy_ into their tensors."""
    B, H, T, D = new.shape
    g = new.float().view(B, H, T, D // group, group)
    mn = g.amin(-1, keepdim=True)
    s = (g.amax(-1, keepdim=True) - mn).clamp_(min=1e-6) / 15.0
    q = ((g - mn) / s).round_().clamp_(0, 15).to(torch.uint8).view(B, H, T, D)
    packed = q[..., 0::2] | (q[..., 1::2] << 4)
    cache["q"].index_copy_(2, pos, packed)
    cache["s"].index_copy_(2, pos, s.view(B, H, T, D // group).to(torch.bfloat16))
    cache["z"].index_copy_(2, pos, mn.view(B, H, T, D // group).to(torch.bfloat16))


def _kv_cache(fmt, B, H, L, D, dev):
    if fmt == "bf16":
        return {"q": torch.zeros(B, H, L, D, dtype=torch.bfloat16, device=dev)}
    if fmt == "int8":
        return {"q": torch.zeros(B, H, L, D, dtype=torch.int8, device=dev),
                "s": torch.zeros(B, H, L, 1, dtype=torch.bfloat16, device=dev)}
    return {"q": torch.zeros(B, H, L, D // 2, dtype=torch.uint8, device=dev),
            "s": torch.zeros(B, H, L, D // 32, dtype=torch.bfloat16, device=dev),
            "z": torch.zeros(B, H, L, D // 32, dtype=torch.bfloat16, device=dev)}


KV_APPEND = {"bf16": kv_append_bf16, "int8": kv_append_int8, "int4": kv_append_int4}


def kv_append_configs(b: Bench) -> list:
    """K and V of the new token quantized and appended, per format, B sequences x Hkv heads x D."""
    shapes, Bs = b.axis("kv_append", "heads_dims"), b.axis("kv_append", "batches")
    L = b.axis("kv_append", "context")
    cfgs = []
    for fmt in b.axis("kv_append", "formats"):
        for H, D in shapes:
            for B in Bs:
                cfgs.append(_kv_append_cfg(b, fmt, B, H, D, L))
    return cfgs


def _kv_append_cfg(b: Bench, fmt, B, H, D, L) -> Config:
    row = B * H * D
    wr = {"bf16": 2 * row, "int8": row + 2 * B * H, "int4": row // 2 + 2 * 2 * B * H * (D // 32)}[fmt]
    meta = dict(impl=f"kv_append_{fmt}", kclass="kv_append", dtype=fmt, rows=B * H, row_width=D, elements=2 * row,
                size_bytes=L, bytes_read=2 * 2 * row, bytes_written=2 * wr, flops=2 * row,
                note=f"K and V of one new token, cache [B={B}, Hkv={H}, L={L}, D={D}]; plain PyTorch ops "
                     f"(validation/whole_step.py has its own copy); position fixed")

    def build():
        kc, vc = _kv_cache(fmt, B, H, L, D, b.dev), _kv_cache(fmt, B, H, L, D, b.dev)
        ks = [torch.randn(B, H, 1, D, dtype=torch.bfloat16, device=b.dev) for _ in range(4)]
        vs = [torch.randn(B, H, 1, D, dtype=torch.bfloat16, device=b.dev) for _ in range(4)]
        pos = torch.tensor([L // 2], dtype=torch.long, device=b.dev)
        fn = KV_APPEND[fmt]

        def f(i):
            fn(kc, ks[i % 4], pos)
            fn(vc, vs[i % 4], pos)
        return f
    return Config(f"kv_append:{fmt}:B{B}_H{H}_D{D}", "kv_append", meta, build, est_us=40.0 if fmt != "bf16" else 5.0)
