"""Op builders shared by the dense and MoE lowerings: matmuls, element-wise ops,
collectives, decode attention, and the per-chip sizes they imply.

Every builder reads only the sealed RunSetup and appends to a Builder; none advances time.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from sim.decode_trace import length_counts
from sim.errors import ConfigError
from sim.formats import get_format
from sim.formats.spec import kv_quant
from sim.lowering.graph import Access, Builder, Op, Program, read, write
from sim.lowering.kernels import Plan, with_prologue
from sim.setup import ACT_BYTES, RunSetup

NOT_WEIGHTS = ("router",)  # matmuls whose weights stay in bf16 under a quantized weight format
_BF16 = get_format("bf16")

# Vector operations per element for the element-wise kernels (an estimate of the
# instruction mix: loads/stores are counted as bytes, not here).
VEC_OPS = {"rmsnorm": 5, "rope": 6, "silu_mul": 8, "softmax": 5, "residual": 1, "argmax": 2, "softcap": 3}
NORM_OPS = ("attn_norm", "ffn_norm", "final_norm", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm")

# -- sizes ---------------------------------------------------------------------------------


def attention_weight_bytes(setup: RunSetup) -> int:
    h, w = setup.model.hidden, setup.weights
    return w.weight_bytes(setup.q_width + setup.k_width + setup.v_width, h) + w.weight_bytes(h, setup.q_width)


def norm_bytes(setup: RunSetup) -> int:
    return setup.model.hidden * ACT_BYTES


def qk_norm_bytes(setup: RunSetup) -> tuple[int, int]:
    """Gain-weight bytes one chip reads for the Q and the K norm of a layer ((0, 0) without
    QK-norm): a whole-projection norm is sharded with the heads, a per-head norm is not."""
    m = setup.model
    if m.qk_norm == "full":
        return setup.q_width * ACT_BYTES, setup.k_width * ACT_BYTES
    if m.qk_norm == "per_head":
        return m.head_dim * ACT_BYTES, m.head_dim * ACT_BYTES
    return 0, 0


def dense_ffn_weight_bytes(setup: RunSetup) -> int:
    m, w = setup.model, setup.weights
    ffn = math.ceil(m.ffn / setup.tp)
    return w.weight_bytes((m.ffn_matrices - 1) * ffn, m.hidden) + w.weight_bytes(m.hidden, ffn)


def vocab_bytes(setup: RunSetup) -> int:
    """One chip's shard of the embedding table (and of the LM head)."""
    return setup.weights.weight_bytes(setup.vocab, setup.model.hidden)


# -- op builders ---------------------------------------------------------------------------


_PLANS: dict[tuple, tuple] = {}  # what kernels_of reads (the stack by identity) -> (the stack, its plan table)
_PLANS_LIMIT = 64


def op_expander(setup: RunSetup):
    """The Builder's hook that runs each op through the setup's software stack: the op's
    kernels for the run's KV format and the model's variants where the stack has them, the
    matmul dtype's prologue before each matrix kernel, and the sizes temporaries may take."""
    stack = setup.stack
    kv = setup.kv.name
    if stack.kv_formats and kv not in stack.kv_formats and kv_quant(setup.kv):
        raise ConfigError(f"software stack {stack.name}", "kv_formats",
                          f"has no kernels for the KV format {kv!r} (it has: {', '.join(stack.kv_formats)}); "
                          f"add kv_formats.{kv} or run another stack")
    new_kv_share = (setup.k_width + setup.v_width) / (setup.q_width + setup.k_width + setup.v_width)
    plans = _plan_table(setup)

    def plan_of(name: str, kind: str, parts) -> Plan:
        key = (name, kind, parts and tuple(parts.items()))
        plan = plans.get(key)
        if plan is None:
            plan = plans[key] = Plan(kernels_of(setup, name, kind), kind, parts, stack.calls_ns)
        return plan

    def run(name: str, kind: str, accesses, work: dict, parts=None, values: int = 0, quant=None,
            active: int = 1):
        sizes = {}
        if kind == "attention":  # the KV it reads, as bf16 (a dequantizing cache's copies)
            sizes["kv_dense"] = (setup.store, values * ACT_BYTES)
        if name == "rope_append":  # the new token's K and V, as bf16
            x = sum(a.bytes for a in accesses if a.role == "x" and not a.write)
            sizes["new_kv"] = (setup.act_level, round(x * new_kv_share))
        plan = plan_of(name, kind, parts)
        short = plan.uncovered(accesses, setup.store)
        if short is not None:
            role, write, moved, share = short
            raise ConfigError(setup.spec.software or f"software stack {stack.name}", f"ops.{name}",
                              f"its kernels {'write' if write else 'read'} {share:.0%} of the op's {role!r} "
                              f"({moved:,} bytes in {setup.store}); expected each byte the op moves in the backing "
                              "store moved by one of its kernels (a role's shares summing to 1): a stack cannot "
                              "skip them and run below the byte floor")
        return plan.kernels(
            accesses, matrix_flops=work.get("matrix_flops", 0), matrix_m=work.get("matrix_m", 1),
            vector_ops=work.get("vector_ops", 0), dequant_ops=work.get("dequant_ops", 0),
            dtype=work.get("dtype", "bf16"), parallelism=work.get("parallelism", 1), active=active, values=values,
            quant=quant, act_level=setup.act_level, sizes=sizes)

    return run


def _plan_table(setup: RunSetup) -> dict[tuple, Plan]:
    """(op name, kind, parts) -> its expansion Plan, shared by the setups that ``kernels_of``
    reads alike (the same stack object, KV format, model variants and matmul dtype): the same
    for every layer, step and batch, so worked out once. Bounded; an entry keeps its stack, so
    the stack's identity in the key is not reused while the entry lives."""
    m = setup.model
    key = (id(setup.stack), setup.kv.name, m.norm_unit_offset, m.head_dim, m.fused_projections, m.qkv_bias,
           setup.weights.matmul_dtype)
    hit = _PLANS.get(key)
    if hit is None:
        if len(_PLANS) >= _PLANS_LIMIT:
            _PLANS.clear()
        hit = _PLANS[key] = (setup.stack, {})
    return hit[1]


def kernels_of(setup: RunSetup, name: str, kind: str) -> tuple | None:
    """The stack's kernels for op ``name``: for the run's KV format, the model's variants,
    fused projections and the matmul dtype's prologue (and bias epilogue)."""
    stack, m = setup.stack, setup.model
    norm_variants = ("unit_offset",) if m.norm_unit_offset else ()
    variants = norm_variants if name in NORM_OPS else ((f"d{m.head_dim}",) if name == "attention" else ())
    specs = stack.kernels_for(name, kv=setup.kv.name, variants=variants)
    if name in ("qkv", "gate_up") and m.fused_projections:
        specs = stack.ops[f"{name}@fused"].kernels if f"{name}@fused" in stack.ops else None
    if name not in NOT_WEIGHTS and name not in stack.unquantized:
        dtype = setup.weights.matmul_dtype
        specs = with_prologue(specs, stack.prologue(dtype), kind,
                              stack.bias_epilogue(dtype) if name == "qkv" and m.qkv_bias else ())
    return specs


def builder(setup: RunSetup, ops: Program | None = None, stage: int = 0, expand=None) -> Builder:
    """A Builder whose ops run through the setup's software stack (``expand``: the setup's
    ``op_expander``, where the caller keeps one)."""
    return Builder(ops, stage, expand=expand or op_expander(setup), streams=setup.stack.side_stream)


def matmul(setup: RunSetup, b: Builder, name: str, layer: int, batch: int, k: int, n: int,
           residual: bool = False, parts: dict[str, float] | None = None) -> Op:
    """x[batch, k] @ W[k, n] with W in the weight format (bf16 where the stack's quantization
    recipe leaves the matmul unquantized), read once from the store."""
    fmt = _BF16 if name in setup.stack.unquantized else setup.weights
    w = fmt.weight_read(n, k)
    act = setup.act_level
    extra = batch * n * ACT_BYTES if residual else 0
    accesses = [
        read(setup.store, w.stream_bytes, "weights", "w"),
        read(act, batch * k * ACT_BYTES, "act", "x"),
        read(act, extra, "act", "res"),
        write(act, batch * n * ACT_BYTES, "act", "y"),
    ]
    if w.gather_bytes:
        accesses.append(read(setup.store, w.gather_bytes, "outliers", "w", granule=w.gather_granule_bytes))
    return b.add(name, layer, "matmul", accesses, matrix_flops=2 * batch * k * n, matrix_m=batch,
                 vector_ops=w.dequant_ops + (batch * n if residual else 0), dequant_ops=w.dequant_ops,
                 dtype=fmt.matmul_dtype, parallelism=math.ceil(n / 64) * math.ceil(k / 512),  # split-K
                 parts=parts)


def vector(setup: RunSetup, b: Builder, name: str, layer: int, *, reads: int, writes: int, ops: int, rows: int,
           weights: int = 0, extra=(), **fields) -> Op:
    """An element-wise or row-wise op: reads ``reads`` activation bytes (and ``weights`` bytes
    of a small weight vector, e.g. a norm's gain), writes ``writes``."""
    act = setup.act_level
    accesses = [read(act, reads, "act", "x"), read(act, weights, "act", "w"),
                write(act, writes, "act", "y"), *extra]
    return b.add(name, layer, "vector", accesses, vector_ops=ops, parallelism=max(1, rows), **fields)


def collective(setup: RunSetup, b: Builder, name: str, layer: int, kind: str, size: int, group: int) -> Op | None:
    if group <= 1:
        return None
    return b.add(name, layer, "collective", [read("link", size, "link", "link")], collective=(kind, size, group),
                 parallelism=group)


class Ask(NamedTuple):
    """What an op asks of the hardware before the software stack expands it: its accesses and
    the other fields of its ``Work`` (plus ``values``, ``quant`` for the expansion), and its tags."""

    accesses: list[Access]
    fields: dict
    tags: tuple[tuple[str, object], ...]


def attention(setup: RunSetup, b: Builder, layer: int, contexts: tuple[int, ...]) -> Op:
    """One batched decode-attention kernel over all sequences' caches (see ``attention_ask``)."""
    ask = attention_ask(setup, layer, contexts)
    return b.add("attention", layer, "attention", ask.accesses, tags=ask.tags, **ask.fields)


def attention_ask(setup: RunSetup, layer: int, contexts: tuple[int, ...]) -> Ask:
    """What one batched decode-attention kernel over all sequences' caches (incl. the new
    token) asks. A sliding layer (``model.window``) reads only the last ``sliding_window``
    tokens of each cache; a soft-capped model pays cap x tanh(score / cap) on every score."""
    m = setup.model
    window = m.window(layer)
    if window is not None:
        contexts = tuple(min(ctx, window) for ctx in contexts)
    stream, gather, granule, dequant, total_ctx, splits = kv_traffic(setup, contexts)
    softcap = VEC_OPS["softcap"] * setup.heads * total_ctx if m.attn_logit_softcap else 0
    batch = len(contexts)
    act = setup.act_level
    accesses = [
        read(setup.store, stream, "kv", "kv"),
        read(setup.store, gather, "outliers", "kv", granule=granule or None),
        read(act, batch * setup.q_width * ACT_BYTES, "act", "x"),
        write(act, batch * setup.q_width * ACT_BYTES, "act", "y"),
    ]
    return Ask(accesses, dict(
        matrix_flops=4 * setup.heads * m.head_dim * total_ctx, matrix_m=m.heads // m.kv_heads,
        vector_ops=VEC_OPS["softmax"] * setup.heads * total_ctx + softcap + dequant, dequant_ops=dequant,
        dtype="bf16", parallelism=splits * setup.kv_heads,
        values=total_ctx * (setup.k_width + setup.v_width), quant=kv_quant(setup.kv)), (("tokens", total_ctx),))


def prefill_attention(setup: RunSetup, b: Builder, layer: int, prefill: tuple[tuple[int, int], ...]) -> Op:
    """Causal attention of prompt chunks (see ``prefill_attention_ask``)."""
    ask = prefill_attention_ask(setup, prefill)
    return b.add("attention_prefill", layer, "attention", ask.accesses, tags=ask.tags, **ask.fields)


def prefill_attention_ask(setup: RunSetup, prefill: tuple[tuple[int, int], ...]) -> Ask:
    """What causal attention of prompt chunks asks: each chunk of ``c`` tokens after
    ``before`` cached tokens reads its cache (old and new tokens) once and does 4 x heads x
    head_dim x c x (before + (c + 1) / 2) FLOPs (each query sees the tokens before it)."""
    m = setup.model
    stream, gather, granule, dequant, _total, splits = kv_traffic(setup, tuple(before + c for c, before in prefill))
    queries = sum(c for c, _ in prefill)
    pairs = sum(c * before + c * (c + 1) // 2 for c, before in prefill)  # (query, key) pairs
    act = setup.act_level
    accesses = [
        read(setup.store, stream, "kv", "kv"),
        read(setup.store, gather, "outliers", "kv", granule=granule or None),
        read(act, queries * setup.q_width * ACT_BYTES, "act", "x"),
        write(act, queries * setup.q_width * ACT_BYTES, "act", "y"),
    ]
    group = max(1, m.heads // m.kv_heads)
    return Ask(accesses, dict(
        matrix_flops=4 * setup.heads * m.head_dim * pairs, matrix_m=group * max(c for c, _ in prefill),
        vector_ops=VEC_OPS["softmax"] * setup.heads * pairs + dequant, dequant_ops=dequant,
        dtype="bf16", parallelism=max(splits, queries / 64) * setup.kv_heads,
        values=sum(before + c for c, before in prefill) * (setup.k_width + setup.v_width),
        quant=kv_quant(setup.kv)), (("tokens", pairs),))


def kv_traffic(setup: RunSetup, contexts: tuple[int, ...]) -> tuple[int, int, int, int, int, float]:
    """(stream bytes, gather bytes, gather granule, dequant ops, total context, splits) of one
    layer's attention over ``contexts`` (the same in every layer of a step)."""
    kv = setup.kv
    stream = gather = dequant = granule = total_ctx = 0
    splits = 0.0
    for ctx, n in length_counts(contexts):  # sequences of equal length cost the same
        t = kv.kv_read(ctx, setup.k_width, setup.v_width)
        stream += n * t.stream_bytes
        gather += n * t.gather_bytes
        granule = granule or t.gather_granule_bytes
        dequant += n * t.dequant_ops
        total_ctx += n * ctx
        splits += n * max(1.0, ctx / 256)  # KV split into 256-token blocks; fractional keeps time monotone in ctx
    return stream, gather, granule, dequant, total_ctx, splits


