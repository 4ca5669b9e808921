"""Strict JSON Schemas of the ``--json`` outputs, generated from the outputs themselves, and
the one-vocabulary rule they are checked by.

``strict.schema.json`` (beside this module) holds one schema per output kind under
``$defs``: every object lists the keys its producers write, ``additionalProperties: false``,
so a renamed or new key fails validation until the schema is regenerated on purpose
(``python tests/test_json_vocabulary.py --update``, which runs every subcommand's ``--json``
on small inputs and calls ``infer`` here). Objects whose keys are data, not names (a
breakdown's rows, memory levels, energy components), are maps: ``MAP_KEYS`` names them, and
their values share one schema.

``vocabulary_clashes`` says where one quantity appears under two names or two units across
outputs: the same words with two unit words (``kv_pool_GB_per_chip`` and
``kv_pool_bytes_per_chip``), or the same words in another order (``kv_ms`` and ``ms_kv``).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

STRICT_FILE = Path(__file__).resolve().parent / "strict.schema.json"

# objects keyed by data (rows, levels, components, experts, formats), not by field names
MAP_KEYS = frozenset({
    "breakdown_ms", "by_row_J_per_token", "by_component_J_per_token", "tiers", "holds", "peaks_GBps",
    "rows_ms", "matrix_flops_per_cycle", "vector_flops_per_cycle", "memory_pJ_per_bit", "matrix_pJ_per_flop",
    "axes", "by_level", "sources", "experts",
})
DIMENSIONS = {"time": ("ms", "ns", "us", "s"), "size": ("bytes", "B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB"),
              "rate": ("GBps", "TBps"), "energy": ("J", "pJ"), "power": ("W",), "work": ("TFLOPs", "Tops"),
              "frequency": ("GHz",), "share": ("pct", "fraction")}
UNIT_WORDS = frozenset(u for units in DIMENSIONS.values() for u in units)
_DIMENSION = {u: d for d, units in DIMENSIONS.items() for u in units}
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*(_[A-Za-z0-9]+)*")


def _type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def infer(samples: list, key: str | None = None) -> dict:
    """The strict schema every value of ``samples`` (the same field's values across outputs)
    validates against: its JSON types, an object's keys (those present in every sample
    required, ``additionalProperties: false``), a map's shared value schema, an array's items."""
    types = sorted({_type(v) for v in samples})
    schema: dict = {"type": types[0] if len(types) == 1 else types}
    objects = [v for v in samples if isinstance(v, dict)]
    if objects:
        schema.update(_object(objects, key))
    items = [v for s in samples if isinstance(s, list) for v in s]
    if items:
        schema["items"] = infer(items, key)
    return schema


def _object(objects: list[dict], key: str | None) -> dict:
    """An object's keywords: a map's one value schema, or a record's closed list of keys."""
    keys = list(dict.fromkeys(k for o in objects for k in o))
    if key in MAP_KEYS or any(not _NAME.fullmatch(str(k)) for k in keys):
        values = [v for o in objects for v in o.values()]
        return {"additionalProperties": infer(values) if values else {}}
    return {"properties": {k: infer([o[k] for o in objects if k in o], k) for k in keys},
            "required": [k for k in keys if all(k in o for o in objects)], "additionalProperties": False}


def strict_schemas(outputs: dict[str, list[dict]]) -> dict:
    """The strict schema file: ``$defs[kind]`` inferred from every sample output of that kind."""
    defs = {kind: {**infer(samples), "description": f"decodesim {kind} --json (generated from {len(samples)} "
                   f"sample output(s); python tests/test_json_vocabulary.py --update)"}
            for kind, samples in sorted(outputs.items())}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://decodesim.invalid/schema/strict.schema.json",
            "title": "decodesim --json outputs, strict", "$defs": defs}


@lru_cache(maxsize=1)
def strict_schema() -> dict:
    """The committed strict schema file, as a dict."""
    return json.loads(STRICT_FILE.read_text())


def numeric_fields(obj, kind: str, out: dict | None = None) -> dict[str, set[str]]:
    """Every key with a number under it, anywhere in ``obj`` (maps' data keys left out), with
    the kinds of output it appears in."""
    out = defaultdict(set) if out is None else out
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and _NAME.fullmatch(str(k)):
                out[k].add(kind)
            if k not in MAP_KEYS:
                numeric_fields(v, kind, out)
    elif isinstance(obj, list):
        for v in obj:
            numeric_fields(v, kind, out)
    return out


def _split(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    words = name.split("_")
    return tuple(w for w in words if w not in UNIT_WORDS), tuple(w for w in words if w in UNIT_WORDS)


def vocabulary_clashes(fields: dict[str, set[str]]) -> list[str]:
    """Pairs of numeric keys that name one quantity twice: the same words with other unit
    words of the same dimensions (GB and bytes, ms and s; not bytes and ms), or the same
    words in another order."""
    clashes = []
    names = sorted(fields)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            (wa, ua), (wb, ub) = _split(a), _split(b)
            if sorted(wa) != sorted(wb):
                continue
            where = f"{a} ({', '.join(sorted(fields[a]))}) and {b} ({', '.join(sorted(fields[b]))})"
            if ua and ub and sorted(ua) != sorted(ub) and sorted(map(_DIMENSION.get, ua)) == sorted(map(
                    _DIMENSION.get, ub)):
                clashes.append(f"two units: {where}")
            elif sorted(ua) == sorted(ub):
                clashes.append(f"two word orders: {where}")
    return clashes


__all__ = ["STRICT_FILE", "MAP_KEYS", "infer", "strict_schemas", "strict_schema", "numeric_fields",
           "vocabulary_clashes"]
