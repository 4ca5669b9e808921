"""The README's tour runs as written: every `decodesim ...` line of its tour block exits 0."""

from __future__ import annotations

import re
import shlex

import pytest

from tests.conftest import ROOT, run_cli


def _tour_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    tour = text.split("## A 60-second tour", 1)[1].split("\n## ", 1)[0]
    return [re.split(r"\s+#", line.strip(), maxsplit=1)[0] for line in tour.splitlines()
            if line.strip().startswith("decodesim ")]


@pytest.mark.parametrize("command", _tour_commands())
def test_readme_tour_command_runs(command, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = shlex.split(command)[1:]
    argv = [str(tmp_path / a) if a.startswith("out/") else a for a in argv]
    code, out, err = run_cli(*argv)
    assert code == 0, err
    assert out.strip()
