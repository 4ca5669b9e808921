"""Issue 22: ``serve`` as dependable as ``run``: an interrupt keeps what finished, work is
bounded before it starts, progress shows on a terminal only, the offered rate is the
window's, and every input surface is validated strictly (one line, exit 2)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from sim.errors import ConfigError
from tests.conftest import ROOT, run_cli

SMALL = ("--requests", "synthetic", "--prompt-median", "100", "--output-median", "8")


def _one_line_error(code: int, err: str, expect: str) -> None:
    assert code == 2, err
    assert err.startswith("decodesim: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert expect in err, err


# -- interrupts ----------------------------------------------------------------------------------


def test_sigint_ends_a_replay_keeping_what_finished(tmp_path):
    """SIGINT to a running replay: the process stops (exit 130; the 60 s timeout only bounds a
    hang), the tables and a summary marked partial written, no temp file, no stale plot."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "over-time.png").write_bytes(b"stale")  # from an earlier run: must not survive a partial one
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "sim", "serve", "--requests", "synthetic", "--rate", "20",
                             "--duration-s", "3000", "--out", str(out)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not any(p.name.startswith(".steps.parquet.") for p in out.iterdir()):  # the replay has begun
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.05)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)  # a hang bound, not a speed bound
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted; stopped the replay" in stderr
    assert "PARTIAL: interrupted at" in stdout
    names = sorted(p.name for p in out.iterdir())
    assert names == ["requests.parquet", "steps.parquet", "summary.json"], names
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partial"] is True and 0 < summary["stopped_at_s"] < 3000
    requests = pd.read_parquet(out / "requests.parquet")
    steps = pd.read_parquet(out / "steps.parquet")
    assert len(requests) == summary["requests_done"] + summary["requests_rejected"] > 0
    assert len(steps) == summary["steps"] > 0
    assert steps["t_start_s"].max() <= summary["stopped_at_s"]


def test_stop_callback_gives_a_partial_summary_in_process(tmp_path):
    from sim.serve.replay import serve
    from sim.serve.spec import ServeSpec

    calls = {"n": 0}

    def stop():
        calls["n"] += 1
        return calls["n"] > 200

    seen = []
    summary = serve(ServeSpec(requests="synthetic", rate=20, duration_s=60, prompt_median=100, output_median=8),
                    tmp_path, stop=stop, progress=lambda s, done: seen.append((s, done)))
    assert summary["partial"] and 100 < summary["steps"] <= 200  # stop is asked before every step (and idle jump)
    assert summary["rate_per_s"] == pytest.approx(summary["arrivals"] / summary["stopped_at_s"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["requests.parquet", "steps.parquet"]
    assert seen and all(a[0] <= b[0] for a, b in zip(seen, seen[1:], strict=False))


# -- progress ------------------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_on_a_terminal_and_not_with_no_progress(monkeypatch):
    from sim.commands.handlers.serve import _Progress

    cases = ((io.StringIO(), True, False), (_Terminal(), False, False), (_Terminal(), True, True))
    for stream, enabled, shown in cases:
        monkeypatch.setattr(sys, "stderr", stream)
        bar = _Progress(100.0, enabled)
        if bar.bar is not None:
            bar.bar.delay = bar.bar.mininterval = 0  # show at once for the test
        bar(50.0, 7)
        bar.close()
        assert ("simulated s" in stream.getvalue()) is shown, stream.getvalue()
    code, _out, err = run_cli("serve", *SMALL, "--rate", "20", "--duration-s", "1")
    assert code == 0 and err == ""  # captured stderr is not a terminal: no bar


# -- bounded work and the offered rate ------------------------------------------------------------


@pytest.mark.parametrize("argv, expect", [
    (["--duration-s", "1e12"], "duration_s: must be a finite number in (0, 604800]"),
    (["--rate", "1e9", "--duration-s", "5"], "rate: must be a finite number in (0, 10000]"),
    (["--requests", "synthetic", "--rate", "1000", "--duration-s", "3000"], "at most 1,000,000 per replay"),
    (["--rate-scale", "1e5"], "expected at most 10,000"),
    (["--seed", "-1"], "seed: must be a whole number in [0,"),
    (["--rates", "1,,2"], "--rates: item 2 of the comma list is empty"),
    (["--rates", "0x10"], "--rates: item 1: expected a comma list of numbers"),
    (["--rates", ",".join(["1"] * 1001)], "at most 1000 comma-separated numbers"),
    (["--kv", ",".join(["fp16"] * 101), "--rates", ",".join(["1"] * 100)], "the sweep has 10,100 replays"),
    (["--set", "kv=" + "a" * 5000], "at most 1,024 characters"),
    (["--kv", "a" * 300], "at most 255 characters"),
    (["--set", "hardware.hbm.latency_ns=1e-320"], "subnormal"),
    (["--max-batch", "1_000"], "expected a whole number"),
])
def test_bad_serve_input_is_refused_before_any_work(argv, expect):
    start = time.process_time()
    code, _out, err = run_cli("serve", *argv)
    _one_line_error(code, err, expect)
    assert time.process_time() - start < 5.0


def test_compare_refuses_too_many_formats_at_once():
    code, _out, err = run_cli("compare", "--kv", ",".join(["fp16"] * 2000))
    _one_line_error(code, err, "at most 64 comma-separated formats")
    code, _out, err = run_cli("compare", "--kv", "fp16,,int8")
    _one_line_error(code, err, "item 2 of the comma list is empty")


def test_offered_rate_is_the_window_s_arrivals():
    """azure-conv's first 60 s hold fewer arrivals than the hour's mean rate says; the summary's
    rate is the window's (arrivals / 60 s), the hour's mean is kept as the nominal rate."""
    from sim.serve.replay import serve
    from sim.serve.requests import open_source
    from sim.serve.spec import ServeSpec

    arrivals = sum(1 for _ in open_source("azure-conv", duration_s=60))
    summary = serve(ServeSpec(requests="azure-conv", duration_s=60))
    assert summary["arrivals"] == arrivals
    assert summary["rate_per_s"] == pytest.approx(arrivals / 60)
    assert summary["nominal_rate_per_s"] == pytest.approx(19365 / open_source("azure-conv")._arrays[0][-1])
    assert abs(summary["rate_per_s"] - summary["nominal_rate_per_s"]) > 0.5  # the bug: the hour's mean was shown


def test_serve_words_say_what_tokens_count(cli):
    code, out, err = cli("serve", *SMALL, "--rate", "20", "--duration-s", "1")
    assert code == 0, err
    assert "tokens at 4k context" not in out and "cached tokens (" in out and "req/s offered over the 1 s window" in out


# -- request files, --set, studies, names, --version ---------------------------------------------


@pytest.mark.parametrize("rows, expect", [
    ([(0, 1e10, 5)], "prompt_tokens (row 1): token counts must be whole numbers in [1, 10,000,000]"),
    ([(1, 3, 5), (0, 3, 5)], "arrival_s (row 2): arrivals must be in non-decreasing order"),
    ([(1e-320, 3, 5)], "arrival_s (row 1): arrival times must be seconds"),
])
def test_bad_request_files_name_the_row(tmp_path, rows, expect):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({"arrival_s": a, "prompt_tokens": p, "output_tokens": o}) + "\n"
                            for a, p, o in rows))
    code, _out, err = run_cli("serve", "--requests", str(path))
    _one_line_error(code, err, expect)


def test_a_request_file_is_read_by_its_ending(tmp_path):
    path = tmp_path / "r.txt"
    path.write_text('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}\n')
    code, _out, err = run_cli("serve", "--requests", str(path))
    _one_line_error(code, err, "r.txt: a request file's name ends in .jsonl, .csv, .csv.gz, .parquet")


def test_a_bad_cell_of_a_request_csv_is_the_one_named(tmp_path):
    """One text cell turns the whole CSV column into text: the message names that cell, not the first."""
    path = tmp_path / "r.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n0.1,abc,10\n")
    code, _out, err = run_cli("serve", "--requests", str(path))
    _one_line_error(code, err, "prompt_tokens (row 2): must be numbers (not text, booleans or empty cells), got 'abc'")


@pytest.mark.parametrize("text, expect", [
    ("batch=0x10", "plain decimal"), ("batch=1_000", "plain decimal"), ("batch=010", "plain decimal"),
    ("batch=1:30", "plain decimal"), ("target_ms=.inf", "plain decimal"), ("target_ms=1e400", "finite"),
    ("hardware.hbm.latency_ns=1e-320", "subnormal"), ("a..b=1", "path parts may not be empty"),
])
def test_set_values_are_strict(text, expect):
    from sim.config.loader import parse_assignment

    with pytest.raises(ConfigError, match=expect):
        parse_assignment(text)
    code, _out, err = run_cli("run", "--steps", "1", "--set", text)
    _one_line_error(code, err, expect)


def test_plain_set_values_still_work():
    from sim.config.loader import parse_assignment

    assert parse_assignment("batch=16") == ("batch", 16)
    assert parse_assignment("hardware.hbm.latency_ns=1e3") == ("hardware.hbm.latency_ns", 1000.0)
    assert parse_assignment("x={scale: 0.5}") == ("x", {"scale": 0.5})
    assert parse_assignment("kv=kivi-2") == ("kv", "kivi-2")


@pytest.mark.parametrize("text, expect", [
    ("name: only\n", "the study asks nothing"),
    ("name: s\nbase: {batch: \"8\"}\n", "base: batch: input should be a valid integer"),
    ("name: s\nbase: {target_ms: \"10\"}\n", "base: target_ms: input should be a valid number"),
])
def test_study_files_are_strict(tmp_path, text, expect):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    code, _out, err = run_cli("study", str(path), "--check")
    _one_line_error(code, err, expect)


def test_old_sweep_tables_stay_readable():
    from sim.serve.spec import upgrade_names

    old = pd.DataFrame({"max_batch": [12], "max_batch_limit": [256], "kv_pool_tokens_at_4k": [9],
                        "kv_bytes_per_token_at_4k": [1.5]})
    new = upgrade_names(old)
    assert new.iloc[0].to_dict() == {"max_batch_seen": 12, "max_batch": 256, "kv_pool_tokens": 9,
                                     "kv_bytes_per_token": 1.5}


def test_version():
    code, out, _err = run_cli("--version")
    assert code == 0 and out.startswith("decodesim ") and out.split()[1][0].isdigit()


def test_sigint_ends_a_sweep_keeping_the_replays_that_finished(tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) on a sweep: the workers
    are stopped, the finished points are written as a table and a report marked partial."""
    out = tmp_path / "sweep"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "sim", "serve", *SMALL, "--rates", "2,4,3000", "--duration-s",
                             "100", "--jobs", "2", "--out", str(out)], cwd=tmp_path, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen, deadline = "", time.monotonic() + 90
        while seen.count("req/s:") < 2:  # the two light points are done; the heavy one runs on
            assert proc.poll() is None and time.monotonic() < deadline, seen
            seen += proc.stderr.readline()
        os.killpg(proc.pid, signal.SIGINT)
        _stdout, stderr = proc.communicate(timeout=60)  # a hang bound, not a speed bound
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert "2 of 3 replays finished" in stderr and "Traceback" not in stderr
    table = pd.read_parquet(out / "table.parquet")
    assert sorted(table["rate_request"]) == [2.0, 4.0]
    assert "(partial: interrupted after 2 of 3 replays)" in (out / "report.md").read_text()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_progress_bar_draws_on_a_real_terminal(tmp_path):
    """On a pty (which reports no window size here, a case tqdm alone draws nothing for) the
    bar appears after its 2 s delay (--no-progress: the in-process test above)."""
    import pty

    argv = [sys.executable, "-m", "sim", "serve", *SMALL, "--rate", "40", "--duration-s", "240"]  # ~5 s of wall (90 s replayed in under the bar's 2 s delay once attention times were memoized)
    for extra, shown in (([], True),):
        master, slave = pty.openpty()
        proc = subprocess.Popen(argv + extra, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.DEVNULL, stderr=slave)
        os.close(slave)
        data = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        os.close(master)
        assert proc.wait(timeout=120) == 0
        assert (b"simulated s" in data) is shown, data[-300:]
