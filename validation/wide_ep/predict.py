"""Predict the wide expert-parallel cases of cases.yaml; writes predictions.csv beside it.

    python validation/wide_ep/predict.py

Per case: the DES step (ms), output tokens/s per GPU (batch / step) and per 8-GPU node, the
bound, the hottest EP rank's straggler; for ``a2a`` cases the first MoE layer's dispatch and
combine all-to-all times (us). Reads nothing of the published figures (published.yaml).
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from sim.io import write_atomic  # noqa: E402
from sim.run import RunSpec, simulate  # noqa: E402

COLUMNS = ("id", "chips", "batch_per_gpu", "context", "microbatches", "step_ms", "tokens_per_s_per_gpu",
           "tokens_per_s_per_node", "bound", "links_ms", "expert_weights_ms", "kv_ms", "straggler_ms",
           "memory_per_gpu_GB", "dispatch_us", "combine_us")


def predict(case: dict, machine: dict) -> dict:
    """One case's predicted figures (module docstring)."""
    chips, batch = case["chips"], case["batch"]
    spec = RunSpec(model="deepseek-v3", weights="fp8", kv="fp16", hardware=machine["hardware"], chips=chips, tp=1,
                   attention_dp=chips, placement="spread", redundant_experts=32, batch=batch * chips,
                   context=case["context"], steps=1, microbatches=case["microbatches"],
                   overrides=tuple(machine["overrides"].items()))
    result = simulate(spec, keep_ops=bool(case.get("a2a")))
    s = result.summary
    step = s["per_token_ms_p50"]
    rows = s["breakdown_ms"]
    out = {"id": case["id"], "chips": chips, "batch_per_gpu": batch, "context": case["context"],
           "microbatches": case["microbatches"], "step_ms": round(step, 3),
           "tokens_per_s_per_gpu": round(1e3 * batch / step, 1), "tokens_per_s_per_node": round(8e3 * batch / step),
           "bound": s["bound"], "links_ms": round(rows.get("links", 0.0), 3),
           "expert_weights_ms": round(rows.get("expert_weights", 0.0), 3), "kv_ms": round(rows.get("kv", 0.0), 3),
           "straggler_ms": round(s["moe"]["straggler_ms_per_step"], 3),
           "memory_per_gpu_GB": round(s["capacity"]["needed_bytes"] / 1e9, 1), "dispatch_us": "", "combine_us": ""}
    if case.get("a2a"):
        first = {}
        for op in result.ops:
            if op["name"] in ("dispatch_all_to_all", "combine_all_to_all") and op["name"] not in first:
                first[op["name"]] = op["duration_ns"] / 1e3
        out["dispatch_us"], out["combine_us"] = (round(first[n], 1) for n in ("dispatch_all_to_all",
                                                                             "combine_all_to_all"))
    return out


def main() -> None:
    spec = yaml.safe_load((HERE / "cases.yaml").read_text())
    rows = [predict(case, spec["machines"][case["machine"]]) for case in spec["cases"]]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(HERE / "predictions.csv", buf.getvalue())
    print(buf.getvalue())


if __name__ == "__main__":
    main()
