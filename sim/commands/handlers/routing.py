"""What ``decodesim routing`` does: distinct experts touched per MoE layer against batch."""

from __future__ import annotations

from sim.commands.common import comma_list, emit_json
from sim.config.loader import load_yaml, validate
from sim.config.model import ModelSpec
from sim.config.spec import MAX_BATCH, MAX_STEPS
from sim.errors import COMMAND_LINE, ConfigError
from sim.moe import routing
from sim.moe.plan import MAX_ROUTING_DRAWS, moe_layers
from sim.paths import bundled, models_dir
from sim.paths import resolve as resolve_path


def handle(args) -> int:
    if args.write is not None and args.write.suffix != ".jsonl":  # the routing file format is JSON Lines
        raise ConfigError(COMMAND_LINE, "--write", "a routing file is JSON Lines: expected a name ending in .jsonl",
                          str(args.write))
    _check_generator_options(args)
    path = resolve_path(args.model, models_dir(), "model")
    model = validate(ModelSpec, load_yaml(path), path)
    if model.moe is None:
        raise ConfigError(str(path), "moe", "the model has no moe: section (a dense model routes nothing)")
    batches = _batches(args.batch)
    if not 1 <= args.steps <= MAX_STEPS:
        raise ConfigError(COMMAND_LINE, "--steps", f"must be in [1, {MAX_STEPS:,}]", args.steps)
    if batches[-1] > MAX_BATCH:
        raise ConfigError(COMMAND_LINE, "--batch", f"batch sizes must be at most {MAX_BATCH:,}", batches[-1])
    if args.seed < 0:
        raise ConfigError(COMMAND_LINE, "--seed", "must be >= 0", args.seed)
    moe = model.moe
    layers = moe_layers(model)
    draws = args.steps * layers * batches[-1] * moe.experts
    if args.routing in routing.KINDS and draws > MAX_ROUTING_DRAWS:
        raise ConfigError(COMMAND_LINE, "--steps", f"steps x MoE layers x largest batch x experts is {draws:.3g} expert "
                          f"scores to draw; at most {MAX_ROUTING_DRAWS:.0e}: fewer --steps or smaller --batch")
    if args.routing in routing.KINDS:
        trace = routing.generate(moe.experts, moe.top_k, layers, args.steps, batches[-1], kind=args.routing,
                                 skew=args.skew, locality=args.locality, seed=args.seed)
    else:
        file = resolve_path(args.routing, bundled("workloads", "routing"), "routing", suffixes=(".jsonl",),
                            builtin=routing.KINDS)
        trace = routing.read(file, moe.experts, moe.top_k, layers)
        batches = [b for b in batches if b <= trace.tokens] or [trace.tokens]
    rows = [_row(trace, batch, moe.top_k, routing.expected_distinct(moe.experts, moe.top_k, batch))
            for batch in batches]
    if args.write is not None:
        routing.write(trace, args.write)
    if args.json:
        emit_json("routing", {"model": model.name, "experts": moe.experts, "top_k": moe.top_k, "moe_layers": layers,
                              "routing": trace.description, "rows": rows})
    else:
        _print_table(f"{model.name}, {moe.experts} experts, top-{moe.top_k}, {layers} MoE layers, "
                     f"{trace.steps} steps, routing {trace.description}", rows, args.write)
    return 0


MAX_SKEW = 100.0  # the Zipf exponent's range, as a run's routing_skew (sim.config.spec.RunSpec)


def _check_generator_options(args) -> None:
    """--skew in [0, 100] and only for zipf, --locality only for generated routing: an option
    that would change nothing is refused, not ignored."""
    if not 0 <= args.skew <= MAX_SKEW:
        raise ConfigError(COMMAND_LINE, "--skew", f"must be a Zipf exponent in [0, {MAX_SKEW:g}]", args.skew)
    if args.skew != 1.0 and args.routing != "zipf":
        raise ConfigError(COMMAND_LINE, "--skew", "applies only to --routing zipf", args.skew)
    if args.locality != 0.0 and args.routing not in routing.KINDS:
        raise ConfigError(COMMAND_LINE, "--locality", "applies only to generated routing (uniform or zipf), "
                          "not to a routing file", args.locality)


def _batches(text) -> list[int]:
    """The sorted distinct batch sizes of a comma list, each a whole number >= 1."""
    items = comma_list(str(text), "--batch", "batch sizes")
    bad = next((item for item in items if not item.isdigit() or int(item) < 1), None)
    if bad is not None:
        raise ConfigError(COMMAND_LINE, "--batch", "expected comma-separated whole numbers >= 1", bad)
    return sorted({int(item) for item in items})


def _row(trace, batch: int, top_k: int, closed_form: float) -> dict:
    """Distinct experts one layer touches per step at ``batch``, beside the uniform closed form."""
    distinct = trace.distinct(batch)
    mean = float(distinct.mean())
    return {"batch": batch, "distinct_mean": mean, "distinct_min": int(distinct.min()),
            "distinct_max": int(distinct.max()), "uniform_closed_form": closed_form,
            "pairs_per_active_expert": batch * top_k / mean}


def _print_table(title: str, rows: list[dict], written) -> None:
    print(f"decodesim routing: {title}")
    print(f"  {'batch':>6}  {'distinct/layer':>14}  {'min':>4}  {'max':>4}  {'uniform E(1-(1-k/E)^T)':>23}  "
          f"{'pairs/expert':>12}")
    for r in rows:
        print(f"  {r['batch']:>6}  {r['distinct_mean']:>14.2f}  {r['distinct_min']:>4}  {r['distinct_max']:>4}  "
              f"{r['uniform_closed_form']:>23.2f}  {r['pairs_per_active_expert']:>12.2f}")
    if written is not None:
        print(f"  wrote {written}")
