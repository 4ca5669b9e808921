"""Model shapes: decoder transformers (Llama-style, SwiGLU FFN, GQA attention), with an
optional Mixture-of-Experts FFN (``moe:``) and an optional attention description (``attention:``,
for DeepSeek's multi-head latent attention, whose cache is one compressed latent per token).

The FFN activation is ``swiglu`` (gate, up, down: silu(gate) * up), ``geglu`` (the same three
matrices with GELU, tanh approximation: Gemma) or ``gelu`` (two matrices, no gate). Gemma 2's
fields: ``sliding_window`` with ``sliding_layers`` (``all``, or ``even``: layers 0, 2, 4, ...
attend to the last ``sliding_window`` tokens only, the others to the whole context),
``attn_logit_softcap`` and ``final_logit_softcap`` (scores and logits pass through
cap x tanh(x / cap)), ``post_norms`` (RMSNorm after attention and after the FFN as well as
before), ``norm_unit_offset`` (RMSNorm scales by 1 + weight) and ``embed_scale`` (embeddings
times sqrt(hidden)).

Counts only; no weights. ``source`` names the config the shape comes from. Every count lies
in a sanity range well beyond any published model (``MAX_LAYERS`` layers, ...), so a typo
such as ``layers: 100000000000`` is an error that states the range, not minutes of work.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PrivateAttr, model_validator

from sim.config.quantity import Strict, whole

PosFloat = Annotated[float, Field(gt=0, le=1e6)]

MAX_LAYERS = 10_000  # ~80x the deepest published decoder (Llama 3.1 405B: 126)
MAX_WIDTH = 1_000_000  # hidden size, FFN width, LoRA rank (largest published: ~50k)
MAX_HEADS = 100_000
MAX_HEAD_DIM = 65_536
MAX_VOCAB = 100_000_000
MAX_CONTEXT = 1_000_000_000
MAX_EXPERTS = 16_384  # routed experts per layer (largest published: 512)
MAX_SHARED_EXPERTS = 1_024

Layers = whole(1, MAX_LAYERS)
Width = whole(1, MAX_WIDTH)
Heads = whole(1, MAX_HEADS)


class MoESpec(Strict):
    """A Mixture-of-Experts FFN: ``experts`` routed experts of ``expert_ffn`` (SwiGLU), of
    which each token uses ``top_k``, plus ``shared_experts`` every token uses (each of
    ``shared_expert_ffn``, default ``expert_ffn``). Layers listed in ``dense_layers`` (or the
    first ``first_k_dense``) use the dense FFN of the model's ``ffn`` size instead."""

    experts: whole(1, MAX_EXPERTS)
    top_k: whole(1, MAX_EXPERTS)
    shared_experts: whole(0, MAX_SHARED_EXPERTS) = 0
    expert_ffn: Width
    shared_expert_ffn: Width | None = None
    first_k_dense: whole(0, MAX_LAYERS) = 0
    dense_layers: tuple[whole(0, MAX_LAYERS - 1), ...] | None = None
    router: Literal["softmax", "sigmoid"] = "softmax"
    _dense: frozenset[int] = PrivateAttr(default=frozenset())

    @model_validator(mode="after")
    def _shape(self):
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) must be at most experts ({self.experts})")
        if self.first_k_dense and self.dense_layers is not None:
            raise ValueError("give first_k_dense or dense_layers, not both")
        if self.dense_layers is not None:
            self._dense = frozenset(self.dense_layers)
            if len(self._dense) != len(self.dense_layers):
                raise ValueError("dense_layers must not repeat a layer")
        return self

    @property
    def shared_ffn(self) -> int:
        return self.shared_expert_ffn or self.expert_ffn

    def is_dense(self, layer: int) -> bool:
        if self.dense_layers is not None:
            return layer in self._dense
        return layer < self.first_k_dense


class AttentionSpec(Strict):
    """``gqa`` (the default: K and V of ``kv_heads x head_dim`` per token) or ``mla``
    (DeepSeek multi-head latent attention: one cached latent of ``kv_lora_rank`` plus the
    decoupled RoPE key of ``qk_rope_dim`` per token and layer, read as K and as V)."""

    kind: Literal["gqa", "mla"] = "gqa"
    kv_lora_rank: Width | None = None
    qk_rope_dim: whole(1, MAX_HEAD_DIM) | None = None

    @model_validator(mode="after")
    def _mla(self):
        if self.kind == "mla" and (self.kv_lora_rank is None or self.qk_rope_dim is None):
            raise ValueError("mla attention needs kv_lora_rank and qk_rope_dim")
        return self


class ModelSpec(Strict):
    name: str
    source: str
    layers: Layers
    hidden: Width
    heads: Heads
    kv_heads: Heads
    head_dim: whole(1, MAX_HEAD_DIM)
    ffn: Width
    vocab: whole(1, MAX_VOCAB)
    tied_embeddings: bool
    activation: Literal["swiglu", "geglu", "gelu"] = "swiglu"
    # the reference implementation stores Q, K, V (and gate, up) as one fused weight, so a
    # plain PyTorch stack runs one GEMM for them (Phi-3's qkv_proj and gate_up_proj)
    fused_projections: bool = False
    # a bias on the Q, K and V projections (Qwen2): fused into a bf16 GEMM's epilogue, a kernel
    # of its own after an FP8 one (the stack's matrix_prologue bias kernels)
    qkv_bias: bool = False
    # RMSNorm of the query and key projections before RoPE ("QK-norm"): over each whole
    # projection (OLMoE: q_norm = RMSNorm(heads x head_dim), k_norm likewise) or per head
    # (Qwen3: RMSNorm(head_dim) shared by the heads)
    qk_norm: Literal["none", "full", "per_head"] = "none"
    max_context: whole(1, MAX_CONTEXT)
    moe: MoESpec | None = None
    attention: AttentionSpec | None = None
    sliding_window: whole(1, MAX_CONTEXT) | None = None  # tokens a sliding layer attends to
    sliding_layers: Literal["all", "even"] = "all"  # which layers slide (with sliding_window)
    attn_logit_softcap: PosFloat | None = None
    final_logit_softcap: PosFloat | None = None
    post_norms: bool = False  # Gemma 2: RMSNorm after attention and after the FFN too
    norm_unit_offset: bool = False  # Gemma: RMSNorm multiplies by (1 + weight)
    embed_scale: bool = False  # Gemma: embeddings multiplied by sqrt(hidden)

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
        if self.sliding_layers != "all" and self.sliding_window is None:
            raise ValueError("sliding_layers needs sliding_window (the tokens a sliding layer attends to)")
        return self

    def window(self, layer: int) -> int | None:
        """The tokens ``layer`` attends to at most (None: the whole context)."""
        if self.sliding_window is None or (self.sliding_layers == "even" and layer % 2):
            return None
        return self.sliding_window

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
    def qk_norm_params(self) -> int:
        """Gain weights of one layer's QK-norm (0 without one)."""
        if self.qk_norm == "full":
            return self.q_width + self.k_width
        return 2 * self.head_dim if self.qk_norm == "per_head" else 0

    @property
    def ffn_matrices(self) -> int:
        """Weight matrices of the FFN: gated activations (swiglu, geglu) have a gate and an up
        projection before the down projection."""
        return 3 if self.activation in ("swiglu", "geglu") else 2

    @property
    def norms_per_layer(self) -> int:
        return 4 if self.post_norms else 2

    def params(self) -> dict[str, int]:
        """Parameter counts by group (embeddings, attention, ffn, norms, lm_head)."""
        h = self.hidden
        attn = h * (self.q_width + self.k_width + self.v_width) + self.q_width * h
        if self.qkv_bias:
            attn += self.q_width + self.k_width + self.v_width
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
            "norms": (self.norms_per_layer * self.layers + 1) * h + self.layers * self.qk_norm_params,
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
