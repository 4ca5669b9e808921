"""What ``decodesim trace`` does: check the flags' ranges, generate the trace, write it."""

from __future__ import annotations

import math

from sim import decode_trace
from sim.config.quantity import fmt_range
from sim.errors import COMMAND_LINE, ConfigError

# flag -> (lowest, highest, lowest excluded): generous, but never so large that writing the trace takes minutes
LIMITS = {"batch": (1, 1_000_000, False), "context": (1, 1_000_000_000, False), "steps": (1, 1_000_000, False),
          "requests": (1, 10_000_000, False), "rate": (1e-6, 1e9, False), "prompt_median": (1, 1_000_000_000, False),
          "output_median": (1, 1_000_000_000, False), "step_ms": (0.0, 1e6, True), "speedup": (0.0, 1e9, True),
          "seed": (0, 2**63 - 1, False)}
MAX_ENTRIES = 10_000_000  # batch x steps: (sequence, step) pairs in the file


def check_args(args) -> None:
    """Every numeric flag within its range (ConfigError naming the flag otherwise)."""

    for name, (lo, hi, open_low) in LIMITS.items():
        value = getattr(args, name)
        flag = "--" + name.replace("_", "-")
        if not math.isfinite(value) or value > hi or value < lo or (open_low and value == lo):
            raise ConfigError(COMMAND_LINE, flag, f"must be in {fmt_range(lo, hi, open_low)}", value)
    if args.batch * args.steps > MAX_ENTRIES:
        raise ConfigError(COMMAND_LINE, "--batch x --steps", f"must be at most {MAX_ENTRIES:,} (every step lists "
                          "every sequence)", f"{args.batch:,} x {args.steps:,}")


def handle(args) -> int:
    check_args(args)
    if args.kind == "fixed":
        steps = decode_trace.fixed(args.batch, args.context, args.steps)
    else:
        if args.kind == "synthetic":
            requests = decode_trace.synthetic_requests(args.requests, args.rate, args.prompt_median, args.output_median,
                                                seed=args.seed)
        else:
            if args.azure is None:
                raise ConfigError(COMMAND_LINE, "--azure", "the azure generator needs --azure CSV")
            if not args.azure.is_file():
                raise ConfigError(str(args.azure), None, "file not found")
            if args.speedup <= 0:
                raise ConfigError(COMMAND_LINE, "--speedup", "must be > 0", args.speedup)
            requests = [decode_trace.Request(r.arrival_s / args.speedup, r.prompt, r.output)
                        for r in decode_trace.azure_requests(args.azure, limit=args.requests)]
        steps = decode_trace.from_requests(requests, args.batch, step_ms=args.step_ms, max_steps=args.steps)
    decode_trace.write(steps, args.out)
    batches = [s.batch for s in steps]
    print(f"wrote {len(steps)} steps to {args.out} (batch {min(batches)}..{max(batches)}, "
          f"max context {max(max(s.contexts) for s in steps)})")
    return 0
