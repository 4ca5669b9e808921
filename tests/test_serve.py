"""Serving replay (sim.serve): token accounting, Little's law, KV capacity, format monotonicity,
determinism, the step model's exact memo, and bad inputs."""

from __future__ import annotations

import json
import random
import re

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.analytic import analyse
from sim.costs import CostModel
from sim.errors import ConfigError, SimulationError
from sim.formats import get_format
from sim.lowering.decode import lower_step
from sim.run import RunSpec, resolve
from sim.serve.metrics import crossing_rate
from sim.serve.replay import replay, serve
from sim.serve.requests import Request, open_source
from sim.serve.scheduler import KVPool, Scheduler
from sim.serve.spec import ServeSpec, build
from sim.serve.stepmodel import SimulatorStepModel, serve_resolved
from sim.serve.sweep import load_study, study_points

LLAMA8_WIDTH, LLAMA8_LAYERS = 1024, 32  # K and V row width (8 KV heads x 128) and layers of llama-3-8b


class FakeStepModel:
    """A step takes a fixed time plus a cost per decode row and per prefill token."""

    def __init__(self, base_ns=4e6, per_decode_ns=2e4, per_prefill_ns=5e3):
        self.base_ns, self.per_decode_ns, self.per_prefill_ns = base_ns, per_decode_ns, per_prefill_ns

    def step_ns(self, decode_contexts, prefill=()):
        return self.base_ns + self.per_decode_ns * len(decode_contexts) + self.per_prefill_ns * sum(
            c for c, _ in prefill)


class Recorder(FakeStepModel):
    """A fake step model that keeps every step it was asked about."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def step_ns(self, decode_contexts, prefill=()):
        self.seen.append((decode_contexts, prefill))
        return super().step_ns(decode_contexts, prefill)


def footprint(fmt: str):
    kv = get_format(fmt)
    return lambda tokens: kv.kv_footprint(tokens, LLAMA8_WIDTH, LLAMA8_WIDTH) * LLAMA8_LAYERS


def synthetic(rate=40.0, duration_s=6.0, seed=1, prompt=300, output=40):
    return list(open_source("synthetic", rate_per_s=rate, duration_s=duration_s, seed=seed, prompt_median=prompt,
                            output_median=output))


class CheckedScheduler(Scheduler):
    """Checks, after every step, the pool's bookkeeping and that each request samples each of
    its output tokens exactly once."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sampled: dict[int, int] = {}
        self.outputs: dict[int, int] = {}
        self.peak_running = 0
        self.batches: list[int] = []

    def schedule(self, now_ns):
        step = super().schedule(now_ns)
        pool = self.pool
        assert pool.used_bytes <= pool.capacity_bytes
        assert pool.used_bytes == sum(s.charge_bytes for s in self.running)
        assert pool.used_blocks == sum(s.blocks for s in self.running)
        assert all(s.blocks == 0 for s in self.waiting)
        assert len(self.running) <= self.max_batch
        self.peak_running = max(self.peak_running, len(self.running))
        self.batches.append(len(step.work))
        return step

    def complete(self, step, end_ns):
        before = {id(s): s.generated for s, _ in step.work}
        sampled, finished = super().complete(step, end_ns)
        for seq, _ in step.work:
            new = seq.generated - before[id(seq)]
            assert new in (0, 1)
            self.sampled[seq.rid] = self.sampled.get(seq.rid, 0) + new
            self.outputs[seq.rid] = seq.output
        return sampled, finished


def run_fake(requests, fmt="fp16", capacity_bytes=2e9, policy="chunked", max_batch=64, budget=512, model=None,
             out_dir=None):
    scheduler = CheckedScheduler(KVPool(int(capacity_bytes), 16, footprint(fmt)), max_batch=max_batch,
                                 max_tokens_per_step=budget, policy=policy)
    summary = replay(requests, model or FakeStepModel(), scheduler, out_dir=out_dir)
    return summary, scheduler


# -- token accounting, memory, Little's law ---------------------------------------------------


@pytest.mark.parametrize("policy", ["chunked", "separate"])
def test_every_output_token_is_sampled_exactly_once_even_with_preemption(policy, tmp_path):
    requests = synthetic(rate=60, duration_s=5)
    # a pool of ~100k tokens of fp16 llama-3-8b KV (128 KiB/token), far less than the load wants
    summary, scheduler = run_fake(requests, capacity_bytes=8e8, policy=policy, out_dir=tmp_path)
    assert summary["requests_done"] == len(requests) and summary["requests_rejected"] == 0
    assert summary["preemptions"] > 0 and summary["recomputed_tokens"] > 0  # the policy was exercised
    assert scheduler.sampled == scheduler.outputs == {r.rid: r.output_tokens for r in requests}
    assert summary["sampled_tokens"] == summary["output_tokens"] == sum(r.output_tokens for r in requests)
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    table = pd.read_parquet(tmp_path / "requests.parquet")
    assert steps["sampled_tokens"].sum() == summary["output_tokens"]
    assert (steps["kv_bytes"] <= scheduler.pool.capacity_bytes).all()
    assert set(table["status"]) == {"done"} and len(table) == len(requests)
    assert (table["first_token_s"] >= table["arrival_s"]).all() and (table["finish_s"] >= table["first_token_s"]).all()


def test_tokens_computed_are_prompts_outputs_and_recomputation(tmp_path):
    """Each request caches P + O - 1 tokens once (its last token is never cached), plus what
    preemption made it recompute; decode rows and prefill tokens together are exactly that."""
    requests = synthetic(rate=60, duration_s=5)
    summary, _ = run_fake(requests, capacity_bytes=8e8, out_dir=tmp_path)
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert summary["recomputed_tokens"] > 0
    assert steps["prefill_tokens"].sum() + steps["decode_seqs"].sum() == sum(
        r.prompt_tokens + r.output_tokens - 1 for r in requests) + summary["recomputed_tokens"]


def test_chunked_prefill_respects_the_token_budget_and_separate_never_mixes():
    requests = [Request(i, 0.01 * i, 3000 if i % 3 == 0 else 50, 20) for i in range(30)]
    for policy in ("chunked", "separate"):
        recorder = Recorder()
        run_fake(requests, policy=policy, budget=512, model=recorder)
        seen = recorder.seen
        if policy == "chunked":
            assert all(len(d) + sum(c for c, _ in p) <= 512 for d, p in seen)
            assert any(p and p[0][1] > 0 for _, p in seen)  # a long prompt was chunked
        else:
            assert all(not (d and p) for d, p in seen)  # prefill and decode in separate steps
            assert any(sum(c for c, _ in p) == 3000 for _, p in seen)  # whole prompts


def test_littles_law_on_a_synthetic_replay():
    requests = synthetic(rate=30, duration_s=40, prompt=200, output=60)
    summary, _ = run_fake(requests)
    little = summary["throughput_req_per_s"] * summary["mean_e2e_s"]
    assert summary["mean_in_system"] == pytest.approx(little, rel=0.02)
    assert summary["mean_batch"] > 1


def test_admission_never_exceeds_kv_capacity_with_the_simulator(tmp_path):
    spec = ServeSpec(requests="synthetic", rate=30, duration_s=3, prompt_median=400, output_median=30,
                     overrides=("hardware.hbm.capacity_GB=17.7",))
    setup = build(spec)
    assert 0 < setup.kv_pool_bytes < 2.5e8  # ~1,700 tokens of fp16 KV: memory binds
    summary = serve(setup, tmp_path)
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert (steps["kv_bytes"] <= setup.kv_pool_bytes).all() and steps["kv_occupancy"].max() <= 1.0
    assert summary["max_kv_occupancy"] > 0.8 and summary["requests_done"] + summary["requests_rejected"] > 0


SMALLER = [("fp16", "int8"), ("fp16", "kivi-4"), ("kivi-4", "kivi-2"), ("fp16", "kivi-2"),
           ("fp16", "int2-asym-outlier")]  # each second format holds no more bytes at any block boundary


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=st.sampled_from(SMALLER), rate=st.sampled_from([200.0, 1000.0, 10_000.0]), seed=st.integers(0, 50))
def test_a_smaller_kv_format_never_admits_fewer_sequences(pair, rate, seed):
    """Under the same arrivals and the same step times, a format that charges no more bytes
    per block never holds fewer sequences. The arrivals saturate the pool (a backlog from the
    start): at light load the number in the system also depends on congestion history (a
    format that preempts builds a backlog that can briefly raise its own peak), which is not
    a capacity effect."""
    larger, smaller = pair
    f_large, f_small = footprint(larger), footprint(smaller)
    assert all(f_small(16 * k) <= f_large(16 * k) for k in (1, 2, 8, 9, 63, 256, 1024))
    requests = synthetic(rate=rate, duration_s=300 / rate, seed=seed, prompt=500, output=50)
    model = FakeStepModel(per_decode_ns=0, per_prefill_ns=0)  # the same steps whatever the format
    big, sched_big = run_fake(requests, fmt=larger, capacity_bytes=6e8, model=model, max_batch=256)
    small, sched_small = run_fake(requests, fmt=smaller, capacity_bytes=6e8, model=model, max_batch=256)
    assert sched_small.peak_running >= sched_big.peak_running
    assert small["max_batch_seen"] >= big["max_batch_seen"]
    assert small["mean_batch"] >= big["mean_batch"] - 1e-9
    assert small["mean_batch_per_step"] >= big["mean_batch_per_step"] - 1e-9
    assert small["steps"] <= big["steps"]


def test_kv_formats_change_how_many_sequences_fit():
    fp16, kivi = build(ServeSpec(kv="fp16")), build(ServeSpec(kv="kivi-2"))
    assert fp16.kv_pool_bytes == kivi.kv_pool_bytes
    assert kivi.describe()["kv_pool_tokens"] > 4.5 * fp16.describe()["kv_pool_tokens"]


# -- determinism ----------------------------------------------------------------------------


def test_same_seed_same_results(tmp_path):
    spec = ServeSpec(requests="synthetic", rate=25, duration_s=4, prompt_median=300, output_median=40, seed=7)
    first, second = serve(spec, tmp_path / "a"), serve(spec, tmp_path / "b")
    for summary in (first, second):
        summary.pop("wall_s")
    assert first == second
    for name in ("steps.parquet", "requests.parquet"):
        assert pd.read_parquet(tmp_path / "a" / name).equals(pd.read_parquet(tmp_path / "b" / name))
    other = serve(spec.model_copy(update={"seed": 8}))
    assert other["requests_done"] != first["requests_done"] or other["tpot_ms_p99"] != first["tpot_ms_p99"]


# -- the step model -------------------------------------------------------------------------


def direct_step_ns(spec: RunSpec, contexts) -> float:
    """A decode step as sim.run evaluates it: a fresh lowering, costs and analytic model."""
    res = resolve(spec)
    graph = lower_step(res, tuple(contexts))
    costs = CostModel(res.hardware, res.stack)
    return analyse(graph, [costs.cost(op.work) for op in graph.ops], costs.host, res.graph).time_ns


@pytest.mark.parametrize("kv", ["fp16", "int8", "kivi-2", "int2-asym-outlier"])
def test_memoized_step_times_equal_direct_lowering(kv):
    spec = RunSpec(kv=kv, engine="analytic")
    model = SimulatorStepModel(serve_resolved(spec), check_every=10**9)  # no self-checks: compare here
    exact = SimulatorStepModel(serve_resolved(spec), exact=True)
    rng = random.Random(kv)
    for _ in range(25):  # decode-only steps against sim.run's own path
        contexts = tuple(rng.randint(1, 5000) for _ in range(rng.choice([1, 2, 3, 3, 5])))
        assert model.step_ns(contexts) == pytest.approx(direct_step_ns(spec, contexts), rel=1e-9)
    for _ in range(25):  # mixed steps against the full (stand-in) lowering
        contexts = tuple(rng.randint(1, 5000) for _ in range(rng.choice([0, 1, 3])))
        prefill = tuple((rng.randint(1, 400), rng.randint(0, 3000)) for _ in range(rng.choice([1, 2])))
        assert model.step_ns(contexts, prefill) == pytest.approx(exact.step_ns(contexts, prefill), rel=1e-9)
    assert model.fallback_reason is None and not model.exact
    assert model.stats["exact_evaluations"] < model.stats["steps"]  # the memo did work


def test_fp16_decode_time_depends_only_on_batch_and_total_context():
    """With fp16 KV and every context >= 256 tokens, the attention cost is linear in the total
    context, so (batch, total context) is an exact key (checked on the direct lowering)."""
    spec = RunSpec(kv="fp16", engine="analytic")
    a, b = (1000, 3000, 2000), (2000, 2000, 2000)
    assert direct_step_ns(spec, a) == pytest.approx(direct_step_ns(spec, b), rel=1e-12)
    c = (100, 5900, 2000)  # a context below 256 tokens breaks the linearity (one KV split minimum)
    assert direct_step_ns(spec, c) != pytest.approx(direct_step_ns(spec, b), rel=1e-12)


def test_step_model_falls_back_to_exact_when_the_step_is_not_a_chain():
    spec = RunSpec(engine="analytic", software="torch-eager")  # launch-bound: not a sum of ops
    model = SimulatorStepModel(serve_resolved(spec))
    for contexts in ((100,), (100, 200), (300, 400, 500)):
        assert model.step_ns(contexts) == pytest.approx(direct_step_ns(spec, contexts), rel=1e-9) or model.exact
    assert model.exact and model.fallback_reason


def test_prefill_costs_more_than_decode_and_grows_with_the_chunk():
    model = SimulatorStepModel(serve_resolved(RunSpec(engine="analytic")))
    decode = model.step_ns((2000,) * 8)
    small, large = model.step_ns((2000,) * 8, ((128, 0),)), model.step_ns((2000,) * 8, ((2048, 0),))
    assert decode < small < large
    assert model.step_ns((), ((1024, 4096),)) > model.step_ns((), ((1024, 0),))  # attention over the cache


# -- sources, metrics, CLI, bad inputs ----------------------------------------------------------


def test_azure_sources_are_full_length_and_rate_scaling_compresses_time():
    conv, code = open_source("azure-conv"), open_source("azure-code")
    assert sum(1 for _ in conv) == 19366 and sum(1 for _ in code) == 8819
    fast = open_source("azure-conv", rate_scale=4)
    first = [r.arrival_s for _, r in zip(range(50), conv, strict=False)]
    quick = [r.arrival_s for _, r in zip(range(50), fast, strict=False)]
    assert quick == pytest.approx([t / 4 for t in first])
    assert open_source("azure-conv", rate_per_s=11.06).rate_scale == pytest.approx(2.0, rel=1e-3)
    assert sum(1 for _ in open_source("azure-conv", duration_s=60)) < 19366


def test_request_files(tmp_path):
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text("\n".join(json.dumps({"arrival_s": t, "prompt_tokens": 100, "output_tokens": 5})
                               for t in (0.5, 0.7, 0.9)) + "\n")
    got = list(open_source(str(jsonl)))
    assert [r.arrival_s for r in got] == pytest.approx([0.0, 0.2, 0.4])  # relative to the first
    csv = tmp_path / "r.csv"
    pd.DataFrame({"arrival_s": [0, 1], "prompt_tokens": [10, 20], "output_tokens": [3, 4]}).to_csv(csv, index=False)
    assert [r.prompt_tokens for r in open_source(str(csv))] == [10, 20]


@pytest.mark.parametrize("content, expect", [
    ("{bad json\n", "line 1: invalid JSON"),
    ('{"arrival_s": 0}\n', "line 1: expected"),
    ('{"arrival_s": 0, "prompt_tokens": 0, "output_tokens": 5}\n', "prompt_tokens (row 1): token counts must be whole"),
    ('{"arrival_s": -1, "prompt_tokens": 3, "output_tokens": 5}\n', "arrival times must be seconds in [0,"),
    ('{"arrival_s": 0, "prompt_tokens": 2.5, "output_tokens": 5}\n', "whole numbers in [1, 10,000,000]"),
    ('{"arrival_s": 0, "prompt_tokens": 1e10, "output_tokens": 5}\n', "whole numbers in [1, 10,000,000]"),
    ('{"arrival_s": 1e-320, "prompt_tokens": 3, "output_tokens": 5}\n', "arrival times must be seconds"),
    ('{"arrival_s": 2, "prompt_tokens": 3, "output_tokens": 5}\n{"arrival_s": 1, "prompt_tokens": 3, '
     '"output_tokens": 5}\n', "arrival_s (row 2): arrivals must be in non-decreasing order"),
])
def test_bad_request_files(tmp_path, content, expect):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError, match=re.escape(expect)):
        open_source(str(path))


@pytest.mark.parametrize("kwargs, expect", [
    ({"requests": "nope.jsonl"}, "request source not found"),
    ({"requests": "synthetic", "rate_scale": 2.0}, "scales a recorded trace"),
    ({"requests": "azure-conv", "rate_scale": 2.0, "rate_per_s": 3.0}, "at most one"),
    ({"requests": "azure-conv", "rate_scale": -1.0}, "must be a finite number > 0"),
])
def test_bad_sources(kwargs, expect):
    with pytest.raises(ConfigError, match=expect):
        open_source(**kwargs)


def test_a_setup_without_memory_for_kv_says_what_holds_the_memory():
    """A verdict about the machine (SimulationError; a sweep's row says does-not-fit), naming the
    tier, what already fills it and the knob that sizes the activations."""
    with pytest.raises(SimulationError) as err:
        build(ServeSpec(model="llama-3-70b"))
    text = str(err.value)
    assert text.startswith("no memory is left for the KV cache: hbm holds 141.00 GB per chip and weights ")
    assert "(llama-3-70b on h200-sxm, tp 1 x pp 1)" in text and "--max-tokens-per-step" in text
    with pytest.raises(ConfigError, match="no memory is left for the KV cache"):  # the pool's own guard
        KVPool(0, 16, lambda tokens: tokens)


def test_crossing_rate():
    assert crossing_rate([1, 2, 4], [5, 8, 12], 10) == {"kind": "between", "low": 2, "high": 4, "rate": 3.0}
    assert crossing_rate([1, 2], [11, 12], 10)["kind"] == "below"
    assert crossing_rate([1, 2], [5, 6], 10)["kind"] == "above"


def test_cli_one_replay_and_a_sweep(cli, tmp_path):
    code, out, err = cli("serve", "--requests", "synthetic", "--rate", "20", "--duration-s", "3",
                         "--prompt-median", "200", "--output-median", "20", "--out", str(tmp_path / "one"))
    assert code == 0, err
    assert "TPOT" in out and "verdict:" in out
    for name in ("steps.parquet", "requests.parquet", "summary.json", "over-time.png"):
        assert (tmp_path / "one" / name).is_file()
    code, out, err = cli("serve", "--requests", "synthetic", "--rates", "10,40", "--kv", "fp16,kivi-2",
                         "--duration-s", "2", "--prompt-median", "200", "--output-median", "20", "--jobs", "1",
                         "--json", "--out", str(tmp_path / "sweep"))
    assert code == 0, err
    data = json.loads(out)
    assert data["kind"] == "serve" and data["mode"] == "sweep" and data["schema_version"]
    rows = data["rows"]
    assert len(rows) == 4 and {r["kv"] for r in rows} == {"fp16", "kivi-2"}
    for name in ("table.csv", "table.parquet", "latency-vs-rate.png", "report.md"):
        assert (tmp_path / "sweep" / name).is_file()
    assert "crosses 10 ms" in (tmp_path / "sweep" / "report.md").read_text()


@pytest.mark.parametrize("argv, expect", [
    (["--kv", "nope"], "unknown format"),
    (["--rates", "1,x"], "--rates: item 2: expected a comma list of numbers"),
    (["--rates", "1,,2"], "--rates: item 2 of the comma list is empty"),
    (["--seed", "-1"], "seed: must be a whole number in [0,"),
    (["--duration-s", "1e12"], "duration_s: must be a finite number in (0, 604800]"),
    (["--rate", "1e9", "--duration-s", "5"], "rate: must be a finite number in (0, 10000]"),
    (["--requests", "synthetic", "--rate", "1000", "--duration-s", "3000"], "expected at most 1,000,000 per replay"),
    (["--duration-s", "1_000"], "expected a plain decimal number"),
    (["--kv", "fp16,,int8"], "--kv: item 2 of the comma list is empty"),
    (["--requests", "synthetic", "--rate-scale", "2"], "scales a recorded trace"),
    (["--max-batch", "0"], "max_batch"),
    (["--policy", "fifo"], "invalid choice"),
    (["--study", "hbm-bandwidth-what-if"], "kind: a serving study starts with `kind: serve`"),
    # an option that would change nothing is refused, not ignored
    (["--study", "serving-rate-vs-kv", "--rate", "5"], "command line: --rate: does not apply with --study"),
    (["--rate", "2", "--replot"], "command line: --replot: does not apply for one replay"),
    # a request source that is not there is said against the option that named it
    (["--requests", "no-such-source"], "command line: --requests: request source not found"),
    (["--requests", "no-such-source", "--rates", "1,2"], "command line: --requests: request source not found"),
])
def test_cli_bad_input_is_one_line_and_exit_2(cli, argv, expect):
    code, out, err = cli("serve", *argv)
    assert code == 2 and expect in err and len(err.strip().splitlines()) == 1


STUDY_WITH = """kind: serve
name: bad-name
hardware: [{hardware}]
models: [{{model: llama-3-8b, weights: {weights}}}]
kv: [fp16, {kv}]
rates: [1, 2]
base: {{requests: {requests}, duration_s: 5{base}}}
"""


@pytest.mark.parametrize("fields, expect", [
    ({"kv": "nosuch"}, ": kv: unknown format 'nosuch'"),
    ({"weights": "nosuch"}, ": models: unknown format 'nosuch'"),
    ({"hardware": "nosuch"}, ": hardware: unknown hardware 'nosuch'"),
    ({"base": ", software: nosuch"}, ": base.software: unknown software stack 'nosuch'"),
    ({"hardware": "h200-sxm-x8", "base": ", tp: 3"}, ": base.tp: tp x pp must equal the chip count 8"),
    ({"requests": "no-such-source"}, ": base.requests: request source not found"),
])
def test_a_serving_study_with_a_bad_setup_is_one_error_before_any_replay(cli, tmp_path, fields, expect):
    """A name that is not there is bad input (exit 2, the file and the study key), not an error
    row after the other points ran; nothing is written."""
    values = {"hardware": "h200-sxm", "weights": "bf16", "kv": "int8", "base": "", "requests": "synthetic", **fields}
    study = tmp_path / "study.yaml"
    study.write_text(STUDY_WITH.format(**values))
    code, out, err = cli("serve", "--study", str(study), "--out", str(tmp_path / "out"), "--no-progress")
    assert code == 2 and err.startswith(f"decodesim: {study}{expect}") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists() and out == ""


def test_a_sweep_with_an_unknown_name_is_one_error_on_the_command_line(cli, tmp_path):
    code, _out, err = cli("serve", "--kv", "fp16,nosuch", "--rates", "1,2", "--requests", "synthetic",
                          "--duration-s", "5", "--out", str(tmp_path / "out"))
    assert code == 2 and err.startswith("decodesim: command line: kv: unknown format 'nosuch'")
    assert not (tmp_path / "out").exists()


def test_an_output_folder_that_cannot_be_made_is_refused_before_any_replay(cli, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, out, err = cli("serve", "--rates", "1,2", "--requests", "synthetic", "--duration-s", "5",
                         "--out", str(blocker / "sweep"))
    # refused when the options are read: no replay ran (each prints its line)
    assert code == 2 and f"cannot be created: {blocker} is a file, not a folder" in err and out == ""


def test_a_kv_block_larger_than_the_pool_is_refused(cli):
    code, out, err = cli("serve", "--requests", "synthetic", "--duration-s", "2", "--block-tokens", "1000000")
    assert code == 2 and out == "" and err.startswith("decodesim: command line: block_tokens: one KV block of "
                                                      "1,000,000 tokens takes ")


@pytest.mark.parametrize("rows, expect", [
    ("0,200000,10\n1,200000,10\n", "verdict: NO RESULT: none of the 2 requests finished (2 rejected"),
    ("0,100,10\n", "1 arrived (one arrival: no rate), 1 done"),
])
def test_a_replay_without_a_latency_or_a_rate_says_so_instead_of_printing_nan(cli, tmp_path, rows, expect):
    """No request finished (each alone overflows the pool), or one arrival (no rate)."""
    requests = tmp_path / "r.csv"
    requests.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    code, out, err = cli("serve", "--requests", str(requests))
    assert code == 0, err
    assert expect in out and "nan" not in out


def test_bundled_serving_study_resolves():
    study, path = load_study("serving-rate-vs-kv")
    points = study_points(study, path)
    assert {p.kv for p in points} >= {"fp16", "int8", "kivi-2"} and {p.hardware for p in points} >= {"h200-sxm"}


def test_decodesim_study_points_a_serving_study_to_serve(cli):
    """The other half of the pair above: `decodesim study` on a `kind: serve` file says which
    command runs it, in one line (it used to complain about a serving key)."""
    code, _out, err = cli("study", "serving-rate-vs-kv", "--check")
    assert code == 2 and "decodesim serve --study serving-rate-vs-kv" in err and len(err.strip().splitlines()) == 1
