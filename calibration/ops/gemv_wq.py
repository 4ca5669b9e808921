"""Triton split-K GEMV with fused weight dequantization (int8 per channel, int4 in groups) and its
split reduction (kernels.py's gemm_wonly section). Defined only where Triton imports.
"""
from __future__ import annotations

try:
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except Exception:  # noqa: BLE001
    HAVE_TRITON = False

if HAVE_TRITON:
    @triton.jit(do_not_specialize=["M", "kb_per_prog"])
    def _wq_splitk_kernel(x_ptr, w_ptr, s_ptr, z_ptr, part_ptr, y_ptr, M, N, K, kb_per_prog,
                          BITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZERO: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          USE_DOT: tl.constexpr, DOT_FP32: tl.constexpr, DIRECT: tl.constexpr):
        """Weight-only quantized y[M,N] = x[M,K] @ dequant(W)[N,K]^T, split over K.

        Program (n, s) dequantizes [BLOCK_N, BLOCK_K] weight tiles of K blocks
        s*kb_per_prog .. (s+1)*kb_per_prog-1 and accumulates in fp32. W is int8 [N,K]
        (BITS=8) or uint8 [N,K/2] holding two 4-bit values (BITS=4, even k in the low
        nibble). Scales (and zeros) are [K/GROUP, N] (GROUP=0: one row, per output channel);
        w = (q - z) * s. DIRECT writes bf16 y
        (one split); otherwise fp32 partials [splits, M, N] for _splitk_reduce_kernel.
        BLOCK_M == 1 uses a multiply-and-sum instead of tl.dot.
        """
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = offs_n < N
        offs_m = tl.arange(0, BLOCK_M)
        m_mask = offs_m < M
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        kb0 = pid_s * kb_per_prog
        for kb in range(kb0, kb0 + kb_per_prog):
            offs_k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
            k_mask = offs_k < K
            wmask = n_mask[:, None] & k_mask[None, :]
            if BITS == 8:
                q = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=wmask,
                            other=0).to(tl.float32)
            else:
                b = tl.load(w_ptr + offs_n[:, None] * (K // 2) + (offs_k // 2)[None, :],
                            mask=wmask, other=0).to(tl.int32)
                q = ((b >> ((offs_k % 2) * 4)[None, :]) & 0xF).to(tl.float32)
            if GROUP == 0:
                g = 0
            else:
                g = (kb * BLOCK_K) // GROUP
            smask = n_mask & (kb * BLOCK_K < K)
            s = tl.load(s_ptr + g * N + offs_n, mask=smask, other=0.0).to(tl.float32)
            if HAS_ZERO:
                z = tl.load(z_ptr + g * N + offs_n, mask=smask, other=0.0).to(tl.float32)
                w = (q - z[:, None]) * s[:, None]
            else:
                w = q * s[:, None]
            x = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :],
                        mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            if USE_DOT:
                if DOT_FP32:
                    acc += tl.dot(x.to(tl.float32), tl.trans(w))
                else:
                    acc += tl.dot(x.to(tl.bfloat16), tl.trans(w.to(tl.bfloat16)))
            else:
                acc += tl.sum(x.to(tl.float32) * w, axis=1)[None, :]
        y_offs = offs_m[:, None] * N + offs_n[None, :]
        mask = m_mask[:, None] & n_mask[None, :]
        if DIRECT:
            tl.store(y_ptr + y_offs, acc.to(tl.bfloat16), mask=mask)
        else:
            tl.store(part_ptr + pid_s * M * N + y_offs, acc, mask=mask)

    @triton.jit(do_not_specialize=["MN", "splits"])
    def _splitk_reduce_kernel(part_ptr, y_ptr, MN, splits, BLOCK: tl.constexpr):
        """y[i] = bf16(sum over splits of part[s, i])."""
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < MN
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for s in range(splits):
            acc += tl.load(part_ptr + s * MN + offs, mask=mask, other=0.0)
        tl.store(y_ptr + offs, acc.to(tl.bfloat16), mask=mask)
