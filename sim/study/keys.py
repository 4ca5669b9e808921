"""The key of a study point: a content hash of everything that can change its result.

The SHA-256 of the resolved configuration: the normalised RunSpec, the validated hardware
profile and model after overrides, the bytes of the format and trace files it reads, and
the simulator version (the package version plus a digest of the simulator's own source, so
a change to the engine invalidates the cache). Shared by the study spec (which resolves
every point up front) and the runner (which caches by it).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

import sim
from sim.config.spec import RunSpec, apply_run_overrides
from sim.setup import RunSetup, resolve


@lru_cache(maxsize=1)
def simulator_version() -> str:
    """``<package version>+<digest of the simulator source>`` (study, report and CLI code excluded)."""
    root = Path(sim.__file__).resolve().parent
    digest = hashlib.sha256()
    skip = {"study", "report", "commands", "_bundled"}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in skip or rel.name == "cli.py":
            continue
        digest.update(str(rel).encode())
        digest.update(path.read_bytes())
    return f"{sim.__version__}+{digest.hexdigest()[:12]}"


def _file_bytes(path: str | None) -> bytes:
    if not path:
        return b""
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""


def content_hash(spec: RunSpec, extra: str = "", res: RunSetup | None = None) -> str:
    """The key of one run: everything that can change its result, and nothing else.
    ``res`` is ``resolve(spec)`` when the caller already has it (saves resolving twice)."""
    res = resolve(spec) if res is None else res
    h = hashlib.sha256()
    for part in (simulator_version(), extra, apply_run_overrides(spec).model_dump_json(),
                 res.hardware.model_dump_json(), res.model.model_dump_json()):
        h.update(part.encode())
        h.update(b"\0")
    for fmt in (res.weights, res.kv):
        h.update(_file_bytes(getattr(fmt, "file", None)))
        h.update(b"\0")
    for value in apply_run_overrides(spec).model_dump().values():  # trace and any other file a field names
        if isinstance(value, str) and ("/" in value or value.endswith((".jsonl", ".parquet", ".csv", ".yaml"))):
            h.update(_file_bytes(value))
    return h.hexdigest()[:20]
