"""``decodesim study FILE``: run a YAML what-if study and write its table, plots and report."""

from __future__ import annotations

from sim.commands.common import output_dir, output_file


def register(sub) -> None:
    p = sub.add_parser("study", help="run a YAML what-if study (sweeps, overrides) with caching and resume",
                       description="Expand a study (base + overrides + sweeps + seeds), check every point, run "
                                   "the points not yet cached, and write results.{parquet,csv}, plots and "
                                   "report.md under --out (default reports/<study name>/).")
    p.add_argument("file", help="study YAML path or bundled study name (workloads/studies/)")
    p.add_argument("--out", type=output_dir, default=None, help="output folder (default reports/<study name>/)")
    p.add_argument("--executor", choices=["local", "dask"], default="local",
                   help="local process pool (default) or a Dask distributed cluster")
    p.add_argument("--address", default=None, help="Dask scheduler address, e.g. tcp://10.0.0.1:8786")
    p.add_argument("--jobs", "-j", type=int, default=None, help="local worker processes (default: CPU count; 1 = "
                                                                 "in this process)")
    p.add_argument("--max-points", type=int, default=None, metavar="N",
                   help="refuse studies of more than N points (default 100,000; checked before expanding)")
    p.add_argument("--check", action="store_true", help="validate every point and print the plan; run nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-report", action="store_true", help="write the table only (no plots or report)")
    p.add_argument("--trace-out", type=output_file, default=None,
                   help="also write the detail point's Chrome/Perfetto trace JSON (its one DES step) here")
    p.add_argument("--json", action="store_true", help="print one JSON object (the plan, and what ran) instead")
    p.set_defaults(handler=handle)


def plan(study) -> dict:
    """The study's plan as the ``--json`` payload has it."""
    grid = len(study.grid_points)
    return {"name": study.spec.name, "file": _shown(study.file), "points": len(study.points), "grid_points": grid,
            "sensitivity_points": len(study.points) - grid, "axes": list(study.axes),
            "excluded": [{"where": rule.where, "reason": rule.reason, "points": n} for rule, n in study.excluded]}


def _shown(path) -> str:
    from sim.paths import display_path

    return display_path(path)


def handle(args) -> int:
    from sim.errors import ConfigError
    from sim.study import load_study, run_study
    from sim.study.spec import MAX_POINTS

    if args.max_points is not None and args.max_points < 1:
        raise ConfigError("--max-points", "max_points", "must be >= 1", args.max_points)
    study = load_study(args.file, max_points=args.max_points or MAX_POINTS)
    if args.executor == "dask" and not args.address:
        raise ConfigError("--address", "address", "--executor dask needs --address tcp://HOST:PORT")
    if args.jobs is not None and args.jobs < 1:
        raise ConfigError("--jobs", "jobs", "must be >= 1", args.jobs)
    say = (lambda *a: None) if args.json else print
    grid = len(study.grid_points)
    say(f"study {study.spec.name}: {len(study.points)} points ({grid} grid, {len(study.points) - grid} "
        f"sensitivity) over axes {', '.join(study.axes) or '(none)'}")
    for rule, count in study.excluded:
        where = ", ".join(f"{a}={v}" for a, v in rule.where.items())
        say(f"  {count} grid points left out by sweep.exclude ({where}): {rule.reason}")
    if args.check:
        say("all points resolve; nothing run (--check)")
        if args.json:
            _emit(study, None, args)
        return 0
    result = run_study(study, args.out, executor=args.executor, jobs=args.jobs, address=args.address,
                       progress=not args.no_progress and not args.json, report=not args.no_report)
    say(f"{result.simulated} simulated, {result.cached} cached, {result.failed} failed; "
        f"{result.wall_s:.1f} s, {result.points_per_s:.1f} points/s")
    say(f"wrote {result.out_dir}/results.parquet, results.csv" + ("" if args.no_report else ", report.md, report.html, plots/"))
    trace = result.out_dir / "detail" / "trace.json"
    if args.trace_out is not None:
        if not trace.is_file():
            raise ConfigError("--trace-out", "trace_out", "the detail point produced no trace (see detail/meta.json)")
        from sim.io import write_atomic

        write_atomic(args.trace_out, trace.read_text())
        say(f"wrote {args.trace_out} (Chrome/Perfetto trace of one step of the detail point)")
    if args.json:
        _emit(study, result, args)
    return 0


def _emit(study, result, args) -> None:
    """The ``--json`` output: the plan, and (after a run) counts, timing and the files written."""
    from sim.commands.common import emit_json

    payload = {**plan(study), "ran": result is not None}
    if result is not None:
        out = result.out_dir
        files = ["results.parquet", "results.csv"] + ([] if args.no_report else ["report.md", "report.html"])
        plots = sorted(p.name for p in (out / "plots").glob("*.png")) if not args.no_report else []
        payload.update(simulated=result.simulated, cached=result.cached, failed=result.failed, wall_s=result.wall_s,
                       points_per_s=result.points_per_s, out_dir=str(out),
                       files=files + [f"plots/{name}" for name in plots])
    emit_json("study", payload)
