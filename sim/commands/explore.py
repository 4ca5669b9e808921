"""``decodesim explore``: the what-if explorer, a local web page over the CLI's answers (sim.explore)."""

from __future__ import annotations

import sys


def register(sub) -> None:
    p = sub.add_parser("explore", help="a local web page: pick a setup, see latency, breakdown, roofline, curves",
                       description="Serve the what-if explorer on http://127.0.0.1:PORT/ (this machine only): "
                                   "ms per token with its bound and verdict, the step breakdown, the roofline, "
                                   "latency against batch and context, two setups side by side, and short serving "
                                   "replays; every view exports as a self-contained HTML file. Ctrl-C stops it.")
    p.add_argument("--port", type=int, default=8765, help="TCP port on 127.0.0.1 (default 8765; 0 picks a free one)")
    p.set_defaults(handler=handle)


def handle(args) -> int:
    from sim.errors import ConfigError

    if not 0 <= args.port <= 65535:
        raise ConfigError("--port", "port", "must be a TCP port in [0, 65535]", args.port)
    from sim.explore.html import plotly_js_path
    from sim.explore.server import make_server

    plotly_js_path()  # the page needs plotly.js: say so now, not on the first request
    try:
        server = make_server(args.port)
    except OSError as err:
        raise ConfigError("--port", "port", f"cannot listen on 127.0.0.1:{args.port} ({err.strerror or err})",
                          args.port) from None
    host, port = server.server_address[:2]
    print(f"decodesim explorer on http://{host}:{port}/ (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        sys.stderr.write("decodesim: explorer stopped\n")
    finally:
        server.server_close()
    return 0
