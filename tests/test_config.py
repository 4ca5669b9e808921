"""Loading the bundled profiles and models, and every class of bad input."""

from __future__ import annotations

import os
import textwrap

import pytest
import yaml

from sim import load_model, load_profile
from sim.config.hardware import HardwareProfile, sources
from sim.config.loader import apply_override, load_yaml, validate
from sim.config.spec import RunSpec
from sim.errors import ConfigError
from sim.paths import hardware_dir
from sim.setup import resolve

H200 = "hardware_profiles/h200-sxm.yaml"


def test_bundled_h200_loads_with_derived_peaks(root):
    hw = load_profile("h200-sxm")
    assert hw.store.peak_GBps == pytest.approx(4800)
    assert hw.compute.matrix_peak_TFLOPs("bf16") == pytest.approx(989.4, rel=1e-3)
    assert all(src.strip() for _path, _v, src, _e in sources(hw))


def test_models_have_the_published_parameter_counts():
    assert load_model("llama-3-8b").total_params == pytest.approx(8.03e9, rel=0.002)
    assert load_model("llama-3-70b").total_params == pytest.approx(70.55e9, rel=0.002)


def _write(tmp_path, text, name="p.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _mutated(root, tmp_path, mutate):
    data = yaml.safe_load((root / H200).read_text())
    mutate(data)
    path = tmp_path / "mutant.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("mutate, expect", [
    (lambda d: d["memory"][0].pop("capacity_GB"), "memory.hbm.capacity_GB: required key is missing"),
    (lambda d: d["memory"][0].update(capacity_gb={"value": 1, "source": "x"}), "unknown key; allowed keys:"),
    (lambda d: d["compute"]["tiles"].update(value="many"), "compute.tiles.value: must be a whole number"),
    (lambda d: d["compute"]["tiles"].update(value=0), "compute.tiles.value: must be >= 1"),
    (lambda d: d["memory"][0]["channel_bandwidth_GBps"].update(value=-5), "channel_bandwidth_GBps.value: must be > 0"),
    (lambda d: d["memory"][0]["stream_efficiency"].update(value=1.5), "must be a fraction in (0, 1]"),
    (lambda d: d["memory"][0]["latency_ns"].update(source=""), "source must name"),
    (lambda d: d["memory"][0]["latency_ns"].update(value="1e3"),  # YAML 1.1 reads 1e3 as text
     "latency_ns.value: must be a number; YAML reads an exponent without a decimal point as text: write 1.0e3"),
    (lambda d: d["memory"][1].update(name="hbm"), "memory level names must be unique"),
])
def test_bad_profile_gives_one_line_naming_file_and_key(root, tmp_path, cli, mutate, expect):
    path = _mutated(root, tmp_path, mutate)
    code, out, err = cli("run", "--hardware", str(path), "--steps", "1")
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert str(path) in err and expect in err


def test_yaml_syntax_error_names_line(tmp_path, cli):
    path = _write(tmp_path, "name: x\nmemory: [\n  - kind: hbm\n")
    code, _out, err = cli("run", "--hardware", str(path))
    assert code == 2 and "YAML syntax error at line" in err and str(path) in err


def test_missing_file_and_unknown_name(cli):
    code, _o, err = cli("run", "--hardware", "no/such/file.yaml")
    assert code == 2 and "no/such/file.yaml: hardware file not found" in err
    code, _o, err = cli("run", "--model", "llama-9000")
    assert code == 2 and "unknown model 'llama-9000'" in err and "llama-3-8b" in err


def test_top_level_must_be_a_mapping(tmp_path):
    path = _write(tmp_path, "- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping at the top level, not a list"):
        load_yaml(path)
    path.write_text("# only a comment\n")
    with pytest.raises(ConfigError, match="the file is empty .or only comments.; expected a mapping"):
        load_yaml(path)


def test_safe_loading_refuses_python_tags(tmp_path):
    path = _write(tmp_path, "name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="YAML syntax error"):
        load_yaml(path)


@pytest.mark.parametrize("setting, expect", [
    ("hardware.hbm.nonsense=1", "--set: hardware.hbm.nonsense: no such key; allowed keys:"),
    ("hardware.hbm.capacity_GB=0", "must be > 0"),
    ("model.layers=-3", "--set: model.layers: must be a whole number in [1, 10,000], got -3"),
    ("model.heads=7", "heads (7) must be a multiple of kv_heads"),
    ("bogus=1", "bogus: no such path"),
    ("hardware.hbm.capacity_GB.value.deeper=1", "is a value, not a section"),
    ("noequals", "expected DOTTED.PATH=VALUE"),
])
def test_bad_set_paths(cli, setting, expect):
    code, _out, err = cli("run", "--steps", "1", "--set", setting)
    assert code == 2, err
    assert expect in err and err.count("\n") == 1


def test_override_sets_value_and_records_source(root):
    raw = load_yaml(root / H200)
    new = apply_override(raw, "memory.hbm.channel_bandwidth_GBps", 50, HardwareProfile, H200)
    hw = validate(HardwareProfile, new, H200)
    assert hw.store.peak_GBps == pytest.approx(50 * 192)
    assert hw.store.channel_bandwidth_GBps.source.startswith("override")
    scaled = validate(HardwareProfile, apply_override(raw, "memory.hbm.channel_bandwidth_GBps", {"scale": 2},
                                                      HardwareProfile, H200), H200)
    assert scaled.store.peak_GBps == pytest.approx(9600)
    assert raw["memory"][0]["channel_bandwidth_GBps"]["value"] == 25.0  # the original is untouched


def test_bad_cli_values_exit_2(cli):
    for argv in (("run", "--batch", "0"), ("run", "--context", "-4"), ("run", "--batch", "two"),
                 ("run", "--engine", "quantum")):
        code, out, err = cli(*argv)
        assert code == 2 and out == "" and err.count("\n") == 1, (argv, err)


LIMIT_CASES = [
    ("a: 1\na: 2\n", "a: duplicate key"),
    ("x: " + "[" * 45 + "]" * 45 + "\n", "nested deeper than 40 levels"),
    ("a: &v 1\nb: [" + ", ".join(["*v"] * 201) + "]\n", "more than 200 YAML aliases"),
    ("a: [1\n", "YAML syntax error at line 2, column 1"),
]


@pytest.mark.parametrize("pure_python", [False, True])
def test_loader_limits_hold_with_and_without_libyaml(pure_python):
    """The strict loader takes its events from libyaml where PyYAML has it and from PyYAML's
    pure-Python parser otherwise; duplicate keys, nesting, aliases and syntax errors are the
    same one-line errors either way (checked in a fresh interpreter with libyaml hidden)."""
    import json
    import subprocess
    import sys

    hide = ("import builtins; real = builtins.__import__\n"
            "def fake(name, *a, **k):\n"
            "    if name == 'yaml._yaml': raise ImportError(name)\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = fake\n") if pure_python else ""
    script = hide + (
        "import json, sys\n"
        "from sim.config.loader import _EventSource, parse_yaml\n"
        "from sim.errors import ConfigError\n"
        "out = [_EventSource.__module__, parse_yaml('a: 1\\nb: [x, y]\\n', 't')]\n"
        f"for text, _ in {LIMIT_CASES!r}:\n"
        "    try:\n"
        "        parse_yaml(text, 't'); out.append(None)\n"
        "    except ConfigError as err:\n"
        "        out.append(str(err))\n"
        "print(json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    source, parsed, *errors = json.loads(done.stdout)
    assert (source == "sim.config.loader") == pure_python
    assert parsed == {"a": 1, "b": ["x", "y"]}
    for (_, expect), err in zip(LIMIT_CASES, errors, strict=True):
        assert err is not None and expect in err and "\n" not in err


def test_runs_of_one_machine_share_its_resolution_until_a_file_changes(tmp_path):
    """The points of a sweep over batch and context resolve the machine once (the same profile,
    stack and format objects, hence one cost model); an edited profile is read again; an
    override whose value does not hash (a scale) is resolved afresh every time."""
    def setup(**kw):
        return resolve(validate(RunSpec, dict(steps=1, **kw), "test"))

    profile = tmp_path / "h200-copy.yaml"
    profile.write_text((hardware_dir() / "h200-sxm.yaml").read_text())
    a, b = setup(hardware=str(profile), batch=2), setup(hardware=str(profile), batch=5, context=300, engine="analytic")
    assert a.hardware is b.hardware and a.model is b.model and a.stack is b.stack
    assert a.weights is b.weights and a.kv is b.kv and (a.tp, a.q_width) == (b.tp, b.q_width)
    assert setup(hardware=str(profile), batch=2, weights="int8").weights is not a.weights
    profile.write_text(profile.read_text().replace("channel_bandwidth_GBps: {value: 25.0,",
                                                   "channel_bandwidth_GBps: {value: 50.0,"))
    stat = profile.stat()
    os.utime(profile, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a new version even on a coarse clock
    edited = setup(hardware=str(profile), batch=2)
    assert edited.hardware is not a.hardware
    assert edited.hardware.store.peak_GBps == 2 * a.hardware.store.peak_GBps
    scaled = [setup(batch=2, overrides=[("hardware.hbm.channel_bandwidth_GBps", {"scale": 2})]) for _ in range(2)]
    assert scaled[0].hardware is not scaled[1].hardware
    assert scaled[0].hardware.store.peak_GBps == scaled[1].hardware.store.peak_GBps == edited.hardware.store.peak_GBps
