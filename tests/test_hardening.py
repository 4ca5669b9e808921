"""Hardening (issue 14): every class of bad input is one line naming its source and exit 2;
sizes are refused before work; interrupted studies keep what finished and leave no orphans;
the installed package works from any folder.

One example per class of rejected input (the table below is what the issue's note lists).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from sim.errors import ConfigError
from tests.conftest import ROOT, run_cli

TRACE_STEP = '{"step": %d, "seqs": %s}\n'


def _jsonl(*steps: tuple[int, list]) -> str:
    return "".join(TRACE_STEP % (index, json.dumps(seqs)) for index, seqs in steps)


@pytest.fixture
def files(tmp_path):
    """Bad inputs on disk, by name."""
    made = {
        "text.csv": "step,seq_id,context\n0,1,abc\n",
        "duplicate.jsonl": _jsonl((0, [[1, 5], [1, 6]])),
        "backwards.jsonl": _jsonl((1, [[1, 5]]), (0, [[1, 6]])),
        "shrinks.jsonl": _jsonl((0, [[1, 5]]), (1, [[1, 4]])),
        "jumps.jsonl": _jsonl((0, [[1, 5]]), (1, [[1, 9]])),
        "empty.jsonl": "",
        "afile": "",
        "study-big.yaml": textwrap.dedent("""
            name: big
            sweep:
              grid:
                batch: {from: 1, to: 1000, steps: 1000}
                context: {from: 1, to: 1000, steps: 1000}
                hardware.hbm.channel_bandwidth_GBps: {from: 1, to: 1000, steps: 1000}
            """),
        "model-deep.yaml": "layers: " + "[" * 50 + "]" * 50 + "\n",
        "text.npy": "not numbers\n",
    }
    for name, text in made.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "binary.jsonl").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "adir").mkdir()
    return tmp_path


# (argv with {tmp} for the temp folder, what the one-line error must say)
REJECTED = [
    # traces
    (["run", "--trace", "{tmp}/text.csv"], "text.csv: context (row 2): expected a whole number, got 'abc'"),
    (["run", "--trace", "{tmp}/binary.jsonl"], "binary.jsonl: not a text file"),
    (["run", "--trace", "{tmp}/adir"], "adir: is not a file"),
    (["run", "--trace", "{tmp}/duplicate.jsonl"], "step 0: sequence id 1 appears more than once in one step"),
    (["run", "--trace", "{tmp}/backwards.jsonl"], "steps must increase (step 0 follows step 1)"),
    (["run", "--trace", "{tmp}/shrinks.jsonl"], "step 1.seq 1: context must grow by one token per step"),
    (["run", "--trace", "{tmp}/jumps.jsonl"], "context must grow by one token per step"),
    (["run", "--trace", "{tmp}/empty.jsonl"], "empty.jsonl: trace has no steps"),
    # output places
    (["run", "--steps", "1", "--out", "{tmp}/afile"], "argument --out: {tmp}/afile: exists and is not a folder"),
    (["run", "--steps", "1", "--trace-out", "{tmp}/adir"], "argument --trace-out: {tmp}/adir: is a folder"),
    (["run", "--steps", "1", "--trace-out", "{tmp}/afile/x.json"], "afile is a file, not a folder"),
    (["trace", "fixed", "--out", "{tmp}/adir"], "argument --out: {tmp}/adir: is a folder"),
    (["study", "hbm-bandwidth-what-if", "--out", "{tmp}/afile"], "argument --out: {tmp}/afile: exists and is not"),
    # trace generator flags
    (["trace", "synthetic", "--rate", "0", "--out", "{tmp}/t.jsonl"], "--rate: must be in [1e-6, 1e9], got 0.0"),
    (["trace", "synthetic", "--rate", "-1", "--out", "{tmp}/t.jsonl"], "--rate: must be in [1e-6, 1e9]"),
    (["trace", "fixed", "--steps", "100000000", "--out", "{tmp}/t.jsonl"], "--steps: must be in [1, 1,000,000]"),
    # absurd magnitudes
    (["run", "--set", "hardware.hbm.channel_bandwidth_GBps=1e300"],
     "--set: hardware.hbm.channel_bandwidth_GBps: must be a number in [1e-6, 1e15], got 1e+300"),
    (["run", "--set", "hardware.compute.clock_GHz=1e-300"], "--set: hardware.compute.clock_GHz: must be a number "
                                                             "in [1e-6, 1e15]"),
    (["run", "--set", "hardware.hbm.latency_ns=1e300"], "must be a number in [0, 1e15]"),
    (["run", "--set", "hardware.hbm.stacks=10000000000"], "must be a whole number in [1, 1,000,000,000]"),
    (["run", "--set", "model.layers=100000000000"], "--set: model.layers: must be a whole number in [1, 10,000]"),
    (["run", "--set", "model.hidden=true"], "--set: model.hidden: must be a number, not a boolean"),
    (["run", "--target-ms", "inf"], "target_ms: must be a finite number in (0, 1e6], got inf"),
    # sizes refused before work
    (["run", "--batch", "1000000000"], "batch: must be a whole number in [1, 1,000,000], got 1000000000"),
    (["run", "--batch", "100000", "--steps", "1000"], "batch x steps must be at most 10,000,000"),
    (["solve", "--vary", "batch", "--range", "1:1e9", "--steps", "1"],
     "--range: batch: must be a whole number in [1, 1,000,000] (the range reaches 1e+09)"),
    (["study", "{tmp}/study-big.yaml", "--check"], "the study has 1,000,000,000 points (1000 x 1000 x 1000 x 1 "
                                                   "seeds); at most 100,000 (raise the limit with decodesim study "
                                                   "--max-points N"),
    (["routing", "--batch", "1000000000", "--steps", "2"], "command line: --batch: batch sizes must be at most 1,000,000"),
    (["fidelity", "--kv", "fp16", "--synthetic", "tokens=1e12"], "must be at most 50,000,000"),
    # context beyond the model
    (["run", "--model", "llama-2-7b"], "decodesim: command line: context: the last step (context 4,096 + 7 steps) "
                                       "holds 4,103 tokens, beyond llama-2-7b's max_context of 4,096; pass "
                                       "--allow-long-context"),
    # parallelism that does not divide the chips, said against the option that asked it
    (["run", "--hardware", "h200-sxm-x8", "--tp", "3"], "decodesim: command line: tp: tp x pp must equal the "
                                                        "chip count 8, got '3 x 2'"),
    # a name that is not bundled, said against the command line and the option that gave it
    (["run", "--kv", "nosuch"], "decodesim: command line: kv: unknown format 'nosuch'; expected a path or one of: bf16"),
    (["run", "--weights", "nosuch"], "decodesim: command line: weights: unknown format 'nosuch'"),
    (["run", "--software", "nosuch"], "decodesim: command line: software: unknown software stack 'nosuch'"),
    (["compare", "--hardware", "nosuch"], "decodesim: command line: hardware: unknown hardware 'nosuch'"),
    # comma lists: an empty item is an error, not dropped (one parser for every command)
    (["fidelity", "--kv", "int8,,fp16"], "decodesim: command line: --kv: item 2 of the comma list is empty"),
    (["routing", "--batch", "1,,8"], "decodesim: command line: --batch: item 2 of the comma list is empty"),
    (["compare", "--kernels", ""], "decodesim: command line: --kernels: expected one or more comma-separated stacks"),
    (["serve", "--rates", "1,2", "--jobs", "0"], "argument --jobs: expected a number of worker processes >= 1"),
    (["routing", "--write", "{tmp}/r.csv"], "command line: --write: a routing file is JSON Lines"),
    (["routing", "--skew", "2"], "command line: --skew: applies only to --routing zipf"),
    (["fidelity", "--kv", "int8", "--v", "{tmp}/text.npy"], "command line: --v: applies only with --input"),
    (["routing", "--routing", "zipf", "--skew", "1e9"], "command line: --skew: must be a Zipf exponent in [0, 100]"),
    # a run field given twice (its option and --set) is refused: one of the two would be dropped
    (["run", "--set", "batch=4", "--batch", "2"], "decodesim: command line: --set: batch is also given as --batch"),
    # an option the trace overrides is refused, not ignored
    (["run", "--trace", "workloads/traces/fixed-b8-c4096.jsonl", "--batch", "4"],
     "decodesim: command line: --batch: does not apply with --trace: the trace gives every step's batch and contexts"),
    # a folder where a file is expected; routing names that include the generated ones
    (["run", "--hardware", "{tmp}/adir"], "adir: is a folder; expected a hardware file"),
    (["run", "--model", "mixtral-8x7b", "--routing", "nosuch", "--steps", "1"],
     "unknown routing 'nosuch'; expected a path or one of: uniform, zipf, mixtral-zipf1.5-loc0.3-b8"),
    # numpy's own message suggests unpickling: not repeated
    (["fidelity", "--kv", "int8", "--input", "{tmp}/text.npy"], "text.npy: not a numpy .npy/.npz file of numbers"),
    # a format made for the other role (its file's role:)
    (["run", "--weights", "kivi-2"], "decodesim: command line: weights: format 'kivi-2' is a KV-cache format "
                                     "(role: kv); expected a weight format: bf16"),
    (["compare", "--kv", "int4-g128,fp16"], "decodesim: command line: kv: format 'int4-g128' is a weight format "
                                            "(role: weights); expected a KV-cache format: bf16"),
    # nesting (the loader's limit) in a model file
    (["run", "--model", "{tmp}/model-deep.yaml"], "nested deeper than 40 levels"),
]


@pytest.mark.parametrize("argv, expect", REJECTED, ids=[" ".join(a)[:60] for a, _ in REJECTED])
def test_each_class_of_bad_input_is_one_line(files, argv, expect):
    argv = [a.replace("{tmp}", str(files)) for a in argv]
    start = time.process_time()  # work, not wall time (a loaded machine stretches wall time)
    code, _out, err = run_cli(*argv)
    assert time.process_time() - start < 5
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert expect.replace("{tmp}", str(files)) in err, err


def test_accepted_after_the_override(files):
    code, out, err = run_cli("run", "--model", "llama-2-7b", "--allow-long-context", "--steps", "2",
                             "--engine", "analytic")
    assert code == 0, err


def test_no_temp_file_is_left_when_the_output_cannot_be_written(files):
    from sim.io import write_atomic

    with pytest.raises(ConfigError, match="is a folder"):
        write_atomic(files / "adir", "x")
    with pytest.raises(ConfigError, match="not a folder"):
        write_atomic(files / "afile" / "x.json", "x")
    assert not [p for p in files.iterdir() if p.name.endswith(".tmp")]
    assert not list((files / "adir").iterdir())


def test_an_unreadable_trace_file_is_one_line(files, monkeypatch):
    import sim.decode_trace
    import sim.io

    def refuse(*_args, **_kwargs):
        raise PermissionError(13, "Permission denied")

    path = files / "duplicate.jsonl"
    monkeypatch.setattr(sim.io, "open", refuse, raising=False)  # tests run as root: chmod would not stop them
    with pytest.raises(ConfigError, match=r"duplicate.jsonl: cannot read file \(Permission denied\)$"):
        sim.decode_trace.read(path)


def test_python_api_errors_are_one_line_config_errors():
    import sim

    for fields, expect in (({"batch": -1}, "simulate(): batch: must be a whole number in [1, 1,000,000], got -1"),
                           ({"bogus": 1}, "simulate(): bogus: unknown key; allowed keys:"),
                           ({"overrides": [5]}, "simulate(): overrides: each override must be"),
                           ({"target_ms": float("nan")}, "target_ms: must be a finite number")):
        with pytest.raises(ConfigError) as info:
            sim.simulate(**fields)
        text = str(info.value)
        assert expect in text and "\n" not in text and "https://" not in text
    with pytest.raises(ConfigError, match=r"^spec: steps: must be a whole number in \[1, 1,000,000\], got 0$"):
        sim.simulate({"steps": 0})


def test_a_huge_moe_batch_that_cannot_fit_answers_at_once():
    import sim

    start = time.process_time()  # work, not wall time (a loaded machine stretches wall time)
    summary = sim.simulate(model="deepseek-v3", chips=8, batch=1_000_000, steps=8, engine="analytic").summary
    assert summary["verdict"] == "does-not-fit"
    assert time.process_time() - start < 5


# -- interrupts -------------------------------------------------------------------------------

SLOW_STUDY = """
name: slow
base: {model: mixtral-8x7b, steps: 10, context: 1024, engine: des}
sweep:
  grid:
    batch: [1, 2, 3, 4, 5, 6, 7, 8]
"""


def _children(pid: int) -> list[int]:
    kids = []
    for task in glob.glob(f"/proc/{pid}/task/*/children"):
        with open(task) as handle:
            kids += [int(x) for x in handle.read().split()]
    return kids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the worker processes")
@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_killed_study_keeps_what_finished_leaves_no_orphans_and_resumes(tmp_path, how):
    study = tmp_path / "slow.yaml"
    study.write_text(SLOW_STUDY)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "sim", "study", str(study), "--out", str(out), "--jobs", "2",
                             "--no-progress", "--no-report"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(out.glob("cache/*.json"))) < 2:
        time.sleep(0.02)
    workers = _children(proc.pid)
    assert len(workers) == 2, "two local workers should be computing"
    if how == "SIGINT":
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
    else:
        os.kill(proc.pid, signal.SIGKILL)
    _stdout, stderr = proc.communicate(timeout=120)  # a hang bound, not a speed bound
    if how == "SIGINT":
        assert proc.returncode == 130, (proc.returncode, stderr)
        assert "finished and are cached" in stderr and "Traceback" not in stderr, stderr
    wait_until = time.monotonic() + 60  # a hang bound: orphans would live on forever
    while time.monotonic() < wait_until and any(_alive(w) for w in workers):
        time.sleep(0.05)
    assert not [w for w in workers if _alive(w)], "workers outlived the study"
    finished = {p.name: p.stat().st_mtime_ns for p in out.glob("cache/*.json")}
    assert 2 <= len(finished) < 8, "the kill should land mid-study"
    for path in out.glob("cache/*.json"):
        assert json.loads(path.read_text())["result"]["status"] == "ok"
    stale = [out / "cache" / ".dead.json.abcd1234.tmp", out / ".results.csv.k2j3x9a1.tmp", out / "cache" / ".old.j5n2x1qa"]
    for path in stale:
        path.write_text("")
    truncated = sorted(finished)[0]  # as an older, non-atomic writer could leave it: recomputed, not a traceback
    (out / "cache" / truncated).write_text("")
    del finished[truncated]
    code, printed, err = run_cli("study", str(study), "--out", str(out), "--jobs", "2", "--no-progress",
                                 "--no-report")
    assert code == 0, err
    assert f"{8 - len(finished)} simulated, {len(finished)} cached, 0 failed" in printed
    assert not [p for p in stale if p.exists()], "stale temp files were not removed"
    for name, mtime in finished.items():
        assert (out / "cache" / name).stat().st_mtime_ns == mtime


def test_a_second_study_on_the_same_folder_is_refused(tmp_path):
    from sim.study.runner import folder_lock

    (tmp_path / "out").mkdir()
    with folder_lock(tmp_path / "out"):
        code, _o, err = run_cli("study", "hbm-bandwidth-what-if", "--out", str(tmp_path / "out"), "--no-progress")
    assert code == 2 and "another decodesim study is writing to this folder" in err


# -- installed use ------------------------------------------------------------------------------


def test_installed_package_works_from_any_folder(tmp_path):
    """``pip install`` into a folder, then run from another folder: validate, a run, a study check."""
    pip = shutil.which("pip") or None
    if pip is None:
        pytest.skip("pip not available")
    target = tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--quiet",
                            "--target", str(target), str(ROOT)], capture_output=True, text=True, timeout=300,
                           cwd=tmp_path)
    if build.returncode != 0 and ("Could not find a version" in build.stderr or "No matching distribution"
                                  in build.stderr):
        pytest.skip("no package index for the build backend: " + build.stderr.strip().splitlines()[-1])
    assert build.returncode == 0, build.stderr
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)

    def sim(*argv):
        return subprocess.run([sys.executable, "-m", "sim", *argv], capture_output=True, text=True, cwd=away,
                              env=env, timeout=120)

    where = sim("--help")
    assert where.returncode == 0
    located = subprocess.run([sys.executable, "-c", "import sim; print(sim.__file__)"], capture_output=True,
                             text=True, cwd=away, env=env)
    assert located.stdout.strip().startswith(str(target)), located.stdout
    done = sim("validate")
    assert done.returncode == 0, done.stderr
    assert (away / "reports" / "validation.md").is_file()
    assert sim("validate", "--help").returncode == 0
    ran = sim("run", "--steps", "1", "--engine", "analytic", "--software", "torch-eager")
    assert ran.returncode == 0, ran.stderr
    checked = sim("study", "hbm-bandwidth-what-if", "--check")
    assert checked.returncode == 0, checked.stderr
    bad = sim("run", "--steps", "1", "--set", "model.hidden=-1")
    assert bad.returncode == 2 and bad.stderr.startswith("decodesim: --set: model.hidden:"), bad.stderr
    assert "site-packages" not in bad.stderr and str(target) not in bad.stderr
