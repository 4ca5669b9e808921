"""``python -m sim.report.link_fit CSV``: print the ``system.links`` block fitted to measured
collectives (issue 7), each number with the CSV as its source, and the fit's residuals.

The fit itself (the simulator's collective model, non-negative least squares) is
sim.experiments.link_fit; this module only reads the arguments and prints.
"""

from __future__ import annotations

import argparse

from sim.errors import ConfigError
from sim.experiments.link_fit import fit, read_rows
from sim.setup import load_profile


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="fit system.links figures from a collectives CSV")
    parser.add_argument("csv", help="CSV with op, world_size, bytes, median_us")
    parser.add_argument("--profile", default="h200-sxm-x8", help="profile whose host.kernel_gap_ns to subtract")
    parser.add_argument("--mode", default="graph", help="rows of this mode column value (default graph; 'any': all)")
    args = parser.parse_args(argv)
    try:
        gap = load_profile(args.profile).host.kernel_gap_ns.value
        result = fit(read_rows(args.csv, None if args.mode == "any" else args.mode), source=args.csv)
    except ConfigError as err:
        print(f"link_fit: {err}")
        return 2
    print(result.yaml_block(gap))
    print(f"# residuals: median {result.median_abs_residual_pct:.1f}%, worst {result.worst_abs_residual_pct:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
