"""``decodesim validate``: write reports/validation.md (predicted vs measured H200 decode steps,
published anchors reproduced from specs, the tensor-parallel row). Needs no GPU."""

from __future__ import annotations

from pathlib import Path

from sim.commands.common import output_file
from sim.errors import ConfigError


def register(sub) -> None:
    p = sub.add_parser("validate", help="write the validation report (measured and published decode latencies)")
    p.add_argument("--out", type=output_file, default=None, help="report path (default: reports/validation.md in the checkout, or under the current folder "
                        "when installed)")
    p.add_argument("--csv", default=None,
                   help="measured decode steps (default: calibration/data/h200/decode_steps.csv)")
    p.set_defaults(handler=handle)


def handle(args) -> int:
    # deferred: the CLI imports every command at start-up, and these pull in the simulator
    from sim.experiments import validation
    from sim.report.validation import write

    csv_path = Path(args.csv).resolve() if args.csv else validation.DECODE_CSV  # a given --csv is from the cwd
    if not validation.repo_path(csv_path).is_file():
        where = str(csv_path) if args.csv else str(validation.repo_path(csv_path))
        raise ConfigError(where, None, "measured decode-step CSV not found" if args.csv else
                          "the bundled H200 measurements are missing (a broken install?); pass --csv FILE")
    expected = "expected columns batch, context, graph, median_ms"
    try:  # the CSV is checked before the report simulates anything (that takes seconds)
        rows = validation.read_measured(csv_path)
    except (KeyError, ValueError) as err:
        raise ConfigError(str(csv_path), None, f"{expected} ({type(err).__name__}: {err})") from None
    if not rows:
        raise ConfigError(str(csv_path), None, f"no measured rows; {expected}")
    try:
        target = write(validation.run(csv_path), args.out)
    except (KeyError, ValueError) as err:
        raise ConfigError(str(csv_path), None, f"{expected} ({err})") from None
    print(f"wrote {target}")
    return 0
