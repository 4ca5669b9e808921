"""Lowering: one decode step becomes an op graph (sim.lowering.graph).

``decode.lower_step`` builds the per-layer ops of a dense decoder; the FFN block is a
strategy (dense here, Mixture-of-Experts in sim.lowering.moe) so that new blocks plug in
without touching the engine. The lowering never advances time.
"""
