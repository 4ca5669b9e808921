"""Tables about formats that the CLI and the report share: bytes, fidelity, side-by-side runs.

* ``byte_rows(model, contexts)``: effective bits and bytes per token per layer of K and V, by
  format and context, with the components (codes, metadata, window, outliers);
* ``fidelity_rows(formats, sample)``: the fidelity metrics of sim.formats.fidelity.

Tables that run the simulator (one run per KV format) live above the runner, in
sim.experiments.compare.
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
    """One KV format's bytes at ``tokens`` of context for one layer's K and V rows (stored
    bytes per token per layer, bits per value by component, reduction against fp16)."""
    base = get_format(BASELINE)
    k = fmt.tensor_bytes("k", tokens, k_width)
    v = fmt.tensor_bytes("v", tokens, v_width)
    total = k.total + v.total
    ref = base.kv_footprint(tokens, k_width, v_width)
    values = tokens * (k_width + v_width)
    return {
        "kv": fmt.name, "context": tokens,
        "k_bits": 8 * k.total / (tokens * k_width), "v_bits": 8 * v.total / (tokens * v_width),
        "kv_bits": 8 * total / values,
        "k_stored_bytes_per_token_layer": k.total / tokens, "v_stored_bytes_per_token_layer": v.total / tokens,
        "kv_stored_bytes_per_token_layer": total / tokens, "footprint_bytes": total,
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
    return {"weights": fmt.name, "bits": 8 * fmt.weight_bytes(rows, cols) / (rows * cols),
            "reduction_pct": 100 * (1 - fmt.weight_bytes(rows, cols) / get_format(BASELINE).weight_bytes(rows, cols)),
            "dequant_ops_per_value": t.dequant_ops / (rows * cols), "matmul_dtype": fmt.matmul_dtype}


def fidelity_rows(formats: list[Format], sample: KVSample, seed: int = 0) -> list[dict]:
    return [measure(f, sample, seed=seed) for f in formats]


def model_sample(model, tokens: int, seed: int = 0, tp: int = 1, **params) -> KVSample:
    """Synthetic KV shaped like one chip's cache of ``model`` (KV heads, head_dim, GQA)."""
    kv_heads = max(1, model.kv_heads // tp)
    return synthetic(SyntheticKV(tokens=tokens, kv_heads=kv_heads, head_dim=model.head_dim,
                                 q_per_kv=max(1, model.heads // model.kv_heads), seed=seed, **params))
