"""What ``decodesim validate`` does: write reports/validation.md (predicted vs measured H200 decode steps,"""

from __future__ import annotations

from pathlib import Path

from sim.errors import ConfigError
from sim.experiments import validation
from sim.report.validation import write


def handle(args) -> int:
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
