"""The decode step of a validation case, built in plain PyTorch the way Hugging Face's modeling
code runs it (see whole_step.py's docstring for what each step does and where it differs).

Random bf16 weights (seeded; FP8 variants with per-tensor scales), the static and the quantized
KV caches, RoPE, the dense and MoE blocks with their four executions, and the Triton fused MoE
(written here, not imported from calibration/: the validation code shares only the harness).
"""
from __future__ import annotations

import contextlib
import os
import zlib
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from cases import Arch, Shape

try:
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except Exception:  # noqa: BLE001
    HAVE_TRITON = False

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
FP8_MAX = 448.0  # largest finite float8_e4m3fn
WEIGHT_STD = 0.02  # Hugging Face's initializer_range
KV_SLACK_TOKENS = 64  # the static cache holds context + 64 positions; attention reads context + 1


# ----------------------------------------------------------------------------- annotation

_ANNOTATE = False
_NULL = contextlib.nullcontext()


def mark(name: str):
    """A profiler range named after the op while profiling; a no-op context otherwise."""
    return torch.profiler.record_function(name) if _ANNOTATE else _NULL


@contextlib.contextmanager
def annotating():
    global _ANNOTATE
    _ANNOTATE = True
    try:
        yield
    finally:
        _ANNOTATE = False


# ----------------------------------------------------------------------------- linears


class Bf16Linear:
    """nn.Linear in bf16: F.linear(x, W[out, in], bias)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight, self.bias = weight, bias

    def __call__(self, x):
        return F.linear(x, self.weight, self.bias)


class Fp8Linear:
    """A plain PyTorch FP8 linear: e4m3 weight [out, in] with a per-tensor scale; each call
    quantizes the activation per tensor and runs torch._scaled_mm to bf16; the bias (Qwen2) is
    a separate add."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        amax = weight.abs().amax().float().clamp(min=1e-12)
        self.scale = (amax / FP8_MAX).reshape(())
        self.weight = (weight.float() / self.scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        self.bias = bias

    def __call__(self, x):
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        x_scale = x2.abs().amax().float().clamp(min=1e-12) / FP8_MAX
        xq = (x2.float() / x_scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(xq, self.weight.t(), scale_a=x_scale, scale_b=self.scale, out_dtype=torch.bfloat16)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*lead, y.shape[-1])


class Fp8StaticLinear(Fp8Linear):
    """An FP8 linear with a static (calibrated offline) activation scale: each call is one cast
    of x to e4m3 and torch._scaled_mm; the scale is a constant tensor (1.0 here: the random
    activations lie well inside e4m3's range)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__(weight, bias)
        self.x_scale = torch.ones((), device=weight.device, dtype=torch.float32)

    def __call__(self, x):
        lead = x.shape[:-1]
        xq = x.reshape(-1, x.shape[-1]).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(xq, self.weight.t(), scale_a=self.x_scale, scale_b=self.scale, out_dtype=torch.bfloat16)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*lead, y.shape[-1])


@dataclass
class LayerWeights:
    """One decoder layer's tensors; projections are Bf16Linear or Fp8Linear."""

    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    o: object
    q: object = None
    k: object = None
    v: object = None
    qkv: object = None
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    gate: object = None
    up: object = None
    gate_up: object = None
    down: object = None
    router: torch.Tensor | None = None       # [E, H]
    w_gate_up: torch.Tensor | None = None    # [E, 2F, H]: gate rows, then up rows
    w_down: torch.Tensor | None = None       # [E, H, F]
    post_attn_norm: torch.Tensor | None = None   # Gemma 2
    post_mlp_norm: torch.Tensor | None = None


@dataclass
class Weights:
    """A model's weights, built once per (model, weight format) and shared by its cases."""

    shape: Shape
    arch: Arch
    fp8: bool
    embed: torch.Tensor
    lm_head: torch.Tensor
    final_norm: torch.Tensor
    inv_freq: torch.Tensor
    layers: list = field(default_factory=list)


def _rand(shape, device, dtype=torch.bfloat16, std=WEIGHT_STD):
    """Random weights filled in place on the device (no host copy: Mixtral is 93 GB)."""
    return torch.empty(shape, device=device, dtype=dtype).normal_(0.0, std)


def _linear(weight, bias, fp8):
    """fp8: False (bf16), True (dynamic per-tensor activation scale) or "static"."""
    if fp8 == "static":
        return Fp8StaticLinear(weight, bias)
    return Fp8Linear(weight, bias) if fp8 else Bf16Linear(weight, bias)


def build_layer(s: Shape, a: Arch, fp8: bool, device) -> LayerWeights:
    """One layer's weights; the bf16 projection matrices are freed once quantized to fp8."""
    h, q, kv = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    ones = lambda n: torch.ones(n, device=device, dtype=torch.bfloat16)  # noqa: E731
    lw = LayerWeights(attn_norm=ones(h), mlp_norm=ones(h), o=_linear(_rand((h, q), device), None, fp8))
    if a.fused:
        lw.qkv = _linear(_rand((q + 2 * kv, h), device), None, fp8)
    else:
        bias = (lambda n: _rand((n,), device)) if a.qkv_bias else (lambda n: None)
        lw.q = _linear(_rand((q, h), device), bias(q), fp8)
        lw.k = _linear(_rand((kv, h), device), bias(kv), fp8)
        lw.v = _linear(_rand((kv, h), device), bias(kv), fp8)
    if a.qk_norm:
        lw.q_norm, lw.k_norm = (ones(s.head_dim), ones(s.head_dim)) if a.qk_norm_per_head else (ones(q), ones(kv))
    if a.gemma:  # Gemma's norms hold w with the gain 1 + w: zeros are the identity
        zeros = lambda n: torch.zeros(n, device=device, dtype=torch.bfloat16)  # noqa: E731
        lw.attn_norm, lw.mlp_norm, lw.post_attn_norm, lw.post_mlp_norm = zeros(h), zeros(h), zeros(h), zeros(h)
    if s.moe:
        lw.router = _rand((s.experts, h), device)
        lw.w_gate_up = _rand((s.experts, 2 * s.expert_ffn, h), device)
        lw.w_down = _rand((s.experts, h, s.expert_ffn), device)
    elif a.fused:
        lw.gate_up = _linear(_rand((2 * s.ffn, h), device), None, fp8)
        lw.down = _linear(_rand((h, s.ffn), device), None, fp8)
    else:
        lw.gate = _linear(_rand((s.ffn, h), device), None, fp8)
        lw.up = _linear(_rand((s.ffn, h), device), None, fp8)
        lw.down = _linear(_rand((h, s.ffn), device), None, fp8)
    return lw


def build_weights(s: Shape, a: Arch, fp8: bool, device) -> Weights:
    """All weights of a model, seeded by its name."""
    if fp8 and s.moe:
        raise ValueError("fp8 MoE experts are not implemented here (the experts would stay bf16)")
    torch.manual_seed(zlib.crc32(s.name.encode()))
    embed = _rand((s.vocab, s.hidden), device)
    lm_head = embed if s.tied else _rand((s.vocab, s.hidden), device)
    inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.int64, device=device).float()
                                       / s.head_dim))
    final = (torch.zeros if a.gemma else torch.ones)(s.hidden, device=device, dtype=torch.bfloat16)
    w = Weights(shape=s, arch=a, fp8=fp8, embed=embed, lm_head=lm_head, final_norm=final, inv_freq=inv_freq)
    for _ in range(s.layers):
        w.layers.append(build_layer(s, a, fp8, device))
    return w


# ----------------------------------------------------------------------------- the step (HF style)


def rms_norm(x, weight, eps):
    """LlamaRMSNorm.forward."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


def gemma_rms_norm(x, weight, eps):
    """Gemma2RMSNorm.forward: fp32 statistics, gain (1 + w) in fp32, cast back."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    h = h * (1.0 + weight.float())
    return h.type_as(x)


# -- quantized KV caches (issue 21): the new token quantized and appended, the whole cache
# dequantized to bf16 for SDPA each layer (the dequantizing cache of Hugging Face's
# QuantizedCache, without its bf16 window of recent tokens). Code separate from calibration/.

def quant_cache(fmt: str, batch: int, heads: int, length: int, dim: int, device) -> dict:
    """Random codes, scales and zeros of a quantized cache [B, Hkv, L, D]."""
    if fmt == "int8":
        return {"q": torch.randint(-127, 128, (batch, heads, length, dim), device=device, dtype=torch.int8),
                "s": torch.full((batch, heads, length, 1), 1.0 / 127, device=device, dtype=torch.bfloat16)}
    g = dim // 32
    return {"q": torch.randint(0, 256, (batch, heads, length, dim // 2), device=device, dtype=torch.uint8),
            "s": torch.full((batch, heads, length, g), 2.0 / 15, device=device, dtype=torch.bfloat16),
            "z": torch.full((batch, heads, length, g), -1.0, device=device, dtype=torch.bfloat16)}


def append_int8(cache: dict, new, pos):
    """Per-token symmetric int8: s = amax|x| / 127 per (sequence, head); q = round(x / s)."""
    s = new.abs().amax(-1, keepdim=True).float().clamp_(min=1e-8) / 127.0
    cache["q"].index_copy_(2, pos, (new.float() / s).round_().clamp_(-127, 127).to(torch.int8))
    cache["s"].index_copy_(2, pos, s.to(torch.bfloat16))


def append_int4(cache: dict, new, pos):
    """Asymmetric int4 in groups of 32 along head_dim (min, max, 15 levels), two codes a byte."""
    b, h, t, d = new.shape
    g = new.float().view(b, h, t, d // 32, 32)
    mn = g.amin(-1, keepdim=True)
    s = (g.amax(-1, keepdim=True) - mn).clamp_(min=1e-6) / 15.0
    q = ((g - mn) / s).round_().clamp_(0, 15).to(torch.uint8).view(b, h, t, d)
    cache["q"].index_copy_(2, pos, q[..., 0::2] | (q[..., 1::2] << 4))
    cache["s"].index_copy_(2, pos, s.view(b, h, t, d // 32).to(torch.bfloat16))
    cache["z"].index_copy_(2, pos, mn.view(b, h, t, d // 32).to(torch.bfloat16))


def dequant_int8(cache: dict, n: int):
    return cache["q"][:, :, :n].to(torch.bfloat16) * cache["s"][:, :, :n]


def dequant_int4(cache: dict, n: int):
    p = cache["q"][:, :, :n]
    b, h, _, half = p.shape
    codes = torch.stack((p & 15, p >> 4), dim=-1).view(b, h, n, 2 * half // 32, 32)
    k = codes.to(torch.bfloat16) * cache["s"][:, :, :n, :, None] + cache["z"][:, :, :n, :, None]
    return k.view(b, h, n, 2 * half)


KV_APPEND = {"int8": append_int8, "int4": append_int4}
KV_DEQUANT = {"int8": dequant_int8, "int4": dequant_int4}


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(inv_freq, position_ids, dtype):
    """LlamaRotaryEmbedding.forward (attention_scaling 1)."""
    inv_freq_expanded = inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
    position_ids_expanded = position_ids[:, None, :].float()
    freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary_pos_emb(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


class DecodeStep:
    """One decode step of one case: the model's weights, this case's KV cache and static
    inputs (tokens, position), and the MoE execution. ``__call__`` runs the step and returns
    the next tokens."""

    def __init__(self, weights: Weights, batch: int, context: int, execution: str, device, seed: int,
                 grouped_cfg=None, kv: str = "bf16"):
        s = weights.shape
        self.w, self.s, self.a = weights, s, weights.arch
        self.batch, self.context, self.execution, self.kv = batch, context, execution, kv
        self.norm = gemma_rms_norm if self.a.gemma else rms_norm
        self.grouped_cfg = grouped_cfg
        gen = torch.Generator(device="cpu").manual_seed(seed)
        self.tokens = torch.randint(0, s.vocab, (batch, 1), generator=gen).to(device)
        self.cache_position = torch.tensor([context], device=device, dtype=torch.long)
        self.position_ids = self.cache_position.unsqueeze(0)
        lmax = context + KV_SLACK_TOKENS
        torch.manual_seed(seed)
        # Gemma 2's sliding layers keep a ring of sliding_window positions (the new token goes to
        # context % window); every other layer a static cache of context + slack positions
        self.window = [s.sliding_window if s.sliding_window and i % 2 == 0 else 0 for i in range(s.layers)]
        self.lengths = [min(lmax, w) if w else lmax for w in self.window]
        self.attend = [min(context + 1, w) if w else context + 1 for w in self.window]
        self.positions = [torch.tensor([context % w if w else context], device=device, dtype=torch.long)
                          for w in self.window]
        if kv == "bf16":
            self.k_cache = [torch.empty(batch, s.kv_heads, n, s.head_dim, device=device,
                                        dtype=torch.bfloat16).normal_() for n in self.lengths]
            self.v_cache = [torch.empty_like(k).normal_() for k in self.k_cache]
        else:
            self.k_cache = [quant_cache(kv, batch, s.kv_heads, n, s.head_dim, device) for n in self.lengths]
            self.v_cache = [quant_cache(kv, batch, s.kv_heads, n, s.head_dim, device) for n in self.lengths]
        self.normalizer = torch.tensor(s.hidden ** 0.5, dtype=torch.bfloat16)  # Gemma (a CPU scalar, as HF)
        self.plan = [None] * s.layers      # loop: (expert, start, count) per touched expert
        self.routing = [None] * s.layers   # tokens per expert, as first seen
        self.recording = False             # read every layer's routing (one extra eager step)
        self.names = [{op: f"L{i}.{op}" for op in ("attn_norm", "qkv", "qk_norm", "rope", "kv_append", "attention",
                                                    "o_proj", "residual", "mlp_norm", "gate_up", "silu_mul",
                                                    "down", "router", "experts", "expert", "post_attn_norm",
                                                    "post_mlp_norm")} for i in range(s.layers)]

    # -- attention -------------------------------------------------------------------
    def project_qkv(self, i, lw, x):
        s, a = self.s, self.a
        with mark(self.names[i]["qkv"]):
            if a.fused:
                qkv = lw.qkv(x)
                qw, kw = s.heads * s.head_dim, s.kv_heads * s.head_dim
                q, k, v = qkv[..., :qw], qkv[..., qw:qw + kw], qkv[..., qw + kw:]
            else:
                q, k, v = lw.q(x), lw.k(x), lw.v(x)
        if a.qk_norm and a.qk_norm_per_head:  # Qwen3: on each head, before the transpose
            with mark(self.names[i]["qk_norm"]):
                d = s.head_dim
                q = rms_norm(q.view(*q.shape[:-1], -1, d), lw.q_norm, a.eps).view(q.shape)
                k = rms_norm(k.view(*k.shape[:-1], -1, d), lw.k_norm, a.eps).view(k.shape)
        elif a.qk_norm:
            with mark(self.names[i]["qk_norm"]):
                q, k = rms_norm(q, lw.q_norm, a.eps), rms_norm(k, lw.k_norm, a.eps)
        return q, k, v

    def attention(self, i, lw, x, cos, sin):
        s, names = self.s, self.names[i]
        bsz = x.shape[0]
        q, k, v = self.project_qkv(i, lw, x)
        q = q.view(bsz, 1, -1, s.head_dim).transpose(1, 2)
        k = k.view(bsz, 1, -1, s.head_dim).transpose(1, 2)
        v = v.view(bsz, 1, -1, s.head_dim).transpose(1, 2)
        with mark(names["rope"]):
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
        n, pos = self.attend[i], self.positions[i]
        if self.kv == "bf16":
            with mark(names["kv_append"]):
                self.k_cache[i].index_copy_(2, pos, k)
                self.v_cache[i].index_copy_(2, pos, v)
            keys, values = self.k_cache[i][:, :, :n], self.v_cache[i][:, :, :n]
        else:
            with mark(names["kv_append"]):
                KV_APPEND[self.kv](self.k_cache[i], k, pos)
                KV_APPEND[self.kv](self.v_cache[i], v, pos)
            with mark(names["attention"]):
                keys, values = KV_DEQUANT[self.kv](self.k_cache[i], n), KV_DEQUANT[self.kv](self.v_cache[i], n)
        with mark(names["attention"]):
            o = F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)
        o = o.transpose(1, 2).contiguous().reshape(bsz, 1, -1)
        with mark(names["o_proj"]):
            return lw.o(o)

    # -- dense MLP -------------------------------------------------------------------
    def mlp(self, i, lw, x):
        names = self.names[i]
        if self.a.fused:
            with mark(names["gate_up"]):
                up_states = lw.gate_up(x)
            gate, up_states = up_states.chunk(2, dim=-1)
            with mark(names["silu_mul"]):
                up_states = up_states * F.silu(gate)
        else:
            with mark(names["gate_up"]):
                gate, up = lw.gate(x), lw.up(x)
            with mark(names["silu_mul"]):
                up_states = F.gelu(gate, approximate="tanh") * up if self.a.gemma else F.silu(gate) * up
        with mark(names["down"]):
            return lw.down(up_states)

    # -- MoE -------------------------------------------------------------------------
    def route(self, i, lw, x2):
        with mark(self.names[i]["router"]):
            router_logits = F.linear(x2, lw.router)
            routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
            routing_weights, selected = torch.topk(routing_weights, self.s.top_k, dim=-1)
            if self.a.norm_topk:
                routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
            return routing_weights.to(x2.dtype), selected

    def expert_mlp(self, lw, e, x):
        """MixtralBlockSparseTop2MLP / OlmoeMLP: down(silu(gate(x)) * up(x))."""
        f = self.s.expert_ffn
        w_gu = lw.w_gate_up[e]
        return F.linear(F.silu(F.linear(x, w_gu[:f])) * F.linear(x, w_gu[f:]), lw.w_down[e])

    def record_routing(self, i, selected):
        """Host sync: tokens per expert of layer i (before capture, and for loop_sync)."""
        counts = torch.bincount(selected.reshape(-1), minlength=self.s.experts).tolist()
        self.routing[i] = counts
        return counts

    def moe_loop(self, i, lw, x2, routing_weights, selected):
        """Graph-safe loop over the touched experts (segments of an argsort of the expert ids)."""
        if self.plan[i] is None:
            counts = self.record_routing(i, selected)
            starts = [sum(counts[:e]) for e in range(len(counts))]
            self.plan[i] = [(e, starts[e], n) for e, n in enumerate(counts) if n]
        flat = selected.view(-1)
        order = torch.argsort(flat)  # one in-place sort kernel for <= 4096 slots; order within an expert is free
        token_of = order // self.s.top_k
        weight_of = routing_weights.view(-1)[order]
        out = torch.zeros_like(x2)
        for e, start, n in self.plan[i]:
            with mark(self.names[i]["expert"]):
                tok = token_of[start:start + n]
                y = self.expert_mlp(lw, e, x2[tok]) * weight_of[start:start + n, None]
                out.index_add_(0, tok, y)
        return out

    def moe_loop_sync(self, i, lw, x2, routing_weights, selected):
        """Hugging Face's expert loop (Mixtral/OLMoE sparse MoE block), host syncs included."""
        if self.routing[i] is None:
            self.record_routing(i, selected)
        out = torch.zeros_like(x2)
        expert_mask = F.one_hot(selected, num_classes=self.s.experts).permute(2, 1, 0)
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
        for expert_idx in expert_hit:
            with mark(self.names[i]["expert"]):
                e = int(expert_idx)  # Hugging Face indexes its ModuleList of experts with this
                idx, top_x = torch.where(expert_mask[e])
                current_state = x2[None, top_x].reshape(-1, x2.shape[-1])
                y = self.expert_mlp(lw, e, current_state) * routing_weights[top_x, idx, None]
                out.index_add_(0, top_x, y.to(x2.dtype))
        return out

    def moe_dense_all(self, i, lw, x2, routing_weights, selected):
        """Every expert over every token (bmm over the stacked experts), router-weighted."""
        e_count, f = self.s.experts, self.s.expert_ffn
        dense_w = torch.zeros(x2.shape[0], e_count, dtype=x2.dtype, device=x2.device)
        dense_w.scatter_(1, selected, routing_weights)
        h = torch.bmm(x2.unsqueeze(0).expand(e_count, -1, -1), lw.w_gate_up.transpose(1, 2))
        a = F.silu(h[..., :f]) * h[..., f:]
        y = torch.bmm(a, lw.w_down.transpose(1, 2))
        return (y * dense_w.t().unsqueeze(-1)).sum(0)

    def moe_grouped(self, i, lw, x2, routing_weights, selected):
        return fused_moe(x2, lw.w_gate_up, lw.w_down, routing_weights, selected, self.grouped_cfg)

    def moe_grouped_mm(self, i, lw, x2, routing_weights, selected):
        """PyTorch's grouped GEMM with device-side offsets (no host sync, graph-safe): count the
        slots per expert (scatter_add_: bincount would sync), pad each expert's rows to 16 (as torchtitan does), place
        each (token, expert) slot at its padded row, torch._grouped_mm for gate_up, silu * up,
        torch._grouped_mm for down, times the router weight, index_add_ into the output. The
        row buffer holds the most rows any routing can need (pairs + 15 x experts)."""
        e_count, f, k = self.s.experts, self.s.expert_ffn, self.s.top_k
        flat = selected.reshape(-1)
        pairs = flat.numel()
        counts = torch.zeros(e_count, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
        padded = (counts + 15) // 16 * 16
        ends = torch.cumsum(padded, 0)
        order = torch.argsort(flat, stable=True)
        expert_of = flat[order]
        first = torch.cumsum(counts, 0) - counts  # first sorted slot of each expert
        rank = torch.arange(pairs, device=flat.device) - first[expert_of]
        row = (ends - padded)[expert_of] + rank
        token = order // k
        rows = pairs + 15 * e_count
        a = x2.new_zeros(rows, x2.shape[-1])
        a.index_copy_(0, row, x2.index_select(0, token))
        offs = ends.to(torch.int32)
        h = torch._grouped_mm(a, lw.w_gate_up.transpose(-2, -1), offs=offs)
        act = F.silu(h[:, :f]) * h[:, f:]
        y = torch._grouped_mm(act, lw.w_down.transpose(-2, -1), offs=offs)
        y = y.index_select(0, row) * routing_weights.reshape(-1)[order, None]
        return torch.zeros_like(x2).index_add_(0, token, y)

    def moe(self, i, lw, x):
        bsz, seq, hidden = x.shape
        x2 = x.view(-1, hidden)
        routing_weights, selected = self.route(i, lw, x2)
        if self.recording:
            self.record_routing(i, selected)
        run = {"loop": self.moe_loop, "loop_sync": self.moe_loop_sync, "dense_all": self.moe_dense_all,
               "grouped": self.moe_grouped, "grouped_mm": self.moe_grouped_mm}[self.execution]
        with mark(self.names[i]["experts"]):
            out = run(i, lw, x2, routing_weights, selected)
        return out.reshape(bsz, seq, hidden)

    # -- the step --------------------------------------------------------------------
    def layer(self, i, lw, h, cos, sin):
        eps, names, norm = self.a.eps, self.names[i], self.norm
        residual = h
        with mark(names["attn_norm"]):
            x = norm(h, lw.attn_norm, eps)
        x = self.attention(i, lw, x, cos, sin)
        if lw.post_attn_norm is not None:
            with mark(names["post_attn_norm"]):
                x = norm(x, lw.post_attn_norm, eps)
        with mark(names["residual"]):
            h = residual + x
        residual = h
        with mark(names["mlp_norm"]):
            x = norm(h, lw.mlp_norm, eps)
        x = self.moe(i, lw, x) if self.s.moe else self.mlp(i, lw, x)
        if lw.post_mlp_norm is not None:
            with mark(names["post_mlp_norm"]):
                x = norm(x, lw.post_mlp_norm, eps)
        with mark(names["residual"]):
            return residual + x

    def __call__(self):
        w = self.w
        with mark("embed"):
            h = F.embedding(self.tokens, w.embed)
            if self.a.gemma:
                h = h * self.normalizer
        with mark("rope_cos_sin"):
            cos, sin = rope_cos_sin(w.inv_freq, self.position_ids, h.dtype)
        for i, lw in enumerate(w.layers):
            h = self.layer(i, lw, h, cos, sin)
        with mark("final_norm"):
            h = self.norm(h, w.final_norm, self.a.eps)
        with mark("lm_head"):
            logits = F.linear(h[:, -1:, :], w.lm_head)
        if self.s.final_softcap:
            with mark("logit_softcap"):
                logits = torch.tanh(logits / self.s.final_softcap) * self.s.final_softcap
        with mark("argmax"):
            return torch.argmax(logits[:, -1, :].to(copy=True, dtype=torch.float32), dim=-1)


# ----------------------------------------------------------------------------- Triton fused MoE

if HAVE_TRITON:
    @triton.jit(do_not_specialize=["n_slots", "max_padded", "max_blocks"])
    def _moe_align_kernel(ids_ptr, sorted_ptr, expert_ids_ptr, n_post_ptr, scratch_ptr, n_slots, n_experts,
                          max_padded, max_blocks, BLOCK_M: tl.constexpr, NP: tl.constexpr, EP: tl.constexpr,
                          MBP: tl.constexpr, FILL: tl.constexpr):
        """One program: count slots per expert, pad each expert's count to BLOCK_M, write each
        slot's index at its expert's next place (sentinel n_slots elsewhere) and each block's
        expert (-1 past the end). scratch: counts [EP], cursors [EP], starts [EP]."""
        ep = tl.arange(0, EP)
        em = ep < n_experts
        tl.store(scratch_ptr + ep, tl.zeros([EP], tl.int32))
        tl.store(scratch_ptr + EP + ep, tl.zeros([EP], tl.int32))
        for start in range(0, max_padded, FILL):
            f = start + tl.arange(0, FILL)
            tl.store(sorted_ptr + f, tl.zeros([FILL], tl.int32) + n_slots, mask=f < max_padded)
        tl.debug_barrier()
        offs = tl.arange(0, NP)
        m = offs < n_slots
        ids = tl.load(ids_ptr + offs, mask=m, other=0).to(tl.int32)
        tl.atomic_add(scratch_ptr + ids, tl.full([NP], 1, tl.int32), mask=m)
        tl.debug_barrier()
        counts = tl.load(scratch_ptr + ep, mask=em, other=0, volatile=True)
        padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        ends = tl.cumsum(padded, 0)
        tl.store(scratch_ptr + 2 * EP + ep, ends - padded)
        total = tl.sum(padded, 0)
        tl.store(n_post_ptr, total)
        tl.debug_barrier()
        place = tl.atomic_add(scratch_ptr + EP + ids, tl.full([NP], 1, tl.int32), mask=m)
        first = tl.load(scratch_ptr + 2 * EP + ids, mask=m, other=0, volatile=True)
        tl.store(sorted_ptr + first + place, offs, mask=m)
        blocks = tl.arange(0, MBP)
        block_start = blocks * BLOCK_M
        before = (ends[None, :] <= block_start[:, None]) & em[None, :]
        expert = tl.sum(before.to(tl.int32), 1)
        expert = tl.where(block_start < total, expert, -1)
        tl.store(expert_ids_ptr + blocks, expert, mask=blocks < max_blocks)

    @triton.jit(do_not_specialize=["n_slots", "top_k"])  # one compile per weight shape, any batch
    def _grouped_gemm_kernel(a_ptr, w_ptr, c_ptr, sorted_ptr, expert_ids_ptr, n_post_ptr, rw_ptr, N, K, n_slots,
                             top_k, stride_am, stride_we, stride_wn, stride_cm, A_PER_TOKEN: tl.constexpr,
                             MUL_WEIGHT: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """C[slot, n] = A[row(slot)] . W[expert(block), n, :] for the BLOCK_M slots of one
        expert block; row(slot) = slot // top_k when A holds tokens, slot when A holds slots;
        optionally times the slot's router weight. Blocks past the padded total exit."""
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        if pid_m * BLOCK_M >= tl.load(n_post_ptr):
            return
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
        slot = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = slot < n_slots
        if A_PER_TOKEN:
            row = slot // top_k
        else:
            row = slot
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + row[:, None].to(tl.int64) * stride_am + ks[None, :]
        w_ptrs = w_ptr + expert * stride_we + cols[None, :].to(tl.int64) * stride_wn + ks[:, None]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_ok = (k0 + ks) < K
            a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None] & (cols[None, :] < N), other=0.0)
            if UPCAST:  # the CPU interpreter cannot dot bf16
                a = a.to(tl.float32)
                w = w.to(tl.float32)
            acc += tl.dot(a, w)
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        if MUL_WEIGHT:
            rw = tl.load(rw_ptr + slot, mask=valid, other=0.0).to(tl.float32)
            acc = acc * rw[:, None]
        c_ptrs = c_ptr + slot[:, None].to(tl.int64) * stride_cm + cols[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & (cols[None, :] < N))

    @triton.jit
    def _silu_mul_kernel(x_ptr, y_ptr, F_dim, stride_x, BLOCK: tl.constexpr):
        """y[r, :] = silu(x[r, :F]) * x[r, F:2F], in fp32, stored in y's dtype."""
        r = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = c < F_dim
        g = tl.load(x_ptr + r * stride_x + c, mask=m, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + r * stride_x + F_dim + c, mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + r * F_dim + c, (g / (1.0 + tl.exp(-g)) * u).to(y_ptr.dtype.element_ty), mask=m)


@dataclass(frozen=True)
class GroupedConfig:
    """Tile sizes of the grouped GEMMs (BLOCK_N chosen per GEMM to fill the SMs)."""

    block_m: int = 16
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3
    sm_count: int = 132


def _block_n(cfg: GroupedConfig, n_out: int, busy_blocks: int) -> int:
    """The widest BLOCK_N (128, 64, 32) that still gives >= 2 programs per SM."""
    for bn in (128, 64):
        if busy_blocks * triton.cdiv(n_out, bn) >= 2 * cfg.sm_count:
            return bn
    return 32


def moe_align(topk_ids, n_experts, block_m):
    """Slots (token x top_k) grouped by expert in blocks of block_m (one Triton program)."""
    n_slots = topk_ids.numel()
    max_padded = n_slots + n_experts * (block_m - 1)
    max_blocks = triton.cdiv(max_padded, block_m)
    dev = topk_ids.device
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(max_blocks, dtype=torch.int32, device=dev)
    n_post = torch.empty(1, dtype=torch.int32, device=dev)
    ep = triton.next_power_of_2(n_experts)
    scratch = torch.empty(3 * ep, dtype=torch.int32, device=dev)
    _moe_align_kernel[(1,)](topk_ids.reshape(-1), sorted_ids, expert_ids, n_post, scratch, n_slots, n_experts,
                            max_padded, max_blocks, BLOCK_M=block_m, NP=triton.next_power_of_2(n_slots), EP=ep,
                            MBP=triton.next_power_of_2(max_blocks), FILL=256)
    return sorted_ids, expert_ids, n_post


def fused_moe(x2, w_gate_up, w_down, routing_weights, selected, cfg: GroupedConfig | None):
    """Grouped-GEMM MoE: align, gate_up, silu*mul, down (times router weights), sum over top_k."""
    cfg = cfg or GroupedConfig()
    tokens, hidden = x2.shape
    n_experts, two_f, _ = w_gate_up.shape
    f, top_k = two_f // 2, selected.shape[1]
    n_slots = tokens * top_k
    sorted_ids, expert_ids, n_post = moe_align(selected, n_experts, cfg.block_m)
    busy = min(n_experts, n_slots)
    grid_m = expert_ids.numel()
    common = dict(UPCAST=INTERPRET, BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
                  num_stages=cfg.num_stages)
    inter = torch.empty(n_slots, two_f, dtype=x2.dtype, device=x2.device)
    bn = _block_n(cfg, two_f, busy)
    _grouped_gemm_kernel[(grid_m, triton.cdiv(two_f, bn))](
        x2, w_gate_up, inter, sorted_ids, expert_ids, n_post, routing_weights, two_f, hidden, n_slots, top_k,
        x2.stride(0), w_gate_up.stride(0), w_gate_up.stride(1), inter.stride(0), A_PER_TOKEN=True,
        MUL_WEIGHT=False, BLOCK_N=bn, **common)
    act = torch.empty(n_slots, f, dtype=x2.dtype, device=x2.device)
    _silu_mul_kernel[(n_slots, triton.cdiv(f, 1024))](inter, act, f, inter.stride(0), BLOCK=1024)
    out = torch.empty(n_slots, hidden, dtype=x2.dtype, device=x2.device)
    bn = _block_n(cfg, hidden, busy)
    _grouped_gemm_kernel[(grid_m, triton.cdiv(hidden, bn))](
        act, w_down, out, sorted_ids, expert_ids, n_post, routing_weights.reshape(-1), hidden, f, n_slots, top_k,
        act.stride(0), w_down.stride(0), w_down.stride(1), out.stride(0), A_PER_TOKEN=False, MUL_WEIGHT=True,
        BLOCK_N=bn, **common)
    return out.view(tokens, top_k, hidden).sum(dim=1)
