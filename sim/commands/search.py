"""``decodesim search``: the best deployment under latency targets, as a Pareto front.

``decodesim search --model llama-3-70b --hardware h200-sxm-x8,b200 --ttft-ms 2000 --tpot-ms 50``
enumerates deployments (chips, tp x pp, weight and KV formats, software stack, max batch,
chunk budget), prunes what does not fit, screens the rest on the analytic step model and
confirms the Pareto front of tokens/s per chip against tokens/s per user with serving
replays. ``--space FILE`` reads the search space and constraints from YAML (sim.search.space);
the options given here override the file. See docs/search.md.

The arguments; sim.commands.handlers.search runs it.
"""

from __future__ import annotations

from sim.options.run import output_dir

MAX_SCREENED = 100_000  # deployments one search screens unless --max-deployments says more


def register(sub) -> None:
    p = sub.add_parser("search", help="the best deployments under TTFT/TPOT targets, as a Pareto front",
                       description="Enumerate deployments (chips, tp x pp, weights, KV format, software stack, "
                                   "max batch, chunk budget), prune what does not fit, screen the rest on the analytic "
                                   "step model and confirm the Pareto front of output tokens/s per chip against "
                                   "tokens/s per user with serving replays (and a DES step). See docs/search.md.")
    p.add_argument("--space", default=None, metavar="FILE", help="search file (YAML): space, SLO, traffic")
    p.add_argument("--model", default=None, help="model name or YAML path (overrides the file's)")
    p.add_argument("--hardware", default=None, metavar="H[,H...]", help="hardware profiles to search (comma list)")
    p.add_argument("--ttft-ms", type=float, default=None, help="time-to-first-token target (ms)")
    p.add_argument("--tpot-ms", type=float, default=None, help="time-per-output-token target (ms)")
    p.add_argument("--percentile", type=int, choices=[50, 90, 99], default=None,
                   help="the percentile the targets hold for (default 99)")
    p.add_argument("--rate", type=float, default=None,
                   help="requests per second (default: each deployment at its goodput, the highest rate whose "
                        "screened percentiles meet the SLOs, confirmed by replay)")
    p.add_argument("--requests", default=None,
                   help="azure-conv (default), azure-code, synthetic, or a request file (.jsonl/.csv/.parquet)")
    p.add_argument("--duration-s", type=float, default=None,
                   help="at most this many seconds of arrivals per replay (default 120)")
    p.add_argument("--load", type=float, default=None, help="without --rate: each deployment at this fraction of its capacity instead of its goodput")
    p.add_argument("--max-replays", type=int, default=None, help="most serving replays spent on the front (default 48)")
    p.add_argument("--out", type=output_dir, default=None, metavar="DIR",
                   help="write deployments.parquet/.csv, search.json, front.png and report.md here")
    p.add_argument("--executor", choices=["local", "dask"], default="local",
                   help="local processes (default) or a Dask cluster (--address)")
    p.add_argument("--jobs", type=int, default=None, help="local worker processes (default: cores)")
    p.add_argument("--address", default=None, help="Dask scheduler address (with --executor dask)")
    p.add_argument("--quiet", action="store_true", help="no progress bars on stderr")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--max-deployments", type=int, default=MAX_SCREENED, metavar="N",
                   help=f"refuse a space of more than N deployments before screening any (default {MAX_SCREENED:,}; "
                        "screening takes minutes per hundred thousand on two cores)")
    p.set_defaults(handler="sim.commands.handlers.search")
