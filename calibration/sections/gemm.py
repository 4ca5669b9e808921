"""kernels.py's matrix sections: bf16 F.linear (gemm), FP8 torch._scaled_mm with dynamic
activation quantization (gemm_fp8), static-scale and per-token FP8 linears (fp8_static) and both
at narrow output widths (fp8_narrow).
"""
from __future__ import annotations


import torch
import torch.nn.functional as F
from harness import log, one_line
from sweep import coverage_order

from sections.bench import Bench, Config, FP8, cdiv, skip_config

# ============================================================================ section: gemm

def gemm_configs(b: Bench) -> list:
    """bf16 F.linear(x[M,K], W[N,K]) over (N,K) pairs and M; W rotates through the pool."""
    Ms = b.axis("gemm", "M")
    lm_heads = b.axis("gemm", "lm_head_NK")
    NKs = b.axis("gemm", "projection_NK") + lm_heads
    gemm_check(b)
    cfgs = []
    for M in coverage_order(Ms):
        for (N, K) in NKs:
            wbytes = N * K * 2
            n_slots = b.slots_for(wbytes, cap=256)
            meta = dict(impl="F.linear", kclass="gemm", dtype="bf16", M=M, N=N, K=K, M_padded=M,
                        bytes_read=wbytes + M * K * 2, bytes_written=M * N * 2, flops=2 * M * N * K,
                        note="lm_head" if (N, K) in lm_heads else "")

            def build(M=M, N=N, K=K, n_slots=n_slots):
                Ws = [s[0] for s in b.carve([((N, K), torch.bfloat16)], n_slots)]
                x = torch.randn(M, K, device=b.dev, dtype=torch.bfloat16)
                return lambda i: F.linear(x, Ws[i % n_slots])
            est = 4.0 + max(wbytes / 3.0e12, 2 * M * N * K / 500e12) * 1e6
            cfgs.append(Config(f"gemm:F.linear:M{M}_N{N}_K{K}", "gemm", meta, build, est_us=est,
                               n_slots=n_slots, bytes_per_slot=wbytes))
    return cfgs


def gemm_check(b: Bench):
    """Relative error of bf16 F.linear against float64 (summary check)."""
    try:
        x = torch.randn(16, 512, device=b.dev, dtype=torch.bfloat16)
        w = torch.randn(384, 512, device=b.dev, dtype=torch.bfloat16)
        ref = x.double() @ w.double().T
        b.checks["gemm_bf16_rel_err"] = float((F.linear(x, w).double() - ref).norm() / ref.norm())
    except Exception as e:  # noqa: BLE001
        b.checks["gemm_bf16_rel_err"] = f"failed: {one_line(e)}"


# ============================================================================ section: gemm_fp8

FP8_MAX = 448.0


def fp8_quantize(x):
    """Per-tensor dynamic e4m3 quantization as plain PyTorch writes it; returns (xq, scale)."""
    scale = (x.abs().amax().float() / FP8_MAX).clamp(min=1e-12)
    return (x / scale).to(torch.float8_e4m3fn), scale


def fp8_linear(x, w8t, w_scale):
    """Plain-PyTorch FP8 linear: quantize x, torch._scaled_mm with the e4m3 weight, bf16 out."""
    xq, xs = fp8_quantize(x)
    return torch._scaled_mm(xq, w8t, scale_a=xs, scale_b=w_scale, out_dtype=torch.bfloat16)


def fp8_weight_pool(b: Bench, N, K, n_slots):
    """n_slots e4m3 weight copies [N,K] (values from the bf16 pool, scaled to about +-4)."""
    src = b.carve([((N, K), torch.bfloat16)], n_slots)
    return [(s[0] * 2.0).to(torch.float8_e4m3fn) for s in src]


def gemm_fp8_configs(b: Bench) -> list:
    """FP8 GEMM alone, activation quantization alone, and the whole FP8 linear."""
    Ms, NKs = b.axis("gemm_fp8", "M"), b.axis("gemm_fp8", "NK")
    fp8_check(b)
    cfgs = []
    pools: dict = {}
    for M in coverage_order(Ms):
        for (N, K) in NKs:
            n_slots = b.slots_for(N * K, cap=256)
            for impl in ("torch._scaled_mm", "fp8_linear"):
                cfgs.append(_fp8_cfg(b, impl, M, N, K, n_slots, pools))
        for K in sorted({k for _, k in NKs}):
            cfgs.append(_fp8_quant_cfg(b, M, K))
    return cfgs


def _fp8_cfg(b: Bench, impl, M, N, K, n_slots, pools) -> Config:
    """_scaled_mm alone (pre-quantized x) or the whole FP8 linear, at one shape."""
    wbytes = N * K
    meta = dict(impl=impl, kclass="gemm_fp8", dtype="fp8_e4m3", M=M, N=N, K=K, M_padded=M,
                bytes_read=wbytes + M * K * (1 if impl == "torch._scaled_mm" else 2) + 8,
                bytes_written=M * N * 2, flops=2 * M * N * K,
                bytes_intermediate=0 if impl == "torch._scaled_mm" else 7 * M * K,
                note="per-tensor fp32 scales; W passed as W8.t() (column-major)")
    if impl == "fp8_linear":
        meta["note"] += "; quantize (abs, amax, /448, clamp, div, cast) + _scaled_mm"

    def build():
        if (N, K) not in pools:
            pools[(N, K)] = fp8_weight_pool(b, N, K, n_slots)
        Ws = pools[(N, K)]
        ws = torch.tensor(0.5, device=b.dev)
        x = torch.randn(M, K, device=b.dev, dtype=torch.bfloat16)
        mp = _fp8_m_padded(b, x, Ws[0], ws)
        if mp != M:
            meta["M_padded"] = mp
            meta["note"] += f"; M padded {M}->{mp} (_scaled_mm rejected M={M})"
            x = torch.cat([x, x.new_zeros(mp - M, K)])
        if impl == "torch._scaled_mm":
            xq, xs = fp8_quantize(x)
            return lambda i: torch._scaled_mm(xq, Ws[i % n_slots].t(), scale_a=xs, scale_b=ws,
                                              out_dtype=torch.bfloat16)
        return lambda i: fp8_linear(x, Ws[i % n_slots].t(), ws)
    est = 5.0 + max(wbytes / 3.0e12, 2 * M * N * K / 1000e12) * 1e6
    return Config(f"gemm_fp8:{impl}:M{M}_N{N}_K{K}", "gemm_fp8", meta, build, est_us=est,
                  n_slots=n_slots, bytes_per_slot=wbytes)


def _fp8_m_padded(b: Bench, x, w8, ws) -> int:
    """M as given if _scaled_mm accepts it, else M rounded up to 16 (raises if that fails too)."""
    M, K = x.shape
    try:
        xq, xs = fp8_quantize(x)
        torch._scaled_mm(xq, w8.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)
        b.sync()
        return M
    except Exception:  # noqa: BLE001
        mp = cdiv(M, 16) * 16
        if mp == M:
            raise
        xp = torch.cat([x, x.new_zeros(mp - M, K)])
        xq, xs = fp8_quantize(xp)
        torch._scaled_mm(xq, w8.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)
        b.sync()
        return mp


def _fp8_quant_cfg(b: Bench, M, K) -> Config:
    """The activation quantization kernels alone (abs, amax, scale, divide, cast)."""
    meta = dict(impl="fp8_quantize", kclass="quantize", dtype="bf16", M=M, K=K, elements=M * K,
                bytes_read=2 * M * K, bytes_written=M * K + 4, bytes_intermediate=7 * M * K,
                flops=3 * M * K, note="x.abs().amax() -> scale -> (x/scale).to(e4m3) (eager group)")

    def build():
        xs = [torch.randn(M, K, device=b.dev, dtype=torch.bfloat16) for _ in range(4)]
        return lambda i: fp8_quantize(xs[i % 4])
    return Config(f"gemm_fp8:fp8_quantize:M{M}_K{K}", "gemm_fp8", meta, build, est_us=15.0)


def fp8_check(b: Bench):
    """Relative error of the FP8 linear against float64 of the dequantized operands."""
    try:
        x = torch.randn(16, 512, device=b.dev, dtype=torch.bfloat16)
        w8 = (torch.randn(256, 512, device=b.dev) * 2).to(torch.float8_e4m3fn)
        ws = torch.tensor(0.5, device=b.dev)
        y = fp8_linear(x, w8.t(), ws)
        ref = x.double() @ (w8.double() * 0.5).T
        b.checks["fp8_linear_rel_err_vs_unquantized_x"] = float((y.double() - ref).norm() / ref.norm())
    except Exception as e:  # noqa: BLE001
        b.checks["fp8_linear_rel_err_vs_unquantized_x"] = f"failed: {one_line(e)}"
    log("   check fp8:", b.checks["fp8_linear_rel_err_vs_unquantized_x"])


# ---- FP8 linears with a static scale and with per-token dynamic scales

def fp8_static_configs(b: Bench) -> list:
    if b.mode == "cpu" or FP8 is None:
        return [skip_config("fp8_static", "fp8_static:cpu", dict(impl="fp8_static_linear", kclass="gemm_fp8"),
                            "torch._scaled_mm needs CUDA")]
    Ms, NKs = b.axis("fp8_static", "M"), b.axis("fp8_static", "NK")
    cfgs = []
    pools: dict = {}
    for M in coverage_order(Ms):
        for N, K in NKs:
            n_slots = b.slots_for(N * K, cap=256)
            for impl in ("fp8_static_linear", "fp8_per_token_linear"):
                cfgs.append(_fp8s_cfg(b, impl, M, N, K, n_slots, pools))
        for K in sorted({k for _, k in NKs}):
            cfgs.append(_fp8_cast_cfg(b, M, K))
    return cfgs


def fp8_narrow_configs(b: Bench) -> list:
    """Static FP8 linears and bf16 F.linear at narrow output widths (GQA K/V projections)."""
    if b.mode == "cpu" or FP8 is None:
        return [skip_config("fp8_narrow", "fp8_narrow:cpu", dict(impl="fp8_static_linear", kclass="gemm_fp8"),
                            "torch._scaled_mm needs CUDA")]
    Ms, NKs = b.axis("fp8_narrow", "M"), b.axis("fp8_narrow", "NK")
    cfgs, pools = [], {}
    for M in coverage_order(Ms):
        for N, K in NKs:
            n_slots = b.slots_for(N * K, cap=256)
            c = _fp8s_cfg(b, "fp8_static_linear", M, N, K, n_slots, pools)
            cfgs.append(Config(c.cid.replace("fp8_static:", "fp8_narrow:"), "fp8_narrow", c.meta, c.build, c.est_us,
                               c.n_slots, c.bytes_per_slot))
            cfgs.append(_bf16_narrow_cfg(b, M, N, K))
    return cfgs


def _bf16_narrow_cfg(b: Bench, M, N, K) -> Config:
    n_slots = b.slots_for(2 * N * K, cap=256)
    meta = dict(impl="F.linear", kclass="gemm", dtype="bf16", M=M, N=N, K=K, M_padded=M, bytes_read=2 * N * K + 2 * M * K,
                bytes_written=2 * M * N, flops=2 * M * N * K, note="bf16 F.linear at a narrow output width")

    def build():
        ws = [s[0] for s in b.carve([((N, K), torch.bfloat16)], n_slots)]
        x = torch.randn(M, K, device=b.dev, dtype=torch.bfloat16)
        return lambda i: F.linear(x, ws[i % n_slots])
    return Config(f"fp8_narrow:F.linear:M{M}_N{N}_K{K}", "fp8_narrow", meta, build,
                  est_us=6.0 + 2 * N * K / 3e12 * 1e6, n_slots=n_slots, bytes_per_slot=2 * N * K)


def _fp8s_cfg(b: Bench, impl, M, N, K, n_slots, pools) -> Config:
    wbytes = N * K
    static = impl == "fp8_static_linear"
    meta = dict(impl=impl, kclass="gemm_fp8", dtype="fp8_e4m3", M=M, N=N, K=K, M_padded=M,
                bytes_read=wbytes + M * K * 2, bytes_written=M * N * 2, flops=2 * M * N * K,
                bytes_intermediate=2 * M * K if static else 8 * M * K,
                note="x.to(e4m3) with a constant scale, then torch._scaled_mm (per-tensor scales)" if static else
                "per-token: s = |x|.amax(-1)/448; (x/s).to(e4m3); _scaled_mm with rowwise scales (w per channel)")

    def build():
        if (N, K) not in pools:
            pools[(N, K)] = fp8_weight_pool(b, N, K, n_slots)
        Ws = pools[(N, K)]
        x = torch.randn(M, K, device=b.dev, dtype=torch.bfloat16)
        mp = cdiv(M, 16) * 16 if M % 16 else M
        if static:
            xs = torch.tensor(1.0, device=b.dev)
            ws = torch.tensor(0.5, device=b.dev)
            try:
                torch._scaled_mm(x.to(FP8), Ws[0].t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)
                b.sync()
            except Exception:  # noqa: BLE001
                meta["M_padded"] = mp
                x = torch.cat([x, x.new_zeros(mp - M, K)])
            return lambda i: torch._scaled_mm(x.to(FP8), Ws[i % n_slots].t(), scale_a=xs, scale_b=ws,
                                              out_dtype=torch.bfloat16)
        wrow = torch.full((1, N), 0.5, device=b.dev, dtype=torch.float32)

        def per_token(i, x=x):
            s = x.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
            xq = (x / s).to(FP8)
            return torch._scaled_mm(xq, Ws[i % n_slots].t(), scale_a=s, scale_b=wrow, out_dtype=torch.bfloat16)
        try:
            per_token(0)
            b.sync()
        except Exception:  # noqa: BLE001
            meta["M_padded"] = mp
            x = torch.cat([x, x.new_zeros(mp - M, K)])
            return lambda i, x=x: per_token(i, x)
        return per_token
    est = 8.0 + max(wbytes / 3.0e12, 2 * M * N * K / 1000e12) * 1e6
    return Config(f"fp8_static:{impl}:M{M}_N{N}_K{K}", "fp8_static", meta, build, est_us=est,
                  n_slots=n_slots, bytes_per_slot=wbytes)


def _fp8_cast_cfg(b: Bench, M, K) -> Config:
    """The static-scale activation quantization alone: x.to(e4m3) (one cast kernel)."""
    meta = dict(impl="cast_bf16_fp8_act", kclass="cast", dtype="bf16", M=M, K=K, elements=M * K, rows=M, row_width=K,
                bytes_read=2 * M * K, bytes_written=M * K, flops=0, note="x.to(float8_e4m3fn), x [M, K] in L2")

    def build():
        xs = [torch.randn(M, K, device=b.dev, dtype=torch.bfloat16) for _ in range(4)]
        return lambda i: xs[i % 4].to(FP8)
    return Config(f"fp8_static:cast_bf16_fp8_act:M{M}_K{K}", "fp8_static", meta, build, est_us=3.0)
