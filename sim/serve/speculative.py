"""Speculative decoding in the serving replay: a step model that drafts and verifies.

``SpeculativeStepModel`` wraps the target's step model (the ``StepModel`` protocol,
``step_ns(decode_contexts, prefill)``, and nothing else of it) and a drafter's:

* **drafting**: ``k`` decode steps of the drafter over the step's decoding sequences, at
  contexts ``c, c + 1, ..., c + k - 1`` (a draft model, or EAGLE-like / MTP heads: the
  target with one decoder layer and its LM head, ``drafter_overrides``); prompts chunks are
  prefilled by the drafter too (a draft model needs its own KV; a head reads the target's
  hidden states of the prompt);
* **verification**: one target pass over ``k + 1`` tokens per decoding sequence (its last
  sampled token and the ``k`` drafts) at its context: through the protocol that is a prompt
  chunk ``(k + 1, c - 1)`` (``c - 1`` tokens cached before it), which costs the attention of
  ``k + 1`` causal queries over the context once (as verification does; ``k + 1`` decode rows
  would read the context ``k + 1`` times). Its logit rows differ: the step model gives a
  chunk one logit row (its last token), verification needs all ``k + 1``. The difference is
  corrected through the protocol: ``D(R) = step_ns((1,) x R, ()) - step_ns((), ((R, 0),))``
  is the cost of ``R - 1`` logit rows beyond one (same body rows, attention over one token),
  so the step adds ``D(n (k + 1)) - D(n)`` for ``n`` decoding sequences (memoised by ``R``);
* **tokens**: a verify step yields ``E = tokens_per_step(k, acceptance)`` tokens per sequence
  on average (sim.speculation). The replay stays one token per sequence per step, in
  expectation: a step that decodes takes ``(draft + verify + logits) / E`` (each sequence
  advances one token in 1/E of a verify step), plus, undivided, what its prompt chunks add
  (``step_ns(verify + chunks) - step_ns(verify)``) and the drafter's prefill of them.

What it leaves out: the burstiness of accepted tokens (ITL is smoothed; TPOT and throughput
are their expectations), the ``k`` rejected tokens' KV held during a step, and the drafter's
weights and KV in the memory pool (a 1B draft or one head layer beside a 70B target).
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.serve.stepmodel import StepModel
from sim.speculation import tokens_per_step

HEAD_DRAFTERS = ("eagle", "mtp")  # drafters that are heads on the target: one decoder layer + the LM head
HEAD_OVERRIDES = (("model.layers", 1),)


class SpeculativeStepModel:
    """Step times of speculative decoding (module docstring)."""

    def __init__(self, target: StepModel, drafter: StepModel, k: int, acceptance: float | Sequence[float]):
        if k < 1:
            raise ValueError(f"k must be >= 1 drafted token, got {k}")
        self.target, self.drafter, self.k = target, drafter, k
        self.tokens_per_step = tokens_per_step(k, acceptance)
        self._extra: dict[int, float] = {}

    def logit_rows_ns(self, rows: int) -> float:
        """``D(rows)``: what ``rows - 1`` logit rows beyond one cost (module docstring)."""
        extra = self._extra.get(rows)
        if extra is None:
            extra = self._extra[rows] = (self.target.step_ns((1,) * rows, ())
                                         - self.target.step_ns((), ((rows, 0),)))
        return extra

    def step_ns(self, decode_contexts: tuple[int, ...], prefill: tuple[tuple[int, int], ...] = ()) -> float:
        decode_contexts, prefill = tuple(decode_contexts), tuple(prefill)
        draft_prefill = self.drafter.step_ns((), prefill) if prefill else 0.0
        if not decode_contexts:
            return self.target.step_ns((), prefill) + draft_prefill
        n, k = len(decode_contexts), self.k
        verify = tuple((k + 1, c - 1) for c in decode_contexts)
        verify_ns = self.target.step_ns((), verify)
        mixed_ns = self.target.step_ns((), verify + prefill) if prefill else verify_ns
        logits_ns = self.logit_rows_ns(n * (k + 1)) - self.logit_rows_ns(n)
        draft_ns = sum(self.drafter.step_ns(tuple(c + i for c in decode_contexts), ()) for i in range(k))
        return (draft_ns + verify_ns + logits_ns) / self.tokens_per_step + (mixed_ns - verify_ns) + draft_prefill


__all__ = ["HEAD_DRAFTERS", "HEAD_OVERRIDES", "SpeculativeStepModel"]
