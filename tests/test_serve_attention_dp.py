"""Issue 40: serve's step model times one attention group holding every sequence, so a
replay with attention data-parallel groups would overstate attention and meter one group's
chips. Until the step model spreads sequences over the groups, serve refuses
``attention_dp`` > 1 with one line naming the key (exit 2); attention_dp 1 still serves."""

from __future__ import annotations

import pytest

from sim.errors import ConfigError
from sim.serve.spec import ServeSpec, build
from tests.conftest import run_cli

DP2 = ("--model", "olmoe-1b-7b", "--hardware", "h200-sxm-x8", "--tp", "4", "--pp", "1",
       "--set", "attention_dp=2", "--duration-s", "1", "--requests", "synthetic", "--rate", "2")


def test_serve_refuses_attention_dp_in_one_line_exit_2():
    code, out, err = run_cli("serve", *DP2)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert "attention_dp" in err and "got 2" in err


def test_build_refuses_attention_dp_but_not_one_group():
    with pytest.raises(ConfigError, match="attention_dp"):
        build(ServeSpec(model="olmoe-1b-7b", tp=1, pp=1, overrides=("attention_dp=2",), duration_s=1))
    assert build(ServeSpec(model="olmoe-1b-7b", tp=1, pp=1, overrides=("attention_dp=1",),
                           duration_s=1)).resolved.attention_dp == 1
