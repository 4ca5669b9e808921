#!/usr/bin/env python3
"""Fit the H200's energy figures to the microbenchmark energies of calibration/energy/data/.

Model, per repetition of a microbenchmark (one row of energy_bench.csv):

    E = static_W x t + e_hbm x HBM bits + e_l2 x L2 bits + e_bf16 x bf16 FLOPs + e_fp8 x fp8 FLOPs

weighted least squares on relative error (each row divided by its measured energy; columns
scaled to order 1 first, so no column is lost to the solver's conditioning). Rows left out,
decided from the calibration data alone before any whole step was compared: ``idle`` rows
(they give ``idle_W``, the floor, not the running chip's static power) and rows whose average
power is within 5% of the enforced power limit (700 W): there the chip throttles its clocks,
a different operating point from a decode step's, which runs below the limit (the capped rows'
error under the fit is reported beside). Nothing here reads validation/energy/.

Writes calibration/energy/energy_fit.json (figures, per-row residuals, calibration errors);
``--write`` puts the figures into hardware_profiles/h200-sxm.yaml between ``# >>> energy`` and
``# <<< energy`` (appended at the end of the profile when the block is not there yet).

Run: python calibration/energy/fit.py [--write]   (numpy + pandas; no GPU)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DATA = HERE / "data" / "energy_bench.csv"
OUT = HERE / "energy_fit.json"
PROFILE = ROOT / "hardware_profiles" / "h200-sxm.yaml"
CAP_FRACTION = 0.95
COLUMNS = [("static_W", "t_rep_s", 1.0), ("hbm_pJ_per_bit", "hbm_bytes", 8e-12),
           ("l2_pJ_per_bit", "l2_bytes", 8e-12), ("bf16_pJ_per_flop", "flops_bf16", 1e-12),
           ("fp8_pJ_per_flop", "flops_fp8", 1e-12)]


def design(d: pd.DataFrame) -> np.ndarray:
    """The rows' regressors in units whose coefficients read W and pJ."""
    return np.column_stack([d[col].to_numpy(float) * scale for _, col, scale in COLUMNS])


def fit(d: pd.DataFrame) -> dict:
    ok = d[d["error"].isna() & (d["kind"] != "idle")].copy()
    capped = ok["avg_W"] >= CAP_FRACTION * ok["power_limit_W"]
    used = ok[~capped]
    x, y = design(used), used["energy_rep_J"].to_numpy(float)
    w = 1.0 / y
    coef, *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    if (coef < 0).any():
        raise SystemExit(f"a fitted figure came out negative: {dict(zip([c[0] for c in COLUMNS], coef))}")
    ok["predicted_J"] = design(ok) @ coef
    ok["rel_err"] = ok["predicted_J"] / ok["energy_rep_J"] - 1
    ok["used"] = ~capped
    err_used = ok.loc[ok["used"], "rel_err"].abs()
    idle = d[d["kind"] == "idle"]
    figures = {name: float(c) for (name, _, _), c in zip(COLUMNS, coef)}
    return {
        "figures": figures,
        "idle_W": float(idle["avg_W"].mean()),
        "idle_rows": idle[["name", "avg_W", "window_s", "ticks"]].to_dict("records"),
        "power_limit_W": float(ok["power_limit_W"].max()),
        "rows_used": int(ok["used"].sum()), "rows_capped": int((~ok["used"]).sum()),
        "calibration_median_abs_err": float(err_used.median()),
        "calibration_max_abs_err": float(err_used.max()),
        "capped_rows_median_abs_err": float(ok.loc[~ok["used"], "rel_err"].abs().median()) if (~ok["used"]).any()
        else None,
        "rows": ok[["name", "kind", "duty", "avg_W", "t_rep_s", "energy_rep_J", "predicted_J", "rel_err",
                    "used"]].round(6).to_dict("records"),
        "method": __doc__.split("\n\n")[1].strip(),
    }


SRC = "measurement in calibration/energy/ (energy_bench.csv via fit.py: {what})"


def profile_block(result: dict) -> str:
    f = result["figures"]
    cal = (f"{result['rows_used']} uncapped windows, calibration median |error| "
           f"{100 * result['calibration_median_abs_err']:.1f}%")
    lines = [
        "# >>> energy (written by calibration/energy/fit.py --write; estimates below the fit are hand-kept there)",
        "energy:",
        "  memory_pJ_per_bit:",
        f"    hbm: {{value: {f['hbm_pJ_per_bit']:.2f}, source: \"{SRC.format(what='HBM copies and reads 128 MiB-4 GiB at duty 0.25-1, the whole path from HBM3e to the SMs; ' + cal)}\"}}",
        f"    l2: {{value: {f['l2_pJ_per_bit']:.2f}, source: \"{SRC.format(what='L2-resident 8 MiB copies and reads; ' + cal)}\"}}",
        "    smem: {value: 0.5, source: \"shared memory next to the SM: a small-SRAM access ~0.1-0.3 pJ/bit (Horowitz, ISSCC 2014, 45 nm: 8-32 KB array 10-20 pJ per 64-bit access) plus the SM's load path; not measured\", estimate: true}",
        "  noc_pJ_per_bit: {value: 2.0, source: \"SM-to-SM traffic over the on-chip crossbar; a fraction of the measured L2 path (the L2 figure includes the crossbar); not measured\", estimate: true}",
        "  host_link_pJ_per_bit: {value: 10.0, source: \"PCIe Gen5 x16, two SerDes ends plus controllers: typical long-reach 32 GT/s SerDes are ~5 pJ/bit per end; not measured\", estimate: true}",
        "  chip_link_pJ_per_bit: {value: 8.0, source: \"NVLink4 100 Gb/s PAM4 SerDes at both ends and one NVSwitch hop, ~2-4 pJ/bit per SerDes; not measured\", estimate: true}",
        "  matrix_pJ_per_flop:",
        f"    bf16: {{value: {f['bf16_pJ_per_flop']:.3f}, source: \"{SRC.format(what='torch.matmul bf16 4096^3, 8192^3 and M=64/256 x 28672 x 8192, below the power limit; the tensor cores with their operand traffic through shared memory and L2; ' + cal)}\"}}",
        f"    fp8: {{value: {f['fp8_pJ_per_flop']:.3f}, source: \"{SRC.format(what='torch._scaled_mm e4m3, the same shapes; ' + cal)}\"}}",
        f"    int8: {{value: {f['fp8_pJ_per_flop']:.3f}, source: \"taken as the measured fp8 figure (the same 8-bit tensor-core rate); not measured\", estimate: true}}",
        "  vector_pJ_per_flop: {value: 2.0, source: \"an FP32 FMA on the CUDA cores with its register-file traffic, ~1-2 pJ per FLOP at 4 nm (Horowitz ISSCC 2014 45 nm fp32 FMA ~4 pJ, scaled); not measured\", estimate: true}",
        f"  static_W: {{value: {f['static_W']:.1f}, source: \"{SRC.format(what='the intercept: power with the clocks up and nothing moving, from the duty-cycled windows; ' + cal)}\"}}",
        f"  idle_W: {{value: {result['idle_W']:.1f}, source: \"measurement in calibration/energy/ (energy_bench.csv: idle windows before and after the benchmarks, nothing queued)\"}}",
        "  host_W: {value: 60, source: \"the host's share while it drives one GPU: one busy core and its share of an 8-GPU server's CPUs and memory; not measured (NVML sees the GPU only)\", estimate: true}",
        f"  power_limit_W: {{value: {result['power_limit_W']:.0f}, source: \"measurement in calibration/energy/ (NVML enforced power limit of this H200; 700 W TDP, NVIDIA H200 datasheet)\"}}",
        "# <<< energy",
    ]
    return "\n".join(lines) + "\n"


def write_profile(block: str, path: Path = PROFILE) -> None:
    text = path.read_text()
    if "# >>> energy" in text:
        text = re.sub(r"# >>> energy.*?# <<< energy\n?", lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n" + block
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="write the figures into hardware_profiles/h200-sxm.yaml")
    args = p.parse_args(argv)
    result = fit(pd.read_csv(DATA))
    tmp = OUT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, OUT)
    f = result["figures"]
    print(f"static {f['static_W']:.1f} W, idle {result['idle_W']:.1f} W, HBM {f['hbm_pJ_per_bit']:.2f} pJ/bit, "
          f"L2 {f['l2_pJ_per_bit']:.2f} pJ/bit, bf16 {f['bf16_pJ_per_flop']:.3f} pJ/FLOP, "
          f"fp8 {f['fp8_pJ_per_flop']:.3f} pJ/FLOP")
    print(f"calibration: {result['rows_used']} windows, median |error| {100 * result['calibration_median_abs_err']:.1f}%,"
          f" max {100 * result['calibration_max_abs_err']:.1f}%; {result['rows_capped']} capped windows left out "
          f"(median |error| under the fit {100 * (result['capped_rows_median_abs_err'] or 0):.1f}%)")
    if args.write:
        write_profile(profile_block(result))
        print("wrote", PROFILE.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
