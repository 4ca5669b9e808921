"""``decodesim solve --target-ms 10 --vary DOTTED.PATH``: the value of one knob that just meets a target."""

from __future__ import annotations

from sim.commands.common import add_run_options, emit_json, spec_from_args


def register(sub) -> None:
    p = sub.add_parser("solve", help="inverse what-if: bisect one parameter to just meet the latency target",
                       description="Find the smallest (or largest, where that is what helps) value of one dotted "
                                   "path at which the p99 per-token latency meets --target-ms, by bisection over "
                                   "a model monotone in it; says so when no value in the range does.")
    add_run_options(p)
    p.add_argument("--vary", required=True, metavar="DOTTED.PATH",
                   help="the parameter to solve for, e.g. hardware.hbm.channel_bandwidth_GBps, "
                        "hardware.l2.capacity_MB, chips, batch")
    p.add_argument("--range", dest="bounds", default=None, metavar="LO:HI",
                   help="values to search (default: current/16 .. current*16; integers 1 .. current*16)")
    p.add_argument("--rel-tol", type=float, default=2e-3, help="stop when the bracket is this narrow (default 0.2%%)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=handle)


def handle(args) -> int:
    from sim.errors import ConfigError
    from sim.study.solve import solve

    lo = hi = None
    if args.bounds:
        try:
            lo_s, hi_s = args.bounds.split(":")
            lo, hi = float(lo_s), float(hi_s)
        except ValueError:
            raise ConfigError("--range", "range", "expected LO:HI with two numbers", args.bounds) from None
    if not 0 < args.rel_tol < 0.5:
        raise ConfigError("--rel-tol", "rel_tol", "must be in (0, 0.5)", args.rel_tol)
    spec = spec_from_args(args)
    solution = solve(spec, args.vary, args.target_ms, lo, hi, rel_tol=args.rel_tol)
    if args.json:
        emit_json("solve", solution.as_dict())
        return 0
    print(f"decodesim solve: {spec.model} on {spec.hardware}, batch {spec.batch}, context {spec.context}, "
          f"weights {spec.weights}, KV {spec.kv}, target {solution.target_ms:g} ms")
    print(f"  {solution.message}")
    print(f"  {len(solution.evaluations)} simulations over [{solution.lo:g}, {solution.hi:g}]")
    return 0 if solution.found else 1
