"""Every citation in every hardware profile resolves to something shipped in this repository
(docs/sources.md's sections, source ids and anchor headings; calibration/ and docs/ files; a
URL or a named paper or document), and every figure not marked an estimate cites something."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sim.config.sources import SourceIndex, problems, references

ROOT = Path(__file__).resolve().parents[1]
PROFILES = sorted((ROOT / "hardware_profiles").glob("*.yaml"))
# figures that are the profile's own design, not facts about a chip: nothing to cite
SELF_EVIDENT = {"one GPU", "one chip", "one card", "one socket", "one wafer (CS-3)", "one chip (hypothetical)",
                "one chip-wide SRAM backing store (hypothetical design)",
                "the store itself: everything in it is resident",
                "tensor parallel over the whole slice (a common JetStream/MaxText decode sharding); pass --tp/--pp "
                "for others"}


def sourced(node, path=""):
    """(key path, source, estimate) of every sourced value under ``node``."""
    if isinstance(node, dict):
        if isinstance(node.get("source"), str):
            yield path, node["source"], bool(node.get("estimate"))
        for key, value in node.items():
            yield from sourced(value, f"{path}.{key}" if path else key)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from sourced(value, f"{path}[{i}]")


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.stem)
def test_every_citation_of_the_profile_resolves(profile):
    text = profile.read_text()
    assert "../shared/" not in text, f"{profile.name} points outside the repository"
    values = list(sourced(yaml.safe_load(text)))
    assert values
    bad = [(path, problems(source)) for path, source, _ in values if problems(source)]
    assert not bad, f"{profile.name}: unresolved citations {bad[:5]}"
    uncited = [path for path, source, estimate in values
               if not estimate and not references(source) and source not in SELF_EVIDENT]
    assert not uncited, f"{profile.name}: figures that are not estimates cite nothing: {uncited}"


def test_the_resolver_finds_what_is_not_there():
    """Each citation form, present and absent."""
    assert problems("188 TF fp16 (sources.md 5, Q1)") == []
    assert problems("legacy name (hardware_facts.md 9.3, D3)") == []
    assert problems("(sources.md 13, Q1)") == ["section 13 of docs/sources.md"]
    assert problems("(N4/N99)") == ["source id N99 (not in docs/sources.md section 10)"]
    assert problems("A100 x H100 at 900 MHz, C2C links, SN40L, E4M3") == []  # names, not ids
    assert problems("(A11nr)") == []
    assert problems("anchors.md D3 and anchors.md B1") == ["anchors.md B1 (no such heading in docs/sources.md)"]
    assert problems("measured: calibration/energy/SOURCES.md") == []
    assert problems("measured: calibration/no-such-file.csv") == ["calibration/no-such-file.csv (no such file)"]
    assert problems("see ../shared/notes") == ["../shared/ (outside the repository)"]
    assert references("NVIDIA PTX ISA, tcgen05.mma") == 1 and references("not published") == 0


def test_sources_md_lists_every_id_it_is_cited_by():
    idx = SourceIndex((ROOT / "docs" / "sources.md").read_text())
    assert {"N4", "Q1", "G4", "SN1", "AP3", "D8", "H4"} <= idx.ids
    assert {"1", "5", "9.3", "10", "12"} <= idx.sections and idx.anchors == {"C1", "D3"}
