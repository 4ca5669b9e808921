"""Studies: parsing, bad input, the content-hash cache, resume after a kill, failure
isolation and the Dask executor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.errors import ConfigError
from sim.study import load_study, results, run_study
from sim.study.runner import content_hash
from sim.study.spec import StudySpec, expand
from tests.conftest import ROOT, run_cli

SMALL = """
name: small
base: {model: llama-3-8b, steps: 1, context: 1024}
sweep:
  grid:
    batch: [1, 4]
    hardware.hbm.channel_bandwidth_GBps: [20, 30]
  zip:
    kv: [fp16, int8]
    weights: [bf16, int8]
"""


def write(tmp_path: Path, text: str, name: str = "study.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def stable(table):
    """The table without its timing column (wall clock differs between runs)."""
    return table.drop(columns=[c for c in table.columns if c == "wall_s"]).reset_index(drop=True)


# -- parsing --------------------------------------------------------------------------------


def test_grid_zip_seeds_and_ranges_expand(tmp_path):
    path = write(tmp_path, """
        name: expand
        base: {model: llama-3-8b, steps: 1}
        overrides: {hardware.hbm.latency_ns: {scale: 2}}
        sweep:
          grid:
            batch: [1, 2, 3]
            hardware.hbm.channel_bandwidth_GBps: {from: 10, to: 40, steps: 3, spacing: log}
          zip: {kv: [fp16, int8], context: [1024, 2048]}
        seeds: [0, 7]
    """)
    study = load_study(path)
    assert len(study.points) == 3 * 3 * 2 * 2
    assert study.axes == ["batch", "hardware.hbm.channel_bandwidth_GBps", "kv", "context"]
    bw = sorted({p.labels["hardware.hbm.channel_bandwidth_GBps"] for p in study.points})
    assert bw == pytest.approx([10, 20, 40])
    pairs = {(p.labels["kv"], p.labels["context"]) for p in study.points}
    assert pairs == {("fp16", 1024), ("int8", 2048)}  # zipped, not crossed
    first = study.points[0].spec
    assert ("hardware.hbm.latency_ns", {"scale": 2}) in first.overrides
    assert {p.seed for p in study.points} == {0, 7}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.integers(0, 3), st.integers(1, 3))
def test_point_count_is_the_product(lengths, zip_len, seeds):
    grid = {f"model.layers_{i}": list(range(1, n + 1)) for i, n in enumerate(lengths)}
    zipped = {"batch": list(range(1, zip_len + 1)), "context": list(range(100, 100 + zip_len))} if zip_len else {}
    spec = StudySpec(name="p", sweep={"grid": grid, "zip": zipped}, seeds=list(range(seeds)))
    study = expand(spec, "p.yaml")
    expected = seeds * max(1, zip_len)
    for n in lengths:
        expected *= n
    assert len(study.points) == expected
    keys = {(p.assignments, p.seed) for p in study.points}
    assert len(keys) == expected  # every point is distinct


BAD = {
    "unknown path": ("sweep:\n  grid:\n    hardware.hbm.bandwith_GBps: [1, 2]\n",
                     "sweep.grid.hardware.hbm.bandwith_GBps", "no such key"),
    "unknown run field": ("sweep:\n  grid:\n    batchsize: [1, 2]\n", "sweep.grid.batchsize", "no such path"),
    "wrong type": ("sweep:\n  grid:\n    batch: [1, many]\n", "sweep.grid.batch", "integer"),
    "wrong type in a profile": ("overrides:\n  hardware.hbm.capacity_GB: lots\n", "overrides.hardware.hbm.capacity_GB",
                                "number"),
    "empty sweep": ("sweep:\n  grid:\n    batch: []\n", "sweep.grid.batch", "empty sweep"),
    "empty range": ("sweep:\n  grid:\n    batch: {from: 1, to: 8, steps: 0}\n", "sweep.grid.batch", "steps >= 1"),
    "duplicate axis (grid and zip)": ("sweep:\n  grid:\n    batch: [1, 2]\n  zip:\n    batch: [3, 4]\n",
                                      "sweep.zip.batch", "duplicate axis"),
    "duplicate axis (two spellings)": ("sweep:\n  grid:\n    hardware.hbm.latency_ns: [1, 2]\n"
                                       "    hardware.memory.hbm.latency_ns: [3, 4]\n",
                                       "sweep.grid.hardware.memory.hbm.latency_ns", "duplicate axis"),
    "duplicate YAML key": ("sweep:\n  grid:\n    batch: [1, 2]\n    batch: [3, 4]\n", "sweep.grid.batch",
                           "duplicate key"),
    "override and axis": ("overrides:\n  batch: 2\nsweep:\n  grid:\n    batch: [3, 4]\n", "sweep.grid.batch",
                          "duplicate axis"),
    "zip lengths": ("sweep:\n  zip:\n    batch: [1, 2]\n    context: [1024]\n", "sweep.zip", "equal lengths"),
    "unknown format": ("sweep:\n  grid:\n    kv: [fp16, int3-nope]\n", "sweep.grid.kv", "unknown format"),
    "unknown top-level key": ("sweeps:\n  grid:\n    batch: [1]\n", "sweeps", "unknown key"),
    "unknown base field": ("base: {bacth: 2}\n", "base", "unknown run field"),
    "format groups do not divide a row width": (
        "sweep:\n  grid:\n    kv: [fp16, int2-asym-outlier]\n    model: [llama-3-8b, deepseek-v3]\n",
        "sweep.grid.kv", "must divide the K row width 576"),
    "exclude names no axis": ("sweep:\n  grid:\n    batch: [1, 2]\n  exclude:\n    - {where: {bacth: 1}, reason: r}\n",
                              "sweep.exclude.0.where", "not a swept axis"),
    "exclude names no value of the axis": (
        "sweep:\n  grid:\n    batch: [1, 2]\n  exclude:\n    - {where: {batch: 3}, reason: r}\n",
        "sweep.exclude.0.where.batch", "must be a value of the axis"),
    "exclude without a reason": ("sweep:\n  grid:\n    batch: [1, 2]\n  exclude:\n    - {where: {batch: 1}}\n",
                                 "sweep.exclude.0.reason", "required"),
    "a value listed twice": ("sweep:\n  grid:\n    batch: [1, 8, 1]\n", "sweep.grid.batch.2", "duplicate value"),
    "a plot axis that is not swept": ("sweep:\n  grid:\n    batch: [1, 2]\n    context: [256, 512]\n"
                                      "plots: {feasibility: [contxt, batch]}\n", "plots.feasibility.0",
                                      "'contxt' is not a swept axis"),
    "a facet that is not swept": ("sweep:\n  grid:\n    batch: [1, 2]\nplots: {facet: kv}\n", "plots.facet",
                                  "'kv' is not a swept axis"),
    "a breakdown axis that is not swept": ("sweep:\n  grid:\n    batch: [1, 2]\nplots: {breakdown: context}\n",
                                           "plots.breakdown", "'context' is not a swept axis"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_error_naming_file_and_path(tmp_path, case):
    body, key, words = BAD[case]
    path = write(tmp_path, "name: bad\nbase: {model: llama-3-8b, steps: 1}\n" + body
                 if not body.startswith("base") else "name: bad\n" + body)
    with pytest.raises(ConfigError) as info:
        load_study(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {key}"), message
    assert words in message
    # through the CLI: one line on stderr, exit 2, nothing written
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("study", str(path), "--out", str(out), "--no-progress")
    assert code == 2 and stderr.count("\n") == 1 and str(path) in stderr
    assert not out.exists()


@pytest.mark.parametrize("name", ["plots", "cache", "detail"])
def test_a_file_where_the_study_makes_a_folder_is_refused_before_any_point_runs(tmp_path, monkeypatch, name):
    import sim.study.runner

    def boom(*a, **k):
        raise AssertionError("no point may run")

    monkeypatch.setattr(sim.study.runner, "run_point", boom)
    path = write(tmp_path, SMALL)
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("x")
    code, stdout, stderr = run_cli("study", str(path), "-j", "1", "--out", str(out), "--no-progress")
    assert code == 2 and stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert stderr.startswith(f"decodesim: {out / name}: ") and "expected a folder" in stderr, stderr
    assert sorted(p.name for p in out.iterdir()) == [name]  # no table, settings or cache written


def test_exclude_leaves_out_the_combinations_a_format_cannot_run(tmp_path):
    path = write(tmp_path, """
        name: excl
        base: {steps: 1}
        sweep:
          grid:
            kv: [fp16, int2-asym-outlier]
            model: [llama-3-8b, deepseek-v3]
          exclude:
            - {where: {model: deepseek-v3, kv: int2-asym-outlier}, reason: groups of 128 do not divide 576}
    """)
    study = load_study(path)  # checks every point's widths: passes once the misfit is left out
    combos = {(p.labels["kv"], p.labels["model"]) for p in study.points}
    assert combos == {("fp16", "llama-3-8b"), ("fp16", "deepseek-v3"), ("int2-asym-outlier", "llama-3-8b")}
    assert [(rule.reason, n) for rule, n in study.excluded] == [("groups of 128 do not divide 576", 1)]
    code, out, err = run_cli("study", str(path), "--check")
    assert code == 0, err
    assert "1 grid points left out by sweep.exclude (model=deepseek-v3, kv=int2-asym-outlier)" in out


def test_every_bundled_study_resolves_and_checks_every_width():
    from sim.config.loader import load_yaml
    from sim.paths import studies_dir

    for path in sorted(studies_dir().glob("*.yaml")):
        if load_yaml(path).get("kind") == "serve":  # a serving study (decodesim serve --study)
            continue
        study = load_study(path)  # raises on any point that cannot run
        assert study.hashes is not None and len(study.hashes) == len(study.points)


# -- cache ----------------------------------------------------------------------------------


def test_second_run_simulates_nothing_and_a_change_recomputes_only_new_points(tmp_path):
    path = write(tmp_path, SMALL)
    out = tmp_path / "out"
    first = run_study(load_study(path), out, jobs=1, progress=False, report=False, detail=False)
    assert first.simulated == 8 and first.cached == 0
    again = run_study(load_study(path), out, jobs=1, progress=False, report=False, detail=False)
    assert again.simulated == 0 and again.cached == 8
    assert stable(again.table).equals(stable(first.table))
    write(tmp_path, SMALL.replace("[20, 30]", "[20, 30, 40]"))
    grown = run_study(load_study(path), out, jobs=1, progress=False, report=False, detail=False)
    assert grown.simulated == 4 and grown.cached == 8
    assert not list(out.rglob(".*.json*")), "temporary files left behind"


def report_lines(report: Path | str) -> list[str]:
    """A report's lines but those that state the run's timing and cache use."""
    text = report.read_text() if isinstance(report, Path) else report
    return [line for line in text.splitlines() if not line.startswith("- Runs: ")]


def test_a_cached_rerun_leaves_table_and_drawings_alone_until_what_they_show_changes(tmp_path, monkeypatch):
    """The table, plots and report are rewritten only when their inputs, the code or the
    files themselves changed (sim.study.stamps); what is rewritten equals a fresh drawing."""
    import sim.study.stamps

    path = write(tmp_path, SMALL)
    out = tmp_path / "out"
    run_study(load_study(path), out, jobs=1, progress=False, report=True, detail=False)
    drawn = sorted(p for p in out.rglob("*") if p.is_file() and p.suffix in (".png", ".svg", ".md", ".html")
                   or p.name.startswith("results."))
    assert {p.name for p in drawn} >= {"results.parquet", "results.csv", "report.md", "report.html",
                                       "breakdown.png", "feasibility.png"}

    def snapshot():
        return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in drawn}

    before = snapshot()
    again = run_study(load_study(path), out, jobs=1, progress=False, report=True, detail=False)
    assert again.simulated == 0 and snapshot() == before, "a re-run with nothing new rewrote a file"
    assert stable(again.table).equals(stable(results(out)))

    (out / "plots" / "breakdown.png").unlink()  # a file gone (or edited) is drawn again
    (out / "report.md").write_text("edited by hand")
    run_study(load_study(path), out, jobs=1, progress=False, report=True, detail=False)
    redrawn = snapshot()  # as drawn before: the table and PNGs byte for byte, the report but its "Runs" line
    assert {p: b for p, (_, b) in redrawn.items() if p.suffix in (".png", ".parquet", ".csv")} == \
        {p: b for p, (_, b) in before.items() if p.suffix in (".png", ".parquet", ".csv")}
    assert report_lines(out / "report.md") == report_lines(before[out / "report.md"][1].decode())

    monkeypatch.setattr(sim.study.stamps, "source_digest", lambda: "other code")  # the drawing code changed
    run_study(load_study(path), out, jobs=1, progress=False, report=True, detail=False)
    assert all(snapshot()[p][0] != before[p][0] for p in drawn), "new code left a file as the old code drew it"
    monkeypatch.undo()

    write(tmp_path, SMALL.replace("name: small", "name: small\ndescription: Said otherwise."))  # same runs
    changed = run_study(load_study(path), out, jobs=1, progress=False, report=True, detail=False)
    assert changed.simulated == 0
    fresh = run_study(load_study(path), tmp_path / "fresh", jobs=1, progress=False, report=True, detail=False)
    assert report_lines(out / "report.md") == report_lines(tmp_path / "fresh" / "report.md")
    assert (out / "report.md").read_bytes() != before[out / "report.md"][1]
    assert stable(fresh.table).drop(columns="hash").equals(stable(results(out)).drop(columns="hash"))


def test_hash_covers_the_profile_file_contents(tmp_path):
    from sim.run import RunSpec

    profile = tmp_path / "hw.yaml"
    text = (ROOT / "hardware_profiles" / "h200-sxm.yaml").read_text()
    profile.write_text(text)
    spec = RunSpec(hardware=str(profile), steps=1)
    before = content_hash(spec)
    assert content_hash(spec) == before
    import yaml

    raw = yaml.safe_load(text)
    raw["memory"][0]["latency_ns"]["value"] += 10  # one number changes, nothing else
    profile.write_text(yaml.safe_dump(raw))
    from sim.setup import _raw

    _raw.cache_clear()
    assert content_hash(spec) != before
    # the same run spelt two ways has one key
    assert content_hash(RunSpec(batch=4, steps=1)) == content_hash(RunSpec(steps=1, overrides=[("batch", 4)]))


# -- resume ---------------------------------------------------------------------------------


def test_resume_after_kill_loses_and_redoes_nothing(tmp_path):
    path = write(tmp_path, """
        name: resume
        base: {model: llama-3-8b, steps: 6, context: 4096}
        sweep:
          grid:
            batch: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
            hardware.hbm.channel_bandwidth_GBps: [15, 20, 25, 30, 35]
    """)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "sim", "study", str(path), "--out", str(out), "--jobs", "1",
                             "--no-progress", "--no-report"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = list((out / "cache").glob("*.json")) if (out / "cache").is_dir() else []
        if len(done) >= 3:
            break
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {p.name: p.stat().st_mtime_ns for p in (out / "cache").glob("*.json")}
    assert 3 <= len(finished) < 60, "the kill should land mid-study"
    assert not (out / "results.parquet").exists()
    resumed = run_study(load_study(path), out, jobs=1, progress=False, report=False, detail=False)
    assert resumed.cached == len(finished) and resumed.simulated == 60 - len(finished)
    for name, mtime in finished.items():  # finished runs were not rewritten
        assert (out / "cache" / name).stat().st_mtime_ns == mtime
    clean = run_study(load_study(path), tmp_path / "clean", jobs=2, progress=False, report=False, detail=False)
    assert stable(resumed.table).equals(stable(clean.table))


# -- failures -------------------------------------------------------------------------------


def test_a_failing_point_is_recorded_and_the_study_goes_on(tmp_path, monkeypatch):
    import sim.run
    import sim.study.runner

    real = sim.run.simulate

    def flaky(spec, **kw):
        plain = sim.run.apply_run_overrides(spec)
        if plain.batch == 4 and plain.kv == "int8":
            raise RuntimeError("injected failure")
        return real(spec, **kw)

    monkeypatch.setattr(sim.study.runner, "simulate", flaky)
    path = write(tmp_path, SMALL)
    result = run_study(load_study(path), tmp_path / "out", jobs=1, progress=False, report=True)
    table = result.table
    bad = table[table["status"] == "error"]
    assert len(bad) == 2 and set(bad["batch"]) == {4} and set(bad["kv"]) == {"int8"}
    assert bad["error"].str.contains("RuntimeError: injected failure").all()
    good = table[table["status"] == "ok"]
    assert len(good) == 6 and good["per_token_ms_p99"].gt(0).all()
    assert "injected failure" in (tmp_path / "out" / "report.md").read_text()


# -- dask -----------------------------------------------------------------------------------


def test_dask_local_cluster_gives_the_local_table(tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    path = write(tmp_path, SMALL)
    local = run_study(load_study(path), tmp_path / "local", jobs=2, progress=False, report=False, detail=False)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, protocol="tcp://", host="127.0.0.1",
                                  dashboard_address=None) as cluster:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1")
        code, stdout, stderr = run_cli("study", str(path), "--out", str(tmp_path / "dask"), "--executor", "dask",
                                       "--address", cluster.scheduler_address, "--no-progress", "--no-report")
    assert code == 0, stderr
    assert "8 simulated, 0 cached, 0 failed" in stdout
    assert stable(results(tmp_path / "dask")).equals(stable(local.table))


def test_the_documented_example_study_is_valid(tmp_path):
    text = (ROOT / "docs" / "studies.md").read_text()
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = write(tmp_path, example, "example.yaml")
    study = load_study(path)
    assert len(study.grid_points) == 4 * 4 * 2 - 4  # llama-3-70b at batch 64 is left out (sweep.exclude)
    assert {p.labels["batch"] for p in study.grid_points} == {1, 4, 16, 64}
    assert [n for _rule, n in study.excluded] == [4]
    assert [c.name for c in study.spec.plots.claims] == ["fp8-weights"]


def test_detail_point_follows_every_zipped_value(tmp_path):
    from sim.study.spec import detail_assignments

    body = SMALL + "plots: {detail: {kv: int8, weights: int8, batch: 4}}\n"
    study = load_study(write(tmp_path, body))
    assert dict(detail_assignments(study)) == {"batch": 4, "hardware.hbm.channel_bandwidth_GBps": 20,
                                               "kv": "int8", "weights": "int8"}
    bad = write(tmp_path, SMALL + "plots: {detail: {kv: int8, weights: bf16}}\n", "bad.yaml")
    with pytest.raises(ConfigError, match="plots.detail: no zipped row"):
        load_study(bad)


@settings(max_examples=30, deadline=None)
@given(st.floats(1, 200), st.floats(1, 200), st.integers(1, 64))
def test_hash_separates_exactly_the_runs_that_differ(a, b, batch):
    from sim.run import RunSpec

    def key(bw, n):
        return content_hash(RunSpec(steps=1, overrides=[("hardware.hbm.channel_bandwidth_GBps", bw), ("batch", n)]))

    assert key(a, batch) == key(a, batch)
    assert (key(a, batch) == key(b, batch)) == (a == b)
    assert key(a, batch) != key(a, batch + 1)
