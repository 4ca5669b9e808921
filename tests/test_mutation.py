"""Property test: any mutation of a bundled profile either loads or fails with one line.

Mutations drop a key, add an unknown key, retype a value or negate a number at a random path
of the YAML tree. Every mutant must give exit status 0 (it is still a valid profile) or 2
with a single stderr line naming the file; never a traceback or another exit status.
"""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, run_cli

PROFILES = sorted((ROOT / "hardware_profiles").glob("*.yaml"))


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, child in node.items():
            yield from _paths(child, prefix + (key,))
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _paths(child, prefix + (i,))


def _parent(data, path):
    node = data
    for part in path[:-1]:
        node = node[part]
    return node


REPLACEMENTS = st.sampled_from(["text", None, [], {}, True, -1, 0, 1e308, "nan", [1, 2], {"value": 1}])


@st.composite
def mutants(draw):
    profile = draw(st.sampled_from(PROFILES))
    data = yaml.safe_load(profile.read_text())
    paths = [p for p in _paths(data) if p]
    path = draw(st.sampled_from(paths))
    action = draw(st.sampled_from(["drop", "add", "retype", "negate"]))
    data = copy.deepcopy(data)
    parent = _parent(data, path)
    key = path[-1]
    if action == "drop":
        del parent[key]
    elif action == "add":
        if isinstance(parent[key], dict):
            parent[key]["unexpected_key"] = draw(REPLACEMENTS)
        elif isinstance(parent, dict):
            parent["unexpected_key"] = draw(REPLACEMENTS)
        else:
            parent.append(draw(REPLACEMENTS))
    elif action == "retype":
        parent[key] = draw(REPLACEMENTS)
    elif isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
        parent[key] = -parent[key]
    else:
        parent[key] = -1
    return profile.name, data


def _check(tmp_path_factory, mutant):
    name, data = mutant
    path = tmp_path_factory.mktemp("mut") / name
    path.write_text(yaml.safe_dump(data))
    code, _out, err = run_cli("run", "--hardware", str(path), "--steps", "1", "--context", "256", "--engine", "analytic")
    assert code in (0, 2), err
    if code == 2:
        assert err.count("\n") == 1 and "Traceback" not in err and str(path) in err, err


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(mutant=mutants())
def test_mutated_profiles_load_or_fail_with_one_line(tmp_path_factory, mutant):
    _check(tmp_path_factory, mutant)


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(mutant=mutants())
def test_mutated_profiles_many(tmp_path_factory, mutant):
    _check(tmp_path_factory, mutant)
