"""Property tests (issue 14): generated models, traces, routing files, studies and command lines
either work or fail with one line.

Each generated case runs the CLI in this process and must end in under ``CASE_LIMIT_S``
seconds of CPU time with exit status 0 (or 1 where the command says "no answer", solve) or 2 with a
single stderr line; an exception escaping ``main`` (a traceback) fails the test. The slow
suite (``-m slow``) runs 2,550 cases over the five generators (routing files too) (plus the profile mutations of
tests/test_mutation.py); the default run has a fixed (derandomized) subset of 115.
"""

from __future__ import annotations

import copy
import io
import json
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, run_cli

CASE_LIMIT_S = 5.0
MODELS = sorted((ROOT / "workloads" / "models").glob("*.yaml"))
SLOW = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
FAST = dict(SLOW, derandomize=True)


def check(argv: list[str], allowed=(0, 2)) -> tuple[int, str, str]:
    """Run ``decodesim ARGV``; assert a clean ending (status, one line, work). The work bound is
    this process's CPU time, never wall time (a loaded 2-core machine stretches wall time, not
    work: no test asserts a wall-clock bound)."""
    start_cpu = time.process_time()
    code, out, err = run_cli(*argv)
    cpu = time.process_time() - start_cpu
    assert cpu < CASE_LIMIT_S, f"{cpu:.1f} s CPU for {argv}"
    assert code in allowed, (argv, code, err)
    if code == 2:
        assert err.startswith("decodesim: ") and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    return code, out, err


# -- models -----------------------------------------------------------------------------------

ODD = st.sampled_from(["text", "", None, [], {}, True, False, -1, 0, 1, 2, 7, 4096.5, 10**11, 2**31, 1e300, -1e300,
                       "nan", ".inf", [1, 2], {"value": 1}, {"experts": 4}, "1e9"])


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, child in node.items():
            yield from _paths(child, prefix + (key,))
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _paths(child, prefix + (i,))


@st.composite
def model_mutants(draw):
    """A bundled model with one change: a key dropped or added, a value retyped, negated or
    blown up, or the YAML text damaged (truncated, a line repeated as a duplicate key)."""
    path = draw(st.sampled_from(MODELS))
    text = path.read_text()
    action = draw(st.sampled_from(["keep", "double", "drop", "add", "retype", "scale", "truncate", "duplicate"]))
    if action == "keep":
        return path.name, text
    if action == "truncate":
        return path.name, text[: draw(st.integers(0, len(text)))]
    if action == "duplicate":
        lines = [line for line in text.splitlines() if line and not line.startswith((" ", "#", "-"))]
        return path.name, text + "\n" + draw(st.sampled_from(lines)) + "\n"
    data = yaml.safe_load(text)
    target = draw(st.sampled_from([p for p in _paths(data) if p]))
    data = copy.deepcopy(data)
    parent = data
    for part in target[:-1]:
        parent = parent[part]
    key = target[-1]
    if action == "drop":
        del parent[key]
    elif action == "add":
        (parent[key] if isinstance(parent[key], dict) else parent)["unexpected_key"] = draw(ODD)
    elif action == "retype":
        parent[key] = draw(ODD)
    else:
        value = parent[key]
        factor = draw(st.sampled_from([2, 0.5, 0, -1, 1e-9, 1e3, 1e9, 1e12] if action == "scale" else [2]))
        parent[key] = value * factor if isinstance(value, (int, float)) and not isinstance(value, bool) else factor
        if isinstance(value, int) and not isinstance(value, bool) and float(parent[key]).is_integer():
            parent[key] = int(parent[key])
    return path.name, yaml.safe_dump(data)


def _check_model(tmp_path_factory, mutant, engine):
    name, text = mutant
    path = tmp_path_factory.mktemp("model") / name
    path.write_text(text)
    check(["run", "--model", str(path), "--steps", "1", "--context", "256", "--engine", engine])


@settings(max_examples=25, **FAST)
@given(mutant=model_mutants(), engine=st.sampled_from(["analytic", "des"]))
def test_mutated_models_fast(tmp_path_factory, mutant, engine):
    _check_model(tmp_path_factory, mutant, engine)


@pytest.mark.slow
@settings(max_examples=600, **SLOW)
@given(mutant=model_mutants(), engine=st.sampled_from(["analytic", "des"]))
def test_mutated_models(tmp_path_factory, mutant, engine):
    _check_model(tmp_path_factory, mutant, engine)


# -- traces -----------------------------------------------------------------------------------

CELL = st.one_of(st.integers(-3, 70_000), st.sampled_from(["abc", "", "1.5", "1e3", "nan", "inf", "-0", "true",
                                                           "99999999999999999999", "2000000000"]))
CONTEXT = st.one_of(st.integers(1, 9_000), st.sampled_from([0, -5, 10**10, 2**63, 1.5, True, "7", None]))


@st.composite
def trace_steps(draw):
    """Steps that are mostly decode-like: a sequence grows by one per step, sometimes not."""
    steps, contexts = [], {}
    for index in range(draw(st.integers(0, 5))):
        live = draw(st.lists(st.integers(0, 6), max_size=6))
        seqs = []
        for seq in live:
            if draw(st.integers(0, 9)) == 0:
                context = draw(CONTEXT)
            else:
                context = contexts.get(seq, draw(st.integers(1, 5_000)) - 1) + 1
            contexts[seq] = context if isinstance(context, int) and not isinstance(context, bool) else 1
            seqs.append([seq, context])
        step = draw(st.sampled_from([index, index, index, index + 2, index - 1, "x", True]))
        steps.append({"step": step, "seqs": seqs})
    return steps


@st.composite
def trace_files(draw):
    """(suffix, bytes) of a trace file: JSON Lines, CSV, Parquet, or junk."""
    kind = draw(st.sampled_from(["jsonl", "jsonl", "csv", "csv", "parquet", "bytes", "text"]))
    if kind == "bytes":
        return ".jsonl", draw(st.binary(max_size=300))
    if kind == "text":
        return draw(st.sampled_from([".jsonl", ".csv"])), draw(st.text(max_size=200)).encode("utf-8", "replace")
    steps = draw(trace_steps())
    if kind == "jsonl":
        lines = [json.dumps(s) for s in steps]
        if lines and draw(st.booleans()):
            lines[draw(st.integers(0, len(lines) - 1))] = draw(st.sampled_from(["{", "[]", '{"seqs": 5}', "null",
                                                                                '{"step": 0}']))
        return ".jsonl", ("\n".join(lines) + "\n").encode()
    rows = [(s["step"], seq, ctx) for s in steps for seq, ctx in s["seqs"]]
    if kind == "csv":
        header = draw(st.sampled_from(["step,seq_id,context", "step,seq_id,context,extra", "step,seq,context", ""]))
        body = [",".join(str(v) for v in row) for row in rows]
        if body and draw(st.booleans()):
            body[draw(st.integers(0, len(body) - 1))] = ",".join(str(draw(CELL)) for _ in range(3))
        return ".csv", ("\n".join([header, *body]) + "\n").encode()
    import pandas as pd

    frame = pd.DataFrame([tuple(str(v) if isinstance(v, str) or v is None else v for v in row) for row in rows],
                         columns=["step", "seq_id", "context"])
    buffer = io.BytesIO()
    try:
        frame.to_parquet(buffer, index=False)
    except Exception:  # noqa: BLE001 - mixed column types pyarrow refuses: write junk instead
        return ".parquet", b"PAR1 not really"
    return ".parquet", buffer.getvalue()


def _check_trace(tmp_path_factory, trace):
    suffix, data = trace
    path = tmp_path_factory.mktemp("trace") / f"t{suffix}"
    path.write_bytes(data)
    check(["run", "--trace", str(path), "--steps", "3", "--engine", "analytic"])


@settings(max_examples=25, **FAST)
@given(trace=trace_files())
def test_generated_traces_fast(tmp_path_factory, trace):
    _check_trace(tmp_path_factory, trace)


@pytest.mark.slow
@settings(max_examples=500, **SLOW)
@given(trace=trace_files())
def test_generated_traces(tmp_path_factory, trace):
    _check_trace(tmp_path_factory, trace)


ROUTING = ROOT / "workloads" / "routing" / "mixtral-zipf1.5-loc0.3-b8.jsonl"


@st.composite
def routing_mutants(draw):
    """The bundled Mixtral routing file with one record damaged, dropped, repeated or retyped."""
    lines = ROUTING.read_text().splitlines()
    action = draw(st.sampled_from(["keep", "drop", "repeat", "retype", "truncate", "junk"]))
    index = draw(st.integers(0, len(lines) - 1))
    if action == "drop":
        del lines[index]
    elif action == "repeat":
        lines.insert(index, lines[index])
    elif action == "retype":
        record = json.loads(lines[index])
        key = draw(st.sampled_from(sorted(record)))
        record[key] = draw(st.one_of(ODD, st.sampled_from([[[0, 0]], [[9, 1]], [[0]], [["a", "b"]], 10**12])))
        lines[index] = json.dumps(record)
    elif action == "junk":
        lines[index] = draw(st.text(max_size=40))
    text = "\n".join(lines) + "\n"
    if action == "truncate":
        text = text[: draw(st.integers(0, len(text)))]
    return text


def _check_routing(tmp_path_factory, text, steps):
    path = tmp_path_factory.mktemp("routing") / "r.jsonl"
    path.write_text(text)
    check(["run", "--model", "mixtral-8x7b", "--routing", str(path), "--steps", steps, "--engine", "analytic"])


@settings(max_examples=10, **FAST)
@given(text=routing_mutants(), steps=st.sampled_from(["1", "4", "9"]))
def test_mutated_routing_files_fast(tmp_path_factory, text, steps):
    _check_routing(tmp_path_factory, text, steps)


@pytest.mark.slow
@settings(max_examples=200, **SLOW)
@given(text=routing_mutants(), steps=st.sampled_from(["1", "4", "9"]))
def test_mutated_routing_files(tmp_path_factory, text, steps):
    _check_routing(tmp_path_factory, text, steps)


# -- studies ----------------------------------------------------------------------------------

RUN_VALUES = {
    "batch": st.one_of(st.integers(1, 16), st.sampled_from([0, -1, 10**9, "x", 2.5, True])),
    "context": st.one_of(st.sampled_from([128, 1024, 4096]), st.sampled_from([0, 10**12, "x", 140_000])),
    "steps": st.one_of(st.integers(1, 2), st.sampled_from([0, 10**8, "x"])),
    "kv": st.sampled_from(["fp16", "int8", "kivi-2", "nope", 3]),
    "weights": st.sampled_from(["bf16", "fp8", "int4-g128", "nope"]),
    "model": st.sampled_from(["llama-3-8b", "llama-3.2-1b", "mixtral-8x7b", "llama-2-7b", "nope", ""]),
    "hardware": st.sampled_from(["h200-sxm", "b200", "groq-lpu", "nope"]),
    "engine": st.sampled_from(["analytic", "des", "magic"]),
    "target_ms": st.sampled_from([10, 0, -1, 1e300, "inf", ".inf"]),
    "seed": st.sampled_from([0, 1, -1, 2**70]),
    "tp": st.sampled_from([1, 2, 0, 3]),
    "allow_long_context": st.sampled_from([True, False, "yes", 1]),
    "bogus_field": st.just(1),
}
OVERRIDE_PATHS = ["hardware.hbm.channel_bandwidth_GBps", "hardware.memory.hbm.latency_ns", "hardware.compute.clock_GHz",
                  "hardware.system.chips", "hardware.nope.x", "model.layers", "model.hidden", "model.kv_heads",
                  "model.moe.experts", "batch", "context", "kv", "nope", "hardware.hbm.channel_bandwidth_GBps.value"]
OVERRIDE_VALUES = st.one_of(st.sampled_from([1, 30, 0, -1, 1e300, 1e-300, "x", None, True, [1], {"scale": 2},
                                             {"scale": "x"}, {"add": 1}, {"scale": 1e300}, {"value": 5}]),
                            st.floats(allow_nan=True, allow_infinity=True))


@st.composite
def axis(draw):
    if draw(st.booleans()):
        return draw(st.lists(st.one_of(st.integers(1, 64), st.sampled_from(["fp16", "x", None, 0, -3])),
                             max_size=4))
    rng = {"from": draw(st.sampled_from([1, 10, 0, -5, "x", 1e300])), "to": draw(st.sampled_from([8, 40, 1, 1e12])),
           "steps": draw(st.sampled_from([1, 2, 3, 0, -1, 2.5, 10**9, 10**12, "x", True]))}
    if draw(st.booleans()):
        rng["spacing"] = draw(st.sampled_from(["linear", "log", "cubic"]))
    if draw(st.booleans()):
        rng["integer"] = draw(st.booleans())
    if draw(st.integers(0, 9)) == 0:
        rng["extra"] = 1
    return rng


@st.composite
def studies(draw):
    """A study YAML text: base, overrides, sweeps, seeds, sensitivity, plots and report keys,
    valid and not; sometimes damaged as text (aliases, nesting, duplicate keys)."""
    study: dict = {"name": draw(st.sampled_from(["fuzz"] * 6 + ["fuzz-2", "bad name", "", "../x"]))}
    base_keys = draw(st.lists(st.sampled_from(sorted(RUN_VALUES)), max_size=4, unique=True))
    study["base"] = {"steps": 1, "engine": "analytic", **{k: draw(RUN_VALUES[k]) for k in base_keys}}
    if draw(st.booleans()):
        study["overrides"] = {draw(st.sampled_from(OVERRIDE_PATHS)): draw(OVERRIDE_VALUES)}
    sweep = {}
    grid = draw(st.lists(st.sampled_from(OVERRIDE_PATHS + ["weights", "batch"]), max_size=3, unique=True))
    if grid:
        sweep["grid"] = {path: draw(axis()) for path in grid}
    if draw(st.integers(0, 3)) == 0:
        sweep["zip"] = {"kv": draw(axis()), "batch": draw(axis())}
    if sweep:
        study["sweep"] = sweep
    if draw(st.booleans()):
        study["seeds"] = draw(st.lists(st.integers(-1, 3), min_size=draw(st.sampled_from([1, 1, 1, 0])), max_size=3))
    if draw(st.integers(0, 3)) == 0:
        study["sensitivity"] = {"percent": draw(st.sampled_from([20, 0, 150, "x"])),
                                "knobs": draw(st.lists(st.sampled_from(OVERRIDE_PATHS), max_size=2))}
    if draw(st.integers(0, 3)) == 0:
        study["plots"] = {"detail": {draw(st.sampled_from(grid or ["batch"])): draw(st.integers(1, 8))}}
    if draw(st.integers(0, 4)) == 0:
        study[draw(st.sampled_from(["compare", "focus", "summary_by", "question", "unknown"]))] = draw(ODD)
    text = yaml.safe_dump(study, sort_keys=False)
    damage = draw(st.sampled_from(["none"] * 6 + ["aliases", "nesting", "duplicate", "truncate"]))
    if damage == "aliases":
        text += "bomb: &a [1]\n" + "".join(f"b{i}: &a{i} [*a, *a]\n" for i in range(draw(st.integers(1, 300))))
    elif damage == "nesting":
        text += "deep: " + "[" * draw(st.integers(30, 200)) + "]" * 200 + "\n"
    elif damage == "duplicate":
        text += f"{next(iter(study))}: again\n"
    elif damage == "truncate":
        text = text[: draw(st.integers(0, len(text)))]
    return text


def _check_study(tmp_path_factory, text, run_small):
    folder = tmp_path_factory.mktemp("study")
    path = folder / "study.yaml"
    path.write_text(text)
    code, out, _err = check(["study", str(path), "--check", "--max-points", "24", "--no-progress"])
    if code == 0 and run_small and "1 points" in out:
        check(["study", str(path), "--out", str(folder / "out"), "--jobs", "1", "--no-progress", "--no-report"])


@settings(max_examples=25, **FAST)
@given(text=studies())
def test_generated_studies_fast(tmp_path_factory, text):
    _check_study(tmp_path_factory, text, run_small=False)


@pytest.mark.slow
@settings(max_examples=450, **SLOW)
@given(text=studies(), run_small=st.booleans())
def test_generated_studies(tmp_path_factory, text, run_small):
    _check_study(tmp_path_factory, text, run_small)


# -- command lines ----------------------------------------------------------------------------

def mostly(valid: list, invalid: list):
    """Two draws in three from ``valid``: enough runs get past the parser to exercise the rest."""
    return st.one_of(st.sampled_from(valid), st.sampled_from(valid), st.sampled_from(invalid))


NUMBER_TEXT = mostly(["1", "2", "4", "8", "64"], ["0", "-1", "1e9", "1000000000", "abc", "", "1.5", "nan", "inf",
                                                  "99999999999999999999", "0x10", " 3", "100000"])
REAL_TEXT = mostly(["10", "0.5", "2", "100"], ["0", "-1", "1e9", "nan", "inf", "-inf", "abc", "", "1e-300", "1e300"])
NAMES = {
    "--hardware": (["h200-sxm", "b200", "groq-lpu", "h200-sxm-x8", "tpu-v5e"], ["nope", "", "hardware_profiles",
                                                                              "/dev/null", "pyproject.toml"]),
    "--model": (["llama-3-8b", "llama-3.2-1b", "mixtral-8x7b", "qwen3-30b-a3b"], ["llama-2-7b", "nope", "",
                                                                                "/etc/passwd"]),
    "--kv": (["fp16", "int8", "kivi-2", "int2-asym-outlier"], ["nope", ""]),
    "--weights": (["bf16", "fp8", "int4-g128"], ["nope"]),
    "--engine": (["des", "analytic"], ["magic"]),
    "--software": (["fused", "torch-eager"], ["torch-graph", "nope", "/dev/null"]),
    "--dispatch": (["host_sync", "device", "sram_zero_copy"], ["nope"]),
    "--placement": (["all-hbm", "static", "lru", "spread"], ["nope"]),
    "--routing": (["uniform", "zipf", "workloads/routing/mixtral-zipf1.5-loc0.3-b8.jsonl"], ["nope.jsonl", "x"]),
    "--trace": (["workloads/traces/fixed-b8-c4096.jsonl", "workloads/traces/azure-code-2023-b16.jsonl"],
                ["nope.jsonl", "pyproject.toml", "workloads"]),
}
SET_PATHS = mostly(["hardware.hbm.channel_bandwidth_GBps", "hardware.compute.clock_GHz", "model.layers", "batch",
                    "routing_skew", "seed", "hardware.l2.capacity_MB"],
                   OVERRIDE_PATHS + ["", "model", "hardware.hbm", "steps"])
SET_VALUES = mostly(["1", "2", "30", "{scale: 2}", "{scale: 0.5}"],
                    ["0", "-1", "1e300", "1e-300", "inf", "nan", "x", "", "{scale: x}", "[1, 2]", "true", "null",
                     "{value: 3}", "{{{", "1e9"])
SETS = st.builds(lambda p, v: f"{p}={v}", SET_PATHS, SET_VALUES)


@st.composite
def run_options(draw, steps=("1", "2")):
    """Options of the simulating commands (run, solve): names, numbers as text, --set."""
    argv = ["--steps", draw(mostly(list(steps), ["0", "-1", "x", "10000000"]))]
    for flag in draw(st.lists(st.sampled_from(sorted(NAMES)), max_size=3, unique=True)):
        argv += [flag, draw(mostly(*NAMES[flag]))]
    for flag in draw(st.lists(st.sampled_from(["--batch", "--context", "--tp", "--pp", "--chips"]), max_size=2,
                              unique=True)):
        argv += [flag, draw(NUMBER_TEXT)]
    if draw(st.booleans()):
        argv += ["--target-ms", draw(REAL_TEXT)]
    for item in draw(st.lists(SETS, max_size=2)):
        argv += ["--set", item]
    argv += draw(st.sampled_from([[], ["--no-graph"], ["--graph"], ["--allow-long-context"], ["--json"]]))
    return argv


@st.composite
def command_lines(draw, out_dir: str):
    """(argv, allowed exit statuses) of one subcommand with generated options."""
    command = draw(st.sampled_from(["run", "run", "solve", "trace", "routing", "formats", "fidelity", "study",
                                    "profiles", "plot", "validate", "nope"]))
    outs = [f"{out_dir}/o", f"{out_dir}/file", f"{out_dir}/file/below", "/proc/nope/x", ""]
    if command == "run":
        argv = ["run", *draw(run_options())]
        if draw(st.booleans()):
            argv += [draw(st.sampled_from(["--out", "--trace-out"])), draw(st.sampled_from(outs))]
        return argv, (0, 2)
    if command == "solve":
        argv = ["solve", "--engine", "analytic", "--vary",
                draw(st.sampled_from(["batch", "context", "hardware.hbm.channel_bandwidth_GBps", "model.layers",
                                      "chips", "nope", "hardware.nope", "kv"])),
                *draw(run_options(steps=("1",)))]
        if draw(st.booleans()):
            argv += ["--range", draw(st.sampled_from(["1:64", "0:5", "5:1", "1:1e9", "a:b", "1:inf", "nan:1", "",
                                                      "1:2:3", "1e-300:1e300", "10:10000"]))]
        if draw(st.booleans()):
            argv += ["--rel-tol", draw(REAL_TEXT)]
        return argv, (0, 1, 2)
    if command == "trace":
        argv = ["trace", draw(st.sampled_from(["fixed", "synthetic", "azure", "nope"])),
                "--out", draw(st.sampled_from([f"{out_dir}/t.jsonl", f"{out_dir}/t.csv", f"{out_dir}/t.parquet",
                                               *outs]))]
        for flag in draw(st.lists(st.sampled_from(["--batch", "--context", "--steps", "--requests", "--seed",
                                                   "--prompt-median", "--output-median"]), max_size=3, unique=True)):
            argv += [flag, draw(NUMBER_TEXT)]
        for flag in draw(st.lists(st.sampled_from(["--rate", "--step-ms", "--speedup"]), max_size=2, unique=True)):
            argv += [flag, draw(REAL_TEXT)]
        if "--steps" not in argv:
            argv += ["--steps", "16"]
        if "--requests" not in argv:
            argv += ["--requests", "50"]
        if draw(st.booleans()):
            argv += ["--azure", draw(st.sampled_from(["pyproject.toml", "nope.csv", "workloads"]))]
        return argv, (0, 2)
    if command == "routing":
        argv = ["routing", "--model", draw(st.sampled_from(["mixtral-8x7b", "qwen3-30b-a3b", "llama-3-8b", "nope"])),
                "--batch", draw(st.sampled_from(["1,8", "1", "0", "a,b", "1000000000", "", "64,64"])),
                "--steps", draw(st.sampled_from(["4", "0", "-1", "100000000", "x"])),
                "--seed", draw(st.sampled_from(["0", "-1", "x"]))]
        for flag in draw(st.lists(st.sampled_from(["--skew", "--locality"]), max_size=2, unique=True)):
            argv += [flag, draw(REAL_TEXT)]
        if draw(st.booleans()):
            argv += ["--write", draw(st.sampled_from(outs))]
        return argv, (0, 2)
    if command == "formats":
        argv = ["formats", "--context", draw(NUMBER_TEXT), "--model", draw(mostly(*NAMES["--model"]))]
        argv += draw(st.sampled_from([[], ["--role", "kv"], ["--role", "nope"], ["--json"]]))
        return argv, (0, 2)
    if command == "fidelity":
        argv = ["fidelity", "--kv", draw(st.sampled_from(["fp16", "int8,kivi-2", "nope", "", ","])),
                "--synthetic", "tokens=" + draw(st.sampled_from(["64", "0", "-1", "1e12", "x", "1.5"])),
                "--synthetic", draw(st.sampled_from(["head_dim=64", "head_dim=3", "kv_heads=1", "k_dof=1",
                                                     "rope_theta=nan", "rope_theta=1e300", "nope=1", "queries=0",
                                                     "seed=-1", "kv_heads=100000"]))]
        for flag in draw(st.lists(st.sampled_from(["--seed", "--queries", "--head-dim"]), max_size=2, unique=True)):
            argv += [flag, draw(NUMBER_TEXT)]
        if draw(st.booleans()):
            argv += ["--input", draw(st.sampled_from(["pyproject.toml", "nope.npz", "workloads"]))]
        return argv, (0, 2)
    if command == "study":
        argv = ["study", draw(st.sampled_from(["hbm-bandwidth-what-if", "kv-format-frontier", "nope",
                                               "pyproject.toml", "workloads"])), "--check",
                "--max-points", draw(st.sampled_from(["1000", "10", "0", "-1", "x"]))]
        argv += draw(st.sampled_from([[], ["--jobs", "0"], ["--executor", "dask"], ["--out", outs[2]]]))
        return argv, (0, 2)
    if command == "profiles":
        return ["profiles", *draw(st.sampled_from([[], ["--sources", "h200-sxm"], ["--sources", "nope"]]))], (0, 2)
    if command == "plot":
        return ["plot", draw(st.sampled_from([out_dir, "nope", "pyproject.toml"]))], (0, 2)
    if command == "validate":
        return ["validate", "--csv", draw(st.sampled_from(["pyproject.toml", "nope.csv", "workloads"])),
                "--out", draw(st.sampled_from(outs))], (0, 2)
    return [command, *draw(st.lists(st.sampled_from(["--help-me", "-x", "1"]), max_size=2))], (0, 2)


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    (folder / "file").write_text("")
    return str(folder)


def _check_cli(case, monkeypatch):
    argv, allowed = case
    monkeypatch.chdir(ROOT)  # bundled relative paths (workloads/...) resolve
    check(argv, allowed)


@settings(max_examples=30, **FAST)
@given(data=st.data())
def test_generated_command_lines_fast(out_dir, monkeypatch, data):
    _check_cli(data.draw(command_lines(out_dir)), monkeypatch)


@pytest.mark.slow
@settings(max_examples=800, **SLOW)
@given(data=st.data())
def test_generated_command_lines(out_dir, monkeypatch, data):
    _check_cli(data.draw(command_lines(out_dir)), monkeypatch)
