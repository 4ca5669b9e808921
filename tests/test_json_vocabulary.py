"""One vocabulary for every ``--json`` output (issue 42, item 4): each subcommand's output
validates against its strict schema (sim/schema/strict.schema.json: every object closed with
``additionalProperties: false``, generated from the outputs), and no quantity appears under
two names or two units across run, compare, fidelity, serve, sweeps, search and studies.

After a deliberate change of an output's keys, regenerate the strict schemas with
``python tests/test_json_vocabulary.py --update`` (and read the diff).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

import jsonschema
import pytest

from sim.schema.strict import STRICT_FILE, numeric_fields, strict_schema, strict_schemas, vocabulary_clashes
from tests.conftest import run_cli
from tests.test_json_schema import COMMANDS

SAMPLES = {
    **COMMANDS,
    "run (wafer)": ("run", "--hardware", "cerebras-wse3", "--steps", "1", "--context", "1024", "--json"),
    "run (analytic, no energy)": ("run", "--hardware", "groq-lpu-576", "--engine", "analytic", "--steps", "1",
                                  "--json"),
    "study (check)": ("study", "hbm-bandwidth-what-if", "--check", "--json"),
}
# one quantity under two units, kept for now: each is a column of a bundled table (reports/search/*,
# reports/serving-rate-vs-kv) that its owners regenerate; the test fails if one goes and the
# other stays listed, and for any new clash
KNOWN = {
    "two units: e2e_ms_mean (serve) and mean_e2e_s (serve)",
    "two units: kv_pool_GB_per_chip (search) and kv_pool_bytes_per_chip (serve)",
    "two units: weights_GB_per_chip (search) and weights_bytes_per_chip (serve)",
}
RETIRED = {"attn_output_rel_error"}  # compare's name for fidelity's output_rel_error


def kind_of(case: str) -> str:
    return {"profile sources": "profile-sources"}.get(case, case.split(" (")[0])


def outputs() -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = defaultdict(list)
    for case, argv in SAMPLES.items():
        code, out, err = run_cli(*argv)
        assert code == 0, f"{case}: {err}"
        found[kind_of(case)].append(json.loads(out))
    return dict(found)


@pytest.fixture(scope="module")
def sampled():
    return outputs()


def test_every_output_validates_against_its_strict_schema(sampled):
    schema = strict_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert set(schema["$defs"]) == set(sampled)
    for kind, samples in sampled.items():
        validator = jsonschema.Draft202012Validator({**schema["$defs"][kind], "$defs": schema["$defs"]})
        for data in samples:
            errors = sorted(validator.iter_errors(data), key=lambda e: list(e.path))
            assert not errors, (kind, [f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors[:5]])


def test_the_strict_schemas_are_closed_and_catch_a_renamed_key(sampled):
    def objects(schema):
        if isinstance(schema, dict):
            if schema.get("type") == "object" or "object" in (schema.get("type") or []):
                yield schema
            for value in schema.values():
                yield from objects(value)

    for kind, definition in strict_schema()["$defs"].items():
        for obj in objects(definition):
            assert obj.get("additionalProperties") is False or isinstance(obj.get("additionalProperties"), dict), kind
    run = dict(sampled["run"][0])
    run["per_token_p99_ms"] = run.pop("per_token_ms_p99")
    validator = jsonschema.Draft202012Validator(strict_schema()["$defs"]["run"])
    assert any("per_token_p99_ms" in e.message for e in validator.iter_errors(run))


def test_no_quantity_has_two_names_or_two_units(sampled):
    fields: dict[str, set[str]] = defaultdict(set)
    for kind, samples in sampled.items():
        for data in samples:
            numeric_fields(data, kind, fields)
    assert not RETIRED & set(fields), RETIRED & set(fields)
    clashes = set(vocabulary_clashes(fields))
    assert clashes - KNOWN == set(), sorted(clashes - KNOWN)
    assert KNOWN <= clashes, f"fixed, take them off KNOWN: {sorted(KNOWN - clashes)}"
    assert vocabulary_clashes({"kv_ms": {"compare"}, "ms_kv": {"run"}, "weights_GB": {"a"}, "weights_bytes": {"b"},
                               "kv_ms_p99": {"a"}}) == ["two word orders: kv_ms (compare) and ms_kv (run)",
                                                        "two units: weights_GB (a) and weights_bytes (b)"]


if __name__ == "__main__" and "--update" in sys.argv:
    STRICT_FILE.write_text(json.dumps(strict_schemas(outputs()), indent=1) + "\n")
    print(f"wrote {STRICT_FILE}")
