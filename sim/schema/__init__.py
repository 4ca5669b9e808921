"""The JSON Schema of every ``--json`` output (``output.schema.json``, draft 2020-12).

``SCHEMA_VERSION`` is written into every output's ``schema_version``; the schema file's
``$id`` and ``version`` carry the same number (a test checks they agree).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

SCHEMA_VERSION = "2.0"
SCHEMA_FILE = Path(__file__).resolve().parent / "output.schema.json"


@lru_cache(maxsize=1)
def output_schema() -> dict:
    """The schema of every ``--json`` output, as a dict."""
    return json.loads(SCHEMA_FILE.read_text())


__all__ = ["SCHEMA_VERSION", "SCHEMA_FILE", "output_schema"]
