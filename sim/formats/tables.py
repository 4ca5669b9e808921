"""Tables about formats that the CLI and the report share: bytes, fidelity, side-by-side runs.

* ``byte_rows(model, contexts)``: effective bits and bytes per token per layer of K and V, by
  format and context, with the components (codes, metadata, window, outliers);
* ``fidelity_rows(formats, sample)``: the fidelity metrics of sim.formats.fidelity;
* ``compare_rows(spec, kv_formats)``: one simulated run per KV format plus its fidelity on
  synthetic KV shaped like the model's cache.
"""

from __future__ import annotations

from sim.formats.base import Format, get_format
from sim.formats.fidelity import KVSample, SyntheticKV, measure, synthetic

BASELINE = "fp16"


def widths(model, tp: int = 1) -> tuple[int, int]:
    """K and V row widths of one chip (KV heads x head_dim), as the lowering uses them."""
    kv_heads = max(1, model.kv_heads // tp)
    k = kv_heads * model.head_dim * model.k_width // (model.kv_heads * model.head_dim)
    v = kv_heads * model.head_dim * model.v_width // (model.kv_heads * model.head_dim)
    return k, v


def byte_row(fmt: Format, tokens: int, k_width: int, v_width: int) -> dict:
    base = get_format(BASELINE)
    k = fmt.tensor_bytes("k", tokens, k_width)
    v = fmt.tensor_bytes("v", tokens, v_width)
    total = k.total + v.total
    ref = base.kv_footprint(tokens, k_width, v_width)
    values = tokens * (k_width + v_width)
    return {
        "format": fmt.name, "context": tokens,
        "k_bits": 8 * k.total / (tokens * k_width), "v_bits": 8 * v.total / (tokens * v_width),
        "kv_bits": 8 * total / values,
        "k_bytes_per_token": k.total / tokens, "v_bytes_per_token": v.total / tokens,
        "kv_bytes_per_token": total / tokens, "footprint_bytes": total,
        "reduction_pct": 100 * (1 - total / ref),
        "code_bits": 8 * (k.values + v.values) / values, "metadata_bits": 8 * (k.metadata + v.metadata) / values,
        "window_bits": 8 * (k.window + v.window) / values,
        "outlier_bits": 8 * (k.outlier_stream + k.outlier_gather + v.outlier_stream + v.outlier_gather) / values,
        "gather_share_pct": 100 * (k.outlier_gather + v.outlier_gather) / total if total else 0.0,
        "layer_constant_bytes": fmt.layer_constant_bytes(k_width, v_width),
        "dequant_ops_per_value": (k.dequant_ops + v.dequant_ops) / values,
    }


def byte_rows(formats: list[Format], contexts: list[int], k_width: int, v_width: int) -> list[dict]:
    return [byte_row(f, c, k_width, v_width) for f in formats for c in contexts]


def weight_row(fmt: Format, rows: int = 4096, cols: int = 4096) -> dict:
    t = fmt.weight_read(rows, cols)
    return {"format": fmt.name, "bits": 8 * fmt.weight_bytes(rows, cols) / (rows * cols),
            "reduction_pct": 100 * (1 - fmt.weight_bytes(rows, cols) / get_format(BASELINE).weight_bytes(rows, cols)),
            "dequant_ops_per_value": t.dequant_ops / (rows * cols), "matmul_dtype": fmt.matmul_dtype}


def fidelity_rows(formats: list[Format], sample: KVSample, seed: int = 0) -> list[dict]:
    return [measure(f, sample, seed=seed) for f in formats]


def model_sample(model, tokens: int, seed: int = 0, tp: int = 1, **params) -> KVSample:
    """Synthetic KV shaped like one chip's cache of ``model`` (KV heads, head_dim, GQA)."""
    kv_heads = max(1, model.kv_heads // tp)
    return synthetic(SyntheticKV(tokens=tokens, kv_heads=kv_heads, head_dim=model.head_dim,
                                 q_per_kv=max(1, model.heads // model.kv_heads), seed=seed, **params))


def compare_rows(spec, kv_formats: list[str], fidelity_tokens: int = 2048) -> list[dict]:
    """One run per KV format (the rest of ``spec`` fixed) and its fidelity."""
    from sim.run import resolve, simulate

    rows = []
    sample = None
    base_kv = None
    for name in kv_formats:
        run_spec = spec.model_copy(update={"kv": name})
        result = simulate(run_spec)
        res = result.resolved
        s = result.summary
        plan = res.plan
        fmt = get_format(name)
        context = max(max(step.contexts) for step in res.steps)
        if sample is None:
            sample = model_sample(res.model, min(context, fidelity_tokens), seed=spec.seed, tp=plan.tp)
        fid = measure(fmt, sample, seed=spec.seed)
        per_token_store = sum(fmt.kv_footprint(context, plan.k_width, plan.v_width) for _ in range(res.model.layers))
        per_token_store /= context
        if base_kv is None and name == BASELINE:
            base_kv = per_token_store
        steps = result.steps or [{}]
        kv_read = sum(r.get("kv_bytes", 0) + r.get("outlier_bytes", 0) for r in steps) / len(steps)
        store = sum(r.get("store_bytes", 0) for r in steps) / len(steps)
        breakdown = s.get("breakdown_ms") or {}
        step_ms = sum(breakdown.values()) or float("nan")
        kv_ms = breakdown.get("kv", 0.0) + breakdown.get("outliers", 0.0)
        rows.append({
            "kv": name, "per_token_ms": s.get("per_token_ms_p50"), "per_token_ms_p99": s.get("per_token_ms_p99"),
            "kv_bytes_per_token": per_token_store, "kv_read_bytes_per_step": kv_read if result.steps else None,
            "kv_bytes_share_pct": 100 * kv_read / store if store else None,
            "kv_ms": kv_ms, "kv_time_share_pct": 100 * kv_ms / step_ms if breakdown else None,
            "dequant_ms": breakdown.get("dequant", 0.0), "bound": s.get("bound"), "verdict": s.get("verdict"),
            "attn_output_rel_error": fid["output_rel_error"], "attn_kl": fid["attn_kl"],
            "score_rel_error": fid["score_rel_error"], "fidelity_tokens": sample.k_pre.shape[0],
        })
    ref = base_kv
    base_ms = next((r["per_token_ms"] for r in rows if r["kv"] == BASELINE), None)
    if ref is None:  # fp16 not in the list: the reduction is still against fp16 bytes
        res = resolve(spec.model_copy(update={"kv": BASELINE}))
        context = max(max(step.contexts) for step in res.steps)
        ref = res.model.layers * get_format(BASELINE).kv_footprint(context, res.plan.k_width, res.plan.v_width) / context
    for r in rows:
        r["reduction_pct"] = 100 * (1 - r["kv_bytes_per_token"] / ref)
        r["latency_cut_pct"] = (100 * (1 - r["per_token_ms"] / base_ms)
                                if base_ms and r["per_token_ms"] is not None else None)
    return rows


def attention_costs(spec) -> dict:
    """Uncontended cost of the attention ops of the first step, summed over layers (ms):
    the matrix part (score and value products), the dequantization and other vector work,
    and the time to read K, V and outliers from the backing store alone."""
    from sim.costs import CostModel
    from sim.lowering.decode import lower_step
    from sim.run import resolve

    res = resolve(spec)
    graph = lower_step(res.plan, res.steps[0].contexts, res.steps[0].index)
    costs = CostModel(res.hardware)
    out = {"matrix_ms": 0.0, "dequant_ms": 0.0, "other_vector_ms": 0.0, "kv_read_ms": 0.0}
    for op in graph.ops:
        if op.kind != "attention":
            continue
        c = costs.cost(op)
        out["matrix_ms"] += c.matrix_ns / 1e6
        out["dequant_ms"] += c.dequant_ns / 1e6
        out["other_vector_ms"] += (c.vector_ns - c.dequant_ns) / 1e6
        out["kv_read_ms"] += sum(f.bytes * f.weight / costs.capacity[f.link] for f in c.flows
                                 if f.category in ("kv", "outliers")) / 1e6
    out["matrix_m"] = next(op.matrix_m for op in graph.ops if op.kind == "attention")
    out["matrix_tile_m"] = costs.tile_m
    return out
