"""What ``decodesim formats`` does: every format with its effective bits and reduction against fp16."""

from __future__ import annotations

from sim.commands.common import emit_json, write_atomic
from sim.config.loader import load_yaml, validate
from sim.config.model import ModelSpec
from sim.errors import COMMAND_LINE, ConfigError
from sim.experiments import formats
from sim.formats import list_formats
from sim.formats.tables import byte_row, weight_row, widths
from sim.paths import models_dir, resolve
from sim.report.formats_report import build_report


def handle(args) -> int:
    if args.context <= 0:
        raise ConfigError(COMMAND_LINE, "--context", "must be > 0", args.context)
    if args.report is not None:

        write_atomic(args.report, build_report(formats.run(model=args.model)))
        print(f"wrote {args.report}")
        return 0
    path = resolve(args.model, models_dir(), "model")
    model = validate(ModelSpec, load_yaml(path), path)
    k_width, v_width = widths(model)
    kv = [byte_row(f, args.context, k_width, v_width) for f in list_formats("kv")] if args.role != "weights" else []
    weights = [weight_row(f) for f in list_formats("weights")] if args.role != "kv" else []
    if args.json:
        emit_json("formats", {"model": model.name, "context": args.context, "k_width": k_width, "v_width": v_width,
                              "kv_formats": kv, "weight_formats": weights})
        return 0
    if kv:
        print(f"KV-cache formats at context {args.context}, {model.name} (K and V rows of {k_width} and "
              f"{v_width} values per layer); bits per value include metadata, outliers and the fp window")
        print(f"  {'format':<18}{'K bits':>7}{'V bits':>7}{'KV B/tok/layer':>15}{'cut':>8}"
              f"{'codes':>7}{'meta':>6}{'window':>7}{'outl.':>6}{'gather':>7}{'deq op/v':>9}")
        for r in kv:
            print(f"  {r['kv']:<18}{r['k_bits']:>7.3f}{r['v_bits']:>7.3f}{r['kv_stored_bytes_per_token_layer']:>15.1f}"
                  f"{r['reduction_pct']:>7.1f}%{r['code_bits']:>7.2f}{r['metadata_bits']:>6.2f}"
                  f"{r['window_bits']:>7.2f}{r['outlier_bits']:>6.2f}{r['gather_share_pct']:>6.1f}%"
                  f"{r['dequant_ops_per_value']:>9.2f}")
    if weights:
        print("weight formats (4096 x 4096 matrix)")
        print(f"  {'format':<18}{'bits':>7}{'cut':>8}{'deq op/v':>9}  matmul")
        for r in weights:
            print(f"  {r['weights']:<18}{r['bits']:>7.3f}{r['reduction_pct']:>7.1f}%"
                  f"{r['dequant_ops_per_value']:>9.2f}  {r['matmul_dtype']}")
    return 0
