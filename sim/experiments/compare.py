"""Side-by-side runs of KV formats: one simulated run per format plus its fidelity.

``compare_rows(spec, kv_formats)`` backs ``decodesim compare`` and the formats report;
``attention_costs(spec)`` splits the attention ops' uncontended cost into its parts.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml

from sim.config.software import load_stack
from sim.costs import CostModel
from sim.formats import get_format
from sim.formats.fidelity import measure
from sim.formats.tables import BASELINE, model_sample
from sim.lowering.decode import lower_step
from sim.run import simulate
from sim.setup import resolve
from sim.units import ns_to_ms


def _dump(data) -> str:
    """``yaml.safe_dump`` of a stack written for ``load_stack`` to read back: the same safe
    representer, libyaml's emitter where PyYAML has it (a break-even bisection writes dozens)."""
    return yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper))


def compare_rows(spec, kv_formats: list[str], fidelity_tokens: int = 2048) -> list[dict]:
    """One run per KV format (the rest of ``spec`` fixed) and its fidelity."""
    rows = []
    sample = None
    for name in kv_formats:
        result = simulate(spec.model_copy(update={"kv": name}))
        res = result.resolved
        if sample is None:
            sample = model_sample(res.model, min(_context(res), fidelity_tokens), seed=spec.seed, tp=res.tp)
        run = _run_figures(result)
        energy = run.pop("J_per_token")
        rows.append({"kv": name, "per_token_ms_p50": run.pop("per_token_ms_p50"),
                     "per_token_ms_p99": run.pop("per_token_ms_p99"),
                     "kv_stored_bytes_per_token": _stored_per_token(name, res), **run,
                     **_fidelity(name, sample, spec.seed), "J_per_token": energy})
    _against_baseline(rows, spec)
    return rows


def _context(res) -> int:
    return max(max(step.contexts) for step in res.steps)


def _stored_per_token(name: str, res) -> float:
    """KV bytes stored per token over all layers at the run's context."""
    context = _context(res)
    fmt = get_format(name)
    return sum(fmt.kv_footprint(context, res.k_width, res.v_width) for _ in range(res.model.layers)) / context


def _fidelity(name: str, sample, seed: int) -> dict:
    fid = measure(get_format(name), sample, seed=seed)
    return {"output_rel_error": fid["output_rel_error"], "attn_kl": fid["attn_kl"],
            "score_rel_error": fid["score_rel_error"], "fidelity_tokens": sample.k_pre.shape[0]}


def _run_figures(result) -> dict:
    """Latency, KV traffic and its share of the bytes and time of one run."""
    s = result.summary
    steps = result.steps or [{}]
    kv_read = sum(r.get("kv_bytes", 0) + r.get("outlier_bytes", 0) for r in steps) / len(steps)
    store = sum(r.get("store_bytes", 0) for r in steps) / len(steps)
    breakdown = s.get("breakdown_ms") or {}
    step_ms = sum(breakdown.values()) or float("nan")
    kv_ms = breakdown.get("kv", 0.0) + breakdown.get("outliers", 0.0)
    return {
        "per_token_ms_p50": s.get("per_token_ms_p50"), "per_token_ms_p99": s.get("per_token_ms_p99"),
        "kv_read_bytes_per_step": kv_read if result.steps else None,
        "kv_bytes_share_pct": 100 * kv_read / store if store else None,
        "kv_ms": kv_ms, "kv_time_share_pct": 100 * kv_ms / step_ms if breakdown else None,
        "dequant_ms": breakdown.get("dequant", 0.0), "bound": s.get("bound"), "verdict": s.get("verdict"),
        "J_per_token": (s.get("energy") or {}).get("J_per_token"),
    }


def _against_baseline(rows: list[dict], spec) -> None:
    """Each row's byte reduction, latency cut and energy cut against fp16 (in place). Without an
    fp16 row the reduction is still against fp16 bytes."""
    base = next((r for r in rows if r["kv"] == BASELINE), None)
    if base is not None:
        ref = base["kv_stored_bytes_per_token"]
    else:
        res = resolve(spec.model_copy(update={"kv": BASELINE}))
        context = _context(res)
        ref = res.model.layers * get_format(BASELINE).kv_footprint(context, res.k_width, res.v_width) / context
    base_ms = base["per_token_ms_p50"] if base else None
    base_J = base["J_per_token"] if base else None
    for r in rows:
        r["energy_cut_pct"] = 100 * (1 - r["J_per_token"] / base_J) if base_J and r["J_per_token"] else None
        r["reduction_pct"] = 100 * (1 - r["kv_stored_bytes_per_token"] / ref)
        r["latency_cut_pct"] = (100 * (1 - r["per_token_ms_p50"] / base_ms)
                                if base_ms and r["per_token_ms_p50"] is not None else None)


def attention_costs(spec) -> dict:
    """Uncontended cost of the attention ops of the first step, summed over layers (ms):
    the matrix part (score and value products), the dequantization and other vector work,
    and the time to read K, V and outliers from the backing store alone."""
    res = resolve(spec)
    graph = lower_step(res, res.steps[0].contexts, res.steps[0].index)
    costs = CostModel(res.hardware)
    out = {"matrix_ms": 0.0, "dequant_ms": 0.0, "other_vector_ms": 0.0, "kv_read_ms": 0.0}
    for op in graph.ops:
        if op.kind != "attention":
            continue
        c = costs.cost(op.work)
        out["matrix_ms"] += ns_to_ms(c.matrix_ns)
        out["dequant_ms"] += ns_to_ms(c.dequant_ns)
        out["other_vector_ms"] += ns_to_ms(c.vector_ns - c.dequant_ns)
        out["kv_read_ms"] += ns_to_ms(sum(f.bytes * f.weight / costs.capacity[f.link] for f in c.flows
                                          if f.category in ("kv", "outliers")))
    out["matrix_m"] = next(op.work.matrix_m for op in graph.ops if op.kind == "attention")
    out["matrix_tile_m"] = costs.tile_m
    return out


def attention_rows(spec, kv_formats: list[str], stacks: list[str], baseline: str = "fp16") -> list[dict]:
    """For each KV format and each stack's attention kernel: the step and attention times,
    attention against the baseline format's, the KV rate the kernel reaches, and the
    break-even factor: how much cheaper per dequantized value the kernel must be for the
    format's step to match the baseline's (1 or less: it already does; inf: not even a
    free dequantization would)."""
    out = []
    for software in stacks:
        base = _attention(spec.model_copy(update={"kv": baseline, "software": software}))
        if base["step_ms"] is None:  # the baseline does not fit: nothing to set against it
            continue
        for name in kv_formats:
            run = spec.model_copy(update={"kv": name, "software": software})
            row = _attention(run)
            if row["step_ms"] is None:  # this format does not fit (its row in the table says why)
                continue
            row.update(kv=name, software=software, attention_vs_baseline=row["attention_ms"] / base["attention_ms"],
                       break_even=break_even(run, base["step_ms"]) if name != baseline else None)
            out.append(row)
    return out


def _attention(spec) -> dict:
    r = simulate(spec, keep_ops=True)
    att = [o for o in r.ops if o["name"] == "attention" and o["step"] == r.steps[0]["step"]]
    ns = sum(o["duration_ns"] for o in att)
    kv_bytes = sum(o.get("read_kv_hbm_bytes", 0) + o.get("read_outliers_hbm_bytes", 0) for o in att)
    return {"step_ms": r.summary["per_token_ms_p50"], "attention_ms": ns_to_ms(ns),
            "kv_GBps": kv_bytes / ns if ns else 0.0}


def break_even(spec, target_ms: float) -> float:
    """The factor by which the stack's dequantization cost per value must shrink for ``spec``'s
    step to take ``target_ms`` (bisection on a scaled copy of the stack; monotone)."""
    stack = load_stack(spec.software)
    if not stack.attention:
        return float("nan")
    raw = stack.model_dump(mode="json", by_alias=True)

    def step_ms(scale: float, folder: Path) -> float:
        scaled = dict(raw, name=f"{raw['name']}-x{scale:.6g}")
        scaled["attention"] = {
            name: {k: (dict(v, value=v["value"] * scale) if k.endswith("_ps") and isinstance(v, dict) else v)
                   for k, v in impl.items()} for name, impl in raw["attention"].items()}
        path = folder / f"stack-{scale:.6g}.yaml"
        path.write_text(_dump(scaled))
        return simulate(spec.model_copy(update={"software": str(path)})).summary["per_token_ms_p50"]

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if step_ms(1.0, folder) <= target_ms:
            return 1.0
        if step_ms(0.0, folder) > target_ms:
            return float("inf")
        lo, hi = 0.0, 1.0  # scale lo meets the target, hi does not
        for _ in range(16):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if step_ms(mid, folder) <= target_ms else (lo, mid)
        return 1.0 / lo if lo > 0 else float("inf")


# -- the KV verdict at three kernel qualities --------------------------------------------------

REFERENCE_STACK = "fused"  # whose measured dequantizing attention kernel is the best measured here
REFERENCE_IMPL = "triton_group"


def _quality_stack(base, attention_kernels: list[dict], impl: dict | None, folder, tag: str) -> str:
    """A copy of stack ``base`` whose attention op (for every KV format it names) runs
    ``attention_kernels``; ``impl`` (an attention implementation) is added as ``quality``."""
    raw = base.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["name"] = f"{raw['name']}-{tag}"
    raw["ops"]["attention"] = {"kernels": attention_kernels, "source": f"decodesim compare: {tag} attention kernel"}
    for table in raw.get("kv_formats", {}).values():
        table.pop("attention", None)
    raw["kv_formats"] = {fmt: table for fmt, table in raw.get("kv_formats", {}).items() if table}
    if impl is not None:
        raw.setdefault("attention", {})["quality"] = impl
    path = folder / f"{tag}.yaml"
    path.write_text(_dump(raw))
    return str(path)


def kv_qualities(spec, kv_formats: list[str], published: tuple[float, str] | None = None) -> list[dict]:
    """Each quantized KV format's step at three qualities of the attention kernel: as the
    stack runs it (measured kernels), with the best dequantizing kernel measured on this chip
    (``REFERENCE_STACK``'s ``REFERENCE_IMPL``: one kernel that reads the quantized cache at its
    measured efficiency and dequantizes at its measured cost per value), and at the byte limit
    (one kernel that reads the quantized bytes at the attention class's rate, dequantization
    free). ``published`` = (fraction of HBM peak bandwidth a published kernel reaches, its
    source) adds a fourth column: the quantized bytes read at that fraction, dequantization
    hidden. With each: the fp16 step under the same stack, and whether the format beats it."""
    base = load_stack(spec.software)
    ref = load_stack(REFERENCE_STACK).attention[REFERENCE_IMPL].model_dump(mode="json", exclude_none=True)
    setup = resolve(spec.model_copy(update={"kv": BASELINE}))
    attention_rate = setup.hardware.kernels.classes["attention"].stream_fraction.value * setup.hardware.store.sustained_GBps \
        if setup.hardware.kernels is not None else setup.hardware.store.peak_GBps
    one = {"name": "attention", "class": "attention", "reads": ["kv", "x"], "writes": ["y"]}
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        stacks = {"measured": spec.software,
                  "best_measured": _quality_stack(base, [dict(one, impl="quality")], ref, folder, "best-measured"),
                  "byte_limit": _quality_stack(base, [one], None, folder, "byte-limit")}
        if published is not None:
            fraction, source = published
            eff = min(1.0, fraction * setup.hardware.store.peak_GBps / attention_rate)
            zero = {k: {"value": 0.0, "source": source} for k in ("value_ps", "unpack_ps", "group_ps", "outlier_ps",
                                                                  "channel_ps")}
            impl = {"efficiency": {"value": eff, "source": source}, **zero, "source": source}
            stacks["published"] = _quality_stack(base, [dict(one, impl="quality")], impl, folder, "published")
        fp16 = {q: simulate(spec.model_copy(update={"kv": BASELINE, "software": s})).summary["per_token_ms_p50"]
                for q, s in stacks.items()}
        if None in fp16.values():  # the fp16 reference does not fit: no verdict against it
            return []
        for name in kv_formats:
            fmt = get_format(name)
            if name == BASELINE or (fmt.k.bits >= 16 and fmt.v.bits >= 16):
                continue
            row = {"kv": name}
            for q, s in stacks.items():
                ms = simulate(spec.model_copy(update={"kv": name, "software": s})).summary["per_token_ms_p50"]
                row[q] = {"ms": ms, "fp16_ms": fp16[q], "beats_fp16": ms < fp16[q]}
            out.append(row)
    return out
