"""Model shapes: decoder transformers (Llama-style, SwiGLU FFN, GQA attention), with an
optional Mixture-of-Experts FFN (``moe:``) and an optional attention description (``attention:``,
for DeepSeek's multi-head latent attention, whose cache is one compressed latent per token).

Counts only; no weights. ``source`` names the config the shape comes from.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from sim.config.quantity import Strict

PosInt = Field(gt=0, strict=True)


class MoESpec(Strict):
    """A Mixture-of-Experts FFN: ``experts`` routed experts of ``expert_ffn`` (SwiGLU), of
    which each token uses ``top_k``, plus ``shared_experts`` every token uses (each of
    ``shared_expert_ffn``, default ``expert_ffn``). Layers listed in ``dense_layers`` (or the
    first ``first_k_dense``) use the dense FFN of the model's ``ffn`` size instead."""

    experts: int = PosInt
    top_k: int = PosInt
    shared_experts: int = Field(default=0, ge=0, strict=True)
    expert_ffn: int = PosInt
    shared_expert_ffn: int | None = Field(default=None, gt=0, strict=True)
    first_k_dense: int = Field(default=0, ge=0, strict=True)
    dense_layers: tuple[int, ...] | None = None
    router: Literal["softmax", "sigmoid"] = "softmax"

    @model_validator(mode="after")
    def _shape(self):
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) must be at most experts ({self.experts})")
        if self.first_k_dense and self.dense_layers is not None:
            raise ValueError("give first_k_dense or dense_layers, not both")
        return self

    @property
    def shared_ffn(self) -> int:
        return self.shared_expert_ffn or self.expert_ffn

    def is_dense(self, layer: int) -> bool:
        if self.dense_layers is not None:
            return layer in self.dense_layers
        return layer < self.first_k_dense


class AttentionSpec(Strict):
    """``gqa`` (the default: K and V of ``kv_heads x head_dim`` per token) or ``mla``
    (DeepSeek multi-head latent attention: one cached latent of ``kv_lora_rank`` plus the
    decoupled RoPE key of ``qk_rope_dim`` per token and layer, read as K and as V)."""

    kind: Literal["gqa", "mla"] = "gqa"
    kv_lora_rank: int | None = Field(default=None, gt=0, strict=True)
    qk_rope_dim: int | None = Field(default=None, gt=0, strict=True)

    @model_validator(mode="after")
    def _mla(self):
        if self.kind == "mla" and (self.kv_lora_rank is None or self.qk_rope_dim is None):
            raise ValueError("mla attention needs kv_lora_rank and qk_rope_dim")
        return self


class ModelSpec(Strict):
    name: str
    source: str
    layers: int = PosInt
    hidden: int = PosInt
    heads: int = PosInt
    kv_heads: int = PosInt
    head_dim: int = PosInt
    ffn: int = PosInt
    vocab: int = PosInt
    tied_embeddings: bool
    activation: Literal["swiglu", "gelu"] = "swiglu"
    # the reference implementation stores Q, K, V (and gate, up) as one fused weight, so a
    # plain PyTorch stack runs one GEMM for them (Phi-3's qkv_proj and gate_up_proj)
    fused_projections: bool = False
    max_context: int = PosInt
    moe: MoESpec | None = None
    attention: AttentionSpec | None = None

    @model_validator(mode="after")
    def _shape(self):
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.moe is not None and self.moe.dense_layers is not None:
            bad = [layer for layer in self.moe.dense_layers if not 0 <= layer < self.layers]
            if bad:
                raise ValueError(f"moe.dense_layers must lie in [0, {self.layers}), got {bad}")
        if self.mla and self.kv_heads != 1:
            raise ValueError("mla attention caches one latent shared by all heads: set kv_heads: 1")
        return self

    @property
    def mla(self) -> bool:
        return self.attention is not None and self.attention.kind == "mla"

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def k_width(self) -> int:
        """Cached K values per token per layer (MLA: the latent plus the RoPE key)."""
        if self.mla:
            return self.attention.kv_lora_rank + self.attention.qk_rope_dim
        return self.kv_heads * self.head_dim

    @property
    def v_width(self) -> int:
        """Cached V values per token per layer (MLA: none; V is read from the latent)."""
        if self.mla:
            return 0
        return self.kv_heads * self.head_dim

    @property
    def ffn_matrices(self) -> int:
        return 3 if self.activation == "swiglu" else 2

    def params(self) -> dict[str, int]:
        """Parameter counts by group (embeddings, attention, ffn, norms, lm_head)."""
        h = self.hidden
        attn = h * (self.q_width + self.k_width + self.v_width) + self.q_width * h
        dense_ffn = self.ffn_matrices * h * self.ffn
        ffn = 0
        for layer in range(self.layers):
            if self.moe is None or self.moe.is_dense(layer):
                ffn += dense_ffn
            else:
                moe = self.moe
                ffn += (moe.experts * self.ffn_matrices * h * moe.expert_ffn
                        + moe.shared_experts * self.ffn_matrices * h * moe.shared_ffn + h * moe.experts)
        return {
            "embedding": self.vocab * h,
            "attention": self.layers * attn,
            "ffn": ffn,
            "norms": (2 * self.layers + 1) * h,
            "lm_head": 0 if self.tied_embeddings else self.vocab * h,
        }

    @property
    def total_params(self) -> int:
        return sum(self.params().values())

    @property
    def active_params(self) -> int:
        """Parameters one token uses: the routed experts it picks, not all of them."""
        p = self.params()
        if self.moe is None:
            return sum(p.values())
        moe, h = self.moe, self.hidden
        idle = (moe.experts - moe.top_k) * self.ffn_matrices * h * moe.expert_ffn
        moe_layers = sum(1 for layer in range(self.layers) if not moe.is_dense(layer))
        return sum(p.values()) - moe_layers * idle
