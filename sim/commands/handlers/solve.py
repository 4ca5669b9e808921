"""What ``decodesim solve`` does: bisect one knob to just meet the latency target."""

from __future__ import annotations

from sim.commands.common import emit_json
from sim.errors import COMMAND_LINE, ConfigError
from sim.options.spec import spec_from_args
from sim.study.solve import solve


def handle(args) -> int:
    lo = hi = None
    if args.bounds:
        try:
            lo_s, hi_s = args.bounds.split(":")
            lo, hi = float(lo_s), float(hi_s)
        except ValueError:
            raise ConfigError(COMMAND_LINE, "--range", "expected LO:HI with two numbers", args.bounds) from None
    if not 0 < args.rel_tol < 0.5:
        raise ConfigError(COMMAND_LINE, "--rel-tol", "must be in (0, 0.5)", args.rel_tol)
    spec = spec_from_args(args)
    solution = solve(spec, args.vary, args.target_ms, lo, hi, rel_tol=args.rel_tol)
    if args.json:
        emit_json("solve", solution.as_dict())
        return 0 if solution.found else 1
    print(f"decodesim solve: {spec.model} on {spec.hardware}, batch {spec.batch}, context {spec.context}, "
          f"weights {spec.weights}, KV {spec.kv}, target {solution.target_ms:g} ms")
    print(f"  {solution.message}")
    print(f"  {len(solution.evaluations)} simulations over [{solution.lo:g}, {solution.hi:g}]")
    return 0 if solution.found else 1
