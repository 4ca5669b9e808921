"""The study runner: independent runs keyed by a content hash, cached, resumable, in parallel.

Each point's key is the SHA-256 of its resolved configuration: the normalised RunSpec, the
validated hardware profile and model after overrides, the bytes of the format and trace
files it reads, and the simulator version (the package version plus a digest of the
simulator's own source, so a change to the engine invalidates the cache). A finished run is
written to ``<out>/cache/<hash>.json`` atomically (temp file, then ``os.replace``), so a
killed study loses at most the runs in flight and a re-run computes only missing keys.
The table, plots and report are written again only when what they are made from changed
(sim.study.stamps), so a re-run with every point cached writes little and draws nothing.

Executors: ``local`` (a process pool, ``jobs`` workers; ``jobs=1`` runs in this process)
with a tqdm progress bar and ETA, or ``dask`` (a dask.distributed scheduler address, or a
``Client``). A point that raises records ``status=error`` and its message in the table; the
rest of the study goes on.

Interrupts: Ctrl-C cancels the queued points, kills the local workers and returns at once;
every point that finished is already in the cache. Local workers die with the study process
(Linux: ``PR_SET_PDEATHSIG``; elsewhere they watch their parent), so ``kill -9`` leaves no
orphans. A study holds a lock on its output folder while it runs, and removes the temp
files an earlier, killed run left there (``sim.io.stale_temp_files``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.config.hardware import sources
from sim.config.spec import RunSpec, apply_run_overrides
from sim.errors import ConfigError
from sim.explore.compute import vector_peak_Tops
from sim.io import make_folder, output_problem, stale_temp_files, write_atomic, write_frame
from sim.paths import display_path
from sim.run import simulate
from sim.setup import resolve
from sim.study import stamps
from sim.study.folder import check_places, read_results, study_places
from sim.study.keys import content_hash, simulator_version
from sim.study.spec import Point, Study, detail_assignments, is_number

if TYPE_CHECKING:
    import pandas as pd

_RESULT_FIELDS = ("hardware", "model", "weights", "kv", "batch", "context", "trace", "steps", "engine", "graph", "tp",
                  "pp", "chips", "software", "target_ms")
DETAIL_STEPS = 1


# -- one run ----------------------------------------------------------------------------------


def flatten_summary(summary: dict) -> dict:
    """One table row from a RunResult summary: scalars as they are, dicts flattened."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        if key == "breakdown_ms" and isinstance(value, dict):
            out.update({f"ms_{k}": float(v) for k, v in value.items()})
        elif isinstance(value, dict):
            out.update({f"{key}_{k}": v for k, v in value.items() if not isinstance(v, (dict, list, tuple))})
        elif isinstance(value, (list, tuple)):
            continue
        else:
            out[key] = value
    return out


def run_point(spec_json: str) -> dict:
    """Simulate one point (picklable: runs in a worker process or a Dask worker)."""
    spec = RunSpec.model_validate_json(spec_json)
    start = time.perf_counter()
    try:
        result = simulate(spec)
        return {"status": "ok", "error": None, **flatten_summary(result.summary)}
    except Exception as err:  # a failing point is recorded, the study goes on
        return {"status": "error", "error": f"{type(err).__name__}: {err}", "wall_s": time.perf_counter() - start}


def write_json_atomic(path: Path, obj) -> None:
    """JSON written to a temp file, then renamed (``write_atomic``: umask file modes)."""
    write_atomic(path, json.dumps(obj, indent=1, default=_plain, allow_nan=True))


def _plain(value):
    if hasattr(value, "item"):
        return value.item()
    return str(value)


# -- the study ------------------------------------------------------------------------------


@dataclass
class StudyResult:
    rows: list[dict]  # the results table's rows (``table`` is them as a DataFrame)
    out_dir: Path
    simulated: int  # runs computed now
    cached: int  # runs found in the cache
    wall_s: float
    failed: int

    @cached_property
    def table(self) -> pd.DataFrame:
        """The tidy results table (built on first use: a cached re-run need not load pandas)."""
        return frame(self.rows)

    @property
    def points_per_s(self) -> float:
        return len(self.rows) / self.wall_s if self.wall_s > 0 else float("inf")


def run_study(study: Study, out_dir: str | Path | None = None, *, executor: str = "local", jobs: int | None = None,
              address=None, progress: bool = True, detail: bool = True, report: bool = True) -> StudyResult:
    """Run every point not yet in the cache, then write the table (and the plots and report)."""
    out = Path(out_dir) if out_dir is not None else Path("reports") / study.spec.name
    problem = output_problem(out, folder=True)
    if problem:
        raise ConfigError(str(out), None, problem)
    check_places(out, study_places(out, detail=detail, report=report))
    make_folder(out)
    with folder_lock(out):
        remove_stale_temp_files(out)
        return _run_study(study, out, executor, jobs, address, progress, detail, report)


def _run_study(study: Study, out: Path, executor: str, jobs: int | None, address, progress: bool, detail: bool,
               report: bool) -> StudyResult:
    start = time.perf_counter()
    runs_dir = out / "cache"
    keys = study.hashes or [content_hash(p.spec) for p in study.points]
    todo: dict[str, Point] = {}
    for point, key in zip(study.points, keys, strict=False):
        if key not in todo and cached_result(runs_dir / f"{key}.json") is None:
            todo[key] = point
    cached = len(set(keys)) - len(todo)
    if todo:
        _execute(todo, runs_dir, executor, jobs, address, progress, study.spec.name)
    rows = table_rows(study, keys, runs_dir)
    result = StudyResult(rows, out, len(todo), cached, 0.0, sum(row.get("status") != "ok" for row in rows))
    write_table(result, out)
    if detail:
        run_detail(study, out)
    write_settings(study, out, keys)
    result.wall_s = time.perf_counter() - start
    write_json_atomic(out / "timing.json", {"points": len(rows), "simulated": result.simulated,
                                            "cached": result.cached, "failed": result.failed,
                                            "wall_s": result.wall_s, "points_per_s": result.points_per_s,
                                            "executor": executor, "jobs": jobs or os.cpu_count()})
    if report:
        draw(out)
    return result


# what the plots and the report are drawn from (timing.json, which only the report's "Runs"
# line reads, is left out: a re-run that simulates nothing leaves the drawings as they are)
DRAWN_FROM = ("results.parquet", "study.json", "detail/meta.json", "detail/ops.parquet", "detail/events.parquet")


def draw(out: Path) -> None:
    """Draw the plots and write report.md and report.html, unless they are already drawn
    from the same inputs by the same code (sim.study.stamps)."""
    inputs = stamps.files_digest([out / name for name in DRAWN_FROM])
    if stamps.fresh(out, "drawings", inputs):
        return
    # deferred: the report and plot modules load pandas and matplotlib (~2 s), which a
    # re-run whose drawings are up to date never needs
    from sim.report import markdown, plots

    written = [Path(p) for p in plots.make_plots(out)]
    report = markdown.write_report(out)
    stamps.record(out, "drawings", inputs, written + [report, out / "report.html"])


def read_json(path: Path) -> dict | None:
    """A JSON object from ``path``, or None when it is missing, unreadable or not an object
    (a truncated file from an older, non-atomic writer is recomputed, not a traceback)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def cached_result(path: Path) -> dict | None:
    """The result row a cache file holds, or None if there is no usable one."""
    result = (read_json(path) or {}).get("result")
    return result if isinstance(result, dict) else None


LOCK_NAME = ".decodesim-study.lock"


@contextmanager
def folder_lock(out: Path):
    """Hold an exclusive lock on the study folder ``out`` (released when the process ends,
    however it ends); a second study writing to the same folder is a ConfigError."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock (and stale temp files are left alone)
        yield False
        return
    (out / "cache").mkdir(exist_ok=True)
    handle = open(out / "cache" / LOCK_NAME, "a")  # in cache/, which is the study's own state (not committed)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ConfigError(str(out), None, "another decodesim study is writing to this folder; wait for it or "
                                              "pick another --out") from None
        yield True
    finally:
        handle.close()


def remove_stale_temp_files(out: Path) -> list[Path]:
    """Remove the temp files a killed run left in the study folder and its cache, detail and
    plots folders (call only while holding ``folder_lock``: then no writer is at work there)."""
    try:
        import fcntl  # noqa: F401 - without the lock, another study's temp file may be live
    except ImportError:
        return []
    removed = []
    for folder in (out, out / "cache", out / "detail", out / "plots"):
        for path in stale_temp_files(folder):
            try:
                path.unlink()
                removed.append(path)
            except OSError:
                pass
    return removed


def _store(runs_dir: Path, key: str, point: Point, row: dict) -> None:
    write_json_atomic(runs_dir / f"{key}.json", {"hash": key, "spec": point.spec.model_dump(mode="json"),
                                                 "simulator": simulator_version(), "result": row})


def _execute(todo: dict[str, Point], runs_dir: Path, executor: str, jobs, address, progress: bool, name: str):
    from tqdm import tqdm

    bar = tqdm(total=len(todo), desc=name, unit="run", disable=not progress, file=sys.stderr,
               dynamic_ncols=True, mininterval=0.5)
    payloads = {key: point.spec.model_dump_json() for key, point in todo.items()}
    try:
        if executor == "dask":
            _execute_dask(todo, payloads, runs_dir, address, bar)
        elif executor == "local":
            jobs = jobs or os.cpu_count() or 1
            if jobs == 1 or len(todo) == 1:
                _execute_serial(todo, payloads, runs_dir, bar)
            else:
                _execute_pool(todo, payloads, runs_dir, jobs, bar)
        else:
            raise ConfigError("--executor", "executor", "must be local or dask", executor)
    finally:
        bar.close()


def _execute_serial(todo: dict[str, Point], payloads: dict[str, str], runs_dir: Path, bar) -> None:
    """Run the points one after another in this process, storing each as it finishes."""
    done = 0
    try:
        for key, point in todo.items():
            _store(runs_dir, key, point, run_point(payloads[key]))
            done += 1
            bar.update()
    except KeyboardInterrupt:
        _say_stopped(done, len(todo), runs_dir)
        raise


def _say_stopped(done: int, total: int, runs_dir: Path) -> None:
    sys.stderr.write(f"decodesim: stopped; {done} of {total} points finished and are cached in {runs_dir} "
                     "(run the study again to resume)\n")


def _execute_pool(todo: dict[str, Point], payloads: dict[str, str], runs_dir: Path, jobs: int, bar) -> None:
    """Run the points on ``jobs`` local worker processes, storing each as it finishes. On
    Ctrl-C: store what finished, cancel the queue, kill the workers, re-raise."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=ctx, initializer=worker_init,
                               initargs=(os.getpid(),))
    futures: dict = {}
    stored: set[str] = set()
    try:
        futures = {pool.submit(run_point, payloads[key]): key for key in todo}
        for future in as_completed(futures):
            key = futures[future]
            _store(runs_dir, key, todo[key], _outcome(future))
            stored.add(key)
            bar.update()
    except BaseException:
        stop_pool(pool)
        for future, key in futures.items():  # finished, but not yet stored when the interrupt came
            if key not in stored and future.done() and not future.cancelled() and future.exception() is None:
                _store(runs_dir, key, todo[key], future.result())
                stored.add(key)
        _say_stopped(len(stored), len(todo), runs_dir)
        raise
    pool.shutdown(wait=True)


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Cancel the queued points and kill the workers now (they only compute; the parent
    writes every result), so an interrupted study exits at once."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        try:
            process.kill()
        except (OSError, ValueError, AttributeError):
            pass
    for process in processes:
        try:
            process.join(timeout=1.0)
        except (OSError, ValueError, AssertionError):
            pass


def worker_init(parent_pid: int) -> None:
    """In each local worker: ignore Ctrl-C (the study process handles it and stops the
    workers) and die with the parent, even if it is killed with SIGKILL."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not _die_with_parent(parent_pid):
        threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True, name="watch-parent").start()


def _die_with_parent(parent_pid: int) -> bool:
    """Linux: ask the kernel to SIGKILL this process when its parent dies. True when set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        if libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    return True


def _watch_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    while os.getppid() == parent_pid:
        time.sleep(interval_s)
    os._exit(1)


def _outcome(future) -> dict:
    try:
        return future.result()
    except Exception as err:  # the worker itself died: record it (not a property of the point)
        return {"status": "error", "error": f"worker failed: {type(err).__name__}: {err}"}


def _execute_dask(todo, payloads, runs_dir: Path, address, bar) -> None:
    from dask.distributed import Client
    from dask.distributed import as_completed as dask_completed

    own = not isinstance(address, Client)
    if own:
        try:
            client = Client(address, timeout="15s")
        except (OSError, TimeoutError, ValueError) as err:
            raise ConfigError("--address", "address", f"cannot reach a Dask scheduler there ({type(err).__name__})",
                              address) from None
    else:
        client = address
    try:
        keys = list(todo)
        futures = client.map(run_point, [payloads[k] for k in keys], key=[f"decodesim-{k}" for k in keys], pure=False)
        which = {f.key: k for f, k in zip(futures, keys, strict=False)}
        for future in dask_completed(futures):
            key = which[future.key]
            _store(runs_dir, key, todo[key], _outcome(future))
            bar.update()
    finally:
        if own:
            client.close()


def _label(value):
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return value


def table_rows(study: Study, keys: list[str], runs_dir: Path) -> list[dict]:
    """One row per point: its index, group, knob, seed, hash and axis labels, then its result."""
    rows = []
    cache: dict[str, dict] = {}
    for point, key in zip(study.points, keys, strict=False):
        if key not in cache:
            cache[key] = cached_result(runs_dir / f"{key}.json")
        result = cache[key]
        row: dict[str, Any] = {"point": point.index, "group": point.group, "knob": point.knob,
                               "delta_percent": point.delta_percent, "seed": point.seed, "hash": key}
        for axis in study.axes:
            row[axis] = _label(point.labels.get(axis)) if axis in point.labels else None
        for k, v in result.items():
            if k not in row:
                row[k] = v
        rows.append(row)
    return rows


def frame(rows: list[dict]) -> pd.DataFrame:
    """The rows as a DataFrame, a column of mixed kinds (numbers and texts) as texts: parquet
    wants one type per column."""
    import pandas as pd  # deferred with the table: a re-run with nothing new never builds it

    table = pd.DataFrame(rows)
    for column in table.columns:
        if _mixed(table[column]):
            table[column] = [None if v is None else str(v) for v in table[column]]
    return table


def _mixed(column) -> bool:
    values = [v for v in column if v is not None and not (isinstance(v, float) and v != v)]
    return bool(values) and not all(is_number(v) for v in values) and not all(isinstance(v, str) for v in values) \
        and not all(isinstance(v, bool) for v in values)


TABLE_FILES = ("results.parquet", "results.csv")


def write_table(result: StudyResult, out: Path) -> None:
    """results.parquet and results.csv, unless they already hold these rows (sim.study.stamps)."""
    inputs = stamps.digest(json.dumps(result.rows, default=_plain, allow_nan=True))
    if stamps.fresh(out, "table", inputs):
        return
    write_frame(result.table, out / "results")
    stamps.record(out, "table", inputs, [out / name for name in TABLE_FILES])


def results(out_dir: str | Path) -> pd.DataFrame:
    """The saved results table of a study folder, as a DataFrame (a damaged or foreign table is
    a ConfigError naming it: sim.study.folder)."""
    return read_results(Path(out_dir))


# -- the detailed point (DES event log and op table, for the timeline plots) ---------------------


def run_detail(study: Study, out: Path) -> None:
    """Run one point with the DES, keeping its op table and event log, for the timeline plots."""
    # deferred like simulate in run_point: the simulator and the trace writer load only when a study runs
    from sim.experiments.detail import detail_run
    from sim.report.timeline import trace_of

    chosen = detail_assignments(study)
    data = dict(study.spec.base)
    data.update(overrides=list(study.spec.overrides.items()) + list(chosen), engine="des", steps=DETAIL_STEPS,
                seed=study.spec.seeds[0])
    spec = RunSpec.model_validate(data)
    key = content_hash(spec, extra="detail")
    folder = out / "detail"
    meta_path = folder / "meta.json"
    if (read_json(meta_path) or {}).get("hash") == key:
        return
    try:
        detail = detail_run(spec)
    except Exception as err:
        write_json_atomic(meta_path, {"hash": key, "error": f"{type(err).__name__}: {err}",
                                      "assignments": [list(a) for a in chosen]})
        return
    result = detail.result
    steps, ops, log = result.tables()
    write_frame(ops, folder / "ops")
    write_frame(log, folder / "events")
    res = result.resolved
    dtype = getattr(res.weights, "matmul_dtype", None) or "bf16"
    try:
        peak_tflops = res.hardware.compute.matrix_peak_TFLOPs(dtype)
    except Exception:
        peak_tflops = res.hardware.compute.matrix_peak_TFLOPs("bf16")
    meta = {"hash": key, "assignments": [list(a) for a in chosen], "spec": spec.model_dump(mode="json"),
            "summary": flatten_summary(result.summary), "store": res.hardware.store.name,
            "peaks_GBps": detail.peaks_GBps,
            "levels": [level.name for level in res.hardware.memory],
            "matrix_peak_TFLOPs": peak_tflops, "matmul_dtype": dtype,
            "vector_peak_Tops": vector_peak_Tops(res.hardware),
            "vector_efficiency": res.hardware.compute.vector_efficiency.value,
            "pp": res.pp, "tp": res.tp,
            "fits": bool(result.summary["capacity"]["fits"])}
    write_atomic(folder / "trace.json", trace_of(result))
    write_json_atomic(meta_path, meta)


def write_settings(study: Study, out: Path, keys: list[str]) -> None:
    """The resolved settings beside the results: the study, the base point's sources, the version."""
    base = RunSpec.model_validate({**study.spec.base, "overrides": list(study.spec.overrides.items())})
    res = resolve(base)
    axes = {}
    for axis in study.axes:
        seen = []
        for p in study.grid_points:
            v = _label(p.labels.get(axis))
            if v not in seen:
                seen.append(v)
        axes[axis] = seen
    write_json_atomic(out / "study.json", {
        "name": study.spec.name, "file": display_path(study.file, out), "description": study.spec.description,
        "question": study.spec.question, "study": study.spec.model_dump(mode="json"), "axes": axes,
        "simulator": simulator_version(), "base_spec": apply_run_overrides(base).model_dump(mode="json"),
        "hardware_file": display_path(res.hardware_file, out), "model_file": display_path(res.model_file, out),
        "hardware_headline": res.hardware.headline(),
        "hardware_sources": [[p, v, s, e] for p, v, s, e in sources(res.hardware)],
        "points": len(study.points), "unique_runs": len(set(keys)),
        "excluded": [{"where": rule.where, "reason": rule.reason, "points": n} for rule, n in study.excluded],
    })
