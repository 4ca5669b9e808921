"""The detailed point of a study: one DES run that keeps its op table and event log, for the
timeline plots, with the links' peak rates those plots draw as ceilings.

``sim.study.runner.run_detail`` caches and writes it; this module only runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.costs import CostModel
from sim.run import RunResult, RunSpec, simulate


@dataclass(frozen=True)
class DetailRun:
    """The run (ops and log kept) and each memory level's and link's peak rate (GB/s)."""

    result: RunResult
    peaks_GBps: dict[str, float]


def detail_run(spec: RunSpec) -> DetailRun:
    """Run ``spec`` keeping ops and log; capacity is not checked (a point that does not fit
    still shows where its time would go)."""
    result = simulate(spec, keep_ops=True, keep_log=True, check_capacity=False)
    capacity = CostModel(result.resolved.hardware).capacity
    return DetailRun(result, {k: v for k, v in capacity.items() if k != "compute"})
