"""Speculative decoding's arithmetic: tokens per verify step from the acceptance of drafts.

A drafter (a small draft model, MTP modules or EAGLE-like heads) proposes ``k`` tokens; the
target verifies them and the ``k + 1`` logit rows of one forward pass: the longest accepted
prefix is kept and the target's own token after it is added, so a verify step yields
``1 + (accepted prefix length)`` tokens (Leviathan et al., "Fast Inference from Transformers
via Speculative Decoding", ICML 2023, section 3.1).

Acceptance is given either as one rate ``a`` (each drafted token accepted with probability
``a``, independently) or per position: ``p_i``, the probability that draft token ``i`` is
accepted given that tokens ``1 .. i-1`` were (what EAGLE and MTP papers report as accept
rates by position). The expected tokens per step are

    E = 1 + sum_{i=1..k} prod_{j<=i} p_j,       and for a constant a:  (1 - a^(k+1)) / (1 - a)

(= k + 1 at a = 1). Pure arithmetic: no units but tokens; used by ``decodesim run`` (how much
speculation a step time needs to meet a per-token target) and by the serving replay.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def tokens_per_step(k: int, acceptance: float | Sequence[float]) -> float:
    """Expected tokens a verify step yields with ``k`` drafted tokens at ``acceptance`` (a rate
    in [0, 1], or one probability per drafted position, ``k`` of them)."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    probs = [float(acceptance)] * k if isinstance(acceptance, (int, float)) else [float(p) for p in acceptance]
    if len(probs) != k:
        raise ValueError(f"expected {k} acceptance probabilities (one per drafted position), got {len(probs)}")
    if any(not 0.0 <= p <= 1.0 for p in probs):
        raise ValueError(f"acceptance probabilities must be in [0, 1], got {probs}")
    total, reach = 1.0, 1.0
    for p in probs:
        reach *= p
        total += reach
    return total


def acceptance_needed(k: int, tokens: float, tol: float = 1e-10) -> float | None:
    """The smallest constant acceptance at which ``k`` drafts yield ``tokens`` per step (a
    bisection: ``tokens_per_step`` grows with the rate), or None when even a = 1 (``k + 1``
    tokens) is not enough. At most one token is needed: 0."""
    if tokens <= 1.0:
        return 0.0
    if tokens > k + 1:
        return None
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if tokens_per_step(k, mid) >= tokens:
            hi = mid
        else:
            lo = mid
    return hi


def speculation_note(per_token_ms: float, target_ms: float, k: int = 4) -> dict:
    """What a step of ``per_token_ms`` needs from speculation to meet ``target_ms`` per token,
    verify steps costing about what a decode step does (small batches: the weights' reads
    dominate and k + 1 rows read them once): the tokens per step needed and the constant
    acceptance that gives them with ``k`` drafts (None: more than k + 1 tokens needed)."""
    needed = per_token_ms / target_ms if target_ms > 0 else math.inf
    return {"tokens_per_step_needed": needed, "draft_tokens": k,
            "acceptance_needed": None if needed <= 1.0 else acceptance_needed(k, needed)}


__all__ = ["acceptance_needed", "speculation_note", "tokens_per_step"]
