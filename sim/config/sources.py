"""Citations in ``source:`` strings and what they resolve to in the repository.

A hardware profile's figures cite their sources in a few forms, each of which must lead a reader
to something shipped here:

* ``sources.md N`` or ``sources.md N, ID``: section ``N`` (``9.3``) of docs/sources.md and a
  source id of its list (section 10); ``hardware_facts.md`` is the name that file was compiled
  under, and means the same;
* a bare source id (``N4``, ``Q1``, ``A11nr``, ``N4/N5``): an id of that list;
* ``anchors.md C1``: a section of docs/sources.md headed so (section 12);
* ``calibration/...`` or ``docs/...``: a file or folder of the repository;
* a URL, a paper (``arXiv``, ``ISCA``, ``ISSCC``), a standard (``JESD``) or a vendor document
  (``datasheet``, ``whitepaper``, ``PTX ISA``) named in the text.

``problems(text)`` lists the citations in ``text`` that do not resolve; ``references(text)``
counts those that do. Reads docs/sources.md once; no YAML, no network.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

FACTS = r"(?:sources|hardware_facts)\.md"
SECTION = re.compile(FACTS + r"(?:\s+(\d+(?:\.\d+)?))?")
ANCHOR = re.compile(r"anchors\.md\s+([A-D]\d)")
SOURCE_ID = re.compile(r"(?<![\w.-])((?:SN|AP|N|A|G|I|Q|C|T|D|H)\d{1,2})(nr)?(?![\w-])")
PATH = re.compile(r"(?<![\w/.])((?:calibration|docs)/[\w./-]*[\w/])")
URL = re.compile(r"https?://\S+")
TITLED = re.compile(r"arXiv|ISCA|ISSCC|NeurIPS|MLSys|JESD\d|datasheet|whitepaper|white paper|PTX ISA|"
                    r"Specification|Technical Blog|Hot Chips|model card|config\.json", re.IGNORECASE)


class SourceIndex:
    """The sections, source ids and anchor headings of docs/sources.md."""

    def __init__(self, text: str):
        self.sections = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.?\s", text, re.MULTILINE))
        self.ids = set(re.findall(r"^- ([A-Z]{1,2}\d{1,2}) ", text, re.MULTILINE))
        self.anchors = set(re.findall(r"^### anchors\.md ([A-D]\d)", text, re.MULTILINE))


@cache
def repo_root() -> Path:
    """The checkout this module runs from (docs/ and calibration/ beside sim/)."""
    return Path(__file__).resolve().parents[2]


@cache
def index(root: Path | None = None) -> SourceIndex:
    """docs/sources.md of ``root`` (the checkout by default), read once."""
    return SourceIndex(((root or repo_root()) / "docs" / "sources.md").read_text(encoding="utf-8"))


def _without_urls(text: str) -> str:
    return URL.sub(" ", text)


def problems(text: str, root: Path | None = None) -> list[str]:
    """Every citation in ``text`` that resolves to nothing shipped, each as a short phrase."""
    root = root or repo_root()
    idx = index(root)
    body = _without_urls(text)
    out = [f"section {m.group(1)} of docs/sources.md" for m in SECTION.finditer(body)
           if m.group(1) and m.group(1) not in idx.sections]
    out += [f"anchors.md {a} (no such heading in docs/sources.md)" for a in ANCHOR.findall(body)
            if a not in idx.anchors]
    rest = ANCHOR.sub(" ", body)
    out += [f"source id {m.group(1)} (not in docs/sources.md section 10)" for m in SOURCE_ID.finditer(rest)
            if m.group(1) not in idx.ids]
    out += [f"{p} (no such file)" for p in PATH.findall(body) if not (root / p).exists()]
    if "../shared/" in text:
        out.append("../shared/ (outside the repository)")
    return out


def references(text: str) -> int:
    """How many citations ``text`` makes (of any form above), resolved or not."""
    body = _without_urls(text)
    return (len(URL.findall(text)) + len(SECTION.findall(body)) + len(ANCHOR.findall(body))
            + len(SOURCE_ID.findall(ANCHOR.sub(" ", body))) + len(PATH.findall(body)) + len(TITLED.findall(body)))
