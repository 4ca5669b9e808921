"""The public Python API (sim.api): each command's function answers what the CLI answers, and
docs/api.md runs as written, its printed output compared block by block.

After a deliberate change of results, refresh the page's outputs with
``python tests/test_api.py --update`` (then read the diff).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"
BLOCK = re.compile(r"```python\n(.*?)```\n\n```text\n(.*?)```", re.S)


def run_doc(text: str) -> list[tuple[str, str, str]]:
    """(code, expected output, printed output) for each python block of the page, run in order
    in one namespace, as a notebook would."""
    namespace: dict = {"__name__": "docs_api"}
    out = []
    for match in BLOCK.finditer(text):
        code, expected = match.group(1), match.group(2)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, str(DOC), "exec"), namespace)
        out.append((code, expected, printed.getvalue()))
    return out


def test_the_api_page_runs_as_written():
    text = DOC.read_text()
    ran = run_doc(text)
    assert len(ran) >= 8 and len(ran) == text.count("```python")  # every block has its output under it
    for code, expected, printed in ran:
        assert printed == expected, f"docs/api.md block:\n{code}\nprinted:\n{printed}\nexpected:\n{expected}"


def test_the_api_is_the_cli(cli):
    import sim
    from sim import api

    for options, argv in (({"hardware": "cerebras-wse3", "engine": "analytic", "steps": 1},
                           ["--hardware", "cerebras-wse3", "--engine", "analytic", "--steps", "1"]),
                          ({"model": "mixtral-8x7b", "steps": 2, "dispatch": "host_sync", "graph": False,
                            "set": ["batch=4"]},
                           ["--model", "mixtral-8x7b", "--steps", "2", "--dispatch", "host_sync", "--no-graph",
                            "--set", "batch=4"])):
        code, out, err = cli("run", *argv, "--json")
        assert code == 0, err
        want = json.loads(out)
        got = dict(sim.simulate(**options).summary)
        for s in (want, got):
            for key in ("wall_s", "schema_version", "kind"):
                s.pop(key, None)
        assert got == want
    assert api.argv_of("serve", {"kv": ["fp16", "int8"], "set": "x=1", "graph": True, "no_progress": True}) == \
        ["serve", "--kv=fp16,int8", "--set=x=1", "--graph", "--no-progress"]
    with pytest.raises(TypeError, match="options of decodesim serve"):
        api.serve(batch=3)
    with pytest.raises(TypeError, match="unexpected keyword 'json'"):
        api.serve(json=True)
    assert sim.simulate({"batch": 3}).summary["batch"] == 3  # a spec (dict or RunSpec) still works
    assert sim.simulate(routing_skew=1.2, model="mixtral-8x7b", steps=1, engine="analytic").summary["batch"] == 1


if __name__ == "__main__" and "--update" in sys.argv:
    text = DOC.read_text()
    results = iter(run_doc(text))
    DOC.write_text(BLOCK.sub(lambda m: f"```python\n{m.group(1)}```\n\n```text\n{next(results)[2]}```", text))
    print(f"updated {DOC}")
