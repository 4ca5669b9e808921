"""Op builders shared by the dense and MoE lowerings: matmuls, element-wise ops,
collectives, decode attention, and the per-chip sizes they imply.

Every builder reads only the sealed Setup and appends to a Builder; none advances time.
"""

from __future__ import annotations

import math
from collections import Counter

from sim.config.setup import ACT_BYTES, Setup
from sim.lowering.graph import Access, Builder, Op

# Vector operations per element for the element-wise kernels (an estimate of the
# instruction mix: loads/stores are counted as bytes, not here).
VEC_OPS = {"rmsnorm": 5, "rope": 6, "silu_mul": 8, "softmax": 5, "residual": 1, "argmax": 2}

# Kernel launches per op for two software stacks. "fused" is a serving stack (fused norms,
# fused RoPE + cache append, fused SwiGLU); "torch-eager" is a plain PyTorch step
# (calibration/decode_step.py), counted with the PyTorch profiler there.
KERNELS = {
    "fused": {"embed": 1, "rmsnorm": 1, "matmul": 1, "rope_append": 1, "attention": 1,
              "silu_mul": 1, "allreduce": 1, "p2p": 1, "argmax": 1, "residual": 0},
    # 30 kernels per layer, as the profiler counted in calibration/data/h200/decode_kernels.csv:
    # RoPE on q and k + cache writes = 8 mul, 4 add, 2 cat, 2 index_copy; cuDNN SDPA = flash
    # kernel + lean reduction; the O and down projections each add a residual add and a
    # cuBLASLt split-K reduce; SwiGLU = silu + mul.
    "torch-eager": {"embed": 1, "rmsnorm": 1, "matmul": 1, "rope_append": 16, "attention": 2,
                    "silu_mul": 2, "allreduce": 1, "p2p": 1, "argmax": 1, "residual": 2},
}


# -- sizes ---------------------------------------------------------------------------------


def attention_weight_bytes(setup: Setup) -> int:
    h, w = setup.model.hidden, setup.weights
    return w.weight_bytes(setup.q_width + setup.k_width + setup.v_width, h) + w.weight_bytes(h, setup.q_width)


def norm_bytes(setup: Setup) -> int:
    return setup.model.hidden * ACT_BYTES


def dense_ffn_weight_bytes(setup: Setup) -> int:
    m, w = setup.model, setup.weights
    ffn = math.ceil(m.ffn / setup.tp)
    return w.weight_bytes((m.ffn_matrices - 1) * ffn, m.hidden) + w.weight_bytes(m.hidden, ffn)


def vocab_bytes(setup: Setup) -> int:
    """One chip's shard of the embedding table (and of the LM head)."""
    return setup.weights.weight_bytes(setup.vocab, setup.model.hidden)


# -- op builders ---------------------------------------------------------------------------


def kernels(setup: Setup, what: str) -> int:
    return KERNELS[setup.software][what]


def matmul(setup: Setup, b: Builder, name: str, layer: int, batch: int, k: int, n: int,
           residual: bool = False) -> Op:
    """x[batch, k] @ W[k, n] with W in the weight format, read once from the store."""
    w = setup.weights.weight_read(n, k)
    act = setup.act_level
    extra = batch * n * ACT_BYTES if residual else 0
    accesses = [
        Access(setup.store, w.stream_bytes, "weights", role="w"),
        Access(act, batch * k * ACT_BYTES, "act", role="x"),
        Access(act, extra, "act", role="res"),
        Access(act, batch * n * ACT_BYTES, "act", write=True, role="y"),
    ]
    if w.gather_bytes:
        accesses.append(Access(setup.store, w.gather_bytes, "outliers", granule=w.gather_granule_bytes, role="w"))
    return b.add(name, layer, "matmul", accesses, matrix_flops=2 * batch * k * n, matrix_m=batch,
                 vector_ops=w.dequant_ops + (batch * n if residual else 0), dequant_ops=w.dequant_ops,
                 dtype=setup.weights.matmul_dtype, parallelism=math.ceil(n / 64) * math.ceil(k / 512),  # split-K
                 kernels=kernels(setup, "matmul") + (kernels(setup, "residual") if residual else 0))


def vector(setup: Setup, b: Builder, name: str, layer: int, *, reads: int, writes: int, ops: int, rows: int,
           kernels: int = 1, weights: int = 0, extra=(), **fields) -> Op:
    """An element-wise or row-wise op: reads ``reads`` activation bytes (and ``weights`` bytes
    of a small weight vector, e.g. a norm's gain), writes ``writes``."""
    act = setup.act_level
    accesses = [Access(act, reads, "act", role="x"), Access(act, weights, "act", role="w"),
                Access(act, writes, "act", write=True, role="y"), *extra]
    return b.add(name, layer, "vector", accesses, vector_ops=ops, parallelism=max(1, rows), kernels=kernels, **fields)


def collective(setup: Setup, b: Builder, name: str, layer: int, kind: str, size: int, group: int) -> Op | None:
    if group <= 1:
        return None
    return b.add(name, layer, "collective", [Access("link", size, "link", role="link")], collective=(kind, size, group),
                 parallelism=group, kernels=kernels(setup, "allreduce"))


def attention(setup: Setup, b: Builder, layer: int, contexts: tuple[int, ...]) -> Op:
    """One batched decode-attention kernel over all sequences' caches (incl. the new token)."""
    m = setup.model
    stream, gather, granule, dequant, total_ctx, splits = kv_traffic(setup, contexts)
    batch = len(contexts)
    act = setup.act_level
    accesses = [
        Access(setup.store, stream, "kv", role="kv"),
        Access(setup.store, gather, "outliers", granule=granule or None, role="kv"),
        Access(act, batch * setup.q_width * ACT_BYTES, "act", role="x"),
        Access(act, batch * setup.q_width * ACT_BYTES, "act", write=True, role="y"),
    ]
    return b.add("attention", layer, "attention", accesses, matrix_flops=4 * setup.heads * m.head_dim * total_ctx,
                 matrix_m=m.heads // m.kv_heads,
                 vector_ops=VEC_OPS["softmax"] * setup.heads * total_ctx + dequant, dequant_ops=dequant,
                 dtype="bf16", parallelism=splits * setup.kv_heads, kernels=kernels(setup, "attention"),
                 tags=(("tokens", total_ctx),))


def kv_traffic(setup: Setup, contexts: tuple[int, ...]) -> tuple[int, int, int, int, int, float]:
    """(stream bytes, gather bytes, gather granule, dequant ops, total context, splits) of one
    layer's attention over ``contexts`` (the same in every layer of a step)."""
    kv = setup.kv
    stream = gather = dequant = granule = total_ctx = 0
    splits = 0.0
    for ctx, n in Counter(contexts).items():  # sequences of equal length cost the same
        t = kv.kv_read(ctx, setup.k_width, setup.v_width)
        stream += n * t.stream_bytes
        gather += n * t.gather_bytes
        granule = granule or t.gather_granule_bytes
        dequant += n * t.dequant_ops
        total_ctx += n * ctx
        splits += n * max(1.0, ctx / 256)  # KV split into 256-token blocks; fractional keeps time monotone in ctx
    return stream, gather, granule, dequant, total_ctx, splits


