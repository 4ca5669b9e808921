"""What a serving replay asks: ``ServeSpec``, and how it becomes a setup.

``ServeSpec`` holds the run fields the step model needs (hardware, model, formats, software,
parallelism, ``--set`` overrides; the analytic engine), the request source and rate, and
the scheduler's knobs. ``build`` resolves it once (sim.run.resolve) and derives the KV pool:
the backing store's capacity minus the weights and activations that ``sim.run.capacity``
computes for a step of ``max(max_tokens_per_step, max_batch)`` token rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator

from sim import trace as traces
from sim.config.loader import parse_assignment
from sim.config.quantity import Strict
from sim.config.setup import Setup as Resolved
from sim.config.spec import RunSpec
from sim.run import capacity
from sim.serve.requests import RequestSource, open_source
from sim.serve.scheduler import DEFAULT_MAX_BATCH, DEFAULT_MAX_TOKENS_PER_STEP, VLLM_BLOCK_TOKENS, KVPool
from sim.serve.stepmodel import serve_resolved


class ServeSpec(Strict):
    hardware: str = "h200-sxm"
    model: str = "llama-3-8b"
    weights: str = "bf16"
    kv: str = "fp16"
    software: str = "fused"  # a software stack (workloads/software/) or a stack YAML
    graph: bool | None = None  # None: the stack's launch mode
    tp: int | None = Field(default=None, gt=0)
    pp: int | None = Field(default=None, gt=0)
    chips: int | None = Field(default=None, gt=0)
    overrides: tuple[tuple[str, Any], ...] = ()
    requests: str = "azure-conv"  # azure-conv | azure-code | synthetic | a request file
    rate_scale: float | None = Field(default=None, gt=0)
    rate: float | None = Field(default=None, gt=0)  # requests per second
    duration_s: float | None = Field(default=None, gt=0)
    prompt_median: int = Field(default=1024, ge=1)  # synthetic only
    output_median: int = Field(default=256, ge=1)  # synthetic only
    seed: int = 0
    max_batch: int = Field(default=DEFAULT_MAX_BATCH, ge=1)
    block_tokens: int = Field(default=VLLM_BLOCK_TOKENS, ge=1)
    max_tokens_per_step: int = Field(default=DEFAULT_MAX_TOKENS_PER_STEP, ge=1)
    policy: Literal["chunked", "separate"] = "chunked"
    target_ms: float = Field(default=10.0, gt=0)

    @field_validator("overrides", mode="before")
    @classmethod
    def _pairs(cls, value):
        return tuple(parse_assignment(v) if isinstance(v, str) else tuple(v) for v in value or ())

    @property
    def activation_rows(self) -> int:
        """Token rows of the largest step the activations are sized for."""
        return max(self.max_tokens_per_step, self.max_batch)

    def run_spec(self) -> RunSpec:
        """The RunSpec the step model resolves (analytic engine; one step of activation rows)."""
        return RunSpec(hardware=self.hardware, model=self.model, weights=self.weights, kv=self.kv,
                       software=self.software, graph=self.graph, tp=self.tp, pp=self.pp, chips=self.chips,
                       overrides=self.overrides, engine="analytic", target_ms=self.target_ms,
                       batch=self.activation_rows, context=1, steps=1, seed=self.seed)


@dataclass
class Setup:
    """A resolved serving setup: the run, its KV pool figures and the request source."""

    spec: ServeSpec
    resolved: Resolved
    capacity: dict
    kv_pool_bytes: int
    source: RequestSource

    def footprint_bytes(self, tokens: int) -> int:
        """KV bytes one sequence of ``tokens`` tokens holds on the fullest chip."""
        res = self.resolved
        return res.kv.kv_footprint(tokens, res.k_width, res.v_width) * res.layers_per_stage

    def pool(self) -> KVPool:
        return KVPool(self.kv_pool_bytes, self.spec.block_tokens, self.footprint_bytes)

    def describe(self) -> dict:
        res = plan = self.resolved
        token_bytes = self.footprint_bytes(4096) / 4096
        return {"hardware": res.hardware.name, "model": res.model.name, "weights": self.spec.weights,
                "kv": self.spec.kv, "software": self.spec.software, "tp": plan.tp, "pp": plan.pp,
                "chips": res.hardware.chips, "policy": self.spec.policy, "max_batch_limit": self.spec.max_batch,
                "block_tokens": self.spec.block_tokens, "max_tokens_per_step": self.spec.max_tokens_per_step,
                "requests": self.spec.requests, "source": self.source.description,
                "rate_scale": self.source.rate_scale, "rate_per_s": self.source.rate_per_s,
                "duration_s": self.spec.duration_s,
                "weights_bytes_per_chip": self.capacity["weights_bytes"],
                "activation_bytes_per_chip": self.capacity["activation_bytes"],
                "kv_pool_bytes_per_chip": self.kv_pool_bytes, "kv_bytes_per_token_at_4k": token_bytes,
                "kv_pool_tokens_at_4k": int(self.kv_pool_bytes // token_bytes)}


def build(spec: ServeSpec) -> Setup:
    """Resolve ``spec``: the run, the KV pool and the request source (ConfigError if bad)."""
    res = serve_resolved(spec.run_spec())
    cap = capacity(dataclasses.replace(res, steps=traces.fixed(spec.activation_rows, 1, 1)))
    pool_bytes = int(cap["available_bytes"] - cap["weights_bytes"] - cap["activation_bytes"])
    source = open_source(spec.requests, rate_scale=spec.rate_scale, rate_per_s=spec.rate,
                         duration_s=spec.duration_s, seed=spec.seed, prompt_median=spec.prompt_median,
                         output_median=spec.output_median)
    return Setup(spec, res, cap, pool_bytes, source)


__all__ = ["ServeSpec", "Setup", "build"]
