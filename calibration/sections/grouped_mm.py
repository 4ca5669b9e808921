"""kernels.py's grouped_mm section: torch._grouped_mm over experts (gate_up and down) with
device-side offsets, several routings rotated through a replay.
"""
from __future__ import annotations


import torch
from sweep import coverage_order
from sweep import axis as sweep_axis

from sections.bench import Bench, Config, skip_config

# ---- torch._grouped_mm over experts, device-side offsets

GROUPED_ROUTINGS = sweep_axis("kernels", "grouped_mm", "routings", "full")  # routings rotated through a replay


def grouped_mm_configs(b: Bench) -> list:
    if not b.cuda or not hasattr(torch, "_grouped_mm"):
        return [skip_config("grouped_mm", "grouped_mm:cpu", dict(impl="torch._grouped_mm", kclass="grouped_mm"),
                            "torch._grouped_mm needs CUDA (sm90)")]
    shapes, Ts = b.axis("grouped_mm", "shapes"), b.axis("grouped_mm", "tokens")
    cfgs = []
    weights: dict = {}
    for H, F_, E, k in shapes:
        for T in coverage_order(Ts):
            for part in ("gate_up", "down"):
                cfgs.append(_grouped_cfg(b, H, F_, E, k, T, part, weights))
    return cfgs


def _grouped_routing(E, k, T, seed):
    """Per-expert row counts of T tokens routed top-k uniformly at random, padded to 16 rows."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)])
    counts = torch.bincount(ids.view(-1), minlength=E)
    padded = (counts + 15) // 16 * 16
    return counts, padded


def _grouped_cfg(b: Bench, H, F_, E, k, T, part, weights) -> Config:
    K, N = (H, 2 * F_) if part == "gate_up" else (F_, H)
    routings = [_grouped_routing(E, k, T, seed) for seed in range(GROUPED_ROUTINGS)]
    rows = max(int(p.sum()) for _, p in routings)
    touched = sum(int((c > 0).sum()) for c, _ in routings) / len(routings)
    per_expert = K * N * 2
    meta = dict(impl=f"torch._grouped_mm_{part}", kclass="grouped_mm", dtype="bf16", M=T * k, N=N, K=K,
                M_padded=rows, elements=E, rows=round(touched, 2), row_width=k,
                bytes_read=round(touched * per_expert) + rows * K * 2, bytes_written=rows * N * 2,
                flops=2 * T * k * N * K,
                note=f"E={E} experts, T={T} tokens top-{k}; rows padded to 16 per expert; offs on the device; "
                     f"rows = mean touched experts over {GROUPED_ROUTINGS} rotated routings")

    def build():
        key = (H, F_, E, part)
        if key not in weights:
            weights[key] = torch.randn(E, N, K, device=b.dev, dtype=torch.bfloat16) * 0.02
        w = weights[key].transpose(-2, -1)  # [E, K, N], column-major as torchtitan passes it
        a = torch.randn(rows, K, device=b.dev, dtype=torch.bfloat16)
        offs = [torch.cumsum(p, 0).to(torch.int32).to(b.dev) for _, p in routings]
        views = [a[:int(p.sum())] for _, p in routings]  # each routing's rows exactly (offs[-1] = rows)
        return lambda i: torch._grouped_mm(views[i % len(offs)], w, offs=offs[i % len(offs)])
    est = 10.0 + touched * per_expert / 2.5e12 * 1e6
    return Config(f"grouped_mm:{part}:H{H}_F{F_}_E{E}_k{k}_T{T}", "grouped_mm", meta, build, est_us=est,
                  n_slots=GROUPED_ROUTINGS, bytes_per_slot=round(touched * per_expert))
