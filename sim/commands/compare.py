"""``decodesim compare``: KV formats side by side for one setup.

One simulated run per KV format (everything else fixed by the usual run options) and the
format's fidelity on synthetic KV shaped like the model's cache: per-token latency, KV bytes
per token (all layers, at the context), reduction against fp16, the KV share of the bytes read
(per step), attention error, what bounds the step and the verdict.
"""

from __future__ import annotations

from sim.options.run import add_run_options


def register(sub) -> None:
    p = sub.add_parser("compare", help="compare KV formats side by side: latency, bytes, error, bound",
                       description="Simulate one setup once per KV format and print latency, KV bytes, "
                                   "reduction, attention error, bound and verdict in one table.")
    add_run_options(p, formats=False)
    p.add_argument("--kv", default="fp16,int8,kivi-2,int2-asym-outlier",
                   help="comma-separated KV formats (default fp16,int8,kivi-2,int2-asym-outlier)")
    p.add_argument("--weights", default="bf16", help="weight format for every run (default bf16)")
    p.add_argument("--fidelity-tokens", type=int, default=2048,
                   help="tokens of synthetic KV for the error columns (default 2048, at most the context)")
    p.add_argument("--kernels", default=None, metavar="STACK,STACK",
                   help="also compare attention kernels: the attention time of each format under each stack's "
                        "kernel (e.g. fused,fused-naive-kv), against fp16, with the break-even factor")
    p.add_argument("--published-kernel", default=None, metavar="FRACTION,SOURCE",
                   help="also state each format's step with a published dequantizing decode kernel that reaches "
                        "FRACTION of the HBM peak bandwidth (dequantization hidden), citing SOURCE")
    p.add_argument("--no-qualities", action="store_true",
                   help="leave out the KV verdict at three kernel qualities (measured, best measured, byte limit)")
    p.add_argument("--json", action="store_true", help="print JSON rows")
    p.set_defaults(handler="sim.commands.handlers.compare")


