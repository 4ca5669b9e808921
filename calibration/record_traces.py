#!/usr/bin/env python3
"""Record PyTorch profiler (Kineto, Chrome JSON) traces of one decode step of a small
Llama-like model, and time its whole steps, for ``decodesim stack --from-profile`` (issue 44).

The model has Llama-3.2-1B's shapes (workloads/models/llama-3.2-1b.yaml: 16 layers, hidden 2048,
32/8 heads of 64, SwiGLU 8192, vocabulary 128256, tied embeddings) and random bf16 weights
(seeded; nothing is downloaded). Two ways of writing the step, as a user's own code:

* ``plain``: Hugging Face style: RMSNorm in fp32 (upcast, pow, mean, add eps, rsqrt, mul, cast,
  weight mul), separate q/k/v and gate/up linears, rotate-half RoPE, a static KV cache written
  with ``index_copy_``, SDPA with ``enable_gqa``, residual adds, LM head, argmax;
* ``fused``: the same model with ``F.rms_norm``, one fused qkv linear (split by views) and one
  fused gate|up linear.

For each: one eager step under ``torch.profiler`` (CPU ops with shapes, CUDA kernels, their
correlation) exported as ``trace_<way>_b<B>.json``, and whole steps timed: CUDA-graph replays
(median of 30, CUDA events) and eager steps (median of 15, host clock, synchronized), written to
``steps.csv`` (way, batch, context, graph_ms, eager_ms). Run on the device:

    python3 calibration/record_traces.py --out $OUT/traces
"""
from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPE = dict(layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64, ffn=8192, vocab=128256, eps=1e-5, theta=500000.0)


def rand(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 0.02


class Step:
    """One decode step of batch ``b`` at context ``ctx``, written the ``way`` a user would."""

    def __init__(self, way: str, b: int, ctx: int):
        s = SHAPE
        torch.manual_seed(0)
        self.way, self.b, self.ctx = way, b, ctx
        h, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
        self.embed = rand(s["vocab"], h)
        self.layers = []
        for _ in range(s["layers"]):
            w = {"n1": torch.ones(h, device="cuda", dtype=torch.bfloat16),
                 "n2": torch.ones(h, device="cuda", dtype=torch.bfloat16), "o": rand(h, q), "down": rand(h, s["ffn"])}
            if way == "fused":
                w["qkv"], w["gate_up"] = rand(q + 2 * kv, h), rand(2 * s["ffn"], h)
            else:
                w.update(q=rand(q, h), k=rand(kv, h), v=rand(kv, h), gate=rand(s["ffn"], h), up=rand(s["ffn"], h))
            w["kc"] = torch.zeros(b, s["kv_heads"], ctx + 64, s["head_dim"], device="cuda", dtype=torch.bfloat16)
            w["vc"] = torch.zeros_like(w["kc"])
            w["kc"][:, :, :ctx].normal_()
            w["vc"][:, :, :ctx].normal_()
            self.layers.append(w)
        self.norm = torch.ones(h, device="cuda", dtype=torch.bfloat16)
        self.tokens = torch.randint(0, s["vocab"], (b, 1), device="cuda")
        self.pos = torch.full((1,), ctx, device="cuda", dtype=torch.long)
        inv = 1.0 / (s["theta"] ** (torch.arange(0, s["head_dim"], 2, device="cuda").float() / s["head_dim"]))
        self.inv_freq = inv

    def rms(self, x, w):
        if self.way == "fused":
            return F.rms_norm(x, (x.shape[-1],), w, SHAPE["eps"])
        xf = x.to(torch.float32)
        var = xf.pow(2).mean(-1, keepdim=True)
        return w * (xf * torch.rsqrt(var + SHAPE["eps"])).to(x.dtype)

    @staticmethod
    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def layer(self, x, w, cos, sin):
        s, b = SHAPE, self.b
        hd, nh, nkv = s["head_dim"], s["heads"], s["kv_heads"]
        h = self.rms(x, w["n1"])
        if self.way == "fused":
            qkv = F.linear(h, w["qkv"])
            q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        else:
            q, k, v = F.linear(h, w["q"]), F.linear(h, w["k"]), F.linear(h, w["v"])
        q = q.view(b, 1, nh, hd).transpose(1, 2)
        k = k.view(b, 1, nkv, hd).transpose(1, 2)
        v = v.view(b, 1, nkv, hd).transpose(1, 2)
        q = q * cos + self.rotate_half(q) * sin
        k = k * cos + self.rotate_half(k) * sin
        w["kc"].index_copy_(2, self.pos, k)
        w["vc"].index_copy_(2, self.pos, v)
        n = self.ctx + 1
        a = F.scaled_dot_product_attention(q, w["kc"][:, :, :n], w["vc"][:, :, :n], enable_gqa=True)
        a = a.transpose(1, 2).reshape(b, 1, nh * hd)
        x = x + F.linear(a, w["o"])
        h = self.rms(x, w["n2"])
        if self.way == "fused":
            gate, up = F.linear(h, w["gate_up"]).chunk(2, dim=-1)
        else:
            gate, up = F.linear(h, w["gate"]), F.linear(h, w["up"])
        return x + F.linear(F.silu(gate) * up, w["down"])

    def __call__(self):
        x = F.embedding(self.tokens, self.embed)
        freqs = self.pos.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for w in self.layers:
            x = self.layer(x, w, cos, sin)
        logits = F.linear(self.rms(x, self.norm), self.embed)[:, -1]
        return logits.float().argmax(-1)


def time_graph(step, reps=30):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        out.append(e0.elapsed_time(e1))
    return statistics.median(out)


def time_eager(step, reps=15):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def record(step, path: Path) -> None:
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        step()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    batches = [1] if args.quick else [int(b) for b in args.batches.split(",")]
    with open(out / "steps.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["way", "batch", "context", "graph_ms", "eager_ms", "error"])
        for way in ("plain", "fused"):
            for b in batches:
                try:
                    step = Step(way, b, args.context)
                    with torch.no_grad():
                        if b == 1:
                            record(step, out / f"trace_{way}_b{b}.json")
                        g = time_graph(step)
                        e = time_eager(step)
                    w.writerow([way, b, args.context, f"{g:.4f}", f"{e:.4f}", ""])
                    print(f"{way} b{b}: graph {g:.3f} ms eager {e:.3f} ms", flush=True)
                    del step
                    torch.cuda.empty_cache()
                except Exception as err:  # noqa: BLE001
                    w.writerow([way, b, args.context, "", "", f"{type(err).__name__}: {err}"[:200]])
                    print(f"{way} b{b}: {err!r}", flush=True)
                fh.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
