"""What ``decodesim search`` does: enumerate, screen and confirm deployments, print or write the front."""

from __future__ import annotations

import shlex
import sys

from sim.commands.common import emit_json
from sim.errors import ConfigError
from sim.io import make_folder
from sim.search import load_space, run_search
from sim.search.output import payload, text, write_outputs


def _changes(args) -> dict:
    changes = {}
    if args.model is not None:
        changes["model"] = args.model
    if args.hardware is not None:
        names = [h.strip() for h in args.hardware.split(",") if h.strip()]
        if not names:
            raise ConfigError("--hardware", "hardware", "expected a comma list of profiles", args.hardware)
        changes["space.grid.hardware"] = names
    for flag, key in (("ttft_ms", "slo.ttft_ms"), ("tpot_ms", "slo.tpot_ms"), ("percentile", "slo.percentile"),
                      ("rate", "traffic.rate"), ("requests", "traffic.requests"),
                      ("duration_s", "traffic.duration_s"), ("load", "traffic.load"), ("max_replays", "max_replays")):
        value = getattr(args, flag)
        if value is not None:
            changes[key] = value
    return changes


def handle(args) -> int:
    if args.jobs is not None and args.jobs < 1:
        raise ConfigError("--jobs", "jobs", "must be >= 1", args.jobs)
    if args.executor == "dask" and not args.address:
        raise ConfigError("--address", "address", "--executor dask needs a scheduler address (host:port)")
    space = load_space(args.space, _changes(args))
    if args.out is not None:
        make_folder(args.out)
    result = run_search(space, executor=args.executor, jobs=args.jobs, address=args.address,
                        progress=not args.quiet)
    files = []
    if args.out is not None:
        command = "decodesim search " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["search"] \
            else None
        files = [str(args.out / f) for f in write_outputs(result, args.out, command=command)]
    if args.json:
        emit_json("search", payload(result, files))
    else:
        print(text(result))
        if files:
            print(f"  wrote {', '.join(files)}")
    return 0 if result.front else 1
