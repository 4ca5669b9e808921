"""Predict the published serving results of cases.yaml with `decodesim serve` and write
predictions.csv (run from the checkout: python reports/serving-published/predict.py).

Each case is an offline batch: ``batch`` requests of ``isl`` prompt and ``osl`` output
tokens sent at 0 (the benchmark's fixed batch), llama-2-70b with fp8 weights and fp16 KV,
TensorRT-LLM's guaranteed-no-evict scheduler with ``max_batch`` = the batch, tensor
parallel over the case's chips; the figure is output tokens/s from the first arrival to the
last finish (decodesim serve's throughput_tokens_per_s).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pandas as pd
import yaml

from sim.serve.replay import serve
from sim.serve.spec import ServeSpec

HERE = Path(__file__).resolve().parent


def predict(case: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        requests = Path(tmp) / "batch.jsonl"
        requests.write_text("".join(json.dumps({"arrival_s": 0.0, "prompt_tokens": case["isl"],
                                                "output_tokens": case["osl"]}) + "\n" for _ in range(case["batch"])))
        spec = ServeSpec(hardware=case["hardware"], model="llama-2-70b", weights="fp8", kv="fp16",
                         chips=case["chips"], tp=case["chips"], pp=1, requests=str(requests), client="offline",
                         policy="trtllm-no-evict", max_batch=case["batch"])
        s = serve(spec)
    return {"name": case["name"], "predicted_tokens_per_s": s["throughput_tokens_per_s"],
            "predicted_ttft_ms_p50": s["ttft_ms_p50"], "predicted_tpot_ms_p50": s["tpot_ms_p50"],
            "mean_batch": s["mean_batch_busy"], "preemptions": s["preemptions"], "requests_done": s["requests_done"]}


def main() -> int:
    cases = yaml.safe_load((HERE / "cases.yaml").read_text())["cases"]
    rows = []
    for case in cases:
        rows.append(predict(case))
        print(rows[-1], file=sys.stderr)
    pd.DataFrame(rows).to_csv(HERE / "predictions.csv", index=False, float_format="%.6g")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
