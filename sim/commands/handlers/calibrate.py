"""What ``decodesim calibrate`` does: check for PyTorch and a GPU, measure, fit, write."""

from __future__ import annotations

import datetime as _dt
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

from sim.calibrate import bench, fit, overlay
from sim.calibrate.harness import log, machine_facts, torch, torch_installed
from sim.errors import ConfigError
from sim.paths import hardware_dir
from sim.setup import load_profile

SWEEP = Path(bench.__file__).with_name("sweeps.yaml")
BASES = (("H200", "h200-sxm"), ("H100", "h100-sxm"), ("A100", "a100-sxm-80g"), ("B200", "b200"), ("MI300X", "mi300x"))


def gpu_problem(cpu: bool = False) -> str | None:
    """Why this machine cannot be measured (one line), or None (``cpu``: only PyTorch is needed)."""
    if not torch_installed():
        return ("decodesim calibrate: PyTorch is not installed here; install torch with CUDA or ROCm support "
                "(https://pytorch.org) on the machine with the GPU, or refit earlier rows with --from DIR")
    if not cpu and not torch.cuda.is_available():
        return (f"decodesim calibrate: PyTorch {torch.__version__} sees no GPU (torch.cuda.is_available() is False); "
                "run it on a machine with an NVIDIA (CUDA) or AMD (ROCm) GPU, or refit earlier rows with --from DIR")
    return None


def base_for(gpu: str, given: str | None) -> str:
    if given:
        return given
    for key, name in BASES:
        if key in gpu.upper():
            return name
    raise ConfigError(None, "--base", f"a bundled profile to overlay (no default for GPU {gpu!r})", "nothing")


def driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return out.splitlines()[0] if out else "?"
    except (OSError, subprocess.SubprocessError):
        return getattr(torch.version, "hip", None) or "?"


def measure(args) -> dict:
    """Run the benchmarks into args.out; the run's facts and section report."""
    mode = "cpu" if args.cpu else "quick" if args.quick else "full"
    sweep = yaml.safe_load(SWEEP.read_text())
    budget = args.budget_s or (150.0 if args.quick else 540.0)
    only = tuple(args.only.split(",")) if args.only else bench.SECTIONS
    facts = machine_facts(not args.cpu)
    facts["driver"] = driver() if not args.cpu else "none (CPU plumbing check)"
    facts.setdefault("gpu_name", "CPU plumbing check")
    t0 = time.time()
    log(f"calibrate: {facts.get('gpu_name')} ({mode}, budget {budget:.0f} s) -> {args.out}")
    report = bench.run(sweep, mode, args.out / "calibrate.csv", budget, only)
    report["wall_s"] = round(time.time() - t0, 1)
    return {"facts": facts, "mode": mode, "report": report}


def handle(args) -> int:
    if args.from_dir is None:
        problem = gpu_problem(args.cpu)
        if problem:
            sys.stderr.write(problem + "\n")
            return 2
        args.out.mkdir(parents=True, exist_ok=True)
        run = measure(args)
        overlay.write_json(args.out / "calibrate_run.json", run)
        folder = args.out
    else:
        folder = args.from_dir
        try:
            run = json.loads((folder / "calibrate_run.json").read_text())
        except OSError as err:
            raise ConfigError(str(folder / "calibrate_run.json"), "", "the run facts of an earlier calibrate run",
                              err.strerror or "unreadable") from None
    return write(args, folder, run)


def write(args, folder: Path, run: dict) -> int:
    facts, mode = run["facts"], run["mode"]
    base = base_for(facts.get("gpu_name", ""), args.base or ("h200-sxm" if mode == "cpu" else None))
    profile = load_profile(base)
    rows = pd.read_csv(folder / "calibrate.csv")
    store = profile.store
    result = fit.fit_all(rows, store.peak_GBps, store.refresh_overhead.value, profile.compute.matrix_peak_TFLOPs("bf16"))
    data = args.data_name or str(folder)
    figs = overlay.figures(result, facts, mode, f"{data}/calibrate.csv", data)
    args.out.mkdir(parents=True, exist_ok=True)
    overlay.write_json(args.out / "calibrate_fit.json", {"base": base, "facts": facts, "fit": result,
                                                         "power": run["report"].get("power")})
    overlay.write_json(args.out / "overlay.json", figs)
    if mode == "cpu":
        print_summary(result, None)
        return 0
    path = hardware_dir() / f"{base}.yaml" if (hardware_dir() / f"{base}.yaml").exists() else Path(base)
    raw = overlay.apply(yaml.safe_load(path.read_text()), figs)
    raw["name"] = args.name or f"{base}-calibrated"
    header = (f"# {raw['name']}: {base} with the figures `decodesim calibrate` measured on {facts.get('gpu_name')} "
              f"({_dt.date.today().isoformat()}); every measured figure's source names the run.\n")
    out = args.out / f"{raw['name']}.yaml"
    overlay.write_profile(raw, out, header)
    print_summary(result, out)
    return 0


def print_summary(result: dict, out: Path | None) -> None:
    print(f"HBM stream {result['hbm']['sustained_GBps']} GB/s (efficiency {result['stream_efficiency']}), "
          f"L2 {result['l2_GBps']} GB/s, bf16 matmul {result['matmul_TFLOPs']} TFLOP/s")
    print("host: " + ", ".join(f"{k} {v:.0f}" for k, v in result["host"].items() if v is not None))
    print(f"{'class':<12} {'startup ns':>10} {'GB/s':>8} {'fraction':>8}  fit (median/worst %)  held out")
    for name, c in result["classes"].items():
        print(f"{name:<12} {c['startup_ns']:>10.0f} {c['bandwidth_GBps']:>8.0f} {c['stream_fraction']:>8.3f}  "
              f"{c['fit'].get('median_abs_pct')}/{c['fit'].get('worst_abs_pct')}  "
              f"{c['held_out'].get('median_abs_pct')}/{c['held_out'].get('worst_abs_pct')}")
    print(f"wrote {out}" if out is not None else "CPU plumbing check: every section ran; its numbers mean nothing, "
          "so no profile is written")
