"""Packaging: every package under sim/ and every bundled data folder is installed."""

from __future__ import annotations

import tomllib

from tests.conftest import ROOT


def _config():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_sim_package_is_listed():
    listed = set(_config()["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "sim").rglob("__init__.py")}
    assert found <= listed, f"add to pyproject.toml [tool.setuptools] packages: {sorted(found - listed)}"


def test_every_bundled_folder_is_mapped():
    mapped = set(_config()["package-dir"].values())
    folders = {"hardware_profiles"} | {f"workloads/{p.name}" for p in (ROOT / "workloads").iterdir() if p.is_dir()}
    assert folders <= mapped, f"map in pyproject.toml package-dir: {sorted(folders - mapped)}"
