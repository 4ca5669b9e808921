"""The CLI as a user meets it: defaults, --json keys, --out tables, traces, exit codes."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from sim import decode_trace
from sim.errors import ConfigError

REQUIRED = {"per_token_ms_p50", "per_token_ms_p99", "meets_target", "verdict", "bound", "hbm_bytes_per_token",
            "weight_bytes_per_token", "kv_bytes_per_token", "hbm_achieved_GBps", "breakdown_ms", "events", "wall_s"}


def test_default_run_prints_the_table(cli):
    code, out, err = cli("run", "--steps", "2")
    assert code == 0, err
    for text in ("llama-3-8b on h200-sxm", "per-token latency: p50", "breakdown", "weights", "bound: memory",
                 "MEETS the 10 ms target"):
        assert text in out


def test_json_has_the_documented_keys(cli):
    code, out, _ = cli("run", "--steps", "2", "--json", "--batch", "4")
    summary = json.loads(out)
    assert code == 0 and REQUIRED <= set(summary)
    assert summary["verdict"] in ("meets-target", "misses-target")
    assert isinstance(summary["breakdown_ms"], dict)


def test_json_does_not_fit(cli):
    code, out, _ = cli("run", "--model", "llama-3-70b", "--batch", "64", "--context", "32768", "--json")
    s = json.loads(out)
    assert code == 0 and s["verdict"] == "does-not-fit" and s["meets_target"] is False


def test_out_writes_tables(cli, tmp_path):
    code, _out, err = cli("run", "--steps", "2", "--out", str(tmp_path / "r"), "--trace-out", str(tmp_path / "t.json"))
    assert code == 0, err
    for name in ("steps", "ops", "events"):
        assert (tmp_path / "r" / f"{name}.parquet").is_file() and (tmp_path / "r" / f"{name}.csv").is_file()
    ops = pd.read_parquet(tmp_path / "r" / "ops.parquet")
    assert set(ops["step"]) == {0, 1} and "attention" in set(ops["name"])
    chrome = json.loads((tmp_path / "t.json").read_text())
    assert {e["ph"] for e in chrome["traceEvents"]} >= {"M", "X"}
    assert not list((tmp_path / "r").glob(".*"))  # no temporary files left behind


def test_trace_roundtrip_and_replay(cli, tmp_path):
    requests = decode_trace.synthetic_requests(50, rate_per_s=200, prompt_median=300, output_median=20, seed=3)
    steps = decode_trace.from_requests(requests, max_batch=8, step_ms=5)
    assert max(s.batch for s in steps) <= 8 and min(s.batch for s in steps) >= 1
    # every request decodes exactly its output tokens
    tokens = sum(s.batch for s in steps)
    assert tokens == sum(max(1, r.output) for r in requests)
    for suffix in (".jsonl", ".parquet", ".csv"):
        path = tmp_path / f"t{suffix}"
        decode_trace.write(steps, path)
        assert decode_trace.read(path) == steps
    code, out, err = cli("run", "--trace", str(tmp_path / "t.jsonl"), "--steps", "30", "--engine", "analytic")
    assert code == 0, err and "batch over the trace" in out


def test_trace_read_stops_after_the_steps_asked_for(cli, tmp_path):
    """``--steps N`` with a JSON Lines trace parses its first N steps only: lines after them may
    be anything, while a bad line among the first N is still the CLI's one-line error."""
    good = [f'{{"step": {i}, "seqs": [[0, {100 + i}], [1, {200 + i}]]}}' for i in range(3)]
    garbage = ["{not json}", '{"step": -1, "seqs": []}', "\xff trailing text"]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(good + garbage) + "\n")
    steps = decode_trace.read(path, steps=3)
    assert [s.index for s in steps] == [0, 1, 2] and steps[2].contexts == (102, 202)
    code, out, err = cli("run", "--trace", str(path), "--steps", "3", "--json", "--engine", "analytic")
    assert code == 0, err
    assert len(json.loads(out)["batch_over_time"]) == 3
    with pytest.raises(ConfigError, match="line 4: invalid JSON"):
        decode_trace.read(path, steps=4)
    code, _out, err = cli("run", "--trace", str(path), "--steps", "4", "--engine", "analytic")
    assert code == 2 and "line 4: invalid JSON" in err and "Traceback" not in err


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".csv"])
def test_trace_steps_read_are_the_first_of_a_full_read(tmp_path, suffix):
    requests = decode_trace.synthetic_requests(40, rate_per_s=200, prompt_median=300, output_median=20, seed=5)
    path = tmp_path / f"t{suffix}"
    decode_trace.write(decode_trace.from_requests(requests, max_batch=8, step_ms=5), path)
    full = decode_trace.read(path)
    assert len(full) > 30
    for n in (1, 7, 30, len(full), len(full) + 5):
        assert decode_trace.read(path, steps=n) == full[:n]


def test_bundled_azure_trace_replays(cli, root):
    code, out, err = cli("run", "--trace", str(root / "workloads/traces/azure-conv-2023-b32.jsonl"),
                         "--steps", "40", "--json", "--engine", "analytic")
    s = json.loads(out)
    assert code == 0, err
    assert len(s["batch_over_time"]) == 40 and s["per_token_ms_p99"] >= s["per_token_ms_p50"]


@pytest.mark.parametrize("content, expect", [
    ("{not json}\n", "line 1: invalid JSON"),
    ('{"step": 0}\n', 'expected {"step": N'),
    ('{"step": 0, "seqs": [[1, 0]]}\n', "context must be in [1, 1,000,000,000]"),
    ('{"step": 0, "seqs": [["a", 5]]}\n', "each entry must be [seq_id, context]"),
    ("", "trace has no steps"),
])
def test_bad_trace_files(cli, tmp_path, content, expect):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    code, _out, err = cli("run", "--trace", str(path))
    assert code == 2 and expect in err and str(path) in err and err.count("\n") == 1


def test_missing_trace_and_profiles_listing(cli):
    code, _o, err = cli("run", "--trace", "nope.jsonl")
    assert code == 2 and "nope.jsonl: trace file not found" in err
    code, out, _ = cli("profiles")
    assert code == 0 and "h200-sxm" in out
    code, out, _ = cli("profiles", "--sources", "h200-sxm")
    assert code == 0 and "memory.hbm.capacity_GB" in out and "datasheet" in out


def test_python_dash_m_sim(root):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "sim", "run", "--steps", "1", "--json"], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout)["verdict"] == "meets-target"


def test_help_starts_without_the_validation_stack():
    """`decodesim --help` builds every subcommand's parser without importing pydantic, SimPy,
    numpy or pandas (start-up is part of the tool's speed; issue 10)."""
    import subprocess
    import sys

    script = ("import io, sys, contextlib\n"
              "from sim.cli import main\n"
              "with contextlib.redirect_stdout(io.StringIO()):\n"
              "    try:\n"
              "        main(['--help'])\n"
              "    except SystemExit:\n"
              "        pass\n"
              "print(sorted(m for m in ('pydantic', 'simpy', 'numpy', 'pandas', 'yaml') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
