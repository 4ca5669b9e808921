"""Formats: exact byte accounting against hand calculations, the anchors.md A2 figures,
bad-format errors, and the format's cost in the engine (dequantization, outlier gathers)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.errors import ConfigError
from sim.formats import build_format, get_format, list_formats

FIXTURES = Path(__file__).parent / "fixtures" / "formats"
W = 1024  # llama-3-8b: 8 KV heads x 128 channels per layer


# -- hand-computed bytes -------------------------------------------------------------------


def test_kivi2_bytes_by_hand_with_a_partial_group():
    f = get_format("kivi-2")
    L = 1000  # 128 tokens in the fp16 window, 872 quantized: 27.25 groups of 32 along K's tokens
    window = 128 * 1024 * 2  # fp16
    codes = 872 * 1024 * 2 // 8
    k_meta = 1024 * math.ceil(872 / 32) * (16 + 16) // 8  # per channel: 28 groups (the last partial)
    v_meta = 872 * (1024 // 32) * (16 + 16) // 8  # per token: 32 groups of 32 channels
    assert f.k_bytes(L, W) == window + codes + k_meta == 600064
    assert f.v_bytes(L, W) == window + codes + v_meta == 596992
    assert f.kv_footprint(L, W, W) == 600064 + 596992
    t = f.kv_read(L, W, W)
    assert t.stream_bytes == 600064 + 596992 and t.gather_bytes == 0
    assert t.dequant_ops == 2 * 872 * 1024 * (2 + 1 + 1 + 1)  # unpack, convert, FMA with the zero point


def test_int4_asym_g128_is_4_25_bits():
    f = get_format("int4-asym-g128")
    per_tensor = 4096 * 1024 * 4 // 8 + 4096 * (1024 // 128) * 4  # codes + fp16 scale and zero per 128
    assert f.k_bytes(4096, W) == f.v_bytes(4096, W) == per_tensor == 2228224
    assert f.effective_bits(4096, W, "k") == pytest.approx(4.25)


def test_kvquant_3_1pct_bytes_by_hand():
    f = get_format("kvquant-3-1pct")
    codes = 4096 * 1024 * 3 // 8
    slots = math.ceil(0.01 * 1024)  # 11 outlier slots per token
    gather = 4096 * slots * (16 + 16) // 8  # fp16 value + 16-bit column index
    pointers = 4096 * 32 // 8  # one CSR row pointer per token
    k = codes + gather + pointers  # K scales are per channel, calibrated: per-layer constants
    v = codes + 4096 * (16 + 16) // 8 + gather + pointers  # V: one scale + zero per token row
    assert f.k_bytes(4096, W) == k == 1769472
    assert f.v_bytes(4096, W) == v == 1785856
    t = f.kv_read(4096, W, W)
    assert t.gather_bytes == 2 * gather and t.gather_granule_bytes == slots * 4 == 44
    assert t.stream_bytes == k + v - 2 * gather
    # constants: K's 1024 per-channel scale+zero and two fitted 8-entry fp16 codebooks
    assert f.layer_constant_bytes(W, W) == 1024 * 4 + 2 * 8 * 2


def test_int2_asym_outlier_channels_by_hand():
    f = get_format("int2-asym-outlier")
    channels = math.ceil(0.05 * 1024)  # 52 outlier channels kept in fp16
    k = 100 * 1024 * 2 // 8 + 100 * 8 * 4 + 100 * channels * 2
    assert f.k_bytes(100, W) == k == 39200
    assert f.kv_read(100, W, 0).gather_bytes == 0  # dense channels stream
    assert f.constant_bytes("k", W) == channels * 2  # their 16-bit channel ids


def test_weight_formats_by_hand():
    nf4 = get_format("nf4")
    assert nf4.weight_bytes(4096, 4096) == 4096 * 4096 // 2 + 4096 * 64 + 4  # codes, int8 scales, fp32 scale
    assert get_format("int4-g128").weight_bytes(4096, 14336) == 4096 * 14336 // 2 + 4096 * 112 * 4
    assert get_format("fp8").weight_read(10, 10).dequant_ops == 0  # fed to the fp8 matrix unit directly
    assert get_format("int8").weight_bytes(4096, 4096) == 4096 * 4096 + 4096 * 2  # fp16 scale per row
    assert get_format("bf16").weight_bytes(3, 5) == 30


# -- anchors.md A2 (effective bits, D rows) ---------------------------------------------------


@pytest.mark.parametrize("L, bits", [(1024, 4.63), (4096, 3.41), (32768, 3.05)])
def test_kivi2_effective_bits_match_anchors_a2(L, bits):
    f = get_format("kivi-2")
    assert abs(f.effective_bits(L, W, "k") - bits) <= 0.005 + 1e-9  # 4.625 is printed 4.63
    assert abs(f.effective_bits(L, W, "v") - bits) <= 0.005 + 1e-9
    # b_eff(L) = (b + 32/G) (L - R) / L + 16 R / L
    assert f.effective_bits(L, W, "k") == pytest.approx((2 + 32 / 32) * (L - 128) / L + 16 * 128 / L)


@pytest.mark.parametrize("b, G, bits", [(2, 32, 3.00), (2, 128, 2.25), (4, 32, 5.00), (4, 64, 4.50), (4, 128, 4.25)])
def test_b_plus_32_over_g(b, G, bits):
    f = build_format({"name": "x", "description": "x", "bits": b, "symmetric": False, "per": "row",
                      "group_size": G, "scale_dtype": "fp16", "zero_dtype": "fp16"})
    assert f.effective_bits(4096, W, "v") == pytest.approx(bits)


@pytest.mark.parametrize("layout, slot_bits, row_bits", [("csr", 16 + 16, 32), ("coo", 16 + 16 + 16, 0)])
def test_sparse_outliers_add_about_32f_bits(layout, slot_bits, row_bits):
    f = build_format({"name": "x", "description": "x", "bits": 3, "scale_dtype": "fp16", "per": "column",
                      "outliers": {"fraction": 0.01, "layout": layout, "index_bits": 16}})
    # 11 slots per 1024-value row; CSR: fp16 value + column index, one 32-bit row pointer per
    # row; COO: value + row index + column index. Per-channel scales are per-layer constants.
    assert f.effective_bits(4096, W, "k") == pytest.approx(3 + (11 * slot_bits + row_bits) / 1024)


# -- invariants --------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from([f.name for f in list_formats("kv")]), tokens=st.integers(1, 70000),
       heads=st.integers(1, 16))
def test_read_equals_footprint_and_grows_with_context(name, tokens, heads):
    f = get_format(name)
    width = 128 * heads
    t = f.kv_read(tokens, width, width)
    assert t.stream_bytes + t.gather_bytes == f.kv_footprint(tokens, width, width)
    assert f.kv_footprint(tokens + 1, width, width) >= f.kv_footprint(tokens, width, width)
    low = min(f.k.bits, f.v.bits)
    assert 8 * f.kv_footprint(tokens, width, width) >= low * tokens * 2 * width


def test_every_bundled_format_loads_and_lists(cli):
    names = {f.name for f in list_formats()}
    assert {"fp16", "bf16", "fp8-e4m3", "int8", "int4-asym-g128", "kivi-2", "kivi-4", "kvquant-3-1pct",
            "int2-asym-outlier", "fp8", "int4-g128", "nf4"} <= names
    code, out, err = cli("formats")
    assert code == 0, err
    for name in names:
        assert name in out
    kivi = next(line for line in out.splitlines() if line.strip().startswith("kivi-2"))
    assert "3.406" in kivi and "78.7%" in kivi


# -- bad input ---------------------------------------------------------------------------------

GOOD = {"name": "bad", "description": "test", "bits": 2, "symmetric": False, "scale_dtype": "fp16",
        "zero_dtype": "fp16", "per": "row", "group_size": 32}


@pytest.mark.parametrize("change, key", [
    ({"bits": 0}, "bits"),
    ({"bits": 17}, "bits"),
    ({"group_size": 96}, "group_size"),  # does not divide the 1024-value row
    ({"k": {"group_size": 96}}, "k.group_size"),
    ({"outliers": {"fraction": 1.0}}, "outliers.fraction"),
    ({"outliers": {"fraction": -0.1}}, "outliers.fraction"),
    ({"scale_dtype": "fp12"}, "scale_dtype"),
    ({"zero_dtype": "none"}, ""),
    ({"levels": "nf"}, ""),
    ({"encoding": "codebook", "levels": [0.0, 1.0]}, ""),
    ({"grop_size": 32}, "grop_size"),
    ({"outliers": {"fraction": 0.01, "index_bits": 8}}, "outliers.index_bits"),
])
def test_impossible_formats_fail_with_one_line(tmp_path, cli, change, key):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**GOOD, **change}))
    code, out, err = cli("run", "--kv", str(path), "--steps", "1")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], err
    assert f": {key}:" in lines[0] if key else "bad.yaml" in lines[0]


def test_build_format_names_the_inline_source():
    with pytest.raises(ConfigError, match="window_tokens"):
        build_format({"name": "w", "description": "w", "role": "weights", "bits": 16, "encoding": "float",
                      "float_format": "fp16", "window_tokens": 4})


# -- the format's cost in the engine --------------------------------------------------------------


def _attention_ns(result) -> float:
    att = [o for o in result.ops if o["name"] == "attention"]
    return sum(o["duration_ns"] for o in att) / len(att)


def test_slow_vector_unit_makes_kivi2_attention_slower_than_int8():
    from sim.run import simulate

    slow = str(FIXTURES / "h200-slow-vector.yaml")  # the H200 with a 32x slower vector unit
    restore = ("hardware.compute.vector_flops_per_cycle.fp32=256", "hardware.compute.vector_flops_per_cycle.bf16=512")
    run = dict(hardware=slow, batch=4, context=8192, steps=1, keep_ops=True, software="torch-graph")
    fast_int8, fast_kivi = (simulate(kv=kv, overrides=restore, **run) for kv in ("int8", "kivi-2"))
    slow_int8, slow_kivi = (simulate(kv=kv, **run) for kv in ("int8", "kivi-2"))
    fast_ratio = _attention_ns(fast_kivi) / _attention_ns(fast_int8)
    slow_ratio = _attention_ns(slow_kivi) / _attention_ns(slow_int8)
    # at full vector rate kivi-2's 2.4x fewer KV bytes keep it near int8; with a slow vector
    # unit its 5 dequant ops per value (int8: 2) make its attention far slower
    assert fast_ratio < 1.25
    assert slow_ratio > 1.5 and slow_ratio > 1.5 * fast_ratio
    assert slow_kivi.summary["breakdown_ms"]["dequant"] > slow_kivi.summary["breakdown_ms"].get("kv", 0.0)
    att = next(o for o in slow_kivi.ops if o["name"] == "attention")
    assert att["bound"] == "dequant"


def test_outlier_heavy_format_makes_attention_gather_bound(tmp_path):
    from sim.run import simulate

    heavy = tmp_path / "heavy-outliers.yaml"
    heavy.write_text(yaml.safe_dump({
        "name": "heavy-outliers", "description": "2-bit with 20% sparse COO outliers", "role": "kv", "bits": 2,
        "symmetric": False, "scale_dtype": "fp16", "zero_dtype": "fp16", "per": "row", "group_size": 128,
        "outliers": {"fraction": 0.2, "layout": "coo", "index_bits": 16}}))
    r = simulate(kv=str(heavy), batch=8, context=8192, steps=1, keep_ops=True, software="torch-graph")
    att = next(o for o in r.ops if o["name"] == "attention")
    assert att["bound"] == "outliers"
    assert r.summary["breakdown_ms"]["outliers"] > r.summary["breakdown_ms"].get("kv", 0.0)


def test_run_accepts_kivi2_with_int4_weights(cli):
    code, out, err = cli("run", "--kv", "kivi-2", "--weights", "int4-g128", "--steps", "1")
    assert code == 0, err
    assert "weights int4-g128, KV kivi-2" in out and "dequant" in out


@pytest.mark.parametrize("kv", ["kivi-2", "kvquant-3-1pct", "int2-asym-outlier", "fp8-e4m3"])
def test_the_step_reads_exactly_the_formats_bytes(kv):
    from sim.run import simulate

    r = simulate(kv=kv, batch=3, context=5000, steps=1)
    fmt, plan = get_format(kv), r.resolved
    t = fmt.kv_read(5000, plan.k_width, plan.v_width)
    step = r.steps[0]
    assert step["kv_bytes"] == 3 * 32 * t.stream_bytes + 3 * 32 * fmt.kv_append(plan.k_width, plan.v_width).stream_bytes
    assert step["outlier_bytes"] == 3 * 32 * t.gather_bytes
    des = r.summary["per_token_ms_p50"]
    analytic = simulate(kv=kv, batch=3, context=5000, steps=1, engine="analytic").summary["per_token_ms_p50"]
    assert des >= analytic * 0.999 and des == pytest.approx(analytic, rel=0.05)


def _attention_ms(kv: str, software: str = "fused", **kw) -> float:
    from sim.run import simulate

    r = simulate(kv=kv, batch=16, context=16384, steps=1, keep_ops=True, software=software, **kw)
    return sum(o["duration_ns"] for o in r.ops if o["name"] == "attention") / 1e6


def test_attention_time_is_monotone_in_the_kernels_efficiency(tmp_path):
    """A worse implementation (lower efficiency, more picoseconds per value) is never faster."""
    import yaml as _yaml

    from sim.config.software import software_dir

    base = _yaml.safe_load((software_dir() / "fused.yaml").read_text())
    times = []
    for scale in (0.5, 1.0, 2.0, 4.0):
        stack = dict(base, name=f"fused-x{scale}")
        impl = dict(stack["attention"]["triton_group"])
        impl["value_ps"] = dict(impl["value_ps"], value=impl["value_ps"]["value"] * scale)
        impl["outlier_ps"] = dict(impl["outlier_ps"], value=impl["outlier_ps"]["value"] * scale)
        stack["attention"] = {"triton_group": impl}
        path = tmp_path / f"s{scale}.yaml"
        path.write_text(_yaml.safe_dump(stack))
        times.append(_attention_ms("int2-asym-outlier", software=str(path)))
    assert times == sorted(times)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_group_size_changes_bytes_and_dequant_work_as_hand_computed(group, tmp_path):
    """int4 asymmetric, K and V per token in groups of G, fp16 scale + zero: per token and
    layer (8 KV heads x 128 = 1024 values each of K and V) 1024 x 4 bits + 1024 / G x 32 bits."""
    fmt = tmp_path / f"int4-g{group}.yaml"
    fmt.write_text(yaml.safe_dump({"name": f"int4-g{group}", "description": "test", "role": "kv", "bits": 4,
                                   "symmetric": False, "scale_dtype": "fp16", "zero_dtype": "fp16", "per": "row",
                                   "group_size": group}))
    from sim.formats import get_format

    f = get_format(str(fmt))
    per_token = 2 * (1024 * 4 // 8 + (1024 // group) * 4)
    assert f.kv_footprint(1000, 1024, 1024) == 1000 * per_token
    from sim.formats.spec import kv_quant

    assert kv_quant(f).group_size == group  # the dequantization cost sees the group size


def test_zero_dequant_cost_and_ideal_bandwidth_reproduce_the_byte_model(tmp_path):
    """A stack whose attention kernel has no start-up beyond the byte model's, efficiency 1 and
    no per-value cost gives attention time = KV bytes / stream rate (+ the fixed start-up)."""
    import yaml as _yaml

    from sim.config.software import software_dir

    base = _yaml.safe_load((software_dir() / "fused.yaml").read_text())
    impl = {k: dict(v, value=0.0) for k, v in base["attention"]["triton_group"].items()}
    impl["efficiency"] = dict(impl["efficiency"], value=1.0)
    base["attention"] = {"triton_group": impl}
    path = tmp_path / "ideal.yaml"
    path.write_text(_yaml.safe_dump(dict(base, name="ideal")))
    from sim.run import simulate

    r = simulate(kv="kivi-2", batch=16, context=16384, steps=1, keep_ops=True, software=str(path))
    att = next(o for o in r.ops if o["name"] == "attention")
    ideal = simulate(kv="fp16", batch=16, context=16384, steps=1, keep_ops=True, software=str(path))
    att16 = next(o for o in ideal.ops if o["name"] == "attention")
    kv2 = att["read_kv_hbm_bytes"]
    kv16 = att16["read_kv_hbm_bytes"]
    # with no dequantization cost the time falls with the bytes
    assert att["duration_ns"] < att16["duration_ns"]
    assert kv2 < 0.25 * kv16
