"""Every subcommand's ``--json`` output validates against the one versioned schema
(sim/schema/output.schema.json, JSON Schema draft 2020-12), uses the same field names for
the same things, and ``run --json`` is the Python API's summary under the envelope."""

from __future__ import annotations

import json
import textwrap

import jsonschema
import pytest

from sim.commands.common import envelope
from sim.schema import SCHEMA_FILE, SCHEMA_VERSION, output_schema
from tests.conftest import ROOT, run_cli

SMALL_RUN = ("--steps", "1", "--context", "1024")
COMMANDS = {
    "run": ("run", *SMALL_RUN, "--json"),
    "run (MoE)": ("run", "--model", "mixtral-8x7b", *SMALL_RUN, "--json"),
    "run (does not fit)": ("run", "--model", "llama-3-70b", "--batch", "64", "--context", "65536", "--steps", "1",
                           "--json"),
    "compare": ("compare", *SMALL_RUN, "--kv", "fp16,kivi-2", "--fidelity-tokens", "128", "--json"),
    "formats": ("formats", "--json"),
    "fidelity": ("fidelity", "--kv", "fp16,int2-asym-outlier", "--synthetic", "tokens=128", "--json"),
    "routing": ("routing", "--steps", "4", "--json"),
    "solve": ("solve", "--vary", "batch", "--range", "1:4", *SMALL_RUN, "--json"),
    "profiles": ("profiles", "--json"),
    "profile sources": ("profiles", "--sources", "h200-sxm", "--json"),
    "search": ("search", "--space", str(ROOT / "tests" / "fixtures" / "search" / "tiny.yaml"), "--jobs", "1", "--quiet",
               "--json"),
    "serve": ("serve", "--requests", "synthetic", "--rate", "20", "--duration-s", "1", "--prompt-median", "100",
              "--output-median", "8", "--json"),
    "serve (sweep)": ("serve", "--requests", "synthetic", "--rates", "10,20", "--duration-s", "1", "--prompt-median",
                      "100", "--output-median", "8", "--jobs", "1", "--json"),
}
# names the schema retired: each thing has one name everywhere
RETIRED = {"p99_ms", "p50_ms", "per_token_ms", "format"}


@pytest.fixture(scope="module")
def validator():
    schema = output_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def keys_in(obj):
    """Every key of every object nested in ``obj``."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield key
            yield from keys_in(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from keys_in(value)


def check(validator, data: dict, kind: str) -> None:
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.path))
    assert not errors, [f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors[:5]]
    assert data["kind"] == kind and data["schema_version"] == SCHEMA_VERSION
    assert not RETIRED & set(keys_in(data)), RETIRED & set(keys_in(data))


@pytest.mark.parametrize("case", sorted(COMMANDS))
def test_every_subcommand_json_validates(validator, case):
    argv = COMMANDS[case]
    code, out, err = run_cli(*argv)
    assert code == 0, err
    data = json.loads(out)
    kind = {"profile sources": "profile-sources"}.get(case, argv[0])
    check(validator, data, kind)


def test_study_json_validates_for_check_and_run(validator, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent("""
        name: s
        base: {model: llama-3-8b, steps: 1, context: 1024}
        sweep:
          grid:
            batch: [1, 2]
            kv: [fp16, int2-asym-outlier]
          exclude:
            - {where: {batch: 2, kv: int2-asym-outlier}, reason: a test}
    """))
    code, out, err = run_cli("study", str(path), "--check", "--json")
    assert code == 0, err
    plan = json.loads(out)
    check(validator, plan, "study")
    assert plan["ran"] is False and plan["excluded"][0]["points"] == 1
    code, out, err = run_cli("study", str(path), "--out", str(tmp_path / "out"), "--jobs", "1", "--no-report",
                             "--json")
    assert code == 0, err
    ran = json.loads(out)
    check(validator, ran, "study")
    assert ran["ran"] and ran["simulated"] == 3 and "results.parquet" in ran["files"]


def test_run_json_is_the_python_summary_under_the_envelope():
    from sim.config.spec import RunSpec
    from sim.run import simulate

    code, out, err = run_cli(*COMMANDS["run"])
    assert code == 0, err
    data = json.loads(out)
    summary = simulate(RunSpec(steps=1, context=1024)).summary
    assert set(data) == {"schema_version", "kind"} | set(summary)
    assert data["per_token_ms_p99"] == pytest.approx(summary["per_token_ms_p99"])


def test_schema_file_is_versioned_and_every_kind_is_documented():
    schema = json.loads(SCHEMA_FILE.read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["version"] == SCHEMA_VERSION and schema["$id"].endswith(SCHEMA_VERSION)
    kinds = set(schema["properties"]["kind"]["enum"])
    assert kinds == set(schema["$defs"])
    assert {argv[0] for argv in COMMANDS.values()} | {"profile-sources", "study"} >= kinds
    for kind in kinds:
        assert schema["$defs"][kind].get("description"), kind


def test_envelope_cannot_be_overwritten_by_a_payload():
    with pytest.raises(ValueError):
        envelope("run", {"kind": "other"})
