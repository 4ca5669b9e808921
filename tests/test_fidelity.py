"""Fidelity: the reference quantizer, the known effects on synthetic KV, user tensors, the CLI."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.formats import build_format, get_format, list_formats
from sim.formats.fidelity import SyntheticKV, load_kv, measure, rope, synthetic
from sim.formats.reference import fake_quant, nf_levels, round_minifloat
from sim.formats.spec import Quant

SAMPLE = synthetic(SyntheticKV(tokens=1024, seed=0))
FP16_V = {"encoding": "float", "float_format": "fp16", "bits": 16, "symmetric": True, "scale_dtype": "none",
          "zero_dtype": "none", "per": "row", "group_size": None, "outliers": None}


def _fmt(k: dict, v: dict | None = None, **top) -> object:
    base = {"name": "t", "description": "t", "role": "kv", "bits": 2, "symmetric": False, "scale_dtype": "fp16",
            "zero_dtype": "fp16", "per": "row", "group_size": 32}
    return build_format({**base, **top, "k": k, "v": FP16_V if v is None else v})


def test_error_falls_as_bits_rise_same_layout():
    rows = [measure(_fmt({}, {}, bits=b), SAMPLE) for b in (2, 3, 4, 8)]
    for key in ("k_rel_error", "v_rel_error", "score_rel_error", "attn_kl", "output_rel_error"):
        values = [r[key] for r in rows]
        assert values == sorted(values, reverse=True) and values[0] > 5 * values[-1], (key, values)


def test_per_channel_k_beats_per_token_k_and_outliers_help_further():
    per_token = measure(_fmt({"per": "row", "group_size": 32}), SAMPLE)
    per_channel = measure(_fmt({"per": "column", "group_size": 32}), SAMPLE)
    with_outliers = measure(_fmt({"per": "column", "group_size": 32, "outliers": {"fraction": 0.01}}), SAMPLE)
    # V is fp16 in all three: the differences are K's alone
    assert per_token["attn_kl"] > 2.5 * per_channel["attn_kl"]
    assert per_token["score_rel_error"] > 1.25 * per_channel["score_rel_error"]
    assert with_outliers["attn_kl"] < 0.8 * per_channel["attn_kl"]
    assert with_outliers["score_rel_error"] < per_channel["score_rel_error"]
    assert with_outliers["k_outlier_fraction"] == pytest.approx(11 / 1024)


def test_bundled_formats_have_plausible_fidelity():
    rows = {f.name: measure(f, SAMPLE) for f in list_formats("kv")}
    assert rows["fp16"]["output_rel_error"] < 1e-3
    assert rows["bf16"]["output_rel_error"] < 1e-2
    assert rows["int8"]["attn_kl"] < rows["kivi-4"]["attn_kl"] < rows["kivi-2"]["attn_kl"]
    assert rows["kivi-4"]["attn_kl"] < rows["int4-asym-g128"]["attn_kl"]  # per-channel K, smaller groups
    for r in rows.values():
        assert all(np.isfinite(v) for k, v in r.items() if k != "kv")


def test_the_window_is_kept_exactly():
    f = get_format("kivi-2")
    small = synthetic(SyntheticKV(tokens=100, kv_heads=1, queries=2))  # all tokens inside the 128 window
    assert measure(f, small)["k_rel_error"] < 1e-3


def test_pre_rope_k_is_quantized_before_the_rotation():
    pre = _fmt({"per": "column", "group_size": None}, k_rope="pre")
    post = _fmt({"per": "column", "group_size": None}, k_rope="post")
    # per-channel scales fit pre-RoPE channels; RoPE mixes outlier channels with their partners
    assert measure(pre, SAMPLE)["k_rel_error"] < measure(post, SAMPLE)["k_rel_error"]


def test_nf4_table_is_qlora_nf4():
    nf4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
           -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
           0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
           0.7229568362236023, 1.0]
    assert np.allclose(nf_levels(4), nf4, atol=1e-6)


def test_minifloat_rounding():
    e4m3 = round_minifloat(np.array([448.0, 1000.0, 1.06, 17.0, 2.0 ** -9, 2.0 ** -11]), "e4m3")
    assert list(e4m3) == [448.0, 448.0, 1.0, 16.0, 2.0 ** -9, 0.0]
    x = np.random.default_rng(1).standard_normal(1000)
    assert np.array_equal(round_minifloat(x, "fp16"), x.astype(np.float16).astype(np.float64))


@settings(max_examples=40, deadline=None)
@given(bits=st.integers(1, 8), group=st.sampled_from([8, 16, 32]), seed=st.integers(0, 10**6),
       per=st.sampled_from(["row", "column"]))
def test_asymmetric_int_error_is_at_most_half_a_step(bits, group, seed, per):
    x = np.random.default_rng(seed).standard_normal((64, 64)) * 3
    q = Quant(bits=bits, symmetric=False, per=per, group_size=group, scale_dtype="fp32", zero_dtype="fp32")
    xhat, _ = fake_quant(q, x)
    if per == "row":
        groups, err = (a.reshape(64, 64 // group, group) for a in (x, np.abs(xhat - x)))
    else:
        groups, err = (a.T.reshape(64, 64 // group, group) for a in (x, np.abs(xhat - x)))
    step = (groups.max(axis=2) - groups.min(axis=2)) / (2 ** bits - 1)
    err = err.max(axis=2)
    assert np.all(err <= step / 2 * (1 + 1e-5) + 1e-6)


def test_user_npz_round_trip(tmp_path, cli):
    p = SyntheticKV(tokens=512, kv_heads=2, queries=4)
    s = synthetic(p)
    k_post = rope(s.k_pre, s.head_dim, s.rope_theta)
    q = s.q.transpose(1, 0, 2)  # [queries, heads, d]
    path = tmp_path / "kv.npz"
    np.savez(path, k=k_post.reshape(512, 2, 128), v=s.v.reshape(512, 2, 128), q=q)
    user = load_kv(path)
    assert np.allclose(user.k_pre, s.k_pre, atol=1e-9)
    fmt = get_format("kivi-2")
    a, b = measure(fmt, s), measure(fmt, user)
    assert a["output_rel_error"] == pytest.approx(b["output_rel_error"], rel=1e-6)
    code, out, err = cli("fidelity", "--kv", "fp16,kivi-2", "--input", str(path))
    assert code == 0, err
    assert "kivi-2" in out and str(path) in out


def test_user_npy_pair_and_bad_inputs(tmp_path, cli):
    k, v = tmp_path / "k.npy", tmp_path / "v.npy"
    np.save(k, np.random.default_rng(0).standard_normal((64, 256)))
    np.save(v, np.random.default_rng(1).standard_normal((64, 256)))
    code, out, err = cli("fidelity", "--kv", "int8", "--input", str(k), "--v", str(v))
    assert code == 0, err
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((64, 100)))
    for argv, key in [(("--input", str(bad), "--v", str(v)), "k"), (("--input", str(k)), "v"),
                      (("--input", str(tmp_path / "none.npz")), "file not found"),
                      (("--synthetic", "tokns=5"), "tokns"), (("--synthetic", "head_dim=7"), "head_dim")]:
        code, out, err = cli("fidelity", "--kv", "int8", *argv)
        assert code == 2 and len(err.strip().splitlines()) == 1 and key in err, (argv, err)


def test_fidelity_cli_on_synthetic(cli):
    code, out, err = cli("fidelity", "--kv", "fp16,int2-asym-outlier", "--synthetic", "tokens=256",
                         "--synthetic", "kv_heads=2", "--json")
    assert code == 0, err
    import json

    data = json.loads(out)
    assert [r["kv"] for r in data["rows"]] == ["fp16", "int2-asym-outlier"]
    assert data["params"]["tokens"] == 256
    assert data["rows"][1]["k_outlier_fraction"] == pytest.approx(13 / 256)  # ceil(5% of 256) channels


def test_threshold_outliers_keep_only_far_values_within_the_slot_budget():
    q = Quant(bits=2, symmetric=False, per="column", scale_dtype="fp16", zero_dtype="fp16",
              outliers={"select": "threshold", "threshold": 6.0, "fraction": 0.05})
    x = np.random.default_rng(3).standard_normal((512, 256))
    x[7, 9] = 40.0  # one far value
    xhat, stats = fake_quant(q, x)
    assert 0 < stats["outlier_fraction"] < 0.05  # fewer than the 13 slots per row are used
    assert xhat[7, 9] == pytest.approx(40.0)  # kept in fp16
    dense_only = Quant(bits=2, symmetric=False, per="column", scale_dtype="fp16", zero_dtype="fp16")
    assert np.abs(fake_quant(dense_only, x)[0] - x).mean() > np.abs(xhat - x).mean()
    # the bytes count the fixed slot capacity (13 slots of value + index, a row pointer per
    # token), whatever the data; per-channel scales without a group are per-layer constants
    f = build_format({"name": "t", "description": "t", **q.model_dump()})
    assert f.k_bytes(512, 256) == 512 * 256 * 2 // 8 + 512 * 13 * 4 + 512 * 4
    assert f.constant_bytes("k", 256) == 256 * 4
