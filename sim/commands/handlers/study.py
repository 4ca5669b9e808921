"""What ``decodesim study FILE`` does: expand the study, run the points not yet cached, write its table,
plots and report, and say what ran."""

from __future__ import annotations

from sim.commands.common import emit_json
from sim.errors import COMMAND_LINE, ConfigError
from sim.io import write_atomic
from sim.paths import display_path
from sim.study import load_study, run_study
from sim.study.spec import MAX_POINTS


def plan(study) -> dict:
    """The study's plan as the ``--json`` payload has it."""
    grid = len(study.grid_points)
    return {"name": study.spec.name, "file": _shown(study.file), "points": len(study.points), "grid_points": grid,
            "sensitivity_points": len(study.points) - grid, "axes": list(study.axes),
            "excluded": [{"where": rule.where, "reason": rule.reason, "points": n} for rule, n in study.excluded]}


def _shown(path) -> str:
    return display_path(path)


def handle(args) -> int:
    if args.max_points is not None and args.max_points < 1:
        raise ConfigError(COMMAND_LINE, "--max-points", "must be >= 1", args.max_points)
    study = load_study(args.file, max_points=args.max_points or MAX_POINTS)
    if args.executor == "dask" and not args.address:
        raise ConfigError(COMMAND_LINE, "--address", "--executor dask needs --address tcp://HOST:PORT")
    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(COMMAND_LINE, "--jobs", "must be >= 1", args.jobs)
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
            raise ConfigError(COMMAND_LINE, "--trace-out", "the detail point produced no trace (see detail/meta.json)")

        write_atomic(args.trace_out, trace.read_text())
        say(f"wrote {args.trace_out} (Chrome/Perfetto trace of one step of the detail point)")
    if args.json:
        _emit(study, result, args)
    return 0


def _emit(study, result, args) -> None:
    """The ``--json`` output: the plan, and (after a run) counts, timing and the files written."""

    payload = {**plan(study), "ran": result is not None}
    if result is not None:
        out = result.out_dir
        files = ["results.parquet", "results.csv"] + ([] if args.no_report else ["report.md", "report.html"])
        plots = sorted(p.name for p in (out / "plots").glob("*.png")) if not args.no_report else []
        payload.update(simulated=result.simulated, cached=result.cached, failed=result.failed, wall_s=result.wall_s,
                       points_per_s=result.points_per_s, out_dir=str(out),
                       files=files + [f"plots/{name}" for name in plots])
    emit_json("study", payload)
