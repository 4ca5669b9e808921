"""FP4 formats (NVFP4, MXFP4) by hand, their reference quantizer, and datatypes per chip: a
format the chip's matrix unit does not execute is converted at its cost, one it does runs
natively (B200's FP4 rate, Groq's int8)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.formats import get_format
from sim.formats.reference import fake_quant, round_minifloat

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


# -- FP4 bytes by hand ---------------------------------------------------------------------


def test_nvfp4_is_4_5_bits_plus_one_fp32_per_tensor():
    f = get_format("nvfp4")
    rows, cols = 4096, 4096
    codes = rows * cols * 4 // 8  # two E2M1 codes per byte
    scales = rows * (cols // 16) * 1  # one E4M3 byte per 16 values
    assert f.tensor_bytes("weight", rows, cols).values == codes
    assert f.tensor_bytes("weight", rows, cols).metadata == scales
    assert f.constant_bytes("weight", cols) == 4  # the FP32 per-tensor scale
    assert f.weight_bytes(rows, cols) == codes + scales + 4 == 9_437_188
    assert 8 * (codes + scales) / (rows * cols) == 4.5
    # KV: per token, 16 channels per scale; the tensor scale is a per-layer constant
    assert f.kv_footprint(100, 1024, 1024) == 2 * 100 * (1024 // 2 + 1024 // 16) == 115_200
    assert f.layer_constant_bytes(1024, 1024) == 8


def test_mxfp4_is_4_25_bits_with_no_per_tensor_scale():
    f = get_format("mxfp4")
    rows, cols = 2880, 2880  # a gpt-oss expert matrix: 90 blocks of 32 per row
    assert f.weight_bytes(rows, cols) == rows * cols // 2 + rows * (cols // 32) == 4_406_400
    assert 8 * f.weight_bytes(rows, cols) / (rows * cols) == 4.25
    assert f.constant_bytes("weight", cols) == 0
    assert f.effective_bits(4096, 1024, "k") == 4.25


def test_fp4_dequant_work_by_hand():
    """Per value: unpack (2) + convert (1) + scale (1); per group: NVFP4 multiplies its fp8
    scale by the tensor scale (1), MXFP4 turns its exponent into a float (1)."""
    nv, mx = get_format("nvfp4"), get_format("mxfp4")
    assert nv.tensor_bytes("v", 10, 1024).dequant_ops == 10 * 1024 * 4 + 10 * 64 * 1
    assert mx.tensor_bytes("v", 10, 1024).dequant_ops == 10 * 1024 * 4 + 10 * 32 * 1


def test_fp4_formats_listed(cli):
    code, out, _ = cli("formats")
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert rows["nvfp4"][1] == "4.500" and rows["mxfp4"][1] == "4.250"


# -- the reference quantizer ---------------------------------------------------------------


def test_e2m1_rounds_to_its_eight_magnitudes_ties_to_even():
    x = np.array([0.25, 0.3, 0.75, 1.25, 2.5, 5.0, 5.1, 9.0, -0.3])
    assert round_minifloat(x, "e2m1").tolist() == [0.0, 0.5, 1.0, 1.0, 2.0, 4.0, 6.0, 6.0, -0.5]


def test_mxfp4_block_uses_a_power_of_two_scale_and_e2m1_levels():
    x = np.linspace(-3.0, 3.0, 32)[None, :]  # absmax 3: scale 2^(floor(log2 3) - 2) = 0.5
    xhat, _ = fake_quant(get_format("mxfp4").weight, x)
    assert set(np.abs(xhat).ravel() / 0.5) <= set(E2M1)
    assert np.abs(xhat - x).max() <= 0.5  # half the widest step (2 x 0.5)


def test_nvfp4_block_scale_is_fp8_times_the_tensor_scale():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 64))
    q = get_format("nvfp4").weight
    xhat, _ = fake_quant(q, x)
    blocks, back = x.reshape(-1, 16), xhat.reshape(-1, 16)
    for b, h in zip(blocks, back):  # the block's largest value lands near 6 x its scale
        assert abs(np.abs(h).max() - np.abs(b).max()) <= 0.1 * np.abs(b).max()
    err = np.sqrt(np.mean((xhat - x) ** 2) / np.mean(x ** 2))
    mx_err = np.sqrt(np.mean((fake_quant(get_format("mxfp4").weight, x)[0] - x) ** 2) / np.mean(x ** 2))
    assert 0.05 < err < mx_err < 0.2  # 4-bit: NVFP4's finer, exact-ish scales beat MXFP4's powers of two


# -- datatypes per chip --------------------------------------------------------------------


def _run(hardware, weights, **kw):
    from sim.run import RunSpec, simulate

    spec = dict(hardware=hardware, model="llama-3-8b", weights=weights, batch=1, context=1024, steps=1,
                engine="analytic")
    return simulate(RunSpec(**{**spec, **kw})).summary


def _weights(hardware, weights):
    """The weight format as the chip runs it (sim.setup resolves it against the compute unit's dtypes)."""
    from sim.run import RunSpec
    from sim.setup import resolve

    return resolve(RunSpec(hardware=hardware, model="llama-3-8b", weights=weights, steps=1)).weights


def test_b200_runs_nvfp4_on_its_fp4_matrix_rate():
    """At a compute-bound shape (batch 1024, short context) the matmuls of NVFP4 weights take a
    quarter of their bf16 time: 9000 vs 2250 dense TFLOP/s (b200.yaml's fp4 and bf16 rates)."""
    from sim.setup import load_profile

    compute = load_profile("b200").compute
    assert compute.matrix_rate("nvfp4") == compute.matrix_rate("fp4") == 4 * compute.matrix_rate("bf16")
    bf16 = _run("b200", "bf16", batch=1024, context=128)
    nv = _run("b200", "nvfp4", batch=1024, context=128)
    assert bf16["breakdown_ms"]["compute"] > 2.0  # compute-bound enough to see the rate
    assert nv["breakdown_ms"]["compute"] == pytest.approx(bf16["breakdown_ms"]["compute"] / 4, rel=0.02)
    assert nv["breakdown_ms"].get("dequant", 0.0) == 0.0 and "datatype_note" not in nv
    # Hopper has no FP4 matrix unit: the same weights are converted to bf16 and say so
    h200 = _run("h200-sxm", "nvfp4", batch=1024, context=128)
    assert h200["breakdown_ms"]["dequant"] > 0 and "no nvfp4" in h200["datatype_note"]


@pytest.mark.parametrize("hardware", ["groq-lpu-576", "cerebras-wse3", "sambanova-sn40l"])
def test_fp8_on_a_chip_without_an_fp8_matrix_unit_pays_conversion(hardware):
    from sim.setup import load_profile

    assert "fp8" not in load_profile(hardware).compute.matrix_flops_per_cycle
    fp8 = _run(hardware, "fp8")
    assert fp8["breakdown_ms"].get("dequant", 0.0) > 0
    assert "has no fp8" in fp8["datatype_note"]
    assert _weights(hardware, "fp8").weight_read(4096, 4096).dequant_ops == 4096 * 4096 * 2  # convert + scale
    assert _weights(hardware, "bf16").weight_read(4096, 4096).dequant_ops == 0


def test_groq_int8_runs_natively_and_h200_weight_only_int8_dequantizes():
    groq = _run("groq-lpu-576", "int8", model="llama-3-70b")
    assert groq["breakdown_ms"].get("dequant", 0.0) == 0.0
    assert "as stored" in groq["datatype_note"]
    assert groq["per_token_ms_p50"] == pytest.approx(
        _run("groq-lpu-576", "int8-w8a8", model="llama-3-70b")["per_token_ms_p50"], rel=1e-6)
    assert _weights("groq-lpu-576", "int8").weight_read(4096, 4096).dequant_ops == 0
    h200 = _run("h200-sxm", "int8")  # a GPU stack's weight-only int8 kernel dequantizes to bf16
    assert "datatype_note" not in h200
    assert _weights("h200-sxm", "int8").weight_read(4096, 4096).dequant_ops == 4096 * 4096 * 2
    assert _weights("h200-sxm", "fp8").weight_read(4096, 4096).dequant_ops == 0  # H200's fp8 tensor cores


def test_datatype_note_is_printed(cli):
    code, out, _ = cli("run", "--hardware", "cerebras-wse3", "--model", "llama-3-8b", "--weights", "fp8",
                       "--steps", "1", "--engine", "analytic")
    assert code == 0
    assert "note: cerebras-wse3's matrix unit has no fp8: fp8 weights are converted to bf16" in out


def test_gpt_oss_120b_in_mxfp4_on_b200():
    """116.8B parameters at 4.25 bits = 62.05 GB; every other layer attends to 128 tokens only."""
    s = _run("b200", "mxfp4", model="gpt-oss-120b", context=8192)
    assert s["capacity"]["weights_bytes"] == pytest.approx(116.8e9 * 4.25 / 8, rel=0.005)
    per_layer_token = 2 * 8 * 64 * 2  # K and V, 8 KV heads x 64, fp16
    assert s["kv_bytes_per_token"] == pytest.approx(18 * (8192 + 128) * per_layer_token, rel=1e-3)
    assert "datatype_note" not in s  # B200's FP4 tensor cores take MXFP4


def test_gb200_nvl72_runs_fp4_at_10_pflops_per_gpu():
    from sim.setup import load_profile

    gb, b = load_profile("gb200-nvl72"), load_profile("b200")
    assert gb.chips == 72 and gb.compute.matrix_peak_TFLOPs("nvfp4") == pytest.approx(10000, rel=0.002)
    assert gb.compute.matrix_peak_TFLOPs("bf16") == pytest.approx(2500, rel=0.002)
    assert b.compute.matrix_peak_TFLOPs("nvfp4") == pytest.approx(9000, rel=0.01)  # HGX B200 at 1000 W
    assert gb.energy.power_limit_W.value == 1200 and gb.store.capacity_GB.value == 186
