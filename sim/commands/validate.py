"""``decodesim validate``: write reports/validation.md (predicted vs measured H200 decode steps,
published anchors reproduced from specs, the tensor-parallel row). Needs no GPU."""

from __future__ import annotations

from sim.commands.common import output_file


def register(sub) -> None:
    p = sub.add_parser("validate", help="write the validation report (measured and published decode latencies)")
    p.add_argument("--out", type=output_file, default=None, help="report path (default: reports/validation.md in the checkout)")
    p.add_argument("--csv", default=None,
                   help="measured decode steps (default: calibration/data/h200/decode_steps.csv)")
    p.set_defaults(handler=handle)


def handle(args) -> int:
    from sim.errors import ConfigError
    from sim.report import validation

    csv_path = args.csv or validation.DECODE_CSV
    if not args.csv and not validation.repo_path(csv_path).is_file():
        raise ConfigError(str(validation.repo_path(csv_path)), None,
                          "the committed H200 measurements are not here: run `decodesim validate` from a checkout "
                          "(calibration/ is not installed with the package) or pass --csv FILE and --out FILE")
    if args.csv and not validation.repo_path(csv_path).is_file():
        raise ConfigError(str(csv_path), None, "measured decode-step CSV not found")
    try:
        target = validation.write(args.out, csv_path)
    except (KeyError, ValueError) as err:
        raise ConfigError(str(csv_path), None, f"expected columns batch, context, graph, median_ms ({err})") from None
    print(f"wrote {target}")
    return 0
