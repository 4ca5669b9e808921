"""What ``decodesim explore`` does: serve the what-if explorer on 127.0.0.1 until Ctrl-C."""

from __future__ import annotations

import re
import sys

from sim.errors import COMMAND_LINE, ConfigError
from sim.explore.html import plotly_js_path
from sim.explore.server import make_server


def handle(args) -> int:
    if not 0 <= args.port <= 65535:
        raise ConfigError(COMMAND_LINE, "--port", "must be a TCP port in [0, 65535]", args.port)
    for name in args.allow_hosts:
        if not re.fullmatch(r"[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]", name):
            raise ConfigError(COMMAND_LINE, "--allow-host", "must be a host name or [IPv6] address, no port", name)
    plotly_js_path()  # the page needs plotly.js: say so now, not on the first request
    try:
        server = make_server(args.port, allow_hosts=args.allow_hosts)
    except OSError as err:
        raise ConfigError(COMMAND_LINE, "--port", f"cannot listen on 127.0.0.1:{args.port} ({err.strerror or err})",
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
