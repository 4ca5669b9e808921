"""Closed-loop serving replay above the step model (issue 16).

Requests arrive by their timestamps (sim.serve.requests), a vLLM-like continuous-batching
scheduler admits them while paged KV blocks and ``max_batch`` allow (sim.serve.scheduler),
each step takes the time the step model says (sim.serve.stepmodel), and the replay
(sim.serve.replay) streams per-step and per-request rows while sim.serve.metrics reduces
them to TTFT, TPOT, throughput, batch, KV occupancy and the verdict. ``docs/serving.md``
is the user guide.
"""
