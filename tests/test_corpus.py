"""A corpus of bad and hostile inputs over every surface a user hands decodesim (issue 43): run
and compare options, odd output names, serve request files, search spaces, studies, software
stacks, hardware energy sections and spatial deployments.

``tests/corpus/cases.yaml`` lists hand-written cases; the generators below add variants of the
bundled files with one thing wrong each (a sourced number made negative, text or NaN, a key
removed, an unknown key added, a value no schema allows). Every case runs the CLI in this
process and must end with exit status 2 and exactly one stderr line that starts
``decodesim: ``, names the file or key, and is no traceback (an exception escaping ``main``
fails the test): 0 tracebacks, 0 nonsense accepted. No case simulates more than a step or two,
so the whole corpus runs in seconds; there is no time assertion (the I/O cases that need real
processes are tests/test_io_failures.py).
"""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from tests.conftest import ROOT, run_cli

CASES = yaml.safe_load((ROOT / "tests" / "corpus" / "cases.yaml").read_text())
QUICK = ["--steps", "1", "--engine", "analytic"]
BAD_NUMBERS = (("neg", -1), ("text", "lots"), ("nan", float("nan")))


def _leaves(node, path=()):
    """(path, leaf dict) for every sourced quantity ({value: ...}) under ``node``."""
    if isinstance(node, dict):
        if "value" in node and not isinstance(node["value"], (dict, list)):
            yield path, node
            return
        for key, child in node.items():
            yield from _leaves(child, (*path, key))


def _at(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def _dump(doc) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def _sourced_variants(tag: str, base: dict, section: tuple, argv, name: str, skip=()):
    """Each sourced number under ``base[section]`` made -1, text and NaN; each of its keys
    removed (where required) and an unknown key added beside it."""
    for path, _leaf in _leaves(_at(base, section), section):
        dotted = ".".join(map(str, path))
        if dotted in skip:
            continue
        for label, bad in BAD_NUMBERS:
            doc = copy.deepcopy(base)
            _at(doc, path)["value"] = bad
            yield f"{tag}-{dotted}-{label}", argv, {name: _dump(doc)}, dotted
        doc = copy.deepcopy(base)
        _at(doc, path[:-1])[f"{path[-1]}_typo"] = copy.deepcopy(_at(base, path))
        yield f"{tag}-{dotted}-unknown-key", argv, {name: _dump(doc)}, f"{path[-1]}_typo"


def _energy_cases():
    base = yaml.safe_load((ROOT / "hardware_profiles" / "h200-sxm.yaml").read_text())
    argv = ["run", "--hardware", "{dir}/hw.yaml", *QUICK]
    yield from _sourced_variants("energy", base, ("energy",), argv, "hw.yaml",
                                 skip={"energy.host_W", "energy.noc_pJ_per_bit", "energy.host_link_pJ_per_bit",
                                       "energy.chip_link_pJ_per_bit", "energy.idle_W"})
    for key in ("noc_pJ_per_bit", "host_link_pJ_per_bit", "chip_link_pJ_per_bit", "host_W", "idle_W"):
        for label, bad in (("neg", -1), ("text", "lots")):  # these may be 0, never negative or text
            doc = copy.deepcopy(base)
            doc["energy"][key]["value"] = bad
            yield f"energy-{key}-{label}", argv, {"hw.yaml": _dump(doc)}, f"energy.{key}"
    for key in ("memory_pJ_per_bit", "matrix_pJ_per_flop", "static_W", "idle_W", "vector_pJ_per_flop"):
        doc = copy.deepcopy(base)
        del doc["energy"][key]
        yield f"energy-no-{key}", argv, {"hw.yaml": _dump(doc)}, key
    doc = copy.deepcopy(base)
    doc["energy"] = {k: ({kk: {"value": 0, "source": "zero"} for kk in v} if k.endswith(("_per_bit", "_per_flop"))
                         and isinstance(v, dict) and "value" not in v else {"value": 0, "source": "zero"})
                     for k, v in base["energy"].items() if k != "power_limit_W"}
    yield "energy-all-zero", argv, {"hw.yaml": _dump(doc)}, "energy."
    doc = copy.deepcopy(base)
    doc["energy"]["memory_pJ_per_bit"]["ddr"] = {"value": 20, "source": "x"}
    yield "energy-tier-not-a-level", argv, {"hw.yaml": _dump(doc)}, "ddr"
    doc = copy.deepcopy(base)
    doc["energy"]["matrix_pJ_per_flop"]["fp6"] = {"value": 1, "source": "x"}
    yield "energy-unknown-dtype", argv, {"hw.yaml": _dump(doc)}, "fp6"
    doc = copy.deepcopy(base)
    doc["energy"]["idle_W"]["value"] = doc["energy"]["static_W"]["value"] * 2
    yield "energy-idle-above-static", argv, {"hw.yaml": _dump(doc)}, "idle_W"
    doc = copy.deepcopy(base)
    doc["energy"] = []
    yield "energy-a-list", argv, {"hw.yaml": _dump(doc)}, "energy"


def _spatial_cases():
    base = yaml.safe_load((ROOT / "hardware_profiles" / "groq-lpu-576.yaml").read_text())
    argv = ["run", "--hardware", "{dir}/hw.yaml", "--model", "llama-3-8b", *QUICK]
    zero_ok = {"system.scaleout.per_message_overhead_ns", "system.links.per_message_overhead_ns"}
    for path, _leaf in _leaves(base["system"], ("system",)):
        dotted = ".".join(path)
        for label, bad in BAD_NUMBERS if dotted not in zero_ok else BAD_NUMBERS[:2]:
            doc = copy.deepcopy(base)
            _at(doc, path)["value"] = bad
            yield f"spatial-{dotted}-{label}", argv, {"hw.yaml": _dump(doc)}, dotted
        if dotted.endswith(("bandwidth_GBps", "chips", "chips_per_group")):  # a link's latency may be 0 (ideal)
            doc = copy.deepcopy(base)
            _at(doc, path)["value"] = 0
            yield f"spatial-{dotted}-zero", argv, {"hw.yaml": _dump(doc)}, dotted
    for section in ("system", "system.scaleout", "system.links"):
        doc = copy.deepcopy(base)
        _at(doc, section.split("."))["hops"] = 3
        yield f"spatial-{section}-unknown-key", argv, {"hw.yaml": _dump(doc)}, "hops"
    for key, bad in (("partition", "random"), ("partition", 7)):
        doc = copy.deepcopy(base)
        doc["system"][key] = bad
        yield f"spatial-{key}-{bad}", argv, {"hw.yaml": _dump(doc)}, key
    for bad in ("hypercube", "", None, 3):
        doc = copy.deepcopy(base)
        doc["system"]["links"]["topology"] = bad
        yield f"spatial-topology-{bad}", argv, {"hw.yaml": _dump(doc)}, "topology"
    doc = copy.deepcopy(base)
    doc["system"]["chips"]["value"] = 2.5
    yield "spatial-chips-fraction", argv, {"hw.yaml": _dump(doc)}, "chips"
    doc = copy.deepcopy(base)
    doc["system"]["scaleout"]["chips_per_group"]["value"] = 7  # does not divide 576
    yield "spatial-group-not-dividing", argv, {"hw.yaml": _dump(doc)}, "chips_per_group"


STACK = "fused"


def _stack_cases():
    base = yaml.safe_load((ROOT / "workloads" / "software" / f"{STACK}.yaml").read_text())
    dense = ["run", "--software", "{dir}/stack.yaml", "--model", "llama-3-8b", *QUICK]
    moe = ["run", "--software", "{dir}/stack.yaml", "--model", "deepseek-v3", "--hardware", "h200-sxm-x8",
           "--weights", "fp8", *QUICK]

    def variant(tag, change, expect, argv=dense):
        doc = copy.deepcopy(base)
        change(doc)
        return f"stack-{tag}", argv, {"stack.yaml": _dump(doc)}, expect

    att = ("ops", "attention", "kernels", 0)
    yield variant("attention-skips-kv", lambda d: _at(d, att).update(reads=["x"]), "ops.attention")
    yield variant("attention-half-kv", lambda d: _at(d, att).update(reads=["kv:0.5", "x"]), "ops.attention")
    yield variant("o-proj-skips-weights", lambda d: d["ops"]["o_proj"]["kernels"][0].update(reads=["x", "res"]),
                  "ops.o_proj")
    yield variant("side-stream-joins-itself", lambda d: d["ops"]["shared_expert"].update(join="shared_expert"),
                  "ops.shared_expert.join", moe)
    yield variant("side-stream-joins-nothing", lambda d: d["ops"]["shared_expert"].update(join="nosuchop"),
                  "ops.shared_expert.join", moe)
    yield variant("side-stream-never-joined", lambda d: d["ops"]["shared_expert"].update(join="embed"),
                  "ops.shared_expert.join", moe)
    yield variant("stream-without-join", lambda d: d["ops"]["shared_expert"].pop("join"), "ops.shared_expert", moe)
    yield variant("join-without-stream", lambda d: d["ops"]["shared_expert"].pop("stream"), "ops.shared_expert", moe)
    for label, bad in (("zero", 0.0), ("neg", -1), ("over-1", 1.5), ("text", "good"), ("nan", float("nan"))):
        yield variant(f"attention-efficiency-{label}",
                      lambda d, bad=bad: d["attention"]["triton_group"]["efficiency"].update(value=bad),
                      "attention.triton_group.efficiency", ["run", "--software", "{dir}/stack.yaml", "--kv", "kivi-2",
                                                            *QUICK])
    for key in ("value_ps", "unpack_ps", "group_ps", "outlier_ps"):
        yield variant(f"attention-{key}-neg", lambda d, key=key: d["attention"]["triton_group"][key].update(value=-1),
                      f"attention.triton_group.{key}")
    yield variant("kernel-class-unknown", lambda d: _at(d, att).update({"class": "warp-magic"}), "warp-magic")
    yield variant("kernel-role-unknown", lambda d: _at(d, att).update(reads=["kv", "x", "zz"]), "zz")
    yield variant("kernel-share-zero", lambda d: _at(d, att).update(reads=["kv:0", "x"]), "kv:0")
    yield variant("kernel-share-over-1", lambda d: _at(d, att).update(reads=["kv:1.5", "x"]), "kv:1.5")
    yield variant("kernel-share-text", lambda d: _at(d, att).update(reads=["kv:lots", "x"]), "kv:lots")
    yield variant("kernel-launches-0", lambda d: _at(d, att).update(launches=0), "launches")
    yield variant("kernel-launches-huge", lambda d: _at(d, att).update(launches=10**6), "launches")
    yield variant("kernel-unknown-key", lambda d: _at(d, att).update(speed="fast"), "speed")
    yield variant("kernel-impl-unknown", lambda d: _at(d, att).update(impl="cutlass-9"), "cutlass-9")
    yield variant("op-unknown", lambda d: d["ops"].update(warp_drive=copy.deepcopy(d["ops"]["o_proj"])), "warp_drive")
    yield variant("op-no-kernels", lambda d: d["ops"]["o_proj"].update(kernels=[]), "ops.o_proj")
    yield variant("op-kernels-not-list", lambda d: d["ops"]["o_proj"].update(kernels="o_proj"), "ops.o_proj")
    yield variant("op-unknown-variant", lambda d: d["ops"].update({"o_proj@turbo": copy.deepcopy(d["ops"]["o_proj"])}),
                  "turbo")
    yield variant("uses-before-made", lambda d: _at(d, att).update(uses=["tmp"]), "tmp")
    yield variant("moe-mode-unknown", lambda d: d.update(moe="telepathy"), "moe")
    yield variant("top-unknown-key", lambda d: d.update(turbo=True), "turbo")
    yield variant("ops-a-list", lambda d: d.update(ops=[]), "ops")
    yield variant("name-missing", lambda d: d.pop("name"), "name")


def _search_cases():
    base = yaml.safe_load((ROOT / "tests" / "fixtures" / "search" / "tiny.yaml").read_text())
    argv = ["search", "--space", "{dir}/space.yaml", "--quiet"]

    def variant(tag, change, expect):
        doc = copy.deepcopy(base)
        change(doc)
        return f"search-{tag}", argv, {"space.yaml": _dump(doc)}, expect

    for key in ("ttft_ms", "tpot_ms"):
        for label, bad in (("zero", 0), ("neg", -5), ("text", "fast"), ("nan", float("nan")), ("inf", float("inf"))):
            yield variant(f"slo-{key}-{label}", lambda d, key=key, bad=bad: d["slo"].update({key: bad}), key)
    yield variant("slo-percentile-95", lambda d: d["slo"].update(percentile=95), "percentile")
    yield variant("slo-unknown-key", lambda d: d["slo"].update(p999=1), "p999")
    for label, bad in (("zero", 0), ("over-1", 1.5), ("neg", -0.5), ("text", "high")):
        yield variant(f"traffic-load-{label}", lambda d, bad=bad: d["traffic"].update(load=bad), "load")
    yield variant("traffic-unknown-key", lambda d: d["traffic"].update(burst=2), "burst")
    yield variant("traffic-requests-missing", lambda d: d["traffic"].update(requests="{dir}/none.jsonl"),
                  "traffic.requests: request source not found")
    for axis, bad in (("hardware", ["nochip"]), ("weights", ["fp5"]), ("kv", ["int3-nope"]), ("max_batch", [0]),
                      ("max_batch", [-4]), ("max_batch", ["big"]), ("max_tokens_per_step", [0]), ("hardware", []),
                      ("weights", []), ("kv", "fp16")):
        yield variant(f"grid-{axis}-{bad!r}"[:60], lambda d, axis=axis, bad=bad: d["space"]["grid"].update({axis: bad}),
                      axis)
    yield variant("grid-duplicate-values", lambda d: d["space"]["grid"].update(kv=["fp16", "fp16"]), "kv")
    yield variant("grid-unknown-axis", lambda d: d["space"]["grid"].update(voltage=[1, 2]), "voltage")
    yield variant("space-unknown-key", lambda d: d["space"].update(random=True), "random")
    yield variant("top-unknown-key", lambda d: d.update(budget=3), "budget")
    yield variant("model-unknown", lambda d: d.update(model="gpt-9"), "gpt-9")
    for label, bad in (("zero", 0), ("neg", -1), ("text", "many")):
        yield variant(f"max-replays-{label}", lambda d, bad=bad: d.update(max_replays=bad), "max_replays")
    yield variant("not-a-mapping", lambda d: d.clear() or d.update(x=1), "space.yaml")
    for key in ("model", "slo"):  # traffic and space have defaults
        yield variant(f"no-{key}", lambda d, key=key: d.pop(key), key)


STUDY = """
name: corpus
base: {model: llama-3-8b, steps: 1, engine: analytic}
sweep:
  grid:
    batch: [1, 2]
"""


def _study_cases():
    base = yaml.safe_load(STUDY)
    argv = ["study", "{dir}/study.yaml", "--check"]

    def variant(tag, change, expect):
        doc = copy.deepcopy(base)
        change(doc)
        return f"study-{tag}", argv, {"study.yaml": _dump(doc)}, expect

    yield variant("unknown-top-key", lambda d: d.update(colour="red"), "colour")
    yield variant("base-unknown-key", lambda d: d["base"].update(turbo=True), "turbo")
    yield variant("base-batch-0", lambda d: d["base"].update(batch=0), "batch")
    yield variant("base-model-unknown", lambda d: d["base"].update(model="gpt-9"), "gpt-9")
    yield variant("grid-empty-axis", lambda d: d["sweep"]["grid"].update(batch=[]), "batch")
    yield variant("grid-not-a-list", lambda d: d["sweep"]["grid"].update(batch=4), "batch")
    yield variant("grid-bad-value", lambda d: d["sweep"]["grid"].update(batch=[1, -2]), "batch")
    yield variant("grid-unknown-axis", lambda d: d["sweep"]["grid"].update(voltage=[1]), "voltage")
    yield variant("grid-bad-path", lambda d: d["sweep"]["grid"].update({"hardware.hbm.nope": [1, 2]}), "nope")
    yield variant("grid-duplicate-values", lambda d: d["sweep"]["grid"].update(batch=[1, 1]), "batch")
    yield variant("zip-unequal", lambda d: d["sweep"].update(zip={"model": ["llama-3-8b"], "weights": ["bf16", "fp8"]}),
                  "zip")
    yield variant("sweep-unknown-key", lambda d: d["sweep"].update(shuffle=True), "shuffle")
    yield variant("name-missing", lambda d: d.pop("name"), "name")
    yield variant("name-path", lambda d: d.update(name="../../etc"), "name")
    yield variant("too-many-points", lambda d: d["sweep"]["grid"].update(
        context=list(range(1, 701)), **{"hardware.hbm.latency_ns": list(range(1, 201))}), "points")
    yield variant("exclude-unknown-axis", lambda d: d["sweep"].update(exclude=[{"where": {"colour": "red"},
                                                                                  "reason": "x"}]), "colour")
    yield variant("target-nan", lambda d: d["base"].update(target_ms=float("nan")), "target_ms")
    yield variant("steps-huge", lambda d: d["base"].update(steps=10**9), "steps")


def _request_cases():
    argv = ["serve", "--requests", "{dir}/{name}", "--duration-s", "30", "--no-progress"]
    good = {"arrival_s": 0.5, "prompt_tokens": 30, "output_tokens": 5}
    rows = {
        "neg-arrival": dict(good, arrival_s=-1), "nan-arrival": dict(good, arrival_s=float("nan")),
        "zero-prompt": dict(good, prompt_tokens=0), "neg-output": dict(good, output_tokens=-3),
        "frac-prompt": dict(good, prompt_tokens=2.5), "text-output": dict(good, output_tokens="many"),
        "bool-prompt": dict(good, prompt_tokens=True), "huge-prompt": dict(good, prompt_tokens=10**12),
        "missing-key": {"arrival_s": 1, "prompt_tokens": 3}, "null-arrival": dict(good, arrival_s=None),
    }
    for label, row in rows.items():
        text = json.dumps(good) + "\n" + json.dumps(row, allow_nan=True) + "\n"
        yield f"requests-jsonl-{label}", [a.replace("{name}", "r.jsonl") for a in argv], {"r.jsonl": text}, "r.jsonl"
        keys = list(good)
        csv = ",".join(keys) + "\n" + ",".join(str(good[k]) for k in keys) + "\n" + \
            ",".join(str(row.get(k, "")) for k in keys) + "\n"
        yield f"requests-csv-{label}", [a.replace("{name}", "r.csv") for a in argv], {"r.csv": csv}, "r.csv"
    odd = {
        "jsonl-empty": ("r.jsonl", ""), "jsonl-not-json": ("r.jsonl", "{arrival\n"),
        "jsonl-a-list": ("r.jsonl", "[1, 2, 3]\n"), "jsonl-binary": ("r.jsonl", "\x00\x01\x02\x03"),
        "jsonl-unsorted": ("r.jsonl", json.dumps(dict(good, arrival_s=5)) + "\n" + json.dumps(good) + "\n"),
        "csv-no-columns": ("r.csv", "a,b,c\n1,2,3\n"), "csv-empty": ("r.csv", ""),
        "csv-header-only": ("r.csv", "arrival_s,prompt_tokens,output_tokens\n"),
        "azure-bad-timestamp": ("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n"
                                          "yesterday,3,4\n"),
        "azure-number-timestamp": ("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n5,374,44\n6,3,4\n"),
        "azure-empty-timestamp": ("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n"
                                            ",3,4\n"),
        "azure-bad-month": ("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-45 18:15:46,374,44\n"),
        "azure-neg-tokens": ("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,-374,44\n"),
        "parquet-not-parquet": ("r.parquet", "PAR1 this is not parquet"),
    }
    for label, (name, text) in odd.items():
        yield f"requests-{label}", [a.replace("{name}", name) for a in argv], {name: text}, name


GENERATED = [*_energy_cases(), *_spatial_cases(), *_stack_cases(), *_search_cases(), *_study_cases(),
             *_request_cases()]
ALL = [(c["id"], c["argv"], c.get("files", {}), c["expect"], c.get("code", 2)) for c in CASES] + \
      [(tag, argv, files, expect, 2) for tag, argv, files, expect in GENERATED]


def test_the_corpus_is_large_and_its_ids_unique():
    ids = [case[0] for case in ALL]
    assert len(ids) >= 300 and len(set(ids)) == len(ids), [i for i in ids if ids.count(i) > 1][:5]


@pytest.mark.parametrize("case_id, argv, files, expect, code", ALL, ids=[case[0] for case in ALL])
def test_bad_input_is_one_line(tmp_path, monkeypatch, case_id, argv, files, expect, code):
    monkeypatch.chdir(ROOT)  # relative paths in the cases are the repository's
    folder = tmp_path / "case"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text.replace("{dir}", str(folder)), encoding="utf-8", errors="surrogateescape")
    argv = [a.replace("{dir}", str(folder)) for a in argv]
    status, _out, err = run_cli(*argv)
    expect = expect.replace("{dir}", str(folder))
    assert status == code, f"{case_id}: exit {status}, stderr {err[-400:]!r}"
    assert err.startswith("decodesim: ") and err.count("\n") == 1 and "Traceback" not in err, f"{case_id}: {err!r}"
    assert expect in err, f"{case_id}: {expect!r} not named in {err!r}"
    assert not [p for p in folder.rglob("*") if p.name.startswith(".") and p.name.endswith(".tmp")]
