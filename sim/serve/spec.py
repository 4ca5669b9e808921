"""What a serving replay asks: ``ServeSpec``, and how it becomes a setup.

``ServeSpec`` holds the run fields the step model needs (hardware, model, formats, software,
parallelism, ``--set`` overrides; the analytic engine), the request source and rate, and
the scheduler's knobs. ``build`` resolves it once (sim.run.resolve) and derives the KV pool:
what the KV cache's tier has left once the weights, activations and anything else the
placement puts there are held (``sim.run.kv_pool_bytes`` over ``sim.run.capacity`` for a step
of ``max(max_tokens_per_step, max_batch)`` token rows); a sequence's KV bytes are
``sim.run.kv_bytes``, the one footprint the capacity check uses too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict, field_validator, model_validator

from sim import decode_trace as traces
from sim.config.hardware import kernel_costs_origin
from sim.config.loader import parse_assignment
from sim.config.quantity import Strict, real, whole
from sim.config.spec import MAX_BATCH, MAX_CHIPS, MAX_TARGET_MS, Name, RunSpec
from sim.errors import ConfigError, SimulationError
from sim.run import capacity, kv_bytes, kv_pool_bytes, no_kv_room
from sim.serve.clients import CLIENTS
from sim.serve.requests import MAX_DURATION_S, MAX_RATE_PER_S, MAX_TOKENS, RequestSource, open_source
from sim.serve.scheduler import DEFAULT_MAX_BATCH, DEFAULT_MAX_TOKENS_PER_STEP, POLICIES, VLLM_BLOCK_TOKENS, KVPool
from sim.serve.speculative import HEAD_DRAFTERS, HEAD_OVERRIDES
from sim.serve.stepmodel import serve_resolved
from sim.setup import RunSetup
from sim.speculation import tokens_per_step
from sim.units import GB

POOL_CONTEXT = 4096  # tokens of the sequence whose bytes per token size the KV pool figure
MAX_RATE_SCALE = 1e6  # x a trace's native rate (the offered rate is bounded separately)


class ServeSpec(Strict):
    """One serving replay as asked (numbers strictly typed: ``"8"`` is not a count)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    hardware: Name = "h200-sxm"
    model: Name = "llama-3-8b"
    weights: Name = "bf16"
    kv: Name = "fp16"
    software: Name = "fused"  # a software stack (workloads/software/) or a stack YAML
    graph: bool | None = None  # None: the stack's launch mode
    tp: whole(1, MAX_CHIPS) | None = None
    pp: whole(1, MAX_CHIPS) | None = None
    chips: whole(1, MAX_CHIPS) | None = None
    overrides: tuple[tuple[str, Any], ...] = ()
    requests: Name = "azure-conv"  # azure-conv | azure-code | synthetic | a request file
    rate_scale: real(0, MAX_RATE_SCALE, lo_open=True) | None = None
    rate: real(0, MAX_RATE_PER_S, lo_open=True) | None = None  # requests per second
    duration_s: real(0, MAX_DURATION_S, lo_open=True) | None = None
    prompt_median: whole(1, MAX_TOKENS) = 1024  # synthetic only
    output_median: whole(1, MAX_TOKENS) = 256  # synthetic only
    seed: whole(0, 2**63 - 1) = 0
    max_batch: whole(1, MAX_BATCH) = DEFAULT_MAX_BATCH
    block_tokens: whole(1, MAX_TOKENS) = VLLM_BLOCK_TOKENS
    max_tokens_per_step: whole(1, MAX_TOKENS) = DEFAULT_MAX_TOKENS_PER_STEP
    policy: str = "chunked"  # a name in sim.serve.scheduler.POLICIES
    target_ms: real(0, MAX_TARGET_MS, lo_open=True) = 10.0
    ttft_target_ms: real(0, 3.6e6, lo_open=True) | None = None  # the TTFT part of the goodput SLO
    client: str = "open-loop"  # a name in sim.serve.clients.CLIENTS
    concurrency: whole(1, MAX_BATCH) | None = None  # requests in flight (closed loop; caps an open loop)
    speculate_k: whole(1, 64) | None = None  # drafted tokens per verify step (None: no speculation)
    acceptance: real(0, 1) | tuple[real(0, 1), ...] = 0.7  # a rate, or one probability per drafted position
    drafter: Name = "eagle"  # eagle | mtp (heads: the target with one layer) | a draft model's name
    prefill_chips: whole(1, MAX_CHIPS) | None = None  # disaggregated: the prefill pool's chips (sim.serve.disagg)
    decode_chips: whole(1, MAX_CHIPS) | None = None  # ... and the decode pool's

    @model_validator(mode="before")
    @classmethod
    def _policy_defaults(cls, data):
        """The scheduler limits not given take the policy's documented defaults (POLICIES)."""
        if not isinstance(data, dict):
            return data
        entry = POLICIES.get(data.get("policy", "chunked"))
        if entry is None:
            return data  # the field validator names the policies
        data = dict(data)
        for key in ("max_batch", "max_tokens_per_step", "block_tokens"):
            if data.get(key) is None:
                data[key] = getattr(entry, key)
        return data

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value):
        if value not in POLICIES:
            raise ValueError(f"expected one of {', '.join(POLICIES)}")
        return value

    @field_validator("client")
    @classmethod
    def _known_client(cls, value):
        if value not in CLIENTS:
            raise ValueError(f"expected one of {', '.join(CLIENTS)}")
        return value

    @model_validator(mode="after")
    def _acceptance_per_position(self):
        if isinstance(self.acceptance, tuple) and self.speculate_k is not None \
                and len(self.acceptance) != self.speculate_k:
            raise ValueError(f"acceptance gives {len(self.acceptance)} probabilities; expected one per drafted "
                             f"position ({self.speculate_k})")
        return self

    def draft_spec(self) -> RunSpec:
        """The drafter's RunSpec: heads (eagle, mtp) are the target with one decoder layer and its
        LM head; any other name is a draft model on the same chips and formats."""
        if self.drafter in HEAD_DRAFTERS:
            return self.run_spec().model_copy(update={"overrides": (*self.run_spec().overrides, *HEAD_OVERRIDES)})
        return self.run_spec().model_copy(update={"model": self.drafter})

    @model_validator(mode="after")
    def _both_pools(self):
        if (self.prefill_chips is None) != (self.decode_chips is None):
            raise ValueError("disaggregated serving needs both pools: --prefill-chips and --decode-chips")
        return self

    @model_validator(mode="after")
    def _client_concurrency(self):
        if self.client == "closed-loop" and self.concurrency is None:
            raise ValueError("a closed-loop client needs a concurrency (--concurrency N)")
        if self.client == "offline" and self.concurrency is not None:
            raise ValueError("an offline client sends every request at 0: no concurrency")
        return self

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
class ServeSetup:
    """A resolved serving setup: the run, its KV pool figures and the request source."""

    spec: ServeSpec
    resolved: RunSetup
    capacity: dict
    kv_pool_bytes: int
    source: RequestSource

    def footprint_bytes(self, tokens: int) -> int:
        """KV bytes one sequence of ``tokens`` tokens holds on the fullest chip."""
        return kv_bytes(self.resolved, tokens)

    def pool(self) -> KVPool:
        return KVPool(self.kv_pool_bytes, self.spec.block_tokens, self.footprint_bytes)

    def describe(self) -> dict:
        """The setup's figures for the summary. ``max_batch`` is the scheduler's limit (the
        summary's ``max_batch_seen`` is the largest batch run); ``kv_pool_tokens`` is the
        cached tokens the pool holds at ``kv_bytes_per_token`` (the bytes per token of a
        4,096-token sequence: formats with a full-precision window or per-group scales store
        a little more per token in short sequences)."""
        res = plan = self.resolved
        token_bytes = self.footprint_bytes(POOL_CONTEXT) / POOL_CONTEXT
        return {"hardware": res.hardware.name, "kernel_costs": kernel_costs_origin(res.hardware),
                "model": res.model.name, "weights": self.spec.weights,
                "kv": self.spec.kv, "software": self.spec.software, "tp": plan.tp, "pp": plan.pp,
                "chips": res.hardware.chips, "policy": self.spec.policy, "max_batch": self.spec.max_batch,
                "client": self.spec.client, "concurrency": self.spec.concurrency,
                "speculate_k": self.spec.speculate_k, "drafter": self.spec.drafter if self.spec.speculate_k else None,
                "acceptance": self.spec.acceptance if self.spec.speculate_k else None,
                "tokens_per_step": tokens_per_step(self.spec.speculate_k, self.spec.acceptance)
                if self.spec.speculate_k else 1.0,
                "block_tokens": self.spec.block_tokens, "max_tokens_per_step": self.spec.max_tokens_per_step,
                "requests": self.spec.requests, "source": self.source.description,
                "rate_scale": self.source.rate_scale, "nominal_rate_per_s": self.source.rate_per_s,
                "duration_s": self.spec.duration_s,
                "weights_bytes_per_chip": self.capacity["weights_bytes"],
                "activation_bytes_per_chip": self.capacity["activation_bytes"],
                "kv_pool_bytes_per_chip": self.kv_pool_bytes, "kv_bytes_per_token": token_bytes,
                "kv_pool_tokens": int(self.kv_pool_bytes // token_bytes)}


# old result names -> the names used now (tables written before the rename stay readable)
RENAMED = {"max_batch_limit": "max_batch", "kv_pool_tokens_at_4k": "kv_pool_tokens",
           "kv_bytes_per_token_at_4k": "kv_bytes_per_token"}


def upgrade_names(table):
    """A sweep table written under the old names, with the current ones (``max_batch`` was
    the largest batch seen when ``max_batch_limit`` held the limit)."""
    if "max_batch_limit" in table.columns:
        table = table.rename(columns={"max_batch": "max_batch_seen"})
    return table.rename(columns={k: v for k, v in RENAMED.items() if k in table.columns})


def build(spec: ServeSpec) -> ServeSetup:
    """Resolve ``spec``: the run, the KV pool and the request source (ConfigError if bad)."""
    source = open_source(spec.requests, rate_scale=spec.rate_scale, rate_per_s=spec.rate,  # bad input first
                         duration_s=spec.duration_s, seed=spec.seed, prompt_median=spec.prompt_median,
                         output_median=spec.output_median)
    res = serve_resolved(spec.run_spec())
    if res.attention_dp > 1:  # the step model times one attention group holding every sequence (issue 40)
        raise ConfigError(None, "attention_dp", "serve does not model attention data-parallel groups yet: its step "
                          "model would time the whole live batch in one group and meter one group's chips; "
                          "expected attention_dp 1 (use `run --attention-dp` for a fixed batch)", res.attention_dp)
    cap = capacity(dataclasses.replace(res, steps=traces.fixed(spec.activation_rows, 1, 1)))
    pool_bytes = kv_pool_bytes(res, cap)
    if pool_bytes <= 0:  # a verdict about this machine, not bad input: a sweep's row says does-not-fit
        raise SimulationError(f"{no_kv_room(res, cap)}; the activations are sized for a step of "
                              f"{spec.activation_rows:,} token rows (the larger of --max-tokens-per-step and --max-batch)")
    block_bytes = kv_bytes(res, spec.block_tokens)
    if block_bytes > pool_bytes:  # no request could ever be admitted
        raise ConfigError(None, "block_tokens", f"one KV block of {spec.block_tokens:,} tokens takes "
                          f"{block_bytes / GB:.3g} GB per chip, more than the KV pool's {pool_bytes / GB:.3g} GB; "
                          "expected a block that fits the pool", spec.block_tokens)
    return ServeSetup(spec, res, cap, pool_bytes, source)


__all__ = ["ServeSpec", "ServeSetup", "build", "upgrade_names", "RENAMED", "POOL_CONTEXT"]
