"""The frozen validation cases (validation/cases.yaml) and the model shapes they name.

Data only, no torch: a case is (id, model, stack, execution, weights, kv, batch, context); the
model's shape comes from workloads/models/<name>.yaml. This module also decides which cases a
run takes and in what order (the smallest case of every group first, so a run cut by the budget
still covers every group; the Triton grouped cases last) and which ones the smoke runs take.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- models


@dataclass(frozen=True)
class Arch:
    """What the model YAML cannot say: how Hugging Face's modeling code for the model runs."""

    fused: bool = False        # Phi-3: one qkv_proj and one gate_up_proj
    qkv_bias: bool = False     # Qwen2: bias on q_proj, k_proj, v_proj
    qk_norm: bool = False      # OLMoE: RMSNorm over the whole Q and K projections, before RoPE
    norm_topk: bool = True     # Mixtral renormalises the top-k router weights; OLMoE does not
    rope_theta: float = 10000.0
    eps: float = 1e-5
    qk_norm_per_head: bool = False  # Qwen3: RMSNorm(head_dim) on every head of Q and K
    gemma: bool = False        # Gemma 2: (1 + w) norms, 4 per layer, sqrt(hidden) embedding scale, GeGLU,
    #                            sliding window on even layers, final logit soft-cap


ARCH = {
    "llama-3.2-1b": Arch(rope_theta=500000.0),
    "phi-3-mini": Arch(fused=True),
    "qwen2.5-14b": Arch(qkv_bias=True, rope_theta=1e6, eps=1e-6),
    "mistral-nemo-12b": Arch(rope_theta=1e6),
    "mixtral-8x7b": Arch(rope_theta=1e6),
    "olmoe-1b-7b": Arch(qk_norm=True, norm_topk=False),
    # appended for issue 21 (2026-12-04)
    "qwen3-30b-a3b": Arch(qk_norm=True, qk_norm_per_head=True, rope_theta=1e6, eps=1e-6),
    "gemma-2-9b": Arch(gemma=True, eps=1e-6),
}


@dataclass(frozen=True)
class Shape:
    """The shape of a model, read from workloads/models/<name>.yaml."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    sliding_window: int = 0    # Gemma 2: even layers attend to (and cache) the last sliding_window tokens
    final_softcap: float = 0.0

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def kv_bytes_per_token(self) -> int:
        """bf16 K and V of one token over all layers."""
        return self.layers * 2 * self.kv_heads * self.head_dim * 2

    def weight_bytes(self, fp8: bool) -> int:
        """Bytes of the weights as built here (norms and router included)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = h * (q + 2 * kv) + q * h
        ffn = (self.experts * 3 * h * self.expert_ffn + self.experts * h) if self.moe else 3 * h * self.ffn
        per_weight = 1 if fp8 else 2
        embed = self.vocab * h * 2 * (1 if self.tied else 2)
        return self.layers * ((attn + ffn) * per_weight + 2 * h * 2) + embed


def load_shape(name: str) -> Shape:
    """Read a model YAML of workloads/models (the same file the simulator reads)."""
    data = yaml.safe_load((REPO / "workloads" / "models" / f"{name}.yaml").read_text())
    moe = data.get("moe") or {}
    return Shape(name=data["name"], layers=data["layers"], hidden=data["hidden"], heads=data["heads"],
                 kv_heads=data["kv_heads"], head_dim=data["head_dim"], ffn=data["ffn"], vocab=data["vocab"],
                 tied=bool(data["tied_embeddings"]), experts=moe.get("experts", 0), top_k=moe.get("top_k", 0),
                 expert_ffn=moe.get("expert_ffn", 0), sliding_window=int(data.get("sliding_window") or 0),
                 final_softcap=float(data.get("final_logit_softcap") or 0.0))


def tiny_shape(shape: Shape) -> Shape:
    """A tiny model of the same kind for the CPU plumbing check (MHA stays MHA, head_dim 96
    becomes 24, MoE keeps top_k)."""
    mha = shape.heads == shape.kv_heads
    return replace(shape, layers=2, hidden=64, heads=4, kv_heads=4 if mha else 2,
                   head_dim=24 if shape.head_dim % 64 else 16, ffn=96, vocab=512,
                   experts=min(shape.experts, 16), expert_ffn=48 if shape.moe else 0,
                   sliding_window=min(shape.sliding_window, 24))


# ----------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    id: str
    model: str
    stack: str
    weights: str
    batch: int
    context: int
    execution: str = ""
    kv: str = "bf16"

    @property
    def group(self):
        return (self.model, self.stack, self.execution, self.weights, self.kv)

    @property
    def path(self):
        return (self.stack, self.execution if self.execution else "dense", self.weights, self.kv)


def load_cases(path: Path) -> list[Case]:
    data = yaml.safe_load(path.read_text())
    cases = [Case(id=c["id"], model=c["model"], stack=c["stack"], weights=c["weights"], batch=int(c["batch"]),
                  context=int(c["context"]), execution=c.get("execution") or "", kv=c.get("kv") or "bf16")
             for c in data["cases"]]
    ids = [c.id for c in cases]
    if len(ids) != len(set(ids)):
        raise ValueError("duplicate case ids in cases.yaml")
    return cases


def order_cases(cases: list[Case]) -> list[Case]:
    """First the smallest case of every (model, stack, execution, weights) group, so every
    group is measured early; then the rest, model by model (fewer rebuilds). The grouped
    (Triton) cases come after all others, in the same two passes: a fault in a hand-written
    kernel can poison the CUDA context for everything after it."""
    groups: dict = OrderedDict()
    for c in cases:
        groups.setdefault(c.group, []).append(c)
    models = list(OrderedDict.fromkeys(c.model for c in cases))
    key = lambda c: (models.index(c.model), c.weights, c.stack, c.execution, c.batch, c.context)  # noqa: E731
    firsts = {min(g, key=lambda c: (c.batch, c.context)).id for g in groups.values()}
    ordered = []
    for grouped in (False, True):
        part = [c for c in cases if (c.execution == "grouped") == grouped]
        ordered += sorted((c for c in part if c.id in firsts), key=key)
        ordered += sorted((c for c in part if c.id not in firsts), key=key)
    return ordered


def smoke_cases(cases: list[Case], cpu: bool) -> list[Case]:
    """Two cases per code path (stack, execution, weights), the smallest of two different models,
    spreading the models over the paths so every model runs; on the CPU with tiny batch and
    context."""
    by_path: dict = OrderedDict()
    for c in sorted(cases, key=lambda c: (c.batch, c.context)):
        by_path.setdefault(c.path, []).append(c)
    uses: dict = {c.model: 0 for c in cases}
    chosen = []
    for path_cases in by_path.values():
        smallest = OrderedDict()
        for c in path_cases:
            smallest.setdefault(c.model, c)
        picked = sorted(smallest.values(), key=lambda c: uses[c.model])[:2]
        for c in picked:
            uses[c.model] += 1
        if cpu:
            picked = [replace(c, id=f"{c.id}@cpu-b{(1, 3)[j]}-l{(16, 40)[j]}", batch=(1, 3)[j],
                              context=(16, 40)[j]) for j, c in enumerate(picked)]
        chosen.extend(picked)
    return chosen


def select_cases(args) -> list[Case]:
    cases = load_cases(Path(args.cases))
    if args.only_ids:
        wanted = [i.strip() for i in args.only_ids.split(",") if i.strip()]
        unknown = sorted(set(wanted) - {c.id for c in cases})
        if unknown:
            raise SystemExit(f"unknown case ids: {', '.join(unknown)}")
        cases = [c for c in cases if c.id in set(wanted)]
    elif args.quick or args.cpu:
        cases = smoke_cases(cases, cpu=args.cpu)
    return order_cases(cases)
