"""``decodesim calibrate``: measure this machine's GPU and write a calibrated hardware profile.

Runs the kernel-class microbenchmarks (sim/calibrate/bench.py, sweeps in
sim/calibrate/sweeps.yaml) on GPU 0 through PyTorch (CUDA or ROCm), fits them
(sim/calibrate/fit.py) and writes, into ``--out``: the raw rows (``calibrate.csv``), the
machine facts and fit (``calibrate.json``), the figures as an overlay of profile paths
(``overlay.json``) and the base profile with those figures set (``<name>.yaml``), every figure
naming the measurement. ``--from DIR`` refits a run's rows without a GPU.
"""

from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this GPU (PyTorch) and write a calibrated profile",
                       description="Measure this machine's GPU (kernel classes, memory and L2 bandwidth, launch, "
                                   "sync and host dispatch, matrix rate, power where readable) and write a profile "
                                   "whose every figure names the measurement.")
    p.add_argument("--out", type=Path, default=Path("calibration-out"), help="folder for the raw rows, the fit and "
                                                                              "the profile (default calibration-out)")
    p.add_argument("--base", default=None, help="bundled profile (or YAML path) the measured figures overlay "
                                                "(default: chosen from the GPU's name, e.g. h100-sxm)")
    p.add_argument("--name", default=None, help="name of the written profile (default: <base>-calibrated)")
    p.add_argument("--quick", action="store_true", help="about 2 minutes: fewer sizes and shapes")
    p.add_argument("--cpu", action="store_true", help="plumbing check of every code path on the CPU with tiny sizes "
                                                      "(needs PyTorch, no GPU; its numbers mean nothing)")
    p.add_argument("--budget-s", type=float, default=None, help="start no new configuration after this many "
                                                                "seconds (default 150 quick, 540 full)")
    p.add_argument("--only", default=None, help="comma-separated sections (overheads,hbm,l2,classes,gemm,sdpa,peak)")
    p.add_argument("--from", dest="from_dir", type=Path, default=None,
                   help="refit the rows of an earlier run in DIR (no GPU needed)")
    p.add_argument("--data-name", default=None, help="how the profile names the raw data folder "
                                                     "(default: the --out path)")
    p.set_defaults(handler="sim.commands.handlers.calibrate")
