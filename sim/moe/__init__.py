"""Mixture-of-Experts data: routing traces (sim.moe.routing), expert placement
(sim.moe.placement), expert sizes (sim.moe.sizes) and a run's MoE plan (sim.moe.plan).

The package imports nothing itself, so that the sizes stay importable without numpy.
"""
