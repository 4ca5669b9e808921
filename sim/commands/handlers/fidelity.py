"""What ``decodesim fidelity`` does: the numerical error of KV formats on synthetic or user KV tensors."""

from __future__ import annotations

import dataclasses
import math

from sim.commands.common import comma_list, emit_json
from sim.config.loader import parse_assignment
from sim.errors import COMMAND_LINE, ConfigError
from sim.formats import get_format
from sim.formats.fidelity import SyntheticKV, load_kv, score_std, synthetic
from sim.formats.tables import fidelity_rows


def check_args(args) -> None:
    """The numeric flags within their ranges (ConfigError naming the flag otherwise)."""
    if not 0 <= args.seed <= 2**63 - 1:
        raise ConfigError(COMMAND_LINE, "--seed", "must be in [0, 2^63 - 1]", args.seed)
    if not (2 <= args.head_dim <= 65_536 and args.head_dim % 2 == 0):
        raise ConfigError(COMMAND_LINE, "--head-dim", "must be an even number in [2, 65,536]", args.head_dim)
    if not 1 <= args.queries <= 100_000:
        raise ConfigError(COMMAND_LINE, "--queries", "must be in [1, 100,000]", args.queries)
    if not (math.isfinite(args.rope_theta) and args.rope_theta > 0):
        raise ConfigError(COMMAND_LINE, "--rope-theta", "must be a finite number > 0", args.rope_theta)
    if args.v_path is not None and not args.input:  # V without K: it would be ignored
        raise ConfigError(COMMAND_LINE, "--v", "applies only with --input (K as .npy)", str(args.v_path))


def synthetic_params(items: list[str], seed: int):
    fields = {f.name: f.type for f in dataclasses.fields(SyntheticKV)}
    values = {"seed": seed}
    for item in items:
        key, value = parse_assignment(item, "--synthetic")
        if key not in fields:
            raise ConfigError("--synthetic", key, f"no such parameter; allowed: {', '.join(fields)}")
        default = getattr(SyntheticKV, key)
        kind = type(default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not float(value).is_integer()):
            raise ConfigError("--synthetic", key, f"must be {'an integer' if kind is int else 'a number'}", value)
        values[key] = kind(value)
    return SyntheticKV(**values)


def handle(args) -> int:
    check_args(args)
    formats = [get_format(n) for n in comma_list(args.kv, "--kv", "formats")]
    if args.input:
        if args.synthetic:
            raise ConfigError(COMMAND_LINE, "--synthetic", "only applies without --input")
        sample = load_kv(args.input, args.v_path, head_dim=args.head_dim, k_rope=args.k_rope,
                         rope_theta=args.rope_theta, queries=args.queries, seed=args.seed)
    else:
        sample = synthetic(synthetic_params(args.synthetic, args.seed))
    rows = fidelity_rows(formats, sample, seed=args.seed)
    if args.json:
        emit_json("fidelity", {"input": sample.label, "params": sample.params, "rows": rows})
        return 0
    tokens, width = sample.k_pre.shape
    print(f"fidelity on {sample.label} KV: {tokens} tokens x {sample.kv_heads} KV heads x {sample.head_dim}, "
          f"{sample.q.shape[1]} queries per KV head (logit std {score_std(sample):.2f})")
    print(f"  {'format':<20}{'K err':>8}{'V err':>8}{'score err':>10}{'KL (nats)':>11}{'out err':>9}"
          f"{'K outl.':>8}{'V outl.':>8}")
    for r in rows:
        print(f"  {r['kv']:<20}{r['k_rel_error']:>8.4f}{r['v_rel_error']:>8.4f}{r['score_rel_error']:>10.4f}"
              f"{r['attn_kl']:>11.5f}{r['output_rel_error']:>9.4f}{100 * r['k_outlier_fraction']:>7.2f}%"
              f"{100 * r['v_outlier_fraction']:>7.2f}%")
    print("  errors are relative Frobenius norms; K after RoPE; KL(P || P_hat) averaged over queries")
    return 0
