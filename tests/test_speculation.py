"""Speculative decoding: tokens per verify step by hand, the verify step through the step-model
protocol, and what `run` says speculation would need."""

from __future__ import annotations

import pytest

from sim.serve.spec import ServeSpec
from sim.serve.speculative import SpeculativeStepModel
from sim.speculation import acceptance_needed, speculation_note, tokens_per_step


def test_tokens_per_step_for_a_constant_acceptance_by_hand():
    # k = 4, a = 0.7: 1 + 0.7 + 0.49 + 0.343 + 0.2401 = 2.7731 = (1 - 0.7^5) / (1 - 0.7)
    assert tokens_per_step(4, 0.7) == pytest.approx(2.7731)
    assert tokens_per_step(4, 0.7) == pytest.approx((1 - 0.7 ** 5) / (1 - 0.7))
    assert tokens_per_step(3, 0.0) == 1.0 and tokens_per_step(3, 1.0) == 4.0
    # per position: 1 + 0.8 + 0.8 x 0.5 + 0.8 x 0.5 x 0.25 = 2.3
    assert tokens_per_step(3, [0.8, 0.5, 0.25]) == pytest.approx(2.3)
    with pytest.raises(ValueError, match="one per drafted position"):
        tokens_per_step(3, [0.8, 0.5])


def test_acceptance_needed_inverts_tokens_per_step():
    a = acceptance_needed(4, 2.7731)
    assert a == pytest.approx(0.7, abs=1e-6)
    assert acceptance_needed(4, 6.0) is None and acceptance_needed(4, 0.9) == 0.0
    note = speculation_note(per_token_ms=21.0, target_ms=10.0, k=4)
    assert note["tokens_per_step_needed"] == pytest.approx(2.1)
    assert tokens_per_step(4, note["acceptance_needed"]) == pytest.approx(2.1, abs=1e-6)
    assert speculation_note(5.0, 10.0)["acceptance_needed"] is None  # meets without


class Linear:
    """base + per decode row + per prefill token + per logit row beyond decode rows: a step
    model whose parts are known by hand."""

    def __init__(self, base, decode, prefill):
        self.base, self.decode, self.prefill = base, decode, prefill
        self.calls = []

    def step_ns(self, decode_contexts, prefill=()):
        self.calls.append((decode_contexts, prefill))
        return self.base + self.decode * len(decode_contexts) + self.prefill * sum(c for c, _ in prefill)


def test_a_speculative_step_by_hand():
    target, drafter = Linear(1000.0, 30.0, 10.0), Linear(100.0, 3.0, 1.0)
    model = SpeculativeStepModel(target, drafter, k=2, acceptance=0.5)  # E = 1 + 0.5 + 0.25 = 1.75
    t = model.step_ns((100, 200), ())
    verify = 1000 + 10 * 2 * 3  # one pass over (k + 1) = 3 tokens of each of 2 sequences
    logits = (30 - 10) * (6 - 2)  # 4 more logit rows at (decode - prefill) row cost each
    draft = 2 * (100 + 3 * 2)  # k = 2 drafter decode steps of the 2 sequences
    assert t == pytest.approx((verify + logits + draft) / 1.75)
    assert ((3, 99), (3, 199)) in [p for _, p in target.calls]  # verify = a chunk at c - 1 cached tokens
    assert ((100, 200), ()) in drafter.calls and ((101, 201), ()) in drafter.calls
    # a prompt chunk in the same step is not divided: it adds its full cost, on both models
    mixed = model.step_ns((100, 200), ((64, 0),))
    assert mixed - t == pytest.approx(10 * 64 + (100 + 64))


def test_speculation_settings_are_checked():
    assert ServeSpec(speculate_k=3, acceptance=(0.8, 0.5, 0.25)).draft_spec().overrides[-1] == ("model.layers", 1)
    assert ServeSpec(speculate_k=2, drafter="llama-3.2-1b").draft_spec().model == "llama-3.2-1b"
    with pytest.raises(ValueError, match="one per drafted position"):
        ServeSpec(speculate_k=2, acceptance=(0.8, 0.5, 0.25))
