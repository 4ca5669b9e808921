#!/usr/bin/env python3
"""Frozen energy validation: whole decode steps measured for energy on one GPU (an H200).

Each case of validation/energy/cases.yaml is one decode step built by validation/whole_step.py
(plain PyTorch, random weights, Hugging Face's way of running a step), captured in one CUDA
graph and replayed back to back for ``--window-s`` seconds while NVML's energy counter is
read (calibration/energy/meter.py: the measuring instrument only; this file shares no code
with the energy fit, calibration/energy/fit.py, and nothing fits on its output).

The ``kv: int8`` cases replace the step's attention: the cache holds int8 codes with one
fp16 scale per token and KV head; the new token's K and V are quantized (amax / 127, round,
clamp) and written with index_copy_; attention is calibration/kv_attention.py's per-group
dequantizing Triton split-K kernel (``triton_group_int8``: split kernel + reduce kernel).

Writes into --out: energy_steps.csv (case_id, model, kv, weights, execution, batch, context,
graph_ms_median (replays each synchronized, as whole_step.py times them), step_s (back-to-back
replays: device time / replays), avg_W, energy_step_J, reps, ticks, ... error), and
energy_steps_meta.json.

Device:  python3 validation/energy/steps.py --out $OUT
Smoke:   python3 validation/energy/steps.py --quick --out /tmp/es   (2 layers, short windows)
"""
from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import torch
import yaml

HERE = Path(__file__).resolve().parents[2]  # this checkout (calibration/energy/meter.py)
# the repository that holds validation/whole_step.py (this checkout, or the one a copy sits in)
REPO = next(p for p in Path(__file__).resolve().parents if (p / "validation" / "whole_step.py").exists())
sys.path.insert(0, str(REPO / "validation"))
sys.path.insert(0, str(REPO / "calibration"))
sys.path.insert(0, str(HERE / "calibration" / "energy"))

from cases import ARCH as CASE_ARCH  # noqa: E402
from cases import Arch, load_shape  # noqa: E402
from measuring import capture_graph, time_graph  # noqa: E402
from model import DecodeStep, GroupedConfig, apply_rotary_pos_emb, build_weights  # noqa: E402
from meter import Meter  # noqa: E402

FIELDS = ["case_id", "model", "kv", "weights", "execution", "batch", "context", "layers_run", "graph_ms_median",
          "step_s", "avg_W", "power_samples_W", "energy_step_J", "reps", "ticks", "tick_span_s", "window_s",
          "meter", "sm_MHz", "mem_MHz", "temp_C", "power_limit_W", "build_s", "error"]
ARCH = dict(CASE_ARCH, **{"llama-3-8b": Arch(rope_theta=500000.0)})


class Int8KVStep(DecodeStep):
    """The whole_step decode step with an int8 KV cache and the triton_group_int8 attention."""

    def __init__(self, weights, batch, context, device, seed):
        super().__init__(weights, batch, context, "loop", device, seed)
        import kv_attention as kva

        s = self.s
        self.k_cache = self.v_cache = None  # the bf16 caches of the base step are not used
        torch.cuda.empty_cache()
        fmt = kva.Fmt("int8", kva.FMT_INT8, s.head_dim)
        self.sh = kva.Shape(B=batch, Hq=s.heads, Hkv=s.kv_heads, D=s.head_dim, L=context + 1)
        self.pool = kva.Pool(kva.storage_shapes(fmt, self.sh), s.layers, device, guard=False)
        kva.fill_random(fmt, self.sh, self.pool, torch.Generator(device=device).manual_seed(seed))
        self.q_buf = torch.zeros(batch, s.heads, s.head_dim, device=device, dtype=torch.bfloat16)
        n_sm = torch.cuda.get_device_properties(0).multi_processor_count
        self.impl = kva.TritonImpl("triton_group_int8", fmt, self.sh, self.pool, [self.q_buf] * s.layers,
                                   device, n_sm)

    def attention(self, i, lw, x, cos, sin):
        s = self.s
        bsz = x.shape[0]
        q, k, v = self.project_qkv(i, lw, x)
        q = q.view(bsz, 1, -1, s.head_dim).transpose(1, 2)
        k = k.view(bsz, 1, -1, s.head_dim).transpose(1, 2)
        v = v.view(bsz, 1, -1, s.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        view = self.pool.views[i]
        for t, codes, scales in ((k, "kc", "ks"), (v, "vc", "vs")):
            scale = t.abs().amax(-1, keepdim=True).float().clamp_min(1e-6) / 127.0
            code = (t.float() / scale).round().clamp(-127, 127).to(torch.int8)
            view[codes].index_copy_(2, self.cache_position, code)
            view[scales].index_copy_(2, self.cache_position, scale.squeeze(-1).to(torch.float16))
        self.q_buf.copy_(q.squeeze(2))
        o = self.impl.call(i).reshape(bsz, 1, -1)
        return lw.o(o)


def load_cases(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text())["cases"]


class Runner:
    def __init__(self, args):
        self.args = args
        self.meter = Meter()
        self.fh = open(os.path.join(args.out, "energy_steps.csv"), "w", newline="")
        self.writer = csv.DictWriter(self.fh, fieldnames=FIELDS)
        self.writer.writeheader()
        self.weights = None
        self.weights_key = None

    def emit(self, row):
        self.writer.writerow({k: row.get(k) for k in FIELDS})
        self.fh.flush()
        print(f"{row['case_id']:<34} {row.get('step_s', 0) * 1e3:8.3f} ms {row.get('avg_W', float('nan')):7.1f} W "
              f"{row.get('energy_step_J', float('nan')):8.4f} J/step ticks {row.get('ticks')} "
              f"{(row.get('error') or '')[:160]}", flush=True)

    def weights_for(self, case):
        key = (case["model"], case["weights"])
        if key != self.weights_key:
            self.weights = None
            gc.collect()
            torch.cuda.empty_cache()
            shape = load_shape(case["model"])
            if self.args.quick:
                shape = replace(shape, layers=2)
            self.weights = build_weights(shape, ARCH[case["model"]], case["weights"] == "fp8", "cuda")
            self.weights_key = key
        return self.weights

    def run(self, case):
        row = {k: case.get(k) for k in ("model", "kv", "weights", "execution", "batch", "context")}
        row["case_id"] = case["id"]
        t0 = time.perf_counter()
        step = graph = None
        try:
            w = self.weights_for(case)
            row["layers_run"] = w.shape.layers
            if case["kv"] == "int8":
                step = Int8KVStep(w, case["batch"], case["context"], "cuda", seed=1)
            else:
                step = DecodeStep(w, case["batch"], case["context"], case.get("execution") or "loop", "cuda",
                                  seed=1, grouped_cfg=GroupedConfig() if case.get("execution") == "grouped"
                                  else None)
            graph = capture_graph(step)
            row["build_s"] = time.perf_counter() - t0
            times = time_graph(graph, 10)
            row["graph_ms_median"] = sorted(times)[len(times) // 2]
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record()
            m = self.meter.measure(lambda: (graph.replay(), 1)[1], lambda: (b.record(), b.synchronize()),
                                   self.args.window_s)
            device_s = a.elapsed_time(b) / 1e3
            row.update(m)
            row["step_s"] = device_s / m["reps"]
            row["energy_step_J"] = m["avg_W"] * row["step_s"]
            row.update(self.meter.state())
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"[:300]
            traceback.print_exc()
        finally:
            del step, graph
            gc.collect()
            torch.cuda.empty_cache()
        self.emit(row)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="2 layers, short windows (smoke run)")
    p.add_argument("--window-s", type=float, default=None)
    p.add_argument("--only", default="", help="comma-separated case ids")
    args = p.parse_args(argv)
    args.window_s = args.window_s or (0.4 if args.quick else 2.0)
    os.makedirs(args.out, exist_ok=True)
    cases = load_cases(Path(__file__).with_name("cases.yaml"))
    if args.only:
        cases = [c for c in cases if c["id"] in args.only.split(",")]
    r = Runner(args)
    meta = {"args": vars(args), "meter": r.meter.kind, "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "state_start": r.meter.state()}
    # group by weights so each model's weights are built once (the order in cases.yaml)
    for case in sorted(cases, key=lambda c: [(x["model"], x["weights"]) for x in cases].index((c["model"], c["weights"]))):
        r.run(case)
    meta["state_end"] = r.meter.state()
    with open(os.path.join(args.out, "energy_steps_meta.json"), "w") as fh:
        json.dump(meta, fh, indent=1, default=str)
    r.fh.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
