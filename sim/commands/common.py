"""What the subcommands' handlers share: the ``--json`` envelope and byte formatting (the run
options, which the explorer parses too, are sim.options.run).

Every ``--json`` output is one JSON object: ``{"schema_version": "2.0", "kind": "<subcommand>",
...payload}``, described by the versioned JSON Schema ``sim/schema/output.schema.json``
(draft 2020-12; ``sim.schema.output_schema()`` loads it). The same field names are used
everywhere: ``per_token_ms_p50`` / ``per_token_ms_p99`` for latency, ``kv`` for a KV-cache
format, ``weights`` for a weight format, units in every other name. ``schema_version`` is
bumped (major) when a field is renamed or removed, (minor) when one is added.
"""

from __future__ import annotations

from sim.io import to_json, write_atomic, write_frame
from sim.schema import SCHEMA_VERSION
from sim.units import GB, KB, MB, TB

__all__ = ["fmt_bytes", "to_json", "write_atomic", "write_frame", "emit_json", "envelope"]


def fmt_bytes(n: float) -> str:
    for unit, size in (("TB", TB), ("GB", GB), ("MB", MB), ("KB", KB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def envelope(kind: str, payload: dict) -> dict:
    """``payload`` under the versioned envelope every ``--json`` output has."""
    reserved = {"schema_version", "kind"} & set(payload)
    if reserved:
        raise ValueError(f"payload may not set {sorted(reserved)}")
    return {"schema_version": SCHEMA_VERSION, "kind": kind, **payload}


def emit_json(kind: str, payload: dict) -> None:
    """Print one ``--json`` output: the envelope and ``payload`` (sim/schema/output.schema.json)."""
    print(to_json(envelope(kind, payload)))
