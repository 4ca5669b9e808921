"""Files a study derives from other files, rewritten only when what they are made from changed.

A study folder holds two derived steps: the table (``results.parquet``/``.csv``, from the
cached runs) and the drawings (plots, ``report.md``, ``report.html``, from the table,
``study.json`` and the detail point). A re-run whose points are all cached would otherwise
spend seconds importing pandas and matplotlib to write the same bytes again.

``<out>/cache/stamps.json`` records, per step, a digest of its inputs and the SHA-256 of
every file the step wrote. A step is skipped while its inputs' digest is unchanged and each
of its files is still there with the bytes it was written with (a file deleted or edited by
hand is rewritten). The inputs always include a digest of the whole ``sim`` package's
source, so a change to the code that writes a file writes it again. Stamps are written
atomically, after the files they vouch for.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from sim.io import write_atomic

STAMPS = Path("cache") / "stamps.json"


@lru_cache(maxsize=1)
def source_digest() -> str:
    """SHA-256 of every Python file of the ``sim`` package (names and bytes)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def digest(*parts: str | bytes) -> str:
    """SHA-256 of ``parts`` (texts or bytes) and the package source, each part delimited."""
    h = hashlib.sha256(source_digest().encode())
    for part in parts:
        h.update(b"\0")
        h.update(part.encode() if isinstance(part, str) else part)
    return h.hexdigest()


def files_digest(paths: list[Path]) -> str:
    """``digest`` of the bytes of ``paths`` (a missing file counts as missing, not as empty)."""
    return digest(*(f"{p.name}:{_file_sha(p) or 'missing'}" for p in paths))


def _file_sha(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _stamps(out: Path) -> dict:
    try:
        data = json.loads((out / STAMPS).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def fresh(out: Path, step: str, inputs: str) -> bool:
    """True when ``step`` last ran on ``inputs`` and every file it wrote is as it wrote it."""
    stamp = _stamps(out).get(step)
    if not isinstance(stamp, dict) or stamp.get("inputs") != inputs or not isinstance(stamp.get("files"), dict):
        return False
    return all(_file_sha(out / name) == sha for name, sha in stamp["files"].items())


def record(out: Path, step: str, inputs: str, files: list[Path]) -> None:
    """Note that ``step`` wrote ``files`` (paths inside ``out``) from ``inputs``."""
    stamps = _stamps(out)
    stamps[step] = {"inputs": inputs,
                    "files": {str(Path(f).relative_to(out)): _file_sha(Path(f)) for f in sorted(files)}}
    write_atomic(out / STAMPS, json.dumps(stamps, indent=1, sort_keys=True))

