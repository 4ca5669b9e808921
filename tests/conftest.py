"""Shared fixtures: the repository root and small helpers to run the CLI in-process."""

from __future__ import annotations

import io
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def root() -> Path:
    return ROOT


def run_cli(*argv: str) -> tuple[int, str, str]:
    """Run ``decodesim ARGV`` in-process; returns (exit code, stdout, stderr)."""
    from sim.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse errors
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def cli():
    return run_cli


sys.path.insert(0, str(ROOT))
