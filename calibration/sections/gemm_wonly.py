"""kernels.py's gemm_wonly section: weight-only quantized GEMV/GEMM: int4 tinygemm, plain-PyTorch
int8 (dequantize, then F.linear) and the Triton split-K GEMV with fused dequantization.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from harness import log, one_line
from sweep import coverage_order

from sections.bench import Bench, Config, HAVE_TRITON, cdiv, raiser

if HAVE_TRITON:
    import triton
    from ops.gemv_wq import _splitk_reduce_kernel, _wq_splitk_kernel

# ============================================================================ section: gemm_wonly


@dataclass
class QuantWeights:
    """One rotation pool of quantized weights: per slot (w, scales, zeros); bytes per slot."""

    slots: list
    bytes_per_slot: int


def quant_int8_pool(b: Bench, N, K, n_slots) -> QuantWeights:
    """Symmetric per-output-channel int8 weights [N,K] with bf16 scales [1,N]."""
    slots = []
    for _ in range(n_slots):
        w = torch.randint(-127, 128, (N, K), dtype=torch.int8, device=b.dev)
        s = (torch.rand(1, N, device=b.dev) * 0.01 + 0.001).to(torch.bfloat16)
        slots.append((w, s, None))
    return QuantWeights(slots, N * K + 2 * N)


def quant_int4_pool(b: Bench, N, K, group, n_slots) -> QuantWeights:
    """Asymmetric int4 weights packed two per byte [N,K/2] (even k low nibble), bf16 scales
    and zero points [K/group, N]; w = (q - z) * s."""
    slots = []
    for _ in range(n_slots):
        w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=b.dev)
        s = (torch.rand(K // group, N, device=b.dev) * 0.01 + 0.001).to(torch.bfloat16)
        z = torch.randint(0, 16, (K // group, N), device=b.dev).to(torch.bfloat16)
        slots.append((w, s, z))
    return QuantWeights(slots, N * K // 2 + 4 * N * (K // group))


def dequant_ref(w, s, z, bits, group):
    """float64 [N,K] weights from a quantized slot (the reference for numerics checks)."""
    if bits == 8:
        return w.double() * s.double().view(1, -1).T
    q = torch.stack([(w & 0xF), (w >> 4)], dim=-1).reshape(w.shape[0], -1).double()
    sk = s.double().T.repeat_interleave(group, dim=1)
    zk = z.double().T.repeat_interleave(group, dim=1)
    return (q - zk) * sk


class SplitKGemv:
    """Launcher of the Triton fused-dequant split-K kernel for one shape and weight format."""

    def __init__(self, b: Bench, M, N, K, bits, group):
        self.M, self.N, self.K, self.bits, self.group = M, N, K, bits, group
        self.BLOCK_N = 64 if b.cuda else 16
        self.BLOCK_K = 128 if b.cuda else 32
        if bits == 4:
            assert group % self.BLOCK_K == 0, "group must be a multiple of BLOCK_K"
        self.BLOCK_M = 1 if M == 1 else max(16, triton.next_power_of_2(M))
        n_blocks = cdiv(N, self.BLOCK_N)
        k_blocks = cdiv(K, self.BLOCK_K)
        target = 4 * b.nsm
        self.splits = max(1, min(k_blocks, round(target / n_blocks)))
        self.kb_per_prog = cdiv(k_blocks, self.splits)
        self.splits = cdiv(k_blocks, self.kb_per_prog)
        self.dot_fp32 = b.interpret
        self.num_warps = 4 if b.cuda else 1
        dev = b.dev
        self.part = (torch.empty(self.splits, M, N, device=dev, dtype=torch.float32)
                     if self.splits > 1 else torch.empty(1, device=dev))
        self.y = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        self.kernels = 1 if self.splits == 1 else 2

    def __call__(self, x, w, s, z):
        """y = x @ dequant(w)^T (bf16), one or two kernels."""
        grid = (cdiv(self.N, self.BLOCK_N), self.splits)
        direct = self.splits == 1
        _wq_splitk_kernel[grid](
            x, w, s, z if z is not None else s, self.part, self.y, self.M, self.N, self.K,
            self.kb_per_prog, BITS=self.bits, GROUP=self.group, HAS_ZERO=z is not None,
            BLOCK_M=self.BLOCK_M, BLOCK_N=self.BLOCK_N, BLOCK_K=self.BLOCK_K,
            USE_DOT=self.BLOCK_M > 1, DOT_FP32=self.dot_fp32, DIRECT=direct,
            num_warps=self.num_warps)
        if not direct:
            MN = self.M * self.N
            BLOCK = 1024 if self.num_warps > 1 else 64
            _splitk_reduce_kernel[(cdiv(MN, BLOCK),)](self.part, self.y, MN, self.splits, BLOCK=BLOCK)
        return self.y


def check_splitk(b: Bench):
    """Triton split-K int8/int4 kernels against float64 of the dequantized weights."""
    if not b.triton_ok:
        b.checks["splitk"] = "skipped: no Triton"
        return
    res = {}
    N, K = (256, 1024) if b.cuda else (32, 256)
    for bits, group in ((8, 0), (4, 128 if b.cuda else 32)):
        pool = quant_int8_pool(b, N, K, 1) if bits == 8 else quant_int4_pool(b, N, K, group, 1)
        w, s, z = pool.slots[0]
        wd = dequant_ref(w, s, z, bits, group)
        for M in (1, 5, 16):
            for force_split in (None, 1):
                try:
                    g = SplitKGemv(b, M, N, K, bits, group)
                    if force_split == 1:
                        g.splits, g.kb_per_prog = 1, cdiv(K, g.BLOCK_K)
                    x = torch.randn(M, K, device=b.dev, dtype=torch.bfloat16)
                    y = g(x, w, s, z).double()
                    ref = x.double() @ wd.T
                    err = float((y - ref).norm() / ref.norm())
                    res[f"int{bits}_M{M}_splits{g.splits}"] = {"rel_err": err, "ok": err < 1e-2}
                except Exception as e:  # noqa: BLE001
                    res[f"int{bits}_M{M}_split{force_split}"] = f"failed: {one_line(e)}"
    b.checks["splitk"] = res
    log("   check splitk:", json.dumps(res))


def tinygemm_pool(b: Bench, N, K, group, n_slots) -> QuantWeights:
    """tinygemm int4 weights (torch._convert_weight_to_int4pack, inner_k_tiles 8) and
    qScaleAndZeros [K/group, N, 2] bf16; slots are clones of one conversion."""
    q = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=b.dev)
    packed = torch._convert_weight_to_int4pack(q, 8)
    sz = torch.empty(K // group, N, 2, device=b.dev, dtype=torch.bfloat16)
    sz[..., 0] = torch.rand(K // group, N, device=b.dev) * 0.01 + 0.001
    sz[..., 1] = torch.randn(K // group, N, device=b.dev) * 0.01
    slots = [(packed.clone(), sz.clone(), None) for _ in range(n_slots)]
    return QuantWeights(slots, N * K // 2 + 4 * N * (K // group))


def check_tinygemm(b: Bench):
    """tinygemm against w = (q - 8) * scale + zero with q from the uint8 nibbles (high = even k).

    Records the error for both nibble orders so a layout surprise is visible, not fatal.
    """
    if not b.cuda:
        b.checks["tinygemm"] = "skipped: needs CUDA"
        return
    try:
        N, K, G = 256, 1024, 128
        q8 = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=b.dev)
        packed = torch._convert_weight_to_int4pack(q8, 8)
        sz = torch.empty(K // G, N, 2, device=b.dev, dtype=torch.bfloat16)
        sz[..., 0] = torch.rand(K // G, N, device=b.dev) * 0.01 + 0.001
        sz[..., 1] = torch.randn(K // G, N, device=b.dev) * 0.01
        x = torch.randn(4, K, device=b.dev, dtype=torch.bfloat16)
        y = torch._weight_int4pack_mm(x, packed, G, sz).double()
        s = sz[..., 0].double().T.repeat_interleave(G, 1)
        z = sz[..., 1].double().T.repeat_interleave(G, 1)
        res = {}
        for order, (a, c) in {"high_even": (q8 >> 4, q8 & 15), "low_even": (q8 & 15, q8 >> 4)}.items():
            q = torch.stack([a, c], -1).reshape(N, K).double()
            ref = x.double() @ ((q - 8) * s + z).T
            res[order] = float((y - ref).norm() / ref.norm())
        b.checks["tinygemm_rel_err"] = res
    except Exception as e:  # noqa: BLE001
        b.checks["tinygemm_rel_err"] = f"failed: {one_line(e)}"
    log("   check tinygemm:", b.checks.get("tinygemm_rel_err"))


def gemm_wonly_configs(b: Bench) -> list:
    """Weight-only int4/int8 GEMV/GEMM: tinygemm, plain-PyTorch int8, Triton split-K."""
    Ms, NKs = b.axis("gemm_wonly", "M"), b.axis("gemm_wonly", "NK")
    check_splitk(b)
    check_tinygemm(b)
    g4 = b.axis("gemm_wonly", "int4_group")
    pools: dict = {}
    cfgs = []
    for M in coverage_order(Ms):
        for (N, K) in NKs:
            for G in b.axis("gemm_wonly", "tinygemm_groups"):
                cfgs.append(_tinygemm_cfg(b, M, N, K, G, pools))
            cfgs.append(_int8_unfused_cfg(b, M, N, K, pools))
            cfgs.append(_splitk_cfg(b, M, N, K, 8, K, pools))
            cfgs.append(_splitk_cfg(b, M, N, K, 4, g4, pools))
    return cfgs


def _pool_get(b: Bench, pools, key, make):
    """Rotation pools are shared by the M values (and impls) of one (N,K) and format."""
    if key not in pools:
        pools[key] = make()
    return pools[key]


def _wq_meta(impl, bits, group, M, N, K, wbytes, inter=0, note=""):
    """CSV fields of a weight-only quantized GEMM row."""
    return dict(impl=impl, kclass="gemv_wq", dtype=f"int{bits}", M=M, N=N, K=K, M_padded=M,
                group_size=group, bytes_read=wbytes + 2 * M * K, bytes_written=2 * M * N,
                bytes_intermediate=inter, flops=2 * M * N * K, note=note)


def _n_slots_q(b: Bench, bytes_per_slot) -> int:
    """Rotation count for quantized weights (each slot is its own allocation)."""
    return b.slots_for(bytes_per_slot, cap=64)


def _tinygemm_cfg(b: Bench, M, N, K, G, pools) -> Config:
    """torch._weight_int4pack_mm at one shape and group size."""
    wbytes = N * K // 2 + 4 * N * (K // G)
    meta = _wq_meta(f"tinygemm_int4_g{G}", 4, G, M, N, K, wbytes,
                    note="torch._weight_int4pack_mm, inner_k_tiles 8, bf16 scale+zero")
    cid = f"gemm_wonly:tinygemm_int4_g{G}:M{M}_N{N}_K{K}"
    if not b.cuda:
        return Config(cid, "gemm_wonly", meta, raiser("skipped: tinygemm int4 needs CUDA"))
    n_slots = _n_slots_q(b, wbytes)

    def build():
        if not hasattr(torch, "_weight_int4pack_mm"):
            raise RuntimeError("torch._weight_int4pack_mm not available")
        pool = _pool_get(b, pools, ("tiny", N, K, G), lambda: tinygemm_pool(b, N, K, G, n_slots))
        x = torch.randn(M, K, device=b.dev, dtype=torch.bfloat16)
        sl = pool.slots
        return lambda i: torch._weight_int4pack_mm(x, sl[i % n_slots][0], G, sl[i % n_slots][1])
    return Config(cid, "gemm_wonly", meta, build, est_us=5.0 + wbytes / 2.5e12 * 1e6,
                  n_slots=n_slots, bytes_per_slot=wbytes)


def _int8_unfused_cfg(b: Bench, M, N, K, pools) -> Config:
    """Plain PyTorch int8 weight-only: F.linear(x, W8.to(bf16)) * scales (3 kernels)."""
    wbytes = N * K + 2 * N
    meta = _wq_meta("int8_unfused", 8, 0, M, N, K, wbytes, inter=4 * N * K,
                    note="F.linear(x, W_int8.to(bf16)) * scale[N]; the cast writes and the GEMM "
                         "reads a bf16 copy of W (bytes_intermediate)")
    n_slots = _n_slots_q(b, wbytes)

    def build():
        pool = _pool_get(b, pools, ("int8", N, K), lambda: quant_int8_pool(b, N, K, n_slots))
        x = torch.randn(M, K, device=b.dev, dtype=torch.bfloat16)
        sl = pool.slots
        return lambda i: F.linear(x, sl[i % n_slots][0].to(torch.bfloat16)) * sl[i % n_slots][1]
    return Config(f"gemm_wonly:int8_unfused:M{M}_N{N}_K{K}", "gemm_wonly", meta, build,
                  est_us=10.0 + 5 * N * K / 2.5e12 * 1e6, n_slots=n_slots, bytes_per_slot=wbytes)


def _splitk_cfg(b: Bench, M, N, K, bits, group, pools) -> Config:
    """Triton fused-dequant split-K GEMV (int8 per-channel or int4 asymmetric grouped)."""
    g_label = 0 if bits == 8 else group
    impl = f"triton_splitk_int{bits}" + (f"_g{group}" if bits == 4 else "")
    wbytes = N * K + 2 * N if bits == 8 else N * K // 2 + 4 * N * (K // group)
    cid = f"gemm_wonly:{impl}:M{M}_N{N}_K{K}"
    meta = _wq_meta(impl, bits, g_label, M, N, K, wbytes)
    if not b.triton_ok:
        return Config(cid, "gemm_wonly", meta, raiser("skipped: Triton needs CUDA or TRITON_INTERPRET=1"))
    n_slots = _n_slots_q(b, wbytes)
    ok = b.checks.get("splitk")
    if isinstance(ok, dict) and not all(isinstance(v, dict) and v.get("ok") for v in ok.values()):
        meta["note"] = "numerics check failed or incomplete (see summary)"

    def build():
        key = ("int8", N, K) if bits == 8 else ("int4", N, K, group)
        make = (lambda: quant_int8_pool(b, N, K, n_slots)) if bits == 8 else \
            (lambda: quant_int4_pool(b, N, K, group, n_slots))
        pool = _pool_get(b, pools, key, make)
        g = SplitKGemv(b, M, N, K, bits, 0 if bits == 8 else group)
        meta["n_programs"] = cdiv(N, g.BLOCK_N) * g.splits
        meta["bytes_intermediate"] = 0 if g.splits == 1 else 2 * 4 * g.splits * M * N
        tiling = f"splits={g.splits} BLOCK_N={g.BLOCK_N} BLOCK_K={g.BLOCK_K} BLOCK_M={g.BLOCK_M}"
        tiling += "; fp32 partials + reduce kernel" if g.splits > 1 else "; one split, bf16 out"
        meta["note"] = "; ".join(x for x in (meta.get("note", ""), tiling) if x)
        x = torch.randn(M, K, device=b.dev, dtype=torch.bfloat16)
        sl = pool.slots
        return lambda i: g(x, *sl[i % n_slots])
    return Config(cid, "gemm_wonly", meta, build, est_us=6.0 + wbytes / 2.0e12 * 1e6,
                  n_slots=n_slots, bytes_per_slot=wbytes)
