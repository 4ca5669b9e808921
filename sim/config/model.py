"""Model shapes: dense decoder transformers (Llama-style, SwiGLU FFN, GQA attention).

Counts only; no weights. ``source`` names the config the shape comes from.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from sim.config.quantity import Strict

PosInt = Field(gt=0, strict=True)


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
    max_context: int = PosInt

    @model_validator(mode="after")
    def _shape(self):
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        return self

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def k_width(self) -> int:
        """Cached K values per token per layer."""
        return self.kv_heads * self.head_dim

    @property
    def v_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def ffn_matrices(self) -> int:
        return 3 if self.activation == "swiglu" else 2

    def params(self) -> dict[str, int]:
        """Parameter counts by group (embeddings, attention, ffn, norms, lm_head)."""
        h = self.hidden
        attn = h * (self.q_width + self.k_width + self.v_width) + self.q_width * h
        ffn = self.ffn_matrices * h * self.ffn
        return {
            "embedding": self.vocab * h,
            "attention": self.layers * attn,
            "ffn": self.layers * ffn,
            "norms": (2 * self.layers + 1) * h,
            "lm_head": 0 if self.tied_embeddings else self.vocab * h,
        }

    @property
    def total_params(self) -> int:
        return sum(self.params().values())
