#!/usr/bin/env python3
"""Minimal llama-3-8b-shape decode step (bf16, random weights) timed eagerly and as a CUDA graph.

Model: 32 layers, hidden 4096, 32 q heads / 8 kv heads, head dim 128, SwiGLU FFN 14336, vocab
128256, untied LM head. Per layer: rms_norm -> fused QKV linear [4096 -> 6144] -> RoPE (rotate-half)
-> K,V written in place into a preallocated cache [B, 8, Lmax, 128] at a position tensor
(index_copy_, so a captured graph can be replayed) -> SDPA (enable_gqa) over the first L positions ->
O linear -> residual -> rms_norm -> fused gate/up linear [4096 -> 28672] -> silu(g)*u -> down linear
[14336 -> 4096] -> residual. Then final rms_norm and LM head. Linear layers use F.linear (W [N, K]).

Every sequence of the batch decodes its token at position L-1 and attends to L positions.
Lmax = L per configuration (KV at B=32, L=16384 is 68.7 GB); memory is freed between configurations.

Writes into --out: decode_steps.csv, decode_kernels.csv, machine_decode.json.
Device:  python3 calibration/decode_step.py --out $OUT
CPU plumbing check (tiny model, no graphs): python3 calibration/decode_step.py --cpu --out /tmp/ds
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from harness import CsvOut, log, machine_facts, nvidia_smi_snapshot, pct, synced_step_ms, write_json  # noqa: E402
from sweep import axis  # noqa: E402

LLAMA3_8B = dict(layers=32, hidden=4096, n_q=32, n_kv=8, head_dim=128, ffn=14336, vocab=128256,
                 eps=1e-5, rope_theta=500000.0)
TINY = dict(layers=2, hidden=256, n_q=4, n_kv=2, head_dim=64, ffn=512, vocab=1000, eps=1e-5,
            rope_theta=500000.0)
STEP_FIELDS = ["batch", "context", "graph", "median_ms", "p10_ms", "p90_ms", "wall_median_ms",
               "kernels_per_step", "n_reps", "weight_bytes", "kv_bytes", "bytes_per_step",
               "achieved_GBps", "check", "note"]
KERNEL_FIELDS = ["batch", "context", "scope", "kernel_name", "count", "is_kernel"]


class Weights:
    def __init__(self, cfg, dev, dt, std=0.02):
        self.cfg = cfg
        h, f, v = cfg["hidden"], cfg["ffn"], cfg["vocab"]
        qkv = (cfg["n_q"] + 2 * cfg["n_kv"]) * cfg["head_dim"]

        def w(*shape):
            t = torch.empty(*shape, device=dev, dtype=dt)
            t.normal_(0.0, std)
            return t

        def norm():
            return (1.0 + 0.1 * torch.randn(h, device=dev)).to(dt)
        self.emb = w(v, h)
        self.layers = []
        for _ in range(cfg["layers"]):
            self.layers.append(dict(n1=norm(), wqkv=w(qkv, h), wo=w(h, cfg["n_q"] * cfg["head_dim"]),
                                    n2=norm(), wgu=w(2 * f, h), wd=w(h, f)))
        self.nf = norm()
        self.head = w(v, h)
        self.bytes = sum(t.numel() * t.element_size() for t in self.tensors())

    def tensors(self):
        yield self.emb
        for lw in self.layers:
            yield from lw.values()
        yield self.nf
        yield self.head


def rope_tables(cfg, lmax, dev):
    d = cfg["head_dim"]
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    t = torch.arange(lmax, dtype=torch.float64)
    fr = torch.outer(t, inv)  # [lmax, d/2]
    return fr.cos().to(torch.bfloat16).to(dev), fr.sin().to(torch.bfloat16).to(dev)


def apply_rope(x, cos, sin):
    # x [B, H, D]; cos/sin [1, D/2] (rotate-half convention)
    d2 = x.shape[-1] // 2
    x1, x2 = x[..., :d2], x[..., d2:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Decoder:
    def __init__(self, W: Weights, B, L, dev, dt):
        cfg = W.cfg
        self.W, self.cfg, self.B, self.L = W, cfg, B, L
        self.lmax = L
        nkv, d = cfg["n_kv"], cfg["head_dim"]
        self.kc, self.vc = [], []
        for _ in range(cfg["layers"]):
            k = torch.empty(B, nkv, self.lmax, d, device=dev, dtype=dt)
            v = torch.empty(B, nkv, self.lmax, d, device=dev, dtype=dt)
            k.normal_()
            v.normal_()
            self.kc.append(k)
            self.vc.append(v)
        self.kv_bytes = 2 * cfg["layers"] * B * nkv * self.lmax * d * 2
        self.cos_t, self.sin_t = rope_tables(cfg, self.lmax, dev)
        self.tokens = torch.randint(0, cfg["vocab"], (B,), device=dev)
        self.pos = torch.full((1,), L - 1, device=dev, dtype=torch.long)

    def layer(self, i, h, cos, sin):
        cfg, lw = self.cfg, self.W.layers[i]
        B, H, nq, nkv, d = self.B, cfg["hidden"], cfg["n_q"], cfg["n_kv"], cfg["head_dim"]
        x = F.rms_norm(h, (H,), lw["n1"], cfg["eps"])
        qkv = F.linear(x, lw["wqkv"])
        q = qkv[:, : nq * d].view(B, nq, d)
        k = qkv[:, nq * d: (nq + nkv) * d].view(B, nkv, d)
        v = qkv[:, (nq + nkv) * d:].view(B, nkv, d)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        self.kc[i].index_copy_(2, self.pos, k.unsqueeze(2))
        self.vc[i].index_copy_(2, self.pos, v.unsqueeze(2))
        kk = self.kc[i][:, :, : self.L]
        vv = self.vc[i][:, :, : self.L]
        o = F.scaled_dot_product_attention(q.unsqueeze(2), kk, vv, enable_gqa=True)  # [B, nq, 1, d]
        h = h + F.linear(o.reshape(B, nq * d), lw["wo"])
        x = F.rms_norm(h, (H,), lw["n2"], cfg["eps"])
        gu = F.linear(x, lw["wgu"])
        g, u = gu.chunk(2, dim=-1)
        h = h + F.linear(F.silu(g) * u, lw["wd"])
        return h

    def rope_at_pos(self):
        return self.cos_t.index_select(0, self.pos), self.sin_t.index_select(0, self.pos)

    def step(self):
        W, cfg = self.W, self.cfg
        h = F.embedding(self.tokens, W.emb)
        cos, sin = self.rope_at_pos()
        for i in range(cfg["layers"]):
            h = self.layer(i, h, cos, sin)
        h = F.rms_norm(h, (cfg["hidden"],), W.nf, cfg["eps"])
        return F.linear(h, W.head)

    def free(self):
        self.kc.clear()
        self.vc.clear()


def _is_dev_event(e, cuda):
    dt = str(getattr(e, "device_type", ""))
    return dt.endswith("CUDA") if cuda else (dt.endswith("CPU") and e.name.startswith("aten::"))


def count_kernels(fn, cuda):
    """Profile one call of fn; returns Counter of device-side kernel/memcpy/memset names."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    c = collections.Counter()
    evs = prof.events()
    for e in evs:
        if _is_dev_event(e, cuda):
            c[e.name] += 1
    if cuda and not c:  # older layouts: device kernels hang off the CPU-side events
        for e in evs:
            for k in getattr(e, "kernels", []) or []:
                c[getattr(k, "name", str(k))] += 1
    return c


def is_kernel(name):
    n = name.lower()
    return not (n.startswith("memcpy") or n.startswith("memset"))


def host_profile(W, cfg, dev, dt, cuda, outdir, facts):
    """Diagnostic (not a validation point): where the host time of an eager step goes, and eager
    step time with the SDPA backend forced. Writes decode_host_ops.csv, decode_eager_variants.csv."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile
    L = 4096 if cuda else 64
    ops = CsvOut(os.path.join(outdir, "decode_host_ops.csv"),
                 ["batch", "context", "op", "count", "self_cpu_us_total", "cpu_us_total", "self_device_us_total"])
    var = CsvOut(os.path.join(outdir, "decode_eager_variants.csv"),
                 ["batch", "context", "variant", "median_ms", "p10_ms", "p90_ms", "wall_median_ms", "n_reps"])
    backends = [("default", None), ("flash", [SDPBackend.FLASH_ATTENTION]),
                ("cudnn", [SDPBackend.CUDNN_ATTENTION])] if cuda else [("default", None),
                                                                      ("math", [SDPBackend.MATH])]
    for B in ((1, 8) if cuda else (1, 2)):
        dec = Decoder(W, B, L, dev, dt)
        for _ in range(3):
            dec.step()
        if cuda:
            torch.cuda.synchronize()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            dec.step()
            if cuda:
                torch.cuda.synchronize()
        ka = sorted(prof.key_averages(), key=lambda k: -k.self_cpu_time_total)
        for k in ka[:60]:
            ops.row(batch=B, context=L, op=k.key[:160], count=k.count, self_cpu_us_total=float(k.self_cpu_time_total),
                    cpu_us_total=float(k.cpu_time_total),
                    self_device_us_total=float(getattr(k, "self_device_time_total", 0.0) or 0.0))
        for name, bl in backends:
            try:
                if bl is None:
                    ev, wall = synced_step_ms(dec.step, 15 if cuda else 2, cuda, warmup=2)
                else:
                    with sdpa_kernel(bl):
                        ev, wall = synced_step_ms(dec.step, 15 if cuda else 2, cuda, warmup=2)
                var.row(batch=B, context=L, variant=f"eager_sdpa_{name}", median_ms=statistics.median(ev),
                        p10_ms=pct(ev, 10), p90_ms=pct(ev, 90), wall_median_ms=statistics.median(wall),
                        n_reps=len(ev))
                log(f"host-profile B={B} eager sdpa={name}: {statistics.median(ev):.3f} ms")
            except Exception as e:  # noqa: BLE001
                var.row(batch=B, context=L, variant=f"eager_sdpa_{name}: failed {e!r}"[:200])
        # host-only cost of one layer's Python+dispatch with the GPU kept busy (ops enqueue only)
        cos, sin = dec.rope_at_pos()
        h0 = torch.randn(B, cfg["hidden"], device=dev, dtype=dt)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU busy: host enqueue is then not throttled
        t0 = time.perf_counter()
        for _ in range(20):
            dec.layer(0, h0, cos, sin)
        t1 = time.perf_counter()
        if cuda:
            torch.cuda.synchronize()
        var.row(batch=B, context=L, variant="host_enqueue_per_layer_gpu_busy", median_ms=(t1 - t0) / 20 * 1e3, n_reps=20)
        log(f"host-profile B={B} host enqueue per layer (GPU busy): {(t1 - t0) / 20 * 1e3:.3f} ms")
        dec.free()
        del dec
        if cuda:
            torch.cuda.empty_cache()
    ops.close()
    var.close()


def step_grid(args, mode):
    """(batches, contexts, eagerly timed batches): the arguments, else calibration/sweeps/decode_step.yaml."""
    def ints(text, name):
        return [int(x) for x in text.split(",")] if text else axis("decode_step", "steps", name, mode)
    batches, contexts = ints(args.batches, "batches"), ints(args.contexts, "contexts")
    eager = set(ints(args.eager_batches, "eager_batches")) if mode == "full" else set(batches)
    return batches, contexts, eager


@dataclass
class StepRun:
    """What every configuration of one run shares: arguments, device, model, CSV outputs and notes."""
    args: argparse.Namespace
    cuda: bool
    dev: torch.device
    dt: torch.dtype
    cfg: dict
    W: Weights
    eager_batches: set
    steps: CsvOut
    kern: CsvOut
    notes: dict = field(default_factory=dict)


def parse_args():
    """Command-line arguments."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--batches", default=None)
    ap.add_argument("--contexts", default=None)
    ap.add_argument("--graph-reps", type=int, default=30)
    ap.add_argument("--eager-reps", type=int, default=20)
    ap.add_argument("--eager-batches", default=None,
                    help="batches also timed eagerly (the brief requires 1)")
    ap.add_argument("--host-profile", action="store_true", help="also write host-time diagnostics")
    return ap.parse_args()


def bytes_per_step(W, dec):
    """Bytes one decode step reads: the weights less the embedding table (only B of its rows are
    read) and the KV cache."""
    return W.bytes - W.emb.numel() * 2 + dec.kv_bytes


def count_config_kernels(run, dec, tag):
    """Counts the kernels of one eager step and of one layer: rows into decode_kernels.csv, counts
    into the notes under tag; returns (kernels per step, kernels per layer)."""
    B, L = dec.B, dec.L
    c_step = count_kernels(dec.step, run.cuda)
    cos, sin = dec.rope_at_pos()
    h0 = torch.randn(B, run.cfg["hidden"], device=run.dev, dtype=run.dt)
    c_layer = count_kernels(lambda: dec.layer(0, h0, cos, sin), run.cuda)
    k_step = sum(v for n, v in c_step.items() if is_kernel(n))
    k_layer = sum(v for n, v in c_layer.items() if is_kernel(n))
    k_all = sum(c_step.values())
    run.notes[tag] = {"kernels_per_step": k_step, "device_ops_per_step_incl_memcpy_memset": k_all,
                      "kernels_per_layer": k_layer,
                      "kernels_outside_layers": k_step - run.cfg["layers"] * k_layer}
    for scope, counts in (("step", c_step), ("layer", c_layer)):
        for n, v in sorted(counts.items(), key=lambda kv: -kv[1]):
            run.kern.row(batch=B, context=L, scope=scope, kernel_name=n, count=v, is_kernel=is_kernel(n))
    return k_step, k_layer


def timed_row(run, dec, graph, ev, wall, kernels, check, note):
    """Writes one timed decode_steps.csv row from event times ev and wall times (ms); returns the
    median step time (ms)."""
    med = statistics.median(ev)
    bytes_step = bytes_per_step(run.W, dec)
    run.steps.row(batch=dec.B, context=dec.L, graph=graph, median_ms=med, p10_ms=pct(ev, 10),
                  p90_ms=pct(ev, 90), wall_median_ms=statistics.median(wall),
                  kernels_per_step=kernels, n_reps=len(ev), weight_bytes=run.W.bytes,
                  kv_bytes=dec.kv_bytes, bytes_per_step=bytes_step,
                  achieved_GBps=bytes_step / (med * 1e-3) / 1e9, check=check, note=note)
    return med


def time_eager(run, dec, tag, finite, k_step, k_layer):
    """Times synchronized eager steps; writes the graph=false row."""
    ev, wall = synced_step_ms(dec.step, run.args.eager_reps if run.cuda else 3, run.cuda, warmup=2)
    med = timed_row(run, dec, "false", ev, wall, k_step, f"finite={finite}",
                    "eager; each step synchronized; CUDA events")
    log(f"{tag} eager : {med:8.3f} ms (wall {statistics.median(wall):8.3f}) "
        f"kernels/step {k_step} per layer {k_layer}")


def capture_step(dec):
    """Warms up on a side stream, captures one step into a CUDA graph and replays it once;
    returns (graph, its output tensor)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            dec.step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = dec.step()
    g.replay()
    torch.cuda.synchronize()
    return g, static_out


def graph_kernels(run, g, tag):
    """Kernels counted by profiling one replay of graph g; -1 (and a note) when profiling failed."""
    try:
        c_graph = count_kernels(g.replay, run.cuda)
        return sum(v for n, v in c_graph.items() if is_kernel(n))
    except Exception as e:  # noqa: BLE001
        run.notes[tag + "_graph_profile_error"] = repr(e)
        return -1


def time_graph(run, dec, tag, finite, k_step):
    """Captures a step as a CUDA graph, compares a replay with an eager step and times synchronized
    replays; writes the graph=true row."""
    g, static_out = capture_step(dec)
    eager_out = dec.step()
    torch.cuda.synchronize()
    diff = float((static_out.float() - eager_out.float()).abs().max())
    scale = float(eager_out.float().abs().max())
    k_graph = graph_kernels(run, g, tag)
    ev, wall = synced_step_ms(g.replay, run.args.graph_reps, run.cuda, warmup=3)
    med = timed_row(run, dec, "true", ev, wall, k_graph if k_graph > 0 else k_step,
                    f"finite={finite};graph_vs_eager_maxabs={diff:.3g};maxabs={scale:.3g}",
                    ("CUDA graph replay; each replay synchronized; CUDA events; "
                     + ("kernels counted by profiling a replay" if k_graph > 0
                        else "kernels = eager count (replay profile gave none)")))
    run.notes[tag]["kernels_in_graph_replay_profile"] = k_graph
    bytes_step = bytes_per_step(run.W, dec)
    log(f"{tag} graph : {med:8.3f} ms (wall {statistics.median(wall):8.3f}) "
        f"{bytes_step / (med * 1e-3) / 1e9:7.1f} GB/s  diff {diff:.3g}  kernels(graph) {k_graph}")


def measure_config(run, B, L):
    """Builds the decoder of one (batch, context), counts its kernels and times it eagerly (batches
    of --eager-batches) and as a CUDA graph (on the device); a failure becomes an error row.
    Frees the KV cache afterwards."""
    tag = f"B{B}_L{L}"
    dec = ref = None
    try:
        t0 = time.time()
        dec = Decoder(run.W, B, L, run.dev, run.dt)
        # eager warm-up (also cuBLAS / SDPA handle creation)
        ref = dec.step()
        if run.cuda:
            torch.cuda.synchronize()
        finite = bool(torch.isfinite(ref.float()).all())
        k_step, k_layer = count_config_kernels(run, dec, tag)
        if B in run.eager_batches:
            time_eager(run, dec, tag, finite, k_step, k_layer)
        if run.cuda:
            time_graph(run, dec, tag, finite, k_step)
        run.notes[tag]["seconds"] = time.time() - t0
    except Exception as e:  # noqa: BLE001
        log(f"!! {tag} failed: {e!r}")
        traceback.print_exc()
        run.notes[tag + "_error"] = repr(e)
        run.steps.row(batch=B, context=L, graph="error", note=f"failed: {e!r}"[:300])
    finally:
        del ref
        if dec is not None:
            dec.free()
        del dec
        if run.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def main():
    """Times every (batch, context) of the sweep, then the optional host profile; writes
    decode_steps.csv, decode_kernels.csv and machine_decode.json into --out."""
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    cuda = not args.cpu
    dev = torch.device("cuda" if cuda else "cpu")
    dt = torch.bfloat16
    cfg = LLAMA3_8B if cuda else TINY
    batches, contexts, eager_batches = step_grid(args, "full" if cuda else "cpu")
    t_start = time.time()

    facts = machine_facts(cuda)
    facts["model"] = cfg
    facts["nvidia_smi_before"] = nvidia_smi_snapshot() if cuda else None
    mpath = os.path.join(args.out, "machine_decode.json")
    write_json(mpath, facts)

    torch.manual_seed(0)
    W = Weights(cfg, dev, dt)
    if cuda:
        torch.cuda.synchronize()
    log(f"weights: {W.bytes / 1e9:.3f} GB, init {time.time() - t_start:.1f} s")
    facts["weight_bytes"] = W.bytes

    run = StepRun(args=args, cuda=cuda, dev=dev, dt=dt, cfg=cfg, W=W, eager_batches=eager_batches,
                  steps=CsvOut(os.path.join(args.out, "decode_steps.csv"), STEP_FIELDS),
                  kern=CsvOut(os.path.join(args.out, "decode_kernels.csv"), KERNEL_FIELDS))
    for B in batches:
        for L in contexts:
            measure_config(run, B, L)
            facts["notes"] = run.notes
            facts["elapsed_s"] = time.time() - t_start
            write_json(mpath, facts)
    run.steps.close()
    run.kern.close()
    if args.host_profile:
        try:
            host_profile(W, cfg, dev, dt, cuda, args.out, facts)
        except Exception as e:  # noqa: BLE001
            log(f"!! host profile failed: {e!r}")
            traceback.print_exc()
            facts["host_profile_error"] = repr(e)
    if cuda:
        facts["nvidia_smi_after"] = nvidia_smi_snapshot()
        facts["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    facts["notes"] = run.notes
    facts["elapsed_s"] = time.time() - t_start
    write_json(mpath, facts)
    log("done in", round(time.time() - t_start, 1), "s")


if __name__ == "__main__":
    main()
