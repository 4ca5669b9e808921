"""Fuzz of the input surfaces issue 22 names (serve options, rates lists, seeds, ``--set``
strings, request files, serving studies, software stack files): 2,000+ generated bad inputs.

A seeded generator (``random.Random``), not hypothesis: the cases are cheap (each fails in the
validation path before any replay), so all of them run in the default suite, in this process
through ``sim.cli.main``. Every *bad* case must end with exit status 2 and exactly one stderr
line starting ``decodesim: `` (no traceback); mutated stack files may also be accepted (exit
0), since a mutation can leave a valid stack. ``-m slow`` runs five times as many.
"""

from __future__ import annotations

import copy
import json
import random
import time

import pytest
import yaml

from tests.conftest import ROOT, run_cli

SEED = 22
SYNTHETIC = ("--requests", "synthetic", "--prompt-median", "64", "--output-median", "4", "--duration-s", "0.5")
BAD_NUMBERS = ["", " ", "abc", "0x10", "0o7", "0b1", "1_000", "1__0", "010", "1:30", "nan", "NaN", "inf", "-inf",
               ".inf", "1e-320", "-1e-320", "4.9e-324", "1e400", "-1", "-0.5", "0", "1e12", "9" * 40, "1,5", "1.2.3",
               "١٢", "+-1", "--1", "1e", "e5", "0x", "\x00", "1 2", "true", "[1]", "{a: 1}"]
WHOLE_FLAGS = ["--seed", "--max-batch", "--block-tokens", "--max-tokens-per-step", "--prompt-median", "--output-median",
               "--tp", "--pp", "--chips"]
REAL_FLAGS = ["--duration-s", "--rate", "--target-ms", "--rate-scale"]
GOOD_RATES = ["1", "2.5", "10", "0.5", "1e1"]
SET_PATHS = ["batch", "context", "steps", "target_ms", "kv", "hardware.hbm.latency_ns",
             "hardware.hbm.channel_bandwidth_GBps", "hardware.system.chips", "model.layers", "model.hidden",
             "routing_skew", "seed"]
BAD_SET_VALUES = ["0x10", "1_000", "010", "1:30", ".inf", "-.inf", ".nan", "1e400", "1e-320", "-4e-310",
                  "{scale: 0x2}", "{add: 1_0}", "[1, 0x3]", "{scale: .nan}"]


def _bad_rates(rng: random.Random) -> str:
    items = [rng.choice(GOOD_RATES) for _ in range(rng.randint(1, 5))]
    how = rng.choice(["empty", "bad", "many", "lead", "trail"])
    if how == "empty":
        items.insert(rng.randint(0, len(items)), "")
    elif how == "bad":
        items.insert(rng.randint(0, len(items)), rng.choice([b for b in BAD_NUMBERS if "," not in b]))
    elif how == "many":
        items = ["1"] * rng.randint(1001, 3000)
    elif how == "lead":
        items[0] = "," + items[0]
    else:
        items[-1] += ","
    return ",".join(items)


def serve_option_cases(rng: random.Random, n: int):
    """Bad serve options: number flags, rate lists, name lists, over-long names."""
    for _ in range(n):
        kind = rng.choice(["whole", "real", "rates", "names", "long"])
        if kind == "whole":
            flag, value = rng.choice(WHOLE_FLAGS), rng.choice(BAD_NUMBERS + ["1.5", "2.0", "-3", "0", "10" * 20])
            if flag in ("--seed",) and value == "0":
                value = "-1"
            if value == "0" and flag in ("--tp", "--pp", "--chips"):
                value = "-2"
            yield ["serve", *SYNTHETIC, flag, value]
        elif kind == "real":
            flag = rng.choice(REAL_FLAGS)
            value = rng.choice(BAD_NUMBERS + ["1e9", "604801", "1e7"])
            if flag == "--target-ms" and value in ("1e7", "604801"):
                value = "1e12"
            if flag == "--rate-scale":  # with a recorded trace (synthetic refuses any scale)
                yield ["serve", "--requests", "azure-code", flag, value if value not in ("604801", "1e7") else "1e6"]
                continue
            yield ["serve", *SYNTHETIC, flag, value] if flag != "--duration-s" else \
                ["serve", "--requests", "synthetic", flag, value]
        elif kind == "rates":
            yield ["serve", *SYNTHETIC, rng.choice(["--rates", "--rate-scales"]), _bad_rates(rng)]
        elif kind == "names":
            flag = rng.choice(["--kv", "--hardware", "--model"])
            names = ["fp16"] * rng.randint(1, 3)
            names.insert(rng.randint(0, len(names)), rng.choice(["", " "]))
            yield ["serve", *SYNTHETIC, flag, ",".join(names)]
        else:
            flag = rng.choice(["--kv", "--weights", "--software", "--requests", "--model", "--hardware"])
            yield ["serve", "--requests", "synthetic", flag, "x" * rng.randint(256, 6000)]


def set_cases(rng: random.Random, n: int):
    """Bad ``--set`` strings for serve and run: non-decimal numerals, non-finite or subnormal
    values, over-long texts, empty or unknown paths, a missing ``=``."""
    for _ in range(n):
        kind = rng.choice(["value", "value", "long", "path", "noeq"])
        path = rng.choice(SET_PATHS)
        if kind == "value":
            text = f"{path}={rng.choice(BAD_SET_VALUES)}"
        elif kind == "long":
            text = f"{path}=" + rng.choice("ab1") * rng.randint(1100, 8000)
        elif kind == "path":
            text = rng.choice([f"{path}..x=1", f".{path}=1", f"{path}.=1", f"nope_{rng.randint(0, 99)}=1", "=1",
                               f"hardware.nope{rng.randint(0, 9)}=1"])
        else:
            text = path
        command = rng.choice(["serve", "run"])
        extra = SYNTHETIC if command == "serve" else ("--steps", "1", "--context", "256", "--engine", "analytic")
        yield [command, *extra, "--set", text]


def _request_rows(rng: random.Random) -> list[dict]:
    rows, t = [], 0.0
    for _ in range(rng.randint(1, 6)):
        t += rng.choice([0.0, 0.1, 0.5])
        rows.append({"arrival_s": t, "prompt_tokens": rng.randint(1, 200), "output_tokens": rng.randint(1, 20)})
    return rows


BAD_CELLS = [-1, -0.5, 0, 1.5, 1e10, 1e-320, 1e300, "x", "", None, True, [1], {"a": 1}, "nan", float("inf")]


def request_file_cases(rng: random.Random, n: int, folder):
    """Bad request files (JSON Lines and CSV): a bad cell, arrivals out of order, a missing
    column, broken JSON, an empty file."""
    for i in range(n):
        rows = _request_rows(rng)
        kind = rng.choice(["cell", "cell", "order", "missing", "json", "empty"])
        if kind == "cell":
            row = rng.choice(rows)
            key = rng.choice(list(row))
            row[key] = rng.choice(BAD_CELLS if key != "arrival_s" else [-1, 1e-320, 1e300, "x", "", None, True,
                                                                        [1], "nan", float("inf"), 2e9])
        elif kind == "order":
            rows.append({"arrival_s": rows[-1]["arrival_s"] + 1, "prompt_tokens": 5, "output_tokens": 2})
            rows.append({"arrival_s": rows[-1]["arrival_s"] - rng.choice([0.001, 0.5, 1]), "prompt_tokens": 5,
                         "output_tokens": 2})
        elif kind == "missing":
            drop = rng.choice(["arrival_s", "prompt_tokens", "output_tokens"])
            for row in rows:
                row.pop(drop)
        csv = rng.random() < 0.3 and kind not in ("json",)
        path = folder / f"r{i}.{'csv' if csv else 'jsonl'}"
        if kind == "empty":
            path.write_text(rng.choice(["", "\n", "\n\n"]))
        elif kind == "json":
            text = "".join(json.dumps(r) + "\n" for r in rows)
            cut = rng.randint(1, max(1, len(text) - 2))
            path.write_text(text[:cut] + rng.choice(["{", "}", "]", ",", "\x00", "nul"]) + text[cut:])
        elif csv:
            keys = sorted({k for r in rows for k in r})
            path.write_text(",".join(keys) + "\n" + "".join(",".join(str(r.get(k, "")) for k in keys) + "\n"
                                                              for r in rows))
        else:
            path.write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))
        yield ["serve", "--requests", str(path), "--prompt-median", "64"]


STUDY = {"kind": "serve", "name": "s", "hardware": ["h200-sxm"], "models": [{"model": "llama-3-8b"}], "kv": ["fp16"],
         "rates": [1, 2], "base": {"requests": "synthetic", "duration_s": 1}}


def study_cases(rng: random.Random, n: int, folder):
    """Bad serving studies: a retyped, dropped or unknown key, bad rates, bad base fields."""
    for i in range(n):
        data = copy.deepcopy(STUDY)
        kind = rng.choice(["retype", "drop", "extra", "rates", "base"])
        if kind == "retype":
            key = rng.choice(["hardware", "models", "kv", "rates", "base", "name"])
            data[key] = rng.choice([3, None, [], True, [None]] + ([] if key == "name" else ["text"])
                                   + ([] if key == "base" else [{}]))
        elif kind == "drop":
            data.pop(rng.choice(["hardware", "models", "kv", "rates", "kind"]))
        elif kind == "extra":
            data[rng.choice(["hardwares", "rate", "sweep", "unknown"])] = 1
        elif kind == "rates":
            data["rates"] = rng.choice([[0], [-1], [1, None], ["1"], [float("nan")], [], [1e9]])
        else:
            key = rng.choice(["seed", "max_batch", "duration_s", "rate", "nope", "target_ms"])
            data["base"][key] = rng.choice(["8", -1, 1e12, "x", [1], True]  # (None is valid for rate, duration_s)
                                           + ([1.5, None] if key in ("seed", "max_batch", "nope") else []))
        path = folder / f"s{i}.yaml"
        path.write_text(yaml.safe_dump(data))
        yield ["serve", "--study", str(path), "--out", str(folder / "out")]


STACKS = sorted((ROOT / "workloads" / "software").glob("*.yaml"))
ODD = ["text", "", None, [], {}, True, -1, 0, 1e300, [1, 2], {"value": 1}, "nan"]


def stack_cases(rng: random.Random, n: int, folder):
    """Mutated bundled stack files (a key dropped, added or retyped): may be accepted."""
    for i in range(n):
        data = yaml.safe_load(rng.choice(STACKS).read_text())
        paths = []

        def walk(node, prefix=()):
            if isinstance(node, dict):
                for key, child in node.items():
                    paths.append(prefix + (key,))
                    walk(child, prefix + (key,))
            elif isinstance(node, list):
                for j, child in enumerate(node):
                    paths.append(prefix + (j,))
                    walk(child, prefix + (j,))

        walk(data)
        target = rng.choice(paths)
        parent = data
        for part in target[:-1]:
            parent = parent[part]
        action = rng.choice(["drop", "add", "retype"])
        if action == "drop":
            del parent[target[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[f"unexpected_{rng.randint(0, 9)}"] = rng.choice(ODD)
        else:
            parent[target[-1]] = rng.choice(ODD)
        path = folder / f"stack{i}.yaml"
        path.write_text(yaml.safe_dump(data))
        yield ["run", "--software", str(path), "--steps", "1", "--context", "256", "--engine", "analytic"]


def _check(argv: list[str], allowed=(2,)) -> int:
    start = time.process_time()
    code, _out, err = run_cli(*argv)
    shown = " ".join(a if len(a) < 80 else a[:60] + "..." for a in argv)
    assert code in allowed, (shown, code, err[-300:])
    if code == 2:
        assert err.startswith("decodesim: ") and err.count("\n") == 1 and "Traceback" not in err, (shown, err[-300:])
    assert time.process_time() - start < 5.0, shown
    return code


def _run_all(tmp_path, scale: int) -> int:
    rng = random.Random(SEED * scale)
    count = 0
    for argv in serve_option_cases(rng, 700 * scale):
        _check(argv)
        count += 1
    for argv in set_cases(rng, 500 * scale):
        _check(argv)
        count += 1
    for argv in request_file_cases(rng, 500 * scale, tmp_path):
        _check(argv)
        count += 1
    for argv in study_cases(rng, 300 * scale, tmp_path):
        _check(argv)
        count += 1
    for argv in stack_cases(rng, 40 * scale, tmp_path):
        _check(argv, allowed=(0, 2))
        count += 1
    return count


def test_generated_bad_inputs_are_one_line_exit_2(tmp_path):
    assert _run_all(tmp_path, 1) >= 2000


@pytest.mark.slow
def test_generated_bad_inputs_are_one_line_exit_2_many(tmp_path):
    assert _run_all(tmp_path, 5) >= 10_000
