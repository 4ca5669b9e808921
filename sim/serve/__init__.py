"""Serving replay above the step model (issues 16 and 41).

A client sends requests (sim.serve.clients: open loop at their timestamps, closed loop at a
fixed concurrency, or offline), an engine's continuous-batching scheduler admits them while
paged KV blocks and ``max_batch`` allow (sim.serve.scheduler: vLLM, TensorRT-LLM, SGLang),
each step takes the time the step model says (sim.serve.stepmodel), and the replay
(sim.serve.replay) streams per-step and per-request rows while sim.serve.metrics reduces
them to TTFT, TPOT, throughput, batch, KV occupancy and the verdict. Disaggregated prefill/decode pools (sim.serve.disagg) and speculative
decoding (sim.serve.speculative) sit on the same step-model protocol. ``docs/serving.md``
is the user guide.
"""
