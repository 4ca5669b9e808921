"""Atomic file output: the one way decodesim writes a result file.

Every file is written to a temp file in the target's folder and renamed over the target
(``os.replace``), so a reader sees the old file or the whole new one, and an interrupted
run leaves no partial result that looks complete. Temp files are named ``.<name>.<rand>.tmp``
and removed if the writer fails; files get the umask's mode (a report is for everyone to
read, as a plain ``open()`` would make it).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


FILE_MODE = _umask_mode()


@contextmanager
def atomic_path(path: Path | str, suffix: str = "") -> Iterator[Path]:
    """A temp path beside ``path`` to write; renamed onto ``path`` when the block succeeds,
    removed when it raises. ``suffix`` keeps writers that pick a format by extension happy."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix + ".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_atomic(path: Path | str, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_with(path: Path | str, writer: Callable[[Path], None], suffix: str = "") -> None:
    """Call ``writer(temp_path)`` and move the result onto ``path`` atomically."""
    with atomic_path(path, suffix) as tmp:
        writer(tmp)


def write_frame(frame, path: Path | str) -> None:
    """Write a DataFrame as Parquet (``path``.parquet) and CSV beside it, each atomically."""
    path = Path(path)
    write_with(path.with_suffix(".parquet"), lambda tmp: frame.to_parquet(tmp, index=False))
    write_with(path.with_suffix(".csv"), lambda tmp: frame.to_csv(tmp, index=False))


def to_json(obj) -> str:
    """JSON of results: numpy scalars as numbers, paths as strings, non-finite floats as null."""
    return json.dumps(_finite(obj), indent=2, default=_plain, allow_nan=False)


def _plain(value):
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
