"""`decodesim stack --from-profile` (issue 44): the ops and kernel classes read from a trace of a
graph-captured decode step (tests/fixtures/traces: converted by calibration/census_to_trace.py from
the H200 profiler census of validation/whole_step.py) match that census's own annotations; the
written stack loads and predicts the measured step; eager traces give host dispatch per class; bad
traces are refused in one line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import yaml

from sim.cli import main
from sim.run import simulate

FIX = Path(__file__).parent / "fixtures" / "traces"
LLAMA = FIX / "llama-3.2-1b_graph_b1_l1024.json.gz"
# the census's annotated op sizes (validation/data/h200/val/kernels_llama-3.2-1b_torch-graph.csv, layer 0)
CENSUS = {"attn_norm": 8, "qkv": 3, "rope_append": 12, "attention": 2, "o_proj": 2, "ffn_norm": 8, "gate_up": 2,
          "silu_mul": 2, "down": 3, "final_norm": 8, "lm_head": 1, "argmax": 2, "embed": 8}


def test_graph_trace_gives_the_census_ops_and_predicts_the_step(tmp_path, capsys):
    out = tmp_path / "mine.yaml"
    assert main(["stack", "--from-profile", str(LLAMA), "--out", str(out), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["launch"] == "graph" and facts["layers"] == 16 and facts["ambiguous"] == []
    assert {op: len(c) for op, c in facts["ops"].items()} == CENSUS
    assert facts["ops"]["qkv"] == ["matrix"] * 3 and facts["ops"]["attention"] == ["attention", "reduction"]
    assert facts["ops"]["rope_append"][-2:] == ["index", "index"]
    stack = yaml.safe_load(out.read_text())
    assert stack["launch"] == "graph" and stack["ops"]["qkv"]["kernels"][1]["reads"] == ["x", "w:k"]
    s = simulate(model="llama-3.2-1b", hardware="h200-sxm", batch=1, context=1024, software=str(out), steps=2,
                 engine="analytic").summary
    assert abs(s["per_token_ms_p50"] / 2.19872 - 1) < 0.15  # validation/data/h200/val/steps.csv, measured


def _event(cat, name, ts, corr, dur=2.0):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}


def _eager_trace(path: Path, layers: int = 2) -> None:
    names = (["embedding_indexSelect"] + (["reduce_kernel<512>", "nvjet_gemm", "vectorized_elementwise_kernel<4>",
                                           "index_elementwise_kernel", "flash_fwd_kernel", "nvjet_gemm",
                                           "vectorized_elementwise_kernel<4>", "triton_red_fused_norm", "nvjet_gemm",
                                           "vectorized_elementwise_kernel<8>", "nvjet_gemm",
                                           "vectorized_elementwise_kernel<8>"] * layers)
             + ["triton_red_fused_norm", "nvjet_gemm", "reduce_kernel<512, ArgMaxOps>"])
    events, host = [], 0.0
    for i, name in enumerate(names):
        host += 12.0 if "gemm" in name else 8.0
        events += [_event("cuda_runtime", "cudaLaunchKernel", host, i), _event("kernel", name, 1000 + 10 * i, i)]
    with gzip.open(path, "wt") as fh:
        json.dump({"traceEvents": events}, fh)


def test_eager_trace_gives_dispatch_and_lists_ambiguous_kernels(tmp_path, capsys):
    trace = tmp_path / "eager.json.gz"
    _eager_trace(trace)
    out = tmp_path / "eager.yaml"
    assert main(["stack", "--from-profile", str(trace), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "eager launch, 2 layers" in text and "triton_red_fused_norm" in text
    stack = yaml.safe_load(out.read_text())
    assert stack["launch"] == "eager" and stack["dispatch_ns"]["matrix"]["value"] == 12000
    assert stack["dispatch_ns"]["elementwise"]["value"] == 8000


def test_bad_traces_are_one_line(tmp_path, capsys):
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"traceEvents": [_event("kernel", "flash_fwd_kernel", 1, 1)]}))
    for path in (tmp_path / "missing.json", one):
        assert main(["stack", "--from-profile", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(path) in err
