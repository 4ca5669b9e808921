"""Lowering of one decode step of a decoder (Llama-style) to an op graph.

Per layer and per chip (tensor parallel degree ``tp``): attention RMSNorm, QKV projection,
RoPE with the KV-cache append, attention over every sequence's cache (one batched kernel,
split over sequences, KV heads and KV blocks as FlashDecoding does), O projection (the
residual add fused), an all-reduce when ``tp > 1``, FFN RMSNorm, the FFN block, and a second
all-reduce. Before the layers: the embedding gather; after: the final norm, the LM head
and the argmax, which the host waits for (it needs the step's tokens). Models with QK-norm
(``qk_norm``) normalise the query and key projections before RoPE (``q_norm``, ``k_norm``).
Layers are split over ``pp`` pipeline stages by the RunSetup's partition (whole layers, or
half-layer units on a spatial machine: a stage may end after a layer's attention); a
point-to-point transfer over the chip links joins two stages (over the scale-out links where
the two stages sit in different groups). Placement (sim.lowering.placement) then moves each
access to the tier its data lives in and adds the staging transfers of streamed weights.

``lower_step(setup, step, position)`` is pure: it reads the sealed RunSetup and the step, and
returns a new graph. Bytes come from the formats (sim.formats); the FFN block of a layer is
dense here or Mixture-of-Experts (sim.lowering.moe). Prompt chunks mixed into a step
(``prefill``) run through the same ops. What is ignored: speculative decoding, paged-block
fragmentation, sampling beyond argmax.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache
from typing import NamedTuple

from sim.errors import SimulationError
from sim.lowering.graph import Builder, Op, OpGraph, Program, make_graph, read, write
from sim.lowering.moe import lower_moe, moe_weight_bytes_per_chip
from sim.lowering.ops import (
    VEC_OPS,
    attention,
    attention_weight_bytes,
    builder,
    collective,
    dense_ffn_weight_bytes,
    matmul,
    norm_bytes,
    prefill_attention,
    qk_norm_bytes,
    vector,
    vocab_bytes,
)
from sim.lowering.placement import place_ops
from sim.setup import ACT_BYTES, RunSetup


class StageWeights(NamedTuple):
    """The weight bytes one chip of a pipeline stage holds: everything but MoE expert weights,
    the MoE expert weights, and the most expert weight bytes of one of its units."""

    dense: int
    experts: int
    largest_experts: int


def stage_weight_bytes(setup: RunSetup, stage: int) -> StageWeights:
    """The weight bytes one chip of ``stage`` holds (``StageWeights``): each unit's dense part
    (the same in every layer) and, for an MoE layer's FFN, its experts."""
    m = setup.model
    ffn_norms = (m.norms_per_layer - m.norms_per_layer // 2) * norm_bytes(setup)  # pre-FFN (and post-FFN) norms
    tied = m.tied_embeddings and setup.pp == 1
    dense_part = {  # the dense weights of each kind of unit but an MoE layer's FFN (the same in every layer)
        "embed": vocab_bytes(setup),
        "head": norm_bytes(setup) + (0 if tied else vocab_bytes(setup)),
        "attn": attention_weight_bytes(setup) + m.norms_per_layer // 2 * norm_bytes(setup) + sum(qk_norm_bytes(setup)),
        "ffn": dense_ffn_weight_bytes(setup) + ffn_norms,
    }
    units = setup.stage_units(stage)
    if setup.moe is None:
        return StageWeights(sum(n * dense_part[part] for part, n in _part_counts(units)), 0, 0)
    from_moe = moe_weight_bytes_per_chip(setup)
    dense = experts = 0
    for layer, part in units:
        if part == "ffn" and setup.is_moe_layer(layer):
            dense += ffn_norms
            experts += from_moe
        else:
            dense += dense_part[part]
    return StageWeights(dense, experts, from_moe if experts else 0)


@lru_cache(maxsize=256)
def _part_counts(units: tuple[tuple[int, str], ...]) -> tuple[tuple[str, int], ...]:
    """How many units of each kind (embed, attn, ffn, head) a stage has."""
    return tuple(Counter(part for _layer, part in units).items())


def largest_staged_reads(setup: RunSetup, stage: int) -> list[int]:
    """The dense-weight bytes of each projection of ``stage`` (the LM head at the end of the
    pipeline): what a staging buffer must hold for each."""
    m, w = setup.model, setup.weights
    sizes = []
    for layer, part in setup.stage_units(stage):
        if part == "head":
            sizes.append(vocab_bytes(setup))
        elif part == "attn":
            sizes.append(w.weight_bytes(setup.q_width + setup.k_width + setup.v_width, m.hidden))
            sizes.append(w.weight_bytes(m.hidden, setup.q_width))
        elif part == "ffn" and not setup.is_moe_layer(layer):
            ffn = math.ceil(m.ffn / setup.tp)
            sizes.append(w.weight_bytes((m.ffn_matrices - 1) * ffn, m.hidden))
            sizes.append(w.weight_bytes(m.hidden, ffn))
    return sizes


# -- the step ------------------------------------------------------------------------------


def lower_step(setup: RunSetup, contexts: tuple[int, ...], step: int = 0, position: int = 0,
               prefill: tuple[tuple[int, int], ...] = ()) -> OpGraph:
    """The op graph of one step (see ``lower_one``); with ``microbatches`` M > 1 the sequences
    are split into M contiguous micro-batches, each lowered alone and run on its own streams
    (``main``, ``mb1``, ...), interleaved unit by unit in program order: on a pipeline the
    stages overlap (micro-batch 1 on stage 0 while micro-batch 0 is on stage 1), and on one
    chip one micro-batch's collectives overlap another's compute; where they share a chip
    they share its memory, links and tiles (each reads the weights itself). For a MoE model
    each micro-batch routes its own tokens, and one micro-batch's all-to-alls overlap the
    other's attention and experts: the two-batch overlap of DeepEP and SGLang at M = 2."""
    m = setup.spec.microbatches
    contexts = tuple(contexts)
    if m == 1:
        return lower_one(setup, contexts, step, position, prefill)
    if prefill:
        raise SimulationError("micro-batches of chunked-prefill steps are not modelled")
    if m > len(contexts):
        raise SimulationError(f"{m} micro-batches need at least {m} sequences in a step, got {len(contexts)}")
    groups = [contexts[g * len(contexts) // m:(g + 1) * len(contexts) // m] for g in range(m)]
    # a MoE micro-batch routes its own tokens: the plan's routing row of (step, micro-batch) is
    # position x M + g (sim.moe.plan: the two-batch overlap of DeepEP / SGLang when M = 2)
    moe = setup.moe is not None
    graphs = [lower_one(setup, group, step, position * m + g if moe else position) for g, group in enumerate(groups)]
    return make_graph(interleave([list(g.ops) for g in graphs]), step=step, contexts=contexts, stages=setup.pp)


def interleave(programs: list[list[Op]]) -> list[Op]:
    """One program from several of the same shape: their runs of ops of one (stage, layer)
    taken in turn, program ``g``'s streams renamed ``<stream>`` (g = 0) or ``<stream>`` +
    ``mb<g>`` suffix, indices and dependencies renumbered."""
    chunks = []
    for ops in programs:
        runs, key = [], None
        for op in ops:
            if (op.stage, op.layer) != key:
                runs.append([])
                key = (op.stage, op.layer)
            runs[-1].append(op)
        chunks.append(runs)
    if len({len(c) for c in chunks}) != 1:
        raise SimulationError("micro-batch programs differ in shape")
    new_of: list[dict[int, int]] = [{} for _ in programs]
    order: list[tuple[int, Op]] = []
    for c in range(len(chunks[0])):
        for g, runs in enumerate(chunks):
            for op in runs[c]:
                new_of[g][op.idx] = len(order)
                order.append((g, op))
    out = []
    for pos, (g, op) in enumerate(order):
        stream = op.stream if g == 0 else ("mb" if op.stream == "main" else f"{op.stream}-mb") + str(g)
        out.append(Op(idx=pos, name=op.name, layer=op.layer, work=op.work,
                      deps=tuple(new_of[g][d] for d in op.deps), stream=stream, stage=op.stage,
                      host_sync=op.host_sync, row=op.row, compute_row=op.compute_row, tags=op.tags))
    return out


def lower_one(setup: RunSetup, contexts: tuple[int, ...], step: int = 0, position: int = 0,
              prefill: tuple[tuple[int, int], ...] = ()) -> OpGraph:
    """The op graph of one step that decodes a token for each sequence whose cache holds
    ``contexts`` tokens (after this step's token is appended) and, mixed in (chunked
    prefill), processes a prompt chunk for each ``(chunk tokens, tokens cached before the
    chunk)`` of ``prefill``. The projections, norms and FFN run over all token rows (decode
    rows plus chunk tokens); decode attention reads each cache once per sequence; prefill
    attention is its own op (causal over the chunk and the cache before it); the LM head runs
    one row per sequence. ``position`` is the step's place in the run (the MoE routing row; its
    expert loads stand for all the step's token rows, prompt-chunk tokens included: a caller
    with the step's own loads re-lowers the MoE blocks, sim.lowering.cache.GraphCache)."""
    contexts = tuple(contexts)
    prefill = tuple(prefill)
    m = setup.model
    batch = len(contexts) + sum(chunk for chunk, _ in prefill)  # token rows
    logits = len(contexts) + len(prefill)
    act_row = batch * m.hidden * ACT_BYTES
    logit_row = logits * m.hidden * ACT_BYTES
    ops = Program()
    repeats = []
    for stage in range(setup.pp):
        b = builder(setup, ops, stage)
        units = setup.stage_units(stage)
        if units[0][1] == "embed":
            row = setup.weights.weight_bytes(1, m.hidden)
            b.add("embed", -1, "vector", [
                read(setup.store, batch * row, "weights", "w", granule=row),
                write(setup.act_level, act_row, "act", "y"),
            ], vector_ops=batch * m.hidden, parallelism=batch)
            if m.embed_scale:  # Gemma: embeddings times sqrt(hidden)
                vector(setup, b, "embed_scale", -1, reads=act_row, writes=act_row, ops=batch * m.hidden, rows=batch)
        if stage > 0:
            b.add("recv_activations", -1, "p2p", [read(stage_link(setup, stage), act_row, "link", "link")],
                  collective=("p2p", act_row, 2), deps=(ops[-1].idx,), parallelism=1)
        lower_units(setup, b, units, contexts, position, prefill)
        if units[-1][1] == "head":
            vector(setup, b, "final_norm", -1, reads=logit_row, weights=norm_bytes(setup), writes=logit_row,
                   ops=logits * m.hidden * VEC_OPS["rmsnorm"], rows=logits)
            matmul(setup, b, "lm_head", -1, logits, m.hidden, setup.vocab)
            if m.final_logit_softcap:  # Gemma 2: logits -> cap x tanh(logits / cap)
                row = logits * setup.vocab * ACT_BYTES
                vector(setup, b, "logit_softcap", -1, reads=row, writes=row,
                       ops=logits * setup.vocab * VEC_OPS["softcap"], rows=logits)
            tokens = vector(setup, b, "argmax", -1, reads=logits * setup.vocab * ACT_BYTES, writes=logits * 8,
                            ops=logits * setup.vocab * VEC_OPS["argmax"], rows=logits)
            gather = collective(setup, b, "gather_tokens", -1, "allgather", logits * 8, setup.tp)
            last = gather or tokens
            ops[last.idx] = _synced(last)
        _check_joined(setup, b, stage)
        repeats.extend(b.repeats)
    placed = place_ops(setup, ops)
    return make_graph(placed, step=step, contexts=contexts, stages=setup.pp,
                      repeats=tuple(repeats) if len(placed) == len(ops) else ())  # staging renumbers the ops


def stage_link(setup: RunSetup, stage: int) -> str:
    """The link that joins ``stage`` to the stage before it: the chip links inside a group,
    the scale-out links between groups."""
    system = setup.hardware.system
    first = stage * setup.tp
    return "scaleout" if system.group_of(first - 1) != system.group_of(first) else "link"


def _synced(op: Op) -> Op:
    return op._replace(host_sync=True)


def _check_joined(setup: RunSetup, b: Builder, stage: int) -> None:
    """Refuse a step whose side stream no later op joins (the stack names a join op this model's
    step does not have after it): such a stream could not finish as the stack describes."""
    for join, op in b.unjoined().items():
        where = f" of pipeline stage {stage}" if setup.pp > 1 else ""
        raise SimulationError(f"{setup.spec.software or setup.stack.name}: ops.{op}.join: the side stream of {op!r} is never "
                              f"joined: no op {join!r} follows it in {setup.model.name}'s step{where}; expected the "
                              "name of an op that runs after it in every layer")


def lower_units(setup: RunSetup, b: Builder, units: tuple[tuple[int, str], ...], contexts: tuple[int, ...],
                position: int, prefill: tuple[tuple[int, int], ...] = ()) -> None:
    """Lower a stage's units in order (``units``: the stage's, the embedding and LM head
    included): whole layers through ``lower_layers``, a layer cut by a stage boundary as its
    attention or FFN half alone."""
    for half, layers in _unit_runs(units):
        if half == "layers":
            lower_layers(setup, b, layers, contexts, position, prefill)
        else:
            (lower_attention_half if half == "attn" else lower_ffn_half)(setup, b, layers[0], contexts, position,
                                                                          prefill)


@lru_cache(maxsize=256)
def _unit_runs(units: tuple[tuple[int, str], ...]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """A stage's layer units as runs in program order: ("layers", whole layers) and ("attn" or
    "ffn", (a layer cut by a stage boundary,)); worked out once per partition's stage."""
    parts: dict[int, list[str]] = {}
    for layer, part in units:
        if layer >= 0:  # not the embedding or the LM head
            parts.setdefault(layer, []).append(part)
    runs: list[tuple[str, tuple[int, ...]]] = []
    whole: list[int] = []
    for layer, halves in parts.items():
        if len(halves) == 2:
            whole.append(layer)
            continue
        if whole:
            runs.append(("layers", tuple(whole)))
            whole = []
        runs.append((halves[0], (layer,)))
    if whole:
        runs.append(("layers", tuple(whole)))
    return tuple(runs)


def lower_layers(setup: RunSetup, b: Builder, layers, contexts: tuple[int, ...], position: int,
                 prefill: tuple[tuple[int, int], ...] = ()) -> None:
    """Lower ``layers``. A dense layer's ops depend on the layer only through its kind
    (``layer_kind``: its attention window), so a layer of a kind already lowered is a copy of
    that layer, indices and dependencies shifted, asking the very same Work objects (a memo
    lookup then finds a work's key by identity), where the copy would wait for what a fresh
    lowering would: the template ran on its stage's main stream alone, and so does everything
    the copy follows (``Builder.copyable``). Otherwise (a layer with a side stream) layers are
    lowered until two in a row come out equal, and further layers of the run copy them.
    Consecutive copies of the layer just before them are kept as the graph's ``Repeat``. MoE
    layers are always lowered (routing differs per layer)."""
    templates: dict[tuple, tuple[list[Op], bool]] = {}  # layer kind -> a layer a copy may be made of, main stream alone
    previous: tuple[tuple, list[Op]] | None = None  # the last dense layer: its kind and ops (a copy's: its template)
    run: list[int] = []  # consecutive layers to append as copies of ``source``
    source: list[Op] | None = None
    repeat = False  # the ops just before ``run`` are ``source`` moved
    for layer in layers:
        kind = layer_kind(setup, layer)
        template, alone = templates.get(kind, (None, False))
        if template is not None and (run or not alone or b.copyable()):
            if template is not source:
                b.append_copies(source or [], run, repeat=repeat)
                run, source, repeat = [], template, previous is not None and previous[1] is template
            run.append(layer)
            previous = (kind, template)
            continue
        b.append_copies(source or [], run, repeat=repeat)
        run, source, repeat = [], None, False
        start = len(b.ops)
        clean = b.copyable()
        lower_layer(setup, b, layer, contexts, position, prefill)
        span = b.ops[start:]
        if kind is None:  # an MoE layer
            previous = None
            continue
        if clean and b.copyable() and all(op.stream == "main" for op in span):
            templates[kind] = (span, True)
        elif previous is not None and previous[0] == kind and _same_ops(previous[1], span):
            templates[kind] = (previous[1], False)  # the builder gave both layers the same Work objects
        previous = (kind, span)
    b.append_copies(source or [], run, repeat=repeat)


def layer_kind(setup: RunSetup, layer: int) -> tuple | None:
    """What a dense layer's ops depend on besides the step: its attention window (None for an
    MoE layer, whose routing is its own)."""
    return None if setup.is_moe_layer(layer) else (setup.model.window(layer),)


def _signature(op: Op, base: int) -> tuple:
    return (op.idx - base, op.name, op.work, tuple(d - base for d in op.deps), op.stream, op.stage, op.host_sync,
            op.row, op.compute_row, op.tags)


def _same_ops(first: list[Op], second: list[Op]) -> bool:
    if len(first) != len(second) or not first:
        return False
    return all(_signature(a, first[0].idx) == _signature(b, second[0].idx) for a, b in zip(first, second, strict=True))


def lower_layer(setup: RunSetup, b: Builder, layer: int, contexts: tuple[int, ...], position: int,
                prefill: tuple[tuple[int, int], ...] = ()) -> None:
    lower_attention_half(setup, b, layer, contexts, position, prefill)
    lower_ffn_half(setup, b, layer, contexts, position, prefill)


def lower_attention_half(setup: RunSetup, b: Builder, layer: int, contexts: tuple[int, ...], position: int,
                         prefill: tuple[tuple[int, int], ...] = ()) -> None:
    """The attention half of a layer: norm, QKV, RoPE and append, attention, O projection and
    its all-reduce."""
    m = setup.model
    batch = len(contexts) + sum(chunk for chunk, _ in prefill)  # token rows
    act_row = batch * m.hidden * ACT_BYTES
    norm = dict(reads=act_row, weights=norm_bytes(setup), writes=act_row, ops=batch * m.hidden * VEC_OPS["rmsnorm"],
                rows=batch)
    vector(setup, b, "attn_norm", layer, **norm)
    qkv = setup.q_width + setup.k_width + setup.v_width
    matmul(setup, b, "qkv", layer, batch, m.hidden, qkv,
           parts={"q": setup.q_width / qkv, "k": setup.k_width / qkv, "v": setup.v_width / qkv})
    if m.qk_norm != "none":  # RMSNorm of the query and key projections before RoPE
        for name, width, gain in zip(("q_norm", "k_norm"), (setup.q_width, setup.k_width), qk_norm_bytes(setup),
                                    strict=True):
            row = batch * width * ACT_BYTES
            vector(setup, b, name, layer, reads=row, weights=gain, writes=row, ops=batch * width * VEC_OPS["rmsnorm"],
                   rows=batch * (width // m.head_dim if m.qk_norm == "per_head" else 1))
    append = setup.kv.kv_append(setup.k_width, setup.v_width)
    vector(setup, b, "rope_append", layer, reads=batch * qkv * ACT_BYTES,
           writes=batch * setup.q_width * ACT_BYTES,
           ops=batch * (setup.q_width + setup.k_width) * VEC_OPS["rope"] + batch * (setup.k_width + setup.v_width) * 4,
           rows=batch,
           extra=(write(setup.store, batch * append.stream_bytes, "kv", "cache"),))
    if contexts:
        attention(setup, b, layer, contexts)
    if prefill:
        prefill_attention(setup, b, layer, prefill)
    matmul(setup, b, "o_proj", layer, batch, setup.q_width, m.hidden, residual=True)
    collective(setup, b, "allreduce_attn", layer, "allreduce", act_row, setup.tp)
    if m.post_norms:  # Gemma 2: RMSNorm of the attention output before the residual add
        vector(setup, b, "post_attn_norm", layer, **norm)


def lower_ffn_half(setup: RunSetup, b: Builder, layer: int, contexts: tuple[int, ...], position: int,
                   prefill: tuple[tuple[int, int], ...] = ()) -> None:
    """The FFN half of a layer: norm, the dense or MoE FFN, its all-reduce (and Gemma 2's
    post-FFN norm)."""
    m = setup.model
    batch = len(contexts) + sum(chunk for chunk, _ in prefill)  # token rows
    act_row = batch * m.hidden * ACT_BYTES
    norm = dict(reads=act_row, weights=norm_bytes(setup), writes=act_row, ops=batch * m.hidden * VEC_OPS["rmsnorm"],
                rows=batch)
    vector(setup, b, "ffn_norm", layer, **norm)
    if setup.is_moe_layer(layer):
        lower_moe(setup, b, layer, batch, position)
    else:
        lower_dense_ffn(setup, b, layer, batch)
    collective(setup, b, "allreduce_ffn", layer, "allreduce", act_row, setup.tp)
    if m.post_norms:  # and of the FFN output
        vector(setup, b, "post_ffn_norm", layer, **norm)


def lower_dense_ffn(setup: RunSetup, b: Builder, layer: int, batch: int) -> None:
    """SwiGLU (or GELU) FFN: gate+up projection, activation, down projection."""
    m = setup.model
    ffn = math.ceil(m.ffn / setup.tp)
    up_rows = (m.ffn_matrices - 1) * ffn
    matmul(setup, b, "gate_up", layer, batch, m.hidden, up_rows,
           parts={"gate": ffn / up_rows, "up": 1 - ffn / up_rows})
    vector(setup, b, "silu_mul", layer, reads=batch * up_rows * ACT_BYTES, writes=batch * ffn * ACT_BYTES,
           ops=batch * ffn * VEC_OPS["silu_mul"], rows=batch)
    matmul(setup, b, "down", layer, batch, ffn, m.hidden, residual=True)
