#!/usr/bin/env python3
"""Predicted against measured energy of the frozen whole steps (validation/energy/cases.yaml).

For each measured step of validation/energy/data/energy_steps.csv, decodesim simulates the same
step on the h200-sxm profile (one step: model, weights, KV format, batch, context, and the
software stack that runs it: torch-graph, torch-graph-grouped for the grouped MoE, and
validation/energy/torch-graph-int8kv.yaml for the int8-KV steps) and its chip energy (the
host's share left out: NVML counts the GPU only) is compared with the measured energy per
step. Two errors are reported: the prediction's (simulated time and energy together, the
headline) and the energy model's at the measured step time (static power x measured time +
the simulated dynamic energy), which separates the energy figures from the timing model.
Nothing is fitted or tuned here.

Writes validation/energy/energy_validation.csv and prints a Markdown table.
Run: PYTHONPATH=$PWD python validation/energy/compare.py
"""
from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from sim.run import simulate  # noqa: E402

STACK = {"grouped": "torch-graph-grouped", "loop": "torch-graph"}


def spec_of(row) -> dict:
    software = str(HERE / "torch-graph-int8kv.yaml") if row.kv == "int8" else \
        STACK.get(row.execution if isinstance(row.execution, str) else "", "torch-graph")
    return dict(hardware="h200-sxm", model=row.model, weights=row.weights, kv=row.kv, batch=int(row.batch),
                context=int(row.context), steps=1, software=software)


def compare(measured: pd.DataFrame) -> pd.DataFrame:
    out = []
    for row in measured.itertuples():
        r = simulate(spec_of(row))
        e = r.summary["energy"]
        tokens = int(row.batch)
        chip_J = e["chip_J_per_token"] * tokens
        static_J = e["by_component_J_per_token"].get("static", 0.0) * tokens
        sim_s = r.summary["per_token_ms_mean"] / 1e3
        static_W = static_J / sim_s
        at_measured_time = chip_J - static_J + static_W * row.step_s
        out.append({
            "case_id": row.case_id, "measured_ms": 1e3 * row.step_s, "predicted_ms": 1e3 * sim_s,
            "time_err": sim_s / row.step_s - 1, "measured_W": row.avg_W, "predicted_W": chip_J / sim_s,
            "measured_J": row.energy_step_J, "predicted_J": chip_J, "energy_err": chip_J / row.energy_step_J - 1,
            "J_at_measured_time": at_measured_time, "energy_err_at_measured_time": at_measured_time / row.energy_step_J - 1,
            "predicted_bound": r.summary["bound"],
        })
    return pd.DataFrame(out)


def table(df: pd.DataFrame) -> str:
    lines = ["| case | measured ms | predicted ms | measured W | predicted W | measured J/step | predicted J/step "
             "| error | error at measured time |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in df.itertuples():
        lines.append(f"| {r.case_id} | {r.measured_ms:.2f} | {r.predicted_ms:.2f} | {r.measured_W:.0f} | "
                     f"{r.predicted_W:.0f} | {r.measured_J:.3f} | {r.predicted_J:.3f} | {100 * r.energy_err:+.1f}% | "
                     f"{100 * r.energy_err_at_measured_time:+.1f}% |")
    med = statistics.median(df.energy_err.abs())
    med_t = statistics.median(df.energy_err_at_measured_time.abs())
    lines.append(f"\nmedian |error|: {100 * med:.1f}% (worst {100 * df.energy_err.abs().max():.1f}%); at the measured "
                 f"time {100 * med_t:.1f}% (worst {100 * df.energy_err_at_measured_time.abs().max():.1f}%); "
                 f"time: median |error| {100 * statistics.median(df.time_err.abs()):.1f}%")
    return "\n".join(lines)


def main() -> int:
    measured = pd.read_csv(HERE / "data" / "energy_steps.csv")
    bad = measured[measured["error"].notna()]
    for r in bad.itertuples():
        print(f"{r.case_id}: not measured ({r.error})")
    df = compare(measured[measured["error"].isna()])
    path = HERE / "energy_validation.csv"
    tmp = path.with_suffix(".csv.tmp")
    df.round(6).to_csv(tmp, index=False)
    os.replace(tmp, path)
    print(table(df))
    return 0


if __name__ == "__main__":
    sys.exit(main())
