"""``decodesim validate``: write reports/validation.md (predicted vs measured H200 decode steps,
published anchors reproduced from specs, the tensor-parallel row). Needs no GPU."""

from __future__ import annotations

from sim.options.run import output_file


def register(sub) -> None:
    p = sub.add_parser("validate", help="write the validation report (measured and published decode latencies)")
    p.add_argument("--out", type=output_file, default=None, help="report path (default: reports/validation.md in the checkout, or under the current folder "
                        "when installed)")
    p.add_argument("--csv", default=None,
                   help="measured decode steps (default: calibration/data/h200/decode_steps.csv)")
    p.set_defaults(handler="sim.commands.handlers.validate")


