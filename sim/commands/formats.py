"""``decodesim formats``: every format with its effective bits and reduction against fp16.

KV formats are shown at one context (``--context``) for the K and V row widths of one
model's cache (``--model``); weight formats on a 4096 x 4096 matrix. ``--report PATH``
writes the Markdown report (byte table, fidelity table, the claims check) instead.
"""

from __future__ import annotations

from sim.commands.common import emit_json, output_file, write_atomic
from sim.errors import ConfigError
from sim.paths import models_dir, resolve


def register(sub) -> None:
    p = sub.add_parser("formats", help="list weight and KV formats: effective bits, reduction vs fp16",
                       description="List every bundled format with its effective bits per value (metadata, "
                                   "outliers and the full-precision window included) and its reduction against fp16.")
    p.add_argument("--model", default="llama-3-8b", help="model whose KV row widths are used (default llama-3-8b)")
    p.add_argument("--context", type=int, default=4096, help="tokens in the cache (default 4096)")
    p.add_argument("--role", choices=["kv", "weights"], default=None, help="only KV or only weight formats")
    p.add_argument("--json", action="store_true", help="print JSON rows instead of the table")
    p.add_argument("--report", type=output_file, default=None, metavar="PATH",
                   help="write the formats report (Markdown) to PATH, e.g. reports/formats.md")
    p.set_defaults(handler=handle)


def handle(args) -> int:
    # deferred: the CLI imports every command at start-up; these load numpy, pydantic or the simulator
    from sim.config.loader import load_yaml, validate
    from sim.config.model import ModelSpec
    from sim.formats import list_formats
    from sim.formats.tables import byte_row, weight_row, widths

    if args.context <= 0:
        raise ConfigError("--context", "context", "must be > 0", args.context)
    if args.report is not None:
        from sim.experiments import formats
        from sim.report.formats_report import build_report

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
