"""ChainSteps' memoized decode-attention time (keyed by the batch and ``kv_traffic`` of the
window-clamped contexts) equals, bit for bit, the time of the op lowered and costed afresh."""

from __future__ import annotations

import random

import pytest

from sim.run import ChainSteps, RunSpec, Stepper, resolve


@pytest.mark.parametrize("model", ["llama-3.2-1b", "gemma-2-9b"])  # gemma-2: sliding and global layers
def test_memoized_attention_time_is_the_fresh_one(model):
    setup = resolve(RunSpec(model=model, context=700, steps=1, batch=4, engine="analytic"))
    chain = ChainSteps(Stepper(setup))
    chain.learn(1, 1)
    rng = random.Random(7)
    hits = 0
    for _ in range(60):
        contexts = tuple(rng.choice((1, 255, 256, 4095, 4096, 4097, 9000)) for _ in range(rng.randint(1, 6)))
        for layer, _n in chain._kinds:
            before = len(chain._attention)
            memo = chain._decode_attention_ns(tuple(reversed(contexts)), layer)
            hits += len(chain._attention) == before
            fresh = chain.costs.cost_once(chain.graphs.attention(contexts, layer).work).total_ns
            assert memo == fresh, (contexts, layer)
    assert hits > 0  # some steps were answered from the memo (and matched)
    if model == "gemma-2-9b":
        assert len(chain._kinds) == 2
