"""``decodesim routing``: distinct experts touched per MoE layer against batch.

Generates (or reads) a routing trace for a model's MoE layers and reports, per batch size,
the mean and spread of distinct experts one layer touches in one step, the closed form
E (1 - (1 - k/E)^T) for uniform routing beside it, and the token-expert pairs per active
expert. ``--write FILE`` saves the generated trace in the routing file format
(sim.moe.routing) for replay with ``decodesim run --routing FILE``.
"""

from __future__ import annotations

from sim.options.run import output_file


def register(sub) -> None:
    p = sub.add_parser("routing", help="distinct experts touched per MoE layer against batch",
                       description="Distinct experts per layer and step for a routing trace, against the "
                                   "uniform closed form E(1-(1-k/E)^T).")
    p.add_argument("--model", default="mixtral-8x7b", help="model name or YAML path (needs a moe: section)")
    p.add_argument("--batch", default="1,8,64", help="comma-separated batch sizes (default 1,8,64)")
    p.add_argument("--routing", default="uniform", help="uniform, zipf or a routing file (JSONL)")
    p.add_argument("--skew", type=float, default=1.0, help="Zipf exponent s for --routing zipf (default 1)")
    p.add_argument("--locality", type=float, default=0.0,
                   help="probability a token reuses its sequence's previous experts (default 0)")
    p.add_argument("--steps", type=int, default=64, help="decode steps to generate (default 64)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--write", type=output_file, default=None, help="write the generated trace (largest batch) here")
    p.add_argument("--json", action="store_true", help="print JSON rows instead of the table")
    p.set_defaults(handler="sim.commands.handlers.routing")


