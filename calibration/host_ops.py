#!/usr/bin/env python3
"""Host time of the PyTorch calls in an eager decode step that launch no kernel of their own.

A plain PyTorch (Hugging Face style) layer makes, besides its kernel-launching ops, many
framework calls that cost host time and launch nothing: ``nn.Module.__call__`` around each
projection and norm, ``view``/``reshape``/``transpose``/``unsqueeze``, slicing, ``.shape``
reads. This measures each on the host, with the GPU kept busy by a long ``torch.cuda._sleep``
so the host is never blocked (and, for reference, the kernel-launching calls the dispatch
figures come from: ``F.linear`` and the ``nn.Linear`` module around it). Median of 5 repeats
of N back-to-back calls; microseconds per call.

Output: ``--out DIR/host_ops.csv`` (op, variant, calls, us_per_call_median, us_p10, us_p90,
repeats) and ``host_ops_summary.json`` (machine facts). ``--cpu`` runs on the CPU (numbers
meaningless: a plumbing check). Expected wall time on the device: under 20 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from harness import CsvOut, machine_facts, write_json  # noqa: E402


def timed(fn, calls: int, busy: bool, cuda: bool) -> float:
    if cuda and busy:
        torch.cuda._sleep(int(2e9))  # ~1 s of GPU work: the host never waits for the device
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    if cuda:
        torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cuda = torch.cuda.is_available() and not args.cpu
    dev = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16
    x = torch.randn(1, 1, 4096, device=dev, dtype=dtype)
    q = torch.randn(1, 1, 4096, device=dev, dtype=dtype)
    lin = torch.nn.Linear(4096, 4096, bias=False, device=dev, dtype=dtype)
    w = lin.weight

    class Empty(torch.nn.Module):
        def forward(self, t):
            return t

    empty = Empty()
    calls = {
        ("module_call", "nn.Module __call__ of an empty forward"): lambda: empty(x),
        ("view", "x.view(1, 1, 32, 128)"): lambda: q.view(1, 1, 32, 128),
        ("transpose", "x.view(...).transpose(1, 2)"): lambda: q.view(1, 1, 32, 128).transpose(1, 2),
        ("reshape", "x.reshape(1, 1, -1)"): lambda: q.reshape(1, 1, -1),
        ("unsqueeze", "x.unsqueeze(1)"): lambda: q.unsqueeze(1),
        ("slice", "x[..., :2048]"): lambda: q[..., :2048],
        ("shape", "x.shape[:-1] + (-1, 128)"): lambda: (*q.shape[:-1], -1, 128),
        ("contiguous", "x.contiguous() of a contiguous tensor"): lambda: q.contiguous(),
        ("linear_functional", "F.linear(x, W) (launches a GEMM)"): lambda: F.linear(x, w),
        ("linear_module", "nn.Linear(x) (launches a GEMM)"): lambda: lin(x),
    }
    out = CsvOut(os.path.join(args.out, "host_ops.csv"),
                 ["op", "variant", "calls", "us_per_call_median", "us_p10", "us_p90", "repeats", "device_busy", "error"])
    n = 50 if args.cpu else args.calls
    for (op, variant), fn in calls.items():
        try:
            for _ in range(3):
                fn()
            reps = [timed(fn, n, True, cuda) for _ in range(5)]
            reps.sort()
            out.row(**{"op": op, "variant": variant, "calls": n, "us_per_call_median": statistics.median(reps),
                       "us_p10": reps[0], "us_p90": reps[-1], "repeats": len(reps), "device_busy": cuda,
                       "error": ""})
            print(f"{op:<20}{variant:<45}{statistics.median(reps):8.2f} us", flush=True)
        except Exception as err:  # noqa: BLE001 - a failing call costs only its row
            out.row(**{"op": op, "variant": variant, "calls": n, "error": f"{type(err).__name__}: {err}"})
    out.close()
    write_json(os.path.join(args.out, "host_ops_summary.json"), {"machine": machine_facts(cuda)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
