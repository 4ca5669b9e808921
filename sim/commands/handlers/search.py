"""What ``decodesim search`` does: enumerate, screen and confirm deployments, print or write the front."""

from __future__ import annotations

import shlex
import sys
from contextlib import nullcontext

from sim.commands.common import comma_list, emit_json
from sim.errors import COMMAND_LINE, ConfigError
from sim.io import output_set, writer_lock
from sim.search import load_space, run_search
from sim.search.output import payload, text, write_outputs

FLAGS = {"model": "--model", "space.grid.hardware": "--hardware", "slo.ttft_ms": "--ttft-ms",
         "slo.tpot_ms": "--tpot-ms", "slo.percentile": "--percentile", "traffic.rate": "--rate",
         "traffic.requests": "--requests", "traffic.duration_s": "--duration-s", "traffic.load": "--load",
         "max_replays": "--max-replays"}  # search-file key -> the option that overrides it


def _changes(args) -> dict:
    """The search-file keys the options override (``FLAGS``), with their values."""
    changes = {}
    for key, flag in FLAGS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            changes[key] = comma_list(value, flag, "profiles") if key == "space.grid.hardware" else value
    return changes


def _against_options(err: ConfigError, changes: dict) -> ConfigError:
    """``err`` said against the option that gave the erring value (on the command line), not
    against the search file key it overrode; ``err`` itself when no option gave it."""
    key = err.key_path or ""
    given = next((k for k in changes if key == k or key.startswith(k + ".")), None)
    return err if given is None else ConfigError(COMMAND_LINE, FLAGS[given], err.expected, err.got)


def _bounded(space, limit: int) -> None:
    """Refuse, before any screening, a space of more deployments than ``limit`` (--max-deployments)."""
    if limit < 1:
        raise ConfigError(COMMAND_LINE, "--max-deployments", "must be >= 1", limit)
    if len(space.deployments) > limit:
        raise ConfigError(space.file, "space.grid", f"{len(space.deployments):,} deployments ({len(space.setups):,} "
                          f"setups) to screen; expected at most {limit:,} (--max-deployments N raises the bound; "
                          "or narrow some axes)")


def handle(args) -> int:
    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(COMMAND_LINE, "--jobs", "must be >= 1", args.jobs)
    if args.executor == "dask" and not args.address:
        raise ConfigError(COMMAND_LINE, "--address", "--executor dask needs a scheduler address (host:port)")
    changes = _changes(args)
    # one writer per --out folder (left out again if nothing is written: an error, Ctrl-C in the screen)
    with writer_lock(args.out) if args.out is not None else nullcontext():
        try:
            space = load_space(args.space, changes)
            _bounded(space, args.max_deployments)
            result = run_search(space, executor=args.executor, jobs=args.jobs, address=args.address,
                                progress=not args.quiet, progress_kept=True)
        except ConfigError as err:
            raise _against_options(err, changes) from None
        files = []
        if args.out is not None:
            command = "decodesim search " + " ".join(shlex.quote(a) for a in sys.argv[2:]) \
                if sys.argv[1:2] == ["search"] else None
            with output_set():  # the table, JSON, plot and report land together, or none does
                files = [str(args.out / f) for f in write_outputs(result, args.out, command=command)]
    if result.interrupted:
        sys.stderr.write(f"decodesim: interrupted during the replays; kept the screen of {len(result.rows):,} "
                         f"deployments and the {result.counts['replays']} replays that finished, marked partial"
                         + (f" (in {args.out})" if files else "") + "\n")
    if args.json:
        emit_json("search", payload(result, files))
    else:
        print(text(result))
        if files:
            print(f"  wrote {', '.join(files)}")
    if result.interrupted:
        return 130
    return 0 if result.front else 1
