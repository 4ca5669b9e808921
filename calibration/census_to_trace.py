#!/usr/bin/env python3
"""Turn a committed profiler census of a CUDA-graph decode step (validation/data/h200/*/kernels_*.csv,
recorded by validation/whole_step.py on the H200) into a Kineto/Chrome trace of one graph replay,
for tests of `decodesim stack --from-profile` while no raw trace recorded on a GPU is committed.

The census holds layer 0 and the kernels outside the layers of one case, in launch order, with each
kernel's name, grid, block and duration as the profiler saw them. The trace written here is those
kernels in that order with layer 0's repeated once per layer of the model (every layer of these
models runs the same kernels), one cudaGraphLaunch, and the kernels' own durations laid end to end.
It is a conversion of real profiler output, not a raw trace: its header says so.

    python calibration/census_to_trace.py validation/data/h200/val/kernels_llama-3.2-1b_torch-graph.csv \
        llama-3.2-1b.graph.bf16.b1.l1024 16 tests/fixtures/traces/llama-3.2-1b_graph_b1_l1024.json.gz
"""
from __future__ import annotations

import csv
import gzip
import json
import sys


def main(census: str, case: str, layers: int, out: str) -> int:
    rows = [r for r in csv.DictReader(open(census, newline="")) if r["case_id"] == case]
    rows.sort(key=lambda r: int(r["index"]))
    layer = [r for r in rows if r["scope"] == "layer0"]
    first = int(layer[0]["index"])
    before = [r for r in rows if r["scope"] == "outside" and int(r["index"]) < first]
    after = [r for r in rows if r["scope"] == "outside" and int(r["index"]) > first]
    seq = before + layer * layers + after
    events = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1, "ts": 0.0, "dur": 5.0,
               "args": {"correlation": 1}}]
    ts = 10.0
    for r in seq:
        dur = float(r["duration_us"] or 1.0)
        events.append({"ph": "X", "cat": "kernel", "name": r["kernel"], "pid": 0, "tid": 7, "ts": round(ts, 3),
                       "dur": dur, "args": {"correlation": 1, "grid": json.loads(r["grid"]),
                                            "block": json.loads(r["block"])}})
        ts += dur + 1.0
    doc = {"schemaVersion": 1, "deviceProperties": [{"name": "NVIDIA H200"}],
           "decodesim_note": f"converted by calibration/census_to_trace.py from {census} case {case} "
                             f"(layer 0 repeated x {layers}); not a raw trace",
           "traceEvents": events}
    with gzip.open(out, "wt") as fh:
        json.dump(doc, fh)
    print(f"{out}: {len(seq)} kernels")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
