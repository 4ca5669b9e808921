"""``decodesim explore``: the what-if explorer, a local web page over the CLI's answers (sim.explore).

The arguments; sim.commands.handlers.explore runs it.
"""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("explore", help="a local web page: pick a setup, see latency, breakdown, roofline, curves",
                       description="Serve the what-if explorer on http://127.0.0.1:PORT/ (this machine only): "
                                   "ms per token with its bound and verdict, the step breakdown, the roofline, "
                                   "latency against batch and context, up to six setups side by side, short serving "
                                   "replays and searches; the view in the URL, tables as CSV, every view exported as "
                                   "a self-contained HTML file. Only this machine's browser page (its Host, Origin "
                                   "and session token) can drive it. Ctrl-C stops it.")
    p.add_argument("--port", type=int, default=8765, help="TCP port on 127.0.0.1 (default 8765; 0 picks a free one)")
    p.add_argument("--allow-host", dest="allow_hosts", action="append", default=[], metavar="NAME",
                   help="a further name the Host and Origin headers may give (e.g. a name this machine is reached "
                        "by through an SSH tunnel); by default only 127.0.0.1, localhost and [::1] may drive it")
    p.set_defaults(handler="sim.commands.handlers.explore")
