"""Lowering of one decode step of a dense decoder (Llama-style) to an op graph.

Per layer and per chip (tensor parallel degree ``tp``): attention RMSNorm, QKV projection,
RoPE with the KV-cache append, attention over every sequence's cache (one batched kernel,
split over sequences, KV heads and KV blocks as FlashDecoding does), O projection (the
residual add fused), an all-reduce when ``tp > 1``, FFN RMSNorm, the FFN block, and a second
all-reduce. Before the layers: the embedding gather; after: the final norm, the LM head
and the argmax. Layers are split evenly over ``pp`` pipeline stages; a point-to-point
transfer over the chip links joins two stages.

Bytes come from the formats (sim.formats); the FFN block is a strategy (``DenseFFN`` here;
the Mixture-of-Experts block lives in sim.lowering.moe). What is ignored: prefill, speculative
decoding, paged-block fragmentation, sampling beyond argmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from sim.config.hardware import HardwareProfile
from sim.config.model import ModelSpec
from sim.formats import Format
from sim.lowering.graph import Access, Builder, Op, OpGraph

ACT_BYTES = 2  # activations in bf16

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


class FFNBlock(Protocol):
    def lower(self, plan: "Plan", b: Builder, layer: int, batch: int) -> None: ...

    def weight_bytes_per_chip(self, plan: "Plan", layer: int) -> int: ...


@dataclass
class Plan:
    """Everything about a run that does not change from step to step."""

    model: ModelSpec
    hardware: HardwareProfile
    weights: Format
    kv: Format
    tp: int = 1
    pp: int = 1
    software: str = "fused"
    ffn: FFNBlock | None = None
    act_level: str = ""
    store: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self.store = self.hardware.store.name
        shared = self.hardware.shared_sram
        self.act_level = shared.name if shared is not None else self.store
        if self.ffn is None:
            self.ffn = DenseFFN()
        m = self.model
        self.heads = max(1, m.heads // self.tp)
        self.kv_heads = max(1, m.kv_heads // self.tp)  # KV heads are replicated when tp > kv_heads
        self.q_width = self.heads * m.head_dim
        self.k_width = self.kv_heads * m.head_dim * m.k_width // (m.kv_heads * m.head_dim)
        self.v_width = self.kv_heads * m.head_dim * m.v_width // (m.kv_heads * m.head_dim)
        self.vocab = math.ceil(m.vocab / self.tp)
        self.layers_per_stage = math.ceil(m.layers / self.pp)  # the fullest stage
        self.kernels = KERNELS[self.software]

    def stage_of(self, layer: int) -> int:
        return next(s for s in range(self.pp) if layer in self.stage_layers(s))

    def stage_layers(self, stage: int) -> range:
        """Layers of ``stage``: split as evenly as possible (sizes differ by at most one)."""
        layers = self.model.layers
        return range(stage * layers // self.pp, (stage + 1) * layers // self.pp)

    # -- per-chip weight bytes -------------------------------------------------------------
    def attention_weight_bytes(self) -> int:
        h, w = self.model.hidden, self.weights
        qkv = w.weight_bytes(self.q_width + self.k_width + self.v_width, h)
        return qkv + w.weight_bytes(h, self.q_width)

    def norm_bytes(self) -> int:
        return self.model.hidden * ACT_BYTES

    def weight_bytes_per_chip(self, stage: int) -> int:
        """Weights one chip of ``stage`` holds: its layers, plus embeddings and LM head at
        the ends of the pipeline."""
        total = 0
        for layer in self.stage_layers(stage):
            total += self.attention_weight_bytes() + 2 * self.norm_bytes()
            total += self.ffn.weight_bytes_per_chip(self, layer)
        if stage == 0:
            total += self.embed_bytes()
        if stage == self.pp - 1:
            total += self.norm_bytes() + (0 if self.model.tied_embeddings and self.pp == 1 else self.lm_head_bytes())
        return total

    def embed_bytes(self) -> int:
        return self.weights.weight_bytes(self.vocab, self.model.hidden)

    def lm_head_bytes(self) -> int:
        return self.weights.weight_bytes(self.vocab, self.model.hidden)


@dataclass
class DenseFFN:
    """SwiGLU (or GELU) FFN: gate+up projection, activation, down projection."""

    layer_invariant = True  # every layer lowers to the same ops (the lowering may copy them)

    def weight_bytes_per_chip(self, plan: Plan, layer: int) -> int:
        m, w = plan.model, plan.weights
        ffn = math.ceil(m.ffn / plan.tp)
        up_rows = (m.ffn_matrices - 1) * ffn
        return w.weight_bytes(up_rows, m.hidden) + w.weight_bytes(m.hidden, ffn)

    def lower(self, plan: Plan, b: Builder, layer: int, batch: int) -> None:
        m = plan.model
        ffn = math.ceil(m.ffn / plan.tp)
        up_rows = (m.ffn_matrices - 1) * ffn
        matmul(plan, b, "gate_up", layer, batch, m.hidden, up_rows)
        vector(plan, b, "silu_mul", layer, reads=batch * up_rows * ACT_BYTES,
               writes=batch * ffn * ACT_BYTES, ops=batch * ffn * VEC_OPS["silu_mul"], rows=batch,
               kernels=plan.kernels["silu_mul"])
        matmul(plan, b, "down", layer, batch, ffn, m.hidden, residual=True)


def matmul(plan: Plan, b: Builder, name: str, layer: int, batch: int, k: int, n: int,
           residual: bool = False, weights_level: str | None = None, category: str = "weights"):
    """x[batch, k] @ W[k, n] with W in the weight format, read once from the store."""
    w = plan.weights.weight_read(n, k)
    act = plan.act_level
    extra = batch * n * ACT_BYTES if residual else 0
    accesses = [
        Access(weights_level or plan.store, w.stream_bytes, category),
        Access(act, batch * k * ACT_BYTES + extra, "act"),
        Access(act, batch * n * ACT_BYTES, "act", write=True),
    ]
    if w.gather_bytes:
        accesses.append(Access(weights_level or plan.store, w.gather_bytes, "outliers", granule=w.gather_granule_bytes))
    return b.add(name, layer, "matmul", accesses, matrix_flops=2 * batch * k * n, matrix_m=batch,
                 vector_ops=w.dequant_ops + (batch * n if residual else 0), dequant_ops=w.dequant_ops,
                 dtype=plan.weights.matmul_dtype, parallelism=math.ceil(n / 64) * math.ceil(k / 512),  # split-K
                 kernels=plan.kernels["matmul"] + (plan.kernels["residual"] if residual else 0))


def vector(plan: Plan, b: Builder, name: str, layer: int, *, reads: int, writes: int, ops: int, rows: int,
           kernels: int = 1, extra=()):
    act = plan.act_level
    accesses = [Access(act, reads, "act"), Access(act, writes, "act", write=True), *extra]
    return b.add(name, layer, "vector", accesses, vector_ops=ops, parallelism=max(1, rows), kernels=kernels)


def collective(plan: Plan, b: Builder, name: str, layer: int, kind: str, size: int, group: int):
    if group <= 1:
        return None
    return b.add(name, layer, "collective", [Access("link", size, "link")], collective=(kind, size, group),
                 parallelism=group, kernels=plan.kernels["allreduce"])


def attention(plan: Plan, b: Builder, layer: int, contexts: tuple[int, ...]):
    """One batched decode-attention kernel over all sequences' caches (incl. the new token)."""
    m = plan.model
    stream, gather, granule, dequant, total_ctx, splits = _kv_traffic(plan, contexts)
    batch = len(contexts)
    flops = 4 * plan.heads * m.head_dim * total_ctx  # QK^T and PV
    softmax = VEC_OPS["softmax"] * plan.heads * total_ctx
    act = plan.act_level
    accesses = [
        Access(plan.store, stream, "kv"),
        Access(plan.store, gather, "outliers", granule=granule or None),
        Access(act, batch * plan.q_width * ACT_BYTES, "act"),
        Access(act, batch * plan.q_width * ACT_BYTES, "act", write=True),
    ]
    return b.add("attention", layer, "attention", accesses, matrix_flops=flops,
                 matrix_m=m.heads // m.kv_heads, vector_ops=softmax + dequant, dequant_ops=dequant,
                 dtype="bf16", parallelism=splits * plan.kv_heads, kernels=plan.kernels["attention"],
                 tags={"tokens": total_ctx})


def _kv_traffic(plan: Plan, contexts: tuple[int, ...]) -> tuple[int, int, int, int, int, int]:
    """KV bytes and work of one layer's attention over ``contexts`` (the same in every
    layer of a step, so computed once per step)."""
    cached = plan.extra.get("kv_traffic")
    if cached is not None and cached[0] == contexts:
        return cached[1]
    kv = plan.kv
    stream = gather = dequant = granule = total_ctx = splits = 0
    for ctx in contexts:
        t = kv.kv_read(ctx, plan.k_width, plan.v_width)
        stream += t.stream_bytes
        gather += t.gather_bytes
        granule = granule or t.gather_granule_bytes
        dequant += t.dequant_ops
        total_ctx += ctx
        splits += max(1.0, ctx / 256)  # KV split into 256-token blocks; fractional keeps time monotone in ctx
    result = (stream, gather, granule, dequant, total_ctx, splits)
    plan.extra["kv_traffic"] = (contexts, result)
    return result


def lower_step(plan: Plan, contexts: tuple[int, ...], step: int = 0) -> OpGraph:
    """The op graph of one decode step for sequences whose caches hold ``contexts`` tokens
    (after this step's token is appended).

    For a layer-invariant model only the attention ops depend on the contexts; a step with
    the same batch as the previous one reuses the previous graph's other ops and lowers
    attention afresh (tests check this equals a full lowering)."""
    contexts = tuple(contexts)
    cached = plan.extra.get("step_graph")
    if cached is not None and cached[0] == len(contexts) and getattr(plan.ffn, "layer_invariant", False):
        return _relower_attention(plan, cached[1], contexts, step)
    graph = _lower_step(plan, contexts, step)
    if getattr(plan.ffn, "layer_invariant", False):
        plan.extra["step_graph"] = (len(contexts), graph)
    return graph


def _relower_attention(plan: Plan, previous: OpGraph, contexts: tuple[int, ...], step: int) -> OpGraph:
    probe = Builder()
    fresh = attention(plan, probe, 0, contexts)
    ops = []
    for op in previous.ops:
        if op.kind == "attention":
            op = Op(op.idx, op.name, op.layer, op.kind, fresh.accesses, fresh.matrix_flops, fresh.matrix_m,
                    fresh.vector_ops, fresh.dequant_ops, fresh.dtype, fresh.parallelism, fresh.kernels, op.deps,
                    op.stream, op.stage, op.host_sync, op.host_ns, op.collective, fresh.tags)
        ops.append(op)
    return OpGraph(ops, step=step, batch=len(contexts), contexts=contexts, stages=plan.pp)


def _lower_step(plan: Plan, contexts: tuple[int, ...], step: int) -> OpGraph:
    m = plan.model
    batch = len(contexts)
    act_row = batch * m.hidden * ACT_BYTES
    ops = []
    for stage in range(plan.pp):
        b = Builder(stage)
        b.ops = ops
        if stage == 0:
            b.add("embed", -1, "vector", [
                Access(plan.store, batch * plan.weights.weight_bytes(1, m.hidden), "weights",
                       granule=plan.weights.weight_bytes(1, m.hidden)),
                Access(plan.act_level, act_row, "act", write=True),
            ], vector_ops=batch * m.hidden, parallelism=batch, kernels=plan.kernels["embed"])
        else:
            b.add("recv_activations", -1, "p2p", [Access("link", act_row, "link")],
                  collective=("p2p", act_row, 2), deps=(ops[-1].idx,), parallelism=1, kernels=plan.kernels["p2p"])
        _lower_layers(plan, b, plan.stage_layers(stage), contexts)
        if stage == plan.pp - 1:
            vector(plan, b, "final_norm", -1, reads=act_row + plan.norm_bytes(), writes=act_row,
                   ops=batch * m.hidden * VEC_OPS["rmsnorm"], rows=batch, kernels=plan.kernels["rmsnorm"])
            matmul(plan, b, "lm_head", -1, batch, m.hidden, plan.vocab)
            vector(plan, b, "argmax", -1, reads=batch * plan.vocab * ACT_BYTES, writes=batch * 8,
                   ops=batch * plan.vocab * VEC_OPS["argmax"], rows=batch, kernels=plan.kernels["argmax"])
            collective(plan, b, "gather_tokens", -1, "allgather", batch * 8, plan.tp)
    return OpGraph(ops, step=step, batch=batch, contexts=tuple(contexts), stages=plan.pp)


def _lower_layers(plan: Plan, b: Builder, layers: range, contexts: tuple[int, ...]) -> None:
    """Lower ``layers``. When the FFN block says its layers are alike (``layer_invariant``)
    and the first two layers indeed lower to the same ops, the rest are copies with shifted
    indices rather than lowered again; otherwise (MoE routing, dense-then-MoE stacks) every
    layer is lowered."""
    ops = b.ops
    layers = list(layers)
    if not getattr(plan.ffn, "layer_invariant", False):  # e.g. MoE: routing differs per layer
        for layer in layers:
            lower_layer(plan, b, layer, contexts)
        return
    spans = []
    for layer in layers[:2]:
        start = len(ops)
        lower_layer(plan, b, layer, contexts)
        spans.append((start, len(ops)))
    if len(spans) < 2 or not _same_ops(ops[slice(*spans[0])], ops[slice(*spans[1])]):
        for layer in layers[2:]:
            lower_layer(plan, b, layer, contexts)
        return
    template_start, template_end = spans[1]
    width = template_end - template_start
    for k, layer in enumerate(layers[2:], start=1):
        shift = k * width
        for proto in ops[template_start:template_end]:
            ops.append(Op(proto.idx + shift, proto.name, layer, proto.kind, proto.accesses, proto.matrix_flops,
                          proto.matrix_m, proto.vector_ops, proto.dequant_ops, proto.dtype, proto.parallelism,
                          proto.kernels, tuple(d + shift for d in proto.deps), proto.stream, proto.stage,
                          proto.host_sync, proto.host_ns, proto.collective, proto.tags))
    for key, last in list(b._last.items()):
        if template_start <= last < template_end:
            b._last[key] = last + (len(layers) - 2) * width


def _signature(op: Op, base: int) -> tuple:
    return (op.idx - base, op.name, op.kind, op.accesses, op.matrix_flops, op.matrix_m, op.vector_ops,
            op.dequant_ops, op.dtype, op.parallelism, op.kernels, tuple(d - base for d in op.deps), op.stream,
            op.stage, op.host_sync, op.host_ns, op.collective, repr(sorted(op.tags.items())))


def _same_ops(first: list[Op], second: list[Op]) -> bool:
    if len(first) != len(second) or not first:
        return False
    return all(_signature(a, first[0].idx) == _signature(b, second[0].idx) for a, b in zip(first, second, strict=True))


def lower_layer(plan: Plan, b: Builder, layer: int, contexts: tuple[int, ...]) -> None:
    m = plan.model
    batch = len(contexts)
    act_row = batch * m.hidden * ACT_BYTES
    norm = dict(reads=act_row + plan.norm_bytes(), writes=act_row, ops=batch * m.hidden * VEC_OPS["rmsnorm"],
                rows=batch, kernels=plan.kernels["rmsnorm"])
    vector(plan, b, "attn_norm", layer, **norm)
    qkv = plan.q_width + plan.k_width + plan.v_width
    matmul(plan, b, "qkv", layer, batch, m.hidden, qkv)
    append = plan.kv.kv_append(plan.k_width, plan.v_width)
    vector(plan, b, "rope_append", layer, reads=batch * qkv * ACT_BYTES,
           writes=batch * plan.q_width * ACT_BYTES,
           ops=batch * (plan.q_width + plan.k_width) * VEC_OPS["rope"] + batch * (plan.k_width + plan.v_width) * 4,
           rows=batch, kernels=plan.kernels["rope_append"],
           extra=(Access(plan.store, batch * append.stream_bytes, "kv", write=True),))
    attention(plan, b, layer, contexts)
    matmul(plan, b, "o_proj", layer, batch, plan.q_width, m.hidden, residual=True)
    collective(plan, b, "allreduce_attn", layer, "allreduce", act_row, plan.tp)
    vector(plan, b, "ffn_norm", layer, **norm)
    plan.ffn.lower(plan, b, layer, batch)
    collective(plan, b, "allreduce_ffn", layer, "allreduce", act_row, plan.tp)
