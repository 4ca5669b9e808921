"""Redrawing from saved results (``decodesim plot DIR``, ``decodesim serve --replot``) when
the saved folder was damaged since it was written: each damaged file is one line on stderr
naming it, exit 2, no traceback, and nothing is redrawn."""

from __future__ import annotations

import shutil
import textwrap

import pandas as pd
import pytest

from tests.conftest import run_cli

STUDY = """
name: tiny-plot
base: {model: llama-3.2-1b, steps: 1, context: 1024}
sweep:
  grid:
    batch: [1, 4]
"""
SAVED = ("results.parquet", "study.json", "timing.json", "detail/meta.json", "detail/ops.parquet",
         "detail/events.parquet")


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    """A two-point study's saved files (no drawings: ``decodesim plot`` makes those)."""
    folder = tmp_path_factory.mktemp("plot-hardening")
    (folder / "tiny.yaml").write_text(textwrap.dedent(STUDY))
    code, out, err = run_cli("study", str(folder / "tiny.yaml"), "--out", str(folder / "out"), "--jobs", "1",
                             "--no-progress", "--no-report")
    assert code == 0, err
    return folder / "out"


@pytest.fixture
def copy(study_dir, tmp_path):
    """A fresh copy of the study's saved files, to damage."""
    target = tmp_path / "study"
    for name in SAVED:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(study_dir / name, target / name)
    return target


def garbage(path):
    path.write_bytes(b"\x00\x17not what decodesim wrote\xff" * 8)


def serve_table(path):
    """A ``decodesim serve`` sweep's table where the study's results table belongs."""
    pd.DataFrame([{"hardware": "h200-sxm", "model": "llama-3-8b", "weights": "bf16", "kv": "fp16", "rate_per_s": 2.0,
                   "tpot_ms_p99": 5.0, "status": "ok", "reason": ""}]).to_parquet(path)


DAMAGE = {
    "study.json not JSON": ("study.json", lambda p: p.write_text("{bad"), "invalid JSON"),
    "study.json empty object": ("study.json", lambda p: p.write_text("{}"), "required key is missing"),
    "study.json a list": ("study.json", lambda p: p.write_text("[1]"), "expected a JSON object"),
    "study.json without its study": ("study.json", lambda p: p.write_text(
        p.read_text().replace('"study":', '"studied":')), "study: not a study folder's study.json"),
    "results.parquet garbage": ("results.parquet", garbage, "cannot read it as Parquet"),
    "results.parquet of a serve sweep": ("results.parquet", serve_table, "no column"),
    "timing.json garbage": ("timing.json", garbage, "not a study folder's timing.json"),
    "detail/meta.json garbage": ("detail/meta.json", garbage, "not a detail run's meta.json"),
    "detail/meta.json without its peaks": ("detail/meta.json", lambda p: p.write_text(
        p.read_text().replace('"peaks_GBps":', '"peaks":')), "peaks_GBps"),
    "detail/ops.parquet garbage": ("detail/ops.parquet", garbage, "cannot read it as Parquet"),
    "detail/events.parquet garbage": ("detail/events.parquet", garbage, "cannot read it as Parquet"),
    "plots is a file": ("plots", lambda p: p.write_text("x"), "expected a folder"),
    "report.md is a folder": ("report.md", lambda p: p.mkdir(), "is a folder"),
}


def one_line_naming(code: int, err: str, path) -> str:
    """The one error line, after checking it is one line, exit 2, no traceback, naming ``path``."""
    assert code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith(f"decodesim: {path}:"), err
    return err


def test_an_intact_copy_plots(copy):
    code, out, err = run_cli("plot", str(copy))
    assert code == 0, err
    assert (copy / "plots" / "roofline.png").is_file() and (copy / "report.md").is_file()


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_study_folder_is_one_line_naming_the_file(copy, case):
    name, damage, words = DAMAGE[case]
    damage(copy / name)
    code, out, err = run_cli("plot", str(copy))
    assert words in one_line_naming(code, err, copy / name)
    assert not list(copy.glob("plots/*.png")) and not (copy / "report.md").is_file()  # nothing redrawn


SERVE_STUDY = """
kind: serve
name: tiny-serve
hardware: [h200-sxm]
models: [{model: llama-3.2-1b, weights: bf16}]
kv: [fp16]
rates: [1, 2]
base: {requests: synthetic, duration_s: 2}
"""
SWEEP = ("--requests", "synthetic", "--rates", "1,2", "--duration-s", "2", "--model", "llama-3.2-1b")
REPLOT = {
    "garbage": (garbage, "cannot read it as Parquet"),
    "a study's results table": (lambda p: shutil.copyfile(p.parent.parent / "results.parquet", p), "no column"),
    "another schema": (lambda p: pd.DataFrame({"x": [1]}).to_parquet(p), "no column 'hardware'"),
}


def test_an_intact_serve_table_replots(tmp_path):
    out = tmp_path / "sweep"
    code, stdout, err = run_cli("serve", *SWEEP, "--jobs", "1", "--out", str(out))
    assert code == 0, err
    (out / "report.md").unlink()
    code, stdout, err = run_cli("serve", *SWEEP, "--replot", "--out", str(out))
    assert code == 0, err
    assert (out / "report.md").is_file()


@pytest.mark.parametrize("how", ["options", "study"])
@pytest.mark.parametrize("case", sorted(REPLOT))
def test_a_damaged_serve_table_is_one_line_on_replot(study_dir, tmp_path, case, how):
    out = tmp_path / "sweep"
    out.mkdir()
    shutil.copyfile(study_dir / "results.parquet", tmp_path / "results.parquet")
    damage, words = REPLOT[case]
    damage(out / "table.parquet")
    if how == "study":
        (tmp_path / "serve.yaml").write_text(textwrap.dedent(SERVE_STUDY))
        argv = ["--study", str(tmp_path / "serve.yaml")]
    else:
        argv = list(SWEEP)
    code, stdout, err = run_cli("serve", *argv, "--replot", "--out", str(out))
    assert words in one_line_naming(code, err, out / "table.parquet")
    assert sorted(p.name for p in out.iterdir()) == ["table.parquet"]  # nothing redrawn
