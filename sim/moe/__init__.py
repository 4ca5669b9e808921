"""Mixture-of-Experts routing traces (sim.moe.routing) and expert placement (sim.moe.placement)."""

from sim.moe.placement import POLICIES, Placement, place
from sim.moe.routing import RoutingTrace, expected_distinct, generate, read, write

__all__ = ["POLICIES", "Placement", "place", "RoutingTrace", "expected_distinct", "generate", "read", "write"]
