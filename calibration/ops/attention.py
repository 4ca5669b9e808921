"""Triton split-K flash-decode attention over bf16 and quantized KV caches (kv_attention.py): the
per-format dequantization helpers, the split kernel (one program per split, KV head and
sequence) and the kernel that combines the splits. Triton is required.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

# Triton 3.6's interpreter computes tl.dot on bf16 operands wrongly (their raw bits), so under
# TRITON_INTERPRET=1 the bf16 kernel upcasts its dot operands to fp32; compiled, it is a bf16 dot.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
_BF16_DOT_UPCAST = tl.constexpr(INTERPRETED)


@triton.jit
def _f16_codes(c):
    """Unsigned integer codes in [0, 1024) -> the same values in fp16, exactly, without an
    int->float conversion: 0x6400 | c read as fp16 is 1024 + c."""
    bits = (c.to(tl.uint16) | 0x6400).to(tl.uint16)
    return bits.to(tl.float16, bitcast=True) - 1024.0


@triton.jit
def _dot_bf16(a, b):
    """a @ b for bf16 operands, fp32 result (see _BF16_DOT_UPCAST)."""
    if _BF16_DOT_UPCAST:
        r = tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        r = tl.dot(a, b)
    return r


@triton.jit
def _unpack_int4_row(ptr, n, nmask, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """Group path: codes of BLOCK_N tokens (rows of D/2 bytes, loaded as wide vectors) ->
    fp16 codes [BLOCK_N, D] in natural dim order (low nibble = even dim)."""
    j = tl.arange(0, D // 2)
    b = tl.load(ptr + n[:, None] * (D // 2) + j[None, :], mask=nmask[:, None], other=0)
    lo = _f16_codes(b & 15)
    hi = _f16_codes(b >> 4)
    return tl.reshape(tl.join(lo, hi), [BLOCK_N, D])


@triton.jit
def _unpack_int2_row(ptr, n, nmask, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """Group path: rows of D/4 bytes (dim 4j+i at bits 2i of byte j) -> fp16 codes [BLOCK_N, D]."""
    j = tl.arange(0, D // 4)
    b = tl.load(ptr + n[:, None] * (D // 4) + j[None, :], mask=nmask[:, None], other=0)
    c0 = _f16_codes(b & 3)
    c1 = _f16_codes((b >> 2) & 3)
    c2 = _f16_codes((b >> 4) & 3)
    c3 = _f16_codes(b >> 6)
    # join(join(c0, c2), join(c1, c3))[..., a, t] = c[2a + t]: flattening gives c0, c1, c2, c3
    return tl.reshape(tl.join(tl.join(c0, c2), tl.join(c1, c3)), [BLOCK_N, D])


@triton.jit
def _elem_codes(ptr, n, nmask, BITS: tl.constexpr, D: tl.constexpr):
    """Elem path: each element computes its byte address, loads the byte, shifts and masks
    its own code and converts it to fp32 -> [BLOCK_N, D]."""
    PER: tl.constexpr = 8 // BITS
    d = tl.arange(0, D)
    byte = tl.load(ptr + n[:, None] * (D // PER) + (d // PER)[None, :], mask=nmask[:, None], other=0)
    code = (byte.to(tl.int32) >> ((d % PER) * BITS)[None, :]) & ((1 << BITS) - 1)
    return code.to(tl.float32)


@triton.jit
def _elem_affine(code, s_ptr, z_ptr, idx, mask, HAS_ZERO: tl.constexpr):
    """Elem path: load each element's scale (and zero) through its index, x = s*c (+ z), fp16."""
    s = tl.load(s_ptr + idx, mask=mask, other=0.0).to(tl.float32)
    x = code * s
    if HAS_ZERO:
        x += tl.load(z_ptr + idx, mask=mask, other=0.0).to(tl.float32)
    return x.to(tl.float16)


@triton.jit
def _group_affine(c, s, z, BLOCK_N: tl.constexpr, D: tl.constexpr, G: tl.constexpr):
    """Group path: c [BLOCK_N, D] fp16 codes, s/z [BLOCK_N, D/G] fp16, one per group, broadcast
    over the group's G channels -> [BLOCK_N, D] fp16."""
    c3 = tl.reshape(c, [BLOCK_N, D // G, G])
    x3 = c3 * s[:, :, None] + z[:, :, None]
    return tl.reshape(x3, [BLOCK_N, D])


@triton.jit
def _int8_group_codes(ptr, n, nmask, D: tl.constexpr):
    """Group path, int8: [BLOCK_N, D] codes -> fp16 exactly via the 0x6400 trick on c + 128."""
    d = tl.arange(0, D)
    c = tl.load(ptr + n[:, None] * D + d[None, :], mask=nmask[:, None], other=0)
    u = (c.to(tl.uint8, bitcast=True) ^ 0x80).to(tl.uint8)
    return _f16_codes(u) - 128.0


@triton.jit
def _kivi_k_tile(kc, ks, kz, n, nmask, n0, end, ELEM: tl.constexpr, BLOCK_N: tl.constexpr,
                 D: tl.constexpr, TG: tl.constexpr):
    """KIVI K tile [BLOCK_N, D] fp16: per-channel scale/zero per block of TG tokens."""
    d = tl.arange(0, D)
    if ELEM:
        code = _elem_codes(kc, n, nmask, 2, D)
        idx = (n // TG)[:, None] * D + d[None, :]
        x = _elem_affine(code, ks, kz, idx, nmask[:, None], True)
    else:
        c = _unpack_int2_row(kc, n, nmask, BLOCK_N, D)
        nb = n0 // TG + tl.arange(0, BLOCK_N // TG)
        bmask = nb * TG < end
        s = tl.load(ks + nb[:, None] * D + d[None, :], mask=bmask[:, None], other=0.0)
        z = tl.load(kz + nb[:, None] * D + d[None, :], mask=bmask[:, None], other=0.0)
        c3 = tl.reshape(c, [BLOCK_N // TG, TG, D])
        x = tl.reshape(c3 * s[:, None, :] + z[:, None, :], [BLOCK_N, D])
    return x


@triton.jit
def _grouped_tile(cp, sp, zp, n, nmask, ELEM: tl.constexpr, BITS: tl.constexpr, BLOCK_N: tl.constexpr,
                  D: tl.constexpr, G: tl.constexpr):
    """Asymmetric per-token groups of G channels (int4-gG, KIVI V) -> [BLOCK_N, D] fp16."""
    d = tl.arange(0, D)
    if ELEM:
        code = _elem_codes(cp, n, nmask, BITS, D)
        idx = n[:, None] * (D // G) + (d // G)[None, :]
        x = _elem_affine(code, sp, zp, idx, nmask[:, None], True)
    else:
        if BITS == 4:
            c = _unpack_int4_row(cp, n, nmask, BLOCK_N, D)
        else:
            c = _unpack_int2_row(cp, n, nmask, BLOCK_N, D)
        g = tl.arange(0, D // G)
        s = tl.load(sp + n[:, None] * (D // G) + g[None, :], mask=nmask[:, None], other=0.0)
        z = tl.load(zp + n[:, None] * (D // G) + g[None, :], mask=nmask[:, None], other=0.0)
        x = _group_affine(c, s, z, BLOCK_N, D, G)
    return x


@triton.jit
def _outlier_k_elem_tile(kc, ks, kz, kch, kout, n, nmask, D: tl.constexpr, NOC: tl.constexpr):
    """Outlier format, elem path: dequantize every element, then per element look up whether its
    channel is an outlier channel and, if so, gather the fp16 value that replaces it."""
    d = tl.arange(0, D)
    code = _elem_codes(kc, n, nmask, 2, D)
    idx = n[:, None] + tl.zeros([1, D], tl.int32)
    x = _elem_affine(code, ks, kz, idx, nmask[:, None], True)
    pos = tl.full([D], -1, tl.int32)
    for j in tl.static_range(NOC):
        pos = tl.where(d == tl.load(kch + j).to(tl.int32), j, pos)
    is_out = (pos >= 0)[None, :]
    ko = tl.load(kout + n[:, None] * NOC + pos[None, :], mask=nmask[:, None] & is_out, other=0.0)
    return tl.where(is_out, ko, x)


@triton.jit
def _outlier_v_delta(vptr, vcol, vval, n, nmask, BLOCK_N: tl.constexpr, D: tl.constexpr, KMAX: tl.constexpr):
    """Outlier format, group path: the sparse part of BLOCK_N tokens as a dense fp16 tile; the
    row pointers, columns and values are loaded once per (token, entry) and broadcast over D."""
    d = tl.arange(0, D)
    r0 = tl.load(vptr + n, mask=nmask, other=0)
    r1 = tl.load(vptr + n + 1, mask=nmask, other=0)
    delta = tl.zeros([BLOCK_N, D], tl.float16)
    for k in tl.static_range(KMAX):
        valid = nmask & (r0 + k < r1)
        col = tl.load(vcol + r0 + k, mask=valid, other=-1).to(tl.int32)
        val = tl.load(vval + r0 + k, mask=valid, other=0.0)
        delta = tl.where(col[:, None] == d[None, :], val[:, None], delta)
    return delta


@triton.jit
def _outlier_v_elem_tile(vc, vs, vz, vptr, vcol, vval, n, nmask, D: tl.constexpr, KMAX: tl.constexpr):
    """Outlier format, elem path: per element, dequantize, load its token's row pointers, and
    scan that token's sparse entries (gathered per element) for its column."""
    d = tl.arange(0, D)
    code = _elem_codes(vc, n, nmask, 2, D)
    idx = n[:, None] + tl.zeros([1, D], tl.int32)
    m2 = nmask[:, None] & (idx >= 0)
    x = _elem_affine(code, vs, vz, idx, m2, True).to(tl.float32)
    r0 = tl.load(vptr + idx, mask=m2, other=0)
    r1 = tl.load(vptr + idx + 1, mask=m2, other=0)
    for k in tl.static_range(KMAX):
        valid = m2 & (r0 + k < r1)
        col = tl.load(vcol + r0 + k, mask=valid, other=-1).to(tl.int32)
        val = tl.load(vval + r0 + k, mask=valid, other=0.0).to(tl.float32)
        x += tl.where(col == d[None, :], val, 0.0)
    return x.to(tl.float16)


@triton.jit
def _scores(q, qa, qo, qsum, n, nmask, n0, end, bh, kh, L, Lq,
            k0, k1, k2, k3, k4,
            D: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr, ELEM: tl.constexpr,
            G: tl.constexpr, NOC: tl.constexpr, NOCP: tl.constexpr, WIN: tl.constexpr,
            TG: tl.constexpr):
    """q . k for one block of BLOCK_N tokens -> [HP, BLOCK_N] fp32 (not yet scaled)."""
    d = tl.arange(0, D)
    if MODE == 0:  # bf16
        k = tl.load(k0 + bh * L * D + n[:, None] * D + d[None, :], mask=nmask[:, None], other=0.0)
        qk = _dot_bf16(q, tl.trans(k))
    elif MODE == 1:  # int8, per-token symmetric
        kc = k0 + bh * L * D
        ks = k1 + bh * L
        if ELEM:
            code = tl.load(kc + n[:, None] * D + d[None, :], mask=nmask[:, None], other=0).to(tl.float32)
            idx = n[:, None] + tl.zeros([1, D], tl.int32)
            x = _elem_affine(code, ks, ks, idx, nmask[:, None], False)
            qk = tl.dot(q, tl.trans(x))
        else:
            c = _int8_group_codes(kc, n, nmask, D)
            s = tl.load(ks + n, mask=nmask, other=0.0).to(tl.float32)
            qk = tl.dot(q, tl.trans(c)) * s[None, :]
    elif MODE == 2:  # int4, groups of G
        x = _grouped_tile(k0 + bh * L * (D // 2), k1 + bh * L * (D // G), k2 + bh * L * (D // G),
                          n, nmask, ELEM, 4, BLOCK_N, D, G)
        qk = tl.dot(q, tl.trans(x))
    elif MODE == 3:  # KIVI K: per channel, token blocks of TG
        x = _kivi_k_tile(k0 + bh * Lq * (D // 4), k1 + bh * (Lq // TG) * D, k2 + bh * (Lq // TG) * D,
                         n, nmask, n0, end, ELEM, BLOCK_N, D, TG)
        qk = tl.dot(q, tl.trans(x))
    elif MODE == 4:  # int2 per token + fp16 outlier channels
        kc = k0 + bh * L * (D // 4)
        ks = k1 + bh * L
        kz = k2 + bh * L
        kout = k4 + bh * L * NOC
        if ELEM:
            x = _outlier_k_elem_tile(kc, ks, kz, k3 + kh * NOC, kout, n, nmask, D, NOC)
            qk = tl.dot(q, tl.trans(x))
        else:
            c = _unpack_int2_row(kc, n, nmask, BLOCK_N, D)
            s = tl.load(ks + n, mask=nmask, other=0.0).to(tl.float32)
            z = tl.load(kz + n, mask=nmask, other=0.0).to(tl.float32)
            jo = tl.arange(0, NOCP)
            ko = tl.load(kout + n[:, None] * NOC + jo[None, :], mask=nmask[:, None] & (jo < NOC)[None, :],
                         other=0.0)
            qk = tl.dot(qa, tl.trans(c)) * s[None, :] + qsum[:, None] * z[None, :]
            qk = tl.dot(qo, tl.trans(ko), acc=qk)
    else:  # MODE == 5: fp16 window (KIVI residual), rows Lq .. L-1
        k = tl.load(k3 + bh * WIN * D + (n - Lq)[:, None] * D + d[None, :], mask=nmask[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k))
    return qk


@triton.jit
def _pv(p, n, nmask, n0, end, bh, L, Lq,
        v0, v1, v2, v3, v4, v5,
        D: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr, ELEM: tl.constexpr,
        G: tl.constexpr, KMAX: tl.constexpr, NNZ: tl.constexpr, WIN: tl.constexpr, TG: tl.constexpr):
    """p @ v for one block: p [HP, BLOCK_N] fp32 -> [HP, D] fp32."""
    d = tl.arange(0, D)
    if MODE == 0:
        v = tl.load(v0 + bh * L * D + n[:, None] * D + d[None, :], mask=nmask[:, None], other=0.0)
        pv = _dot_bf16(p.to(tl.bfloat16), v)
    elif MODE == 1:
        vc = v0 + bh * L * D
        vs = v1 + bh * L
        if ELEM:
            code = tl.load(vc + n[:, None] * D + d[None, :], mask=nmask[:, None], other=0).to(tl.float32)
            idx = n[:, None] + tl.zeros([1, D], tl.int32)
            x = _elem_affine(code, vs, vs, idx, nmask[:, None], False)
            pv = tl.dot(p.to(tl.float16), x)
        else:
            c = _int8_group_codes(vc, n, nmask, D)
            s = tl.load(vs + n, mask=nmask, other=0.0).to(tl.float32)
            pv = tl.dot((p * s[None, :]).to(tl.float16), c)
    elif MODE == 2:
        x = _grouped_tile(v0 + bh * L * (D // 2), v1 + bh * L * (D // G), v2 + bh * L * (D // G),
                          n, nmask, ELEM, 4, BLOCK_N, D, G)
        pv = tl.dot(p.to(tl.float16), x)
    elif MODE == 3:  # KIVI V: per token, groups of TG channels
        x = _grouped_tile(v0 + bh * Lq * (D // 4), v1 + bh * Lq * (D // TG), v2 + bh * Lq * (D // TG),
                          n, nmask, ELEM, 2, BLOCK_N, D, TG)
        pv = tl.dot(p.to(tl.float16), x)
    elif MODE == 4:
        vc = v0 + bh * L * (D // 4)
        vs = v1 + bh * L
        vz = v2 + bh * L
        vptr = v3 + bh * (L + 1)
        vcol = v4 + bh * L * NNZ
        vval = v5 + bh * L * NNZ
        if ELEM:
            x = _outlier_v_elem_tile(vc, vs, vz, vptr, vcol, vval, n, nmask, D, KMAX)
        else:
            c = _unpack_int2_row(vc, n, nmask, BLOCK_N, D)
            s = tl.load(vs + n, mask=nmask, other=0.0)
            z = tl.load(vz + n, mask=nmask, other=0.0)
            x = c * s[:, None] + z[:, None] + _outlier_v_delta(vptr, vcol, vval, n, nmask, BLOCK_N, D, KMAX)
        pv = tl.dot(p.to(tl.float16), x)
    else:
        v = tl.load(v3 + bh * WIN * D + (n - Lq)[:, None] * D + d[None, :], mask=nmask[:, None], other=0.0)
        pv = tl.dot(p.to(tl.float16), v)
    return pv


@triton.jit
def _attend(q, qa, qo, qsum, m_i, l_i, acc, start, end, bh, kh, L, Lq, qk_scale,
            k0, k1, k2, k3, k4, v0, v1, v2, v3, v4, v5,
            D: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr, ELEM: tl.constexpr,
            G: tl.constexpr, NOC: tl.constexpr, NOCP: tl.constexpr, KMAX: tl.constexpr,
            NNZ: tl.constexpr, WIN: tl.constexpr, TG: tl.constexpr):
    """Online softmax over tokens [start, end) in blocks of BLOCK_N (exp2 domain)."""
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < end
        qk = _scores(q, qa, qo, qsum, n, nmask, n0, end, bh, kh, L, Lq, k0, k1, k2, k3, k4,
                     D, BLOCK_N, MODE, ELEM, G, NOC, NOCP, WIN, TG)
        qk = tl.where(nmask[None, :], qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _pv(p, n, nmask, n0, end, bh, L, Lq, v0, v1, v2, v3, v4, v5,
                                         D, BLOCK_N, MODE, ELEM, G, KMAX, NNZ, WIN, TG)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit(do_not_specialize=["L", "Lq", "tps", "S_q", "S_tot"])
def _split_kernel(q_ptr, pm_ptr, pl_ptr, pacc_ptr,
                  k0, k1, k2, k3, k4, v0, v1, v2, v3, v4, v5,
                  L, Lq, tps, S_q, S_tot, qk_scale,
                  HKV: tl.constexpr, QH: tl.constexpr, HP: tl.constexpr, D: tl.constexpr,
                  BLOCK_N: tl.constexpr, FMT: tl.constexpr, ELEM: tl.constexpr, G: tl.constexpr,
                  NOC: tl.constexpr, NOCP: tl.constexpr, KMAX: tl.constexpr, NNZ: tl.constexpr,
                  WIN: tl.constexpr, TG: tl.constexpr):
    """Split-K decode attention. Program (s, kh, b): query heads kh*QH .. kh*QH+QH-1 (padded to
    HP rows) of sequence b over quantized tokens [s*tps, min((s+1)*tps, Lq)); with WIN > 0 the
    program s == S_q reads the fp16 window (tokens Lq .. L-1) instead. Writes the partial
    (m, l, acc) (exp2 domain, acc unnormalized) at split index s of S_tot."""
    s = tl.program_id(0)
    kh = tl.program_id(1)
    b = tl.program_id(2)
    bh = (b * HKV + kh).to(tl.int64)
    h = tl.arange(0, HP)
    hmask = h < QH
    d = tl.arange(0, D)
    qrow = b * (HKV * QH) + kh * QH + h
    q = tl.load(q_ptr + qrow[:, None] * D + d[None, :], mask=hmask[:, None], other=0.0)
    if FMT != 0:
        q = q.to(tl.float16)
    if FMT == 4 and not ELEM:
        jo = tl.arange(0, NOCP)
        chm = jo < NOC
        ch = tl.load(k3 + kh * NOC + jo, mask=chm, other=0).to(tl.int32)
        hit = (d[:, None] == ch[None, :]) & chm[None, :]
        is_out = tl.max(hit.to(tl.int32), 1) > 0
        qa = tl.where(is_out[None, :], 0.0, q).to(tl.float16)
        qo = tl.load(q_ptr + qrow[:, None] * D + ch[None, :], mask=hmask[:, None] & chm[None, :],
                     other=0.0).to(tl.float16)
        qsum = tl.sum(qa.to(tl.float32), 1)
    else:
        qa = q
        qo = q
        qsum = tl.zeros([HP], tl.float32)
    m_i = tl.full([HP], float("-inf"), tl.float32)
    l_i = tl.zeros([HP], tl.float32)
    acc = tl.zeros([HP, D], tl.float32)
    start = s * tps
    end = tl.minimum(start + tps, Lq)
    if WIN > 0:
        if s == S_q:
            m_i, l_i, acc = _attend(q, qa, qo, qsum, m_i, l_i, acc, Lq, L, bh, kh, L, Lq, qk_scale,
                                    k0, k1, k2, k3, k4, v0, v1, v2, v3, v4, v5,
                                    D, BLOCK_N, 5, ELEM, G, NOC, NOCP, KMAX, NNZ, WIN, TG)
        else:
            m_i, l_i, acc = _attend(q, qa, qo, qsum, m_i, l_i, acc, start, end, bh, kh, L, Lq, qk_scale,
                                    k0, k1, k2, k3, k4, v0, v1, v2, v3, v4, v5,
                                    D, BLOCK_N, FMT, ELEM, G, NOC, NOCP, KMAX, NNZ, WIN, TG)
    else:
        m_i, l_i, acc = _attend(q, qa, qo, qsum, m_i, l_i, acc, start, end, bh, kh, L, Lq, qk_scale,
                                k0, k1, k2, k3, k4, v0, v1, v2, v3, v4, v5,
                                D, BLOCK_N, FMT, ELEM, G, NOC, NOCP, KMAX, NNZ, WIN, TG)
    prow = qrow * S_tot + s
    tl.store(pm_ptr + prow, m_i, mask=hmask)
    tl.store(pl_ptr + prow, l_i, mask=hmask)
    tl.store(pacc_ptr + prow.to(tl.int64)[:, None] * D + d[None, :], acc, mask=hmask[:, None])


@triton.jit(do_not_specialize=["S_tot"])
def _reduce_kernel(pm_ptr, pl_ptr, pacc_ptr, out_ptr, S_tot, D: tl.constexpr, SC: tl.constexpr):
    """Combine the S_tot partials of one (sequence, query head): out = sum w*acc / sum w*l,
    w = 2^(m - max m); written as bf16."""
    row = tl.program_id(0)
    si = tl.arange(0, SC)
    d = tl.arange(0, D)
    m_vec = tl.full([SC], float("-inf"), tl.float32)
    for s0 in range(0, S_tot, SC):
        m_vec = tl.maximum(m_vec, tl.load(pm_ptr + row * S_tot + s0 + si, mask=s0 + si < S_tot,
                                          other=float("-inf")))
    m_max = tl.max(m_vec, 0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    l_vec = tl.zeros([SC], tl.float32)
    acc = tl.zeros([SC, D], tl.float32)
    for s0 in range(0, S_tot, SC):
        sm = s0 + si < S_tot
        m = tl.load(pm_ptr + row * S_tot + s0 + si, mask=sm, other=float("-inf"))
        w = tl.exp2(m - m_max)
        l_vec += w * tl.load(pl_ptr + row * S_tot + s0 + si, mask=sm, other=0.0)
        a = tl.load(pacc_ptr + (row * S_tot + s0 + si).to(tl.int64)[:, None] * D + d[None, :],
                    mask=sm[:, None], other=0.0)
        acc += w[:, None] * a
    o = tl.sum(acc, 0) / tl.sum(l_vec, 0)
    tl.store(out_ptr + row.to(tl.int64) * D + d, o.to(tl.bfloat16))
