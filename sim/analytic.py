"""Closed-form model of the same op graph: the cross-check and the fast path.

Each op takes ``gap + fill + max(per-link bytes / (capacity x efficiency), per-flow bytes /
cap, compute) + drain`` with nothing shared (a roofline per op); ops start when their
dependencies are done and the host has issued them, by the engine's launch and sync rules.
It is the step timer's closed form (``sim.engine.timer.timeline``) applied to every step: no
contention is modelled, so the DES can only be slower; with one stream per stage the DES
times the step by the same closed form.
"""

from __future__ import annotations

from sim.engine.timer import timeline as analyse

__all__ = ["analyse"]
