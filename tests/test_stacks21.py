"""Issue 21: what real code does, said by a stack. Named temporaries (a dequantized KV copy),
activation-quantization prologues as choices, quantize-and-append per KV format, PyTorch's
grouped GEMM, kernel implementations with measured rates, strict keys; Gemma 2's fields."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from sim.config.model import ModelSpec
from sim.config.software import OPS, load_stack, software_dir
from sim.errors import ConfigError
from sim.run import simulate

DENSE = ["llama-3.2-1b", "llama-3-8b", "mistral-nemo-12b", "qwen2.5-14b", "phi-3-mini", "gemma-2-9b"]


def _ms(**kw) -> float:
    return simulate(steps=1, check_capacity=False, **kw).summary["per_token_ms_p50"]


def _stack_file(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load((software_dir() / "torch-graph.yaml").read_text())
    edit(data)
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("edit, key", [
    (lambda d: d["ops"].update(rms_norm=d["ops"]["rmsnorm"]), "ops.rms_norm"),
    (lambda d: d["groups"]["rmsnorm"].append("ffn_nrom"), "groups.rmsnorm.7"),
    (lambda d: d["ops"].update({"embed@looped": d["ops"]["embed"]}), "ops.embed@looped"),
    (lambda d: d["ops"]["embed"]["kernels"][0].update(speed=2), "ops.embed.kernels.embedding.speed"),
    (lambda d: d["ops"]["embed"]["kernels"][0].update(uses=["k16"]), "ops.embed"),
    (lambda d: d["ops"]["embed"]["kernels"][0].update(makes={"k16": "kv_dense"}), "ops.embed"),
    (lambda d: d["ops"]["embed"]["kernels"][0].update(temp_of="kv_sparse"), "ops.embed.kernels.embedding.temp_of"),
    (lambda d: d["matrix_prologue"]["fp8"].update(use="per_block"), "matrix_prologue.fp8"),
    (lambda d: d["ops"]["embed"]["kernels"][0].update(impl="cutlass"), "ops"),
])
def test_a_bad_stack_key_is_one_error_naming_file_and_key(tmp_path, edit, key):
    path = _stack_file(tmp_path, edit)
    load_stack.cache_clear()
    with pytest.raises(ConfigError) as err:
        load_stack(str(path))
    assert str(path) in str(err.value) and key in str(err.value) and "\n" not in str(err.value)


def test_every_op_the_lowering_emits_is_a_known_op_name():
    names = set()
    for model, extra in (("llama-3-8b", {}), ("phi-3-mini", {}), ("gemma-2-9b", {}), ("olmoe-1b-7b", {}),
                         ("qwen3-30b-a3b", {}), ("olmoe-1b-7b", {"dispatch": "host_sync"}),
                         ("llama-3-8b", {"chips": 2, "tp": 2})):
        r = simulate(model=model, batch=2, context=512, steps=1, keep_ops=True, check_capacity=False, **extra)
        names |= {o["name"] for o in r.ops}
    assert names <= set(OPS), sorted(names - set(OPS))


@pytest.mark.parametrize("model", DENSE)
def test_static_fp8_at_batch_1_is_never_slower_than_bf16(model):
    """One cast per linear and half the weight bytes: never slower than bf16 (issue 21)."""
    bf16 = _ms(model=model, software="torch-graph-fp8-static", weights="bf16", context=1024)
    fp8 = _ms(model=model, software="torch-graph-fp8-static", weights="fp8", context=1024)
    assert fp8 <= bf16


def test_prologue_choices_order_the_fp8_step():
    """fused <= static <= per_token, per_tensor: fewer and cheaper kernels before each GEMM."""
    stack = yaml.safe_load((software_dir() / "torch-graph.yaml").read_text())
    out = {}
    for use in ("fused", "static", "per_token", "per_tensor"):
        stack["matrix_prologue"]["fp8"]["use"] = use
        stack["name"] = f"p-{use}"
        path = Path(f"/tmp/decodesim-test-prologue-{use}.yaml")
        path.write_text(yaml.safe_dump(stack))
        out[use] = _ms(model="llama-3.2-1b", software=str(path), weights="fp8", context=1024)
        path.unlink()
    assert out["fused"] <= out["static"] <= out["per_token"] <= out["per_tensor"]


def test_a_dequantizing_cache_moves_its_bf16_copies():
    """Each layer writes and reads back a bf16 copy of K and V: at long context the step reads
    far more than the quantized cache, and more than the same format read by a dequantizing
    attention kernel."""
    kw = dict(model="llama-3.2-1b", batch=1, context=32768, kv="int8", keep_ops=True, steps=1, check_capacity=False)
    deq = simulate(software="torch-graph-dequant-kv", **kw)
    fused = simulate(software="torch-graph-kv-quant", **kw)
    att = [o for o in deq.ops if o["name"] == "attention"][0]
    fused_att = [o for o in fused.ops if o["name"] == "attention"][0]
    values = 32768 * 2 * 8 * 64  # tokens x (K, V) x KV heads x head_dim of one layer
    bound_ns = (att["read_kv_hbm_bytes"] + 2 * (2 * values)) / 4800.0  # codes, then bf16 copies written and read
    assert att["duration_ns"] >= bound_ns
    assert att["duration_ns"] > 3 * fused_att["duration_ns"]
    assert deq.summary["per_token_ms_p50"] > fused.summary["per_token_ms_p50"]


def test_a_stack_with_kv_formats_names_every_quantized_format_it_runs():
    with pytest.raises(ConfigError, match="kv_formats"):
        _ms(model="llama-3.2-1b", software="torch-graph-dequant-kv", kv="kivi-2")
    assert _ms(model="llama-3.2-1b", software="torch-graph-dequant-kv", kv="bf16") > 0  # 16-bit: nothing to name


def test_quantize_and_append_runs_its_own_kernels_per_format():
    """Per layer, the int8 append adds 2 x 13 kernels to RoPE's 10, the int4 append 2 x 18
    (groups, packing, codes, scales and zeros), against torch-graph's two index_copy_."""
    kw = dict(model="llama-3.2-1b", batch=1, context=1024, steps=1)
    base = simulate(software="torch-graph", kv="bf16", **kw).steps[0]["kernels"]
    k8 = simulate(software="torch-graph-kv-quant", kv="int8", **kw).steps[0]["kernels"]
    k4 = simulate(software="torch-graph-kv-quant", kv="int4-asym-g32", **kw).steps[0]["kernels"]
    layers = 16
    assert k8 - base == layers * (26 - 2) and k4 - base == layers * (36 - 2)


def test_an_implementation_below_its_class_rate_is_slower(tmp_path):
    src = (software_dir() / "torch-graph-grouped.yaml").read_text()
    data = yaml.safe_load(src)
    base = _ms(model="olmoe-1b-7b", batch=32, context=1024, software="torch-graph-grouped")
    data["impls"]["grouped_mm"]["efficiency"]["value"] = 1.0
    data["name"] = "grouped-ideal"
    path = tmp_path / "ideal.yaml"
    path.write_text(yaml.safe_dump(data))
    assert _ms(model="olmoe-1b-7b", batch=32, context=1024, software=str(path)) < base


def test_gemma_2_9b_has_its_published_parameter_counts():
    m = ModelSpec.model_validate(yaml.safe_load(Path("workloads/models/gemma-2-9b.yaml").read_text()))
    p = m.params()
    assert p["embedding"] == 917_504_000  # Gemma 2 report, Table 2
    assert m.total_params - p["embedding"] == 8_324_201_984
    assert m.ffn_matrices == 3 and m.window(0) == 4096 and m.window(1) is None


def test_sliding_layers_read_only_their_window():
    r = simulate(model="gemma-2-9b", batch=1, context=8000, steps=1, keep_ops=True, check_capacity=False)
    att = {o["layer"]: o.get("read_kv_hbm_bytes", 0) for o in r.ops if o["name"] == "attention"}
    assert att[0] < 0.55 * att[1]  # layer 0 slides (4096 of 8000 tokens), layer 1 attends globally
    norms = [o["name"] for o in r.ops if o["layer"] == 0 and o["name"].endswith("norm")]
    assert norms.count("post_attn_norm") == 1 and norms.count("post_ffn_norm") == 1
    assert any(o["name"] == "logit_softcap" for o in r.ops)


def test_geglu_counts_three_matrices():
    data = yaml.safe_load(Path("workloads/models/gemma-2-9b.yaml").read_text())
    gelu = ModelSpec.model_validate(dict(data, activation="gelu"))
    geglu = ModelSpec.model_validate(data)
    assert geglu.params()["ffn"] == 1.5 * gelu.params()["ffn"]


def test_bundled_stacks_copy_and_load(tmp_path):
    for name in ("torch-graph-fp8-static", "torch-graph-kv-quant", "torch-graph-dequant-kv", "torch-graph-grouped",
                 "torch-graph-fused-moe"):
        dst = tmp_path / f"{name}.yaml"
        shutil.copy(software_dir() / f"{name}.yaml", dst)
        load_stack.cache_clear()
        assert load_stack(str(dst)).name == name


def test_compare_states_the_kv_verdict_at_three_kernel_qualities():
    """Byte limit <= best measured <= as run for a dequantizing cache; each against fp16."""
    from sim.config.spec import RunSpec
    from sim.experiments.compare import kv_qualities

    spec = RunSpec(model="llama-3.2-1b", batch=8, context=32768, software="torch-graph-dequant-kv", steps=1)
    rows = kv_qualities(spec, ["fp16", "int8"], published=(0.8, "a test figure"))
    (row,) = rows
    assert row["byte_limit"]["ms"] <= row["best_measured"]["ms"] <= row["measured"]["ms"]
    assert row["byte_limit"]["ms"] <= row["published"]["ms"]
    assert not row["measured"]["beats_fp16"] and row["byte_limit"]["beats_fp16"]


def test_compare_refuses_a_published_kernel_without_a_source(capsys):
    from sim.cli import main

    assert main(["compare", "--model", "llama-3.2-1b", "--kv", "fp16,int8", "--published-kernel", "0.9"]) == 2
    err = capsys.readouterr().err
    assert "command line: --published-kernel: expected FRACTION" in err and err.count("\n") == 1


def test_a_qkv_bias_is_a_kernel_of_its_own_after_an_fp8_gemm_only():
    """cuBLAS fuses the bias into a bf16 GEMM; after torch._scaled_mm it is an add (Qwen2)."""
    kw = dict(model="qwen2.5-14b", batch=1, context=1024, software="torch-graph-fp8-static", steps=1)
    biased = simulate(weights="fp8", **kw).steps[0]["kernels"]
    plain = simulate(weights="fp8", **dict(kw, model="workloads/models/qwen2.5-14b.yaml")).steps[0]["kernels"]
    assert biased == plain  # the same file
    data = yaml.safe_load(Path("workloads/models/qwen2.5-14b.yaml").read_text())
    bf16 = {b: simulate(**dict(kw, weights="bf16", model=_model_file(data, b))).steps[0]["kernels"] for b in (True, False)}
    fp8 = {b: simulate(**dict(kw, weights="fp8", model=_model_file(data, b))).steps[0]["kernels"] for b in (True, False)}
    assert bf16[True] == bf16[False] and fp8[True] - fp8[False] == 3 * data["layers"]


def _model_file(data: dict, bias: bool) -> str:
    path = Path(f"/tmp/decodesim-test-qwen-bias-{bias}.yaml")
    path.write_text(yaml.safe_dump(dict(data, qkv_bias=bias, name=f"qwen-bias-{bias}")))
    return str(path)
