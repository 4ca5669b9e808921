"""Every bundled study regenerates identically: its table and report, from a clean folder, match
what is committed under reports/ apart from the lines that state time or the simulator's version.

This is the guard for refactors of the engine, the costs and the report layer: a change that
moves any simulated figure in the four bundled studies shows here as the first differing cell.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from sim.study import load_study, run_study

ROOT = Path(__file__).resolve().parent.parent
STUDIES = ["hbm-bandwidth-what-if", "kv-format-frontier", "seed-claims", "sram-capacity-for-moe"]

# columns that are about the run rather than the simulated machine: the point's content hash
# names the simulator's source version, and wall time is the host's
RUN_COLUMNS = {"hash", "wall_s"}
# report lines that state the version or the run's timing and cache use
RUN_LINES = re.compile(r"^- (Simulator|Runs): ")


def report_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if not RUN_LINES.match(line)]


@pytest.fixture
def unrendered(monkeypatch):
    """Figures are built (every plot function runs) but not rendered: what this guard compares
    is the table and report.md, and rendering the bundled studies' PNGs and SVGs took about a
    third of its time (tests/test_plots.py renders and checks the figures themselves)."""
    from matplotlib.figure import Figure

    def savefig(self, fname, **_kwargs):
        Path(fname).write_bytes(b"")

    monkeypatch.setattr(Figure, "savefig", savefig)


@pytest.mark.parametrize("name", STUDIES)
def test_bundled_study_regenerates_identically(name, tmp_path, unrendered):
    study = load_study(name)
    result = run_study(study, tmp_path / name, jobs=2, progress=False, report=True)
    assert result.failed == 0
    fresh = pd.read_csv(result.out_dir / "results.csv")
    committed = pd.read_csv(ROOT / "reports" / name / "results.csv")
    assert list(fresh.columns) == list(committed.columns)
    assert len(fresh) == len(committed)
    for column in fresh.columns:
        if column in RUN_COLUMNS:
            continue
        a, b = fresh[column], committed[column]
        same = (a == b) | (a.isna() & b.isna())
        if not same.all():
            row = int((~same).to_numpy().nonzero()[0][0])
            raise AssertionError(f"{name}: results.csv column {column!r} row {row}: regenerated "
                                 f"{a.iloc[row]!r}, committed {b.iloc[row]!r}")
    fresh_report = report_lines(result.out_dir / "report.md")
    committed_report = report_lines(ROOT / "reports" / name / "report.md")
    for i, (x, y) in enumerate(zip(fresh_report, committed_report)):
        assert x == y, f"{name}: report.md line {i + 1} differs:\n  regenerated: {x}\n  committed:   {y}"
    assert len(fresh_report) == len(committed_report)
