"""A software stack from a profiler trace of the user's own decode step (``decodesim stack --from-profile``).

Input: a PyTorch profiler trace (Kineto, Chrome JSON; ``.json`` or ``.json.gz``) of one decode
step of a dense transformer, eager or a CUDA-graph replay. Read: the GPU kernels in order
(``cat: kernel``: name, grid, block, duration) and, where present, the host's launch calls
(``cuda_runtime``: ``cudaLaunchKernel`` and kin, ``cudaGraphLaunch``) matched by correlation id.

Each kernel gets a class (sim/kernel_classes.py) from its name (``CLASS_RULES``: cuBLAS/nvjet/
CUTLASS GEMMs are ``matrix``, flash/cuDNN SDPA ``attention``, PyTorch's reduce kernels
``reduction``, index kernels ``index``, the cat/copy kernels ``copy``, casting copies ``cast``,
element-wise kernels ``elementwise``); a kernel no rule claims, or one a rule marks as a guess
(Triton's generated kernels), is listed as ambiguous for the user to confirm.

Ops come from the kernel sequence itself, so no annotation is needed and a graph replay works
as well as an eager step: a layer holds one attention kernel, and a decoder layer's kernels run
``attn_norm | qkv (GEMMs) | rope_append | attention | o_proj (GEMMs) + residual add | ffn_norm |
gate_up (GEMMs) | silu_mul | down (GEMMs) + residual add``. Runs of GEMM kernels (a split-K
GEMM's reduce kernel included) split the layer; the kernels between them take the ops between.
Layer 1's attention norm, projections and RoPE are read (layer 0's norm is found by its length;
what comes before it, the embedding and the RoPE tables, is the ``embed`` op); after the last
layer: ``final_norm``, ``lm_head`` (GEMMs), then ``argmax`` (whatever follows).

Launch mode: ``graph`` if the trace launched a CUDA graph, else ``eager``; in an eager trace the
host time per launch (from one launch call to the next, by class, median) becomes the stack's
``dispatch_ns``; otherwise the reference stack's (``--like``) figures are kept and said so. The
reference stack also gives the measured implementation tables (``impls``, ``attention``).
MoE layers (several GEMM runs per expert) are not recognised: a trace whose layers do not have
this shape is refused with one line.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from sim.errors import ConfigError
from sim.units import NS_PER_US

CLASS_RULES: tuple[tuple[str, str, str | None, bool], ...] = (  # (regex on the name, class, impl, sure)
    (r"splitKreduce|splitK_reduce", "reduction", None, True),
    (r"lean_reduction", "reduction", None, True),
    (r"sdpa|flash|fmha|attention|attn", "attention", None, True),
    (r"nvjet|gemm|gemv|cublas|sm90_xmma|cutlass|Kernel2|matmul", "matrix", None, True),
    (r"indexSelect|index_elementwise|index_copy|index_add|scatter|gather|embedding", "index", None, True),
    (r"reduce_kernel|argmax|softmax|topk|sort", "reduction", None, True),
    (r"LoadWithCast", "cast", "widen_cast", True),  # a converting copy (a norm's bf16 -> fp32 upcast)
    (r"(bfloat16|half|float8\w*)_copy_kernel_cuda", "cast", None, True),  # a narrowing copy
    (r"CatArrayBatchedCopy|direct_copy_kernel_cuda|copy_kernel", "copy", None, True),
    (r"vectorized_elementwise_kernel|unrolled_elementwise_kernel", "elementwise", None, True),
    (r"elementwise_kernel", "elementwise", "strided", True),
    (r"triton_(poi|per|red)", "elementwise", None, False),
    (r"triton_", "matrix", None, False),
)
GRAPH_CALLS = ("cudaGraphLaunch", "hipGraphLaunch")
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "hipLaunchKernel",
                "hipModuleLaunchKernel")


@dataclass(frozen=True)
class TraceKernel:
    """One GPU kernel of the trace, in launch order, with the class its name gives."""

    name: str
    kclass: str
    impl: str | None
    sure: bool
    duration_us: float
    launch_ts_us: float | None  # when the host launched it (eager traces)


def classify(name: str) -> tuple[str, str | None, bool]:
    """(class, implementation, sure) of a kernel by its name."""
    for pattern, kclass, impl, sure in CLASS_RULES:
        if re.search(pattern, name):
            return kclass, impl, sure
    return "elementwise", None, False


def read_trace(path: Path) -> tuple[list[TraceKernel], str]:
    """The kernels of a Kineto/Chrome trace in GPU order, and the launch mode it shows."""
    try:
        raw = gzip.open(path, "rt").read() if str(path).endswith(".gz") else Path(path).read_text()
        data = json.loads(raw)
    except (OSError, ValueError) as err:
        raise ConfigError(str(path), "", "a PyTorch profiler trace (Chrome JSON, .json or .json.gz)",
                          getattr(err, "strerror", None) or str(err).splitlines()[0]) from None
    events = data.get("traceEvents", data) if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ConfigError(str(path), "traceEvents", "a list of trace events", type(events).__name__)
    launches, graph = {}, False
    for e in events:
        if not isinstance(e, dict) or e.get("cat") not in ("cuda_runtime", "cuda_driver", "hip_runtime"):
            continue
        graph = graph or e.get("name") in GRAPH_CALLS
        if e.get("name") in LAUNCH_CALLS:
            launches[(e.get("args") or {}).get("correlation")] = float(e.get("ts", 0.0))
    gpu = sorted((e for e in events if isinstance(e, dict) and e.get("cat") == "kernel"), key=lambda e: float(e["ts"]))
    if not gpu:
        raise ConfigError(str(path), "traceEvents", "GPU kernel events (cat: kernel): profile with "
                          "ProfilerActivity.CUDA", "none")
    out = []
    for e in gpu:
        kclass, impl, sure = classify(e["name"])
        corr = (e.get("args") or {}).get("correlation")
        out.append(TraceKernel(e["name"], kclass, impl, sure, float(e.get("dur", 0.0)),
                               None if graph else launches.get(corr)))
    return out, "graph" if graph else "eager"


def _in_gemm_run(k: TraceKernel, previous: TraceKernel | None) -> bool:
    """A GEMM, or the split-K reduce right after one."""
    if k.kclass == "matrix":
        return True
    return previous is not None and previous.kclass == "matrix" and re.search(r"splitK", k.name) is not None


def runs(kernels: list[TraceKernel]) -> list[tuple[bool, list[int]]]:
    """Maximal runs of kernel indices: (is a GEMM run, indices)."""
    out: list[tuple[bool, list[int]]] = []
    for i, k in enumerate(kernels):
        gemm = _in_gemm_run(k, kernels[i - 1] if i else None)
        if out and out[-1][0] == gemm:
            out[-1][1].append(i)
        else:
            out.append((gemm, [i]))
    return out


class Layout:
    """The decoder's ops found in the kernel sequence (indices per op)."""

    def __init__(self, kernels: list[TraceKernel], path: str):
        self.kernels, self.path = kernels, path
        attn = [i for i, k in enumerate(kernels) if k.kclass == "attention"]
        if len(attn) < 2:
            raise ConfigError(path, "", "a decode step of at least two layers (one attention kernel each)",
                              f"{len(attn)} attention kernel(s)")
        self.layers = len(attn)
        self.runs = runs(kernels)
        self.where = {i: r for r, (_, idx) in enumerate(self.runs) for i in idx}
        self.ops: dict[str, list[int]] = {}
        self._layer(attn[0], attn[1])
        self._edges(attn[0], attn[-1])

    def _gemm_after(self, r: int, n: int) -> list[int]:
        """Run indices of the next ``n`` GEMM runs after run ``r``."""
        found = [j for j in range(r + 1, len(self.runs)) if self.runs[j][0]][:n]
        if len(found) < n:
            raise ConfigError(self.path, "", "a decoder layer: attention, o_proj, gate_up and down GEMMs, "
                              "then the next layer's qkv GEMMs", "a layer with fewer GEMM runs (an MoE layer?)")
        return found

    def _between(self, a: int, b: int) -> list[int]:
        return [i for r in range(a + 1, b) for i in self.runs[r][1]]

    def _layer(self, a0: int, a1: int) -> None:
        r_att = self.where[a0]
        o, gu, dn, qkv = self._gemm_after(r_att, 4)
        att_tail = [i for i in self._between(r_att, o)]
        self.ops["attention"] = [a0, *[i for i in self.runs[r_att][1] if i > a0], *att_tail]
        n1, n2, n3 = self._between(o, gu), self._between(gu, dn), self._between(dn, qkv)
        if not n1 or len(n3) < 2:
            raise ConfigError(self.path, "", "a residual add after o_proj and down, and a norm before each "
                              "GEMM block", "a layer without them")
        self.ops["o_proj"] = [*self.runs[o][1], n1[0]]
        self.ops["ffn_norm"] = n1[1:]
        self.ops["gate_up"] = self.runs[gu][1]
        self.ops["silu_mul"] = n2
        self.ops["down"] = [*self.runs[dn][1], n3[0]]
        self.ops["attn_norm"] = n3[1:]
        self.ops["qkv"] = self.runs[qkv][1]
        self.ops["rope_append"] = [i for i in range(self.runs[qkv][1][-1] + 1, a1)]

    def _edges(self, a0: int, a_last: int) -> None:
        """embed before layer 0's norm; final_norm, lm_head and argmax after the last layer."""
        first_qkv = max(j for j in range(self.where[a0]) if self.runs[j][0])
        start = self.runs[first_qkv][1][0] - len(self.ops["attn_norm"])
        self.ops["embed"] = list(range(0, max(start, 0)))
        _, _, dn, *rest = self._gemm_after(self.where[a_last], 3)
        tail = self._between(dn, len(self.runs))
        heads = [j for j in range(dn + 1, len(self.runs)) if self.runs[j][0]]
        if not heads or len(tail) < 1:
            raise ConfigError(self.path, "", "an LM head GEMM after the last layer", "none")
        head = heads[0]
        self.ops["final_norm"] = self._between(dn, head)[1:]
        self.ops["lm_head"] = self.runs[head][1]
        self.ops["argmax"] = [i for r in range(head + 1, len(self.runs)) for i in self.runs[r][1]]


# the roles of each op's kernels (sim/config/software.py ROLES): GEMM kernels by position, the rest first/last
SPLITS = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}


def _gemm_kernels(op: str, ks: list[TraceKernel]) -> list[dict]:
    gemms = [k for k in ks if k.kclass == "matrix"]
    parts = SPLITS.get(op, ())
    out = []
    for j, k in enumerate(ks):
        if k.kclass != "matrix":
            out.append({"name": f"{op}_{k.kclass}_{j}", "class": k.kclass,
                        **({"reads": ["res"], "temp": 1.0} if k.kclass == "elementwise" else
                           {"temp": 0.5, "dispatched": False})})
            continue
        g = gemms.index(k)
        if len(gemms) == len(parts) and len(parts) > 1:
            out.append({"name": f"{parts[g]}_proj", "class": "matrix", "reads": ["x", f"w:{parts[g]}"],
                        "writes": [f"y:{parts[g]}"]})
        else:  # one GEMM reads x and all of w; several (a split projection) share w, the last writes y
            w = f"w:{round(1 / len(gemms), 3)}" if len(gemms) > 1 else "w"
            kernel = {"name": f"{op}_gemm{g}", "class": "matrix", "reads": ["x", w] if g == 0 else [w]}
            if g == len(gemms) - 1:
                kernel["writes"] = ["y"]
            else:
                kernel["temp"] = 1.0
            out.append(kernel)
    return out


def _roles(op: str, k: TraceKernel, j: int, cache_read: bool) -> dict:
    """The roles of the ``j``-th kernel ``k`` of a non-GEMM op: the cache writes of RoPE's append,
    the attention kernel's KV and query, and otherwise x read by the first, temporaries between."""
    if op == "rope_append" and k.kclass == "index":
        return {"writes": ["cache:0.5"], **({} if cache_read else {"reads": ["x:0.25"]})}
    if op == "attention":
        if k.kclass == "attention":
            return {"reads": ["kv", "x"], "writes": ["y"]}
        return {"temp": 1.0, "dispatched": False}  # the attention library's own follow-up kernels
    if j == 0:
        return {"reads": ["w" if op == "embed" else "x"]}
    return {}


def _vector_kernels(op: str, ks: list[TraceKernel]) -> list[dict]:
    out = []
    for j, k in enumerate(ks):
        kernel = {"name": f"{op}_{k.kclass}_{j}", "class": k.kclass, **({"impl": k.impl} if k.impl else {})}
        kernel.update(_roles(op, k, j, any(e.get("writes") == ["cache:0.5"] for e in out)))
        if j == len(ks) - 1 and op != "attention" and "writes" not in kernel:
            kernel["writes"] = ["y"]
        if not kernel.get("reads") and not kernel.get("writes") and "temp" not in kernel:
            kernel["temp"] = 1.0
        out.append(kernel)
    return out


def stack_from_trace(path: Path, like: dict, name: str) -> tuple[dict, list[str], dict]:
    """(stack YAML data, ambiguous kernels, facts) of the trace at ``path``; ``like`` is the raw
    reference stack whose measured tables (impls, attention, dispatch) are kept."""
    kernels, launch = read_trace(path)
    layout = Layout(kernels, str(path))
    ops = {}
    for op in ("embed", "attn_norm", "qkv", "rope_append", "attention", "o_proj", "ffn_norm", "gate_up", "silu_mul",
               "down", "final_norm", "lm_head", "argmax"):
        ks = [kernels[i] for i in layout.ops.get(op, [])]
        if not ks:
            continue
        kdefs = _gemm_kernels(op, ks) if op in ("qkv", "o_proj", "gate_up", "down", "lm_head") else _vector_kernels(op, ks)
        ops[op] = {"source": f"{len(ks)} kernels: " + ", ".join(k.name[:60] for k in ks)[:400], "kernels": kdefs}
    ambiguous = sorted({k.name for k in kernels if not k.sure})
    dispatch, note = _dispatch(kernels, launch, like)
    stack = {"name": name,
             "description": f"written by `decodesim stack --from-profile` from {Path(path).name} ({launch}, "
                            f"{layout.layers} layers, {len(kernels)} kernels)",
             "source": f"profiler trace {Path(path).name}; measured tables (impls, attention) from the "
                       f"{like['name']} stack; {note}",
             "launch": launch, "moe": like.get("moe", "loop"), "unquantized": like.get("unquantized", []),
             "dispatch_ns": dispatch, "host_calls_ns": like.get("host_calls_ns", {}) if launch == "eager" else {},
             "ops": ops, "impls": like.get("impls", {}), "attention": like.get("attention", {})}
    facts = {"launch": launch, "layers": layout.layers, "kernels": len(kernels),
             "per_layer": sum(len(layout.ops[o]) for o in ("attn_norm", "qkv", "rope_append", "attention", "o_proj",
                                                            "ffn_norm", "gate_up", "silu_mul", "down")),
             "ops": {op: [kernels[i].kclass for i in idx] for op, idx in layout.ops.items()}, "ambiguous": ambiguous}
    return stack, ambiguous, facts


def _dispatch(kernels: list[TraceKernel], launch: str, like: dict) -> tuple[dict, str]:
    """Host time per eager launch by class from the launch calls' spacing, else the reference's."""
    times = [(k.kclass, k.launch_ts_us) for k in kernels if k.launch_ts_us is not None]
    if launch != "eager" or len(times) < 10:
        kept = like.get("dispatch_ns", {}) if launch == "eager" else {}
        return kept, ("host dispatch: the reference stack's figures (the trace has no launch calls)"
                      if launch == "eager" else "graph launch: no host dispatch per kernel")
    by_class: dict[str, list[float]] = {}
    for (_, t0), (kclass, t1) in zip(times, times[1:], strict=False):
        by_class.setdefault(kclass, []).append((t1 - t0) * NS_PER_US)
    src = "measured: host time between consecutive kernel launches in the trace, median by class"
    return ({c: {"value": round(statistics.median(v), 0), "source": src} for c, v in by_class.items()},
            "host dispatch per class from the trace's launch calls")
