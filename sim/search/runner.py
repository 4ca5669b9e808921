"""The search: enumerate, prune, screen, confirm the front, write the results.

``run_search(space, ...)``: reads the traffic's statistics (sim.search.workload), screens
every deployment one setup at a time (sim.search.screen: each task resolves one setup,
prunes what does not fit and times the rest on that setup's memoised step model), keeps the
deployments whose estimates meet the SLOs, and confirms their Pareto front with serving
replays and a DES step (sim.search.front, sim.search.verify). Tasks run in this process
(``jobs=1``), on local worker processes, or on a Dask cluster (``executor="dask"``, a
scheduler ``address`` or a ``Client``), as studies do; progress goes to stderr (tqdm).

Determinism: the deployments, the screening and the replays depend only on the inputs, and
results are put back in enumeration order whatever order the workers finish in.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import asdict, dataclass, field

from sim.errors import ConfigError
from sim.search.front import Confirmed, chosen, confirmed_front, pareto
from sim.search.screen import Correction, SetupScreen, screen
from sim.search.space import Deployment, Space
from sim.search.verify import verify
from sim.search.workload import Workload, workload
from sim.serve.requests import named_at
from sim.study.runner import stop_pool, worker_init

CACHE_SETUPS = 64  # setups (resolved + step model) a process keeps for the replays


class SetupCache:
    """Screened setups of one process, most recent last (bounded): the replays of a
    finalist reuse the step model its screening learned."""

    def __init__(self, size: int = CACHE_SETUPS):
        self.size = size
        self._items: OrderedDict[tuple, SetupScreen] = OrderedDict()

    def get(self, d: Deployment, model: str, overrides: tuple, work: Workload, block_tokens: int) -> SetupScreen:
        key = (d.setup_key, model, repr(overrides), work, block_tokens)
        item = self._items.get(key)
        if item is None:
            item = self._items[key] = SetupScreen(d, model, overrides, work, block_tokens)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        else:
            self._items.move_to_end(key)
        return item


class _Worker:
    """The cache of the worker a task runs in: one per thread of a worker process or Dask
    worker (a step model's memo is not shared between threads)."""

    local = threading.local()

    @classmethod
    def get(cls) -> SetupCache:
        cache = getattr(cls.local, "cache", None)
        if cache is None:
            cache = cls.local.cache = SetupCache()
        return cache


def screen_task(task: dict, cache: SetupCache | None = None) -> list[dict]:
    """Screen the deployments of one setup (picklable: runs in workers)."""
    cache = cache or _Worker.get()
    work = Workload(**task["workload"])
    rows = []
    for fields in task["deployments"]:
        d = Deployment(**fields)
        setup = cache.get(d, task["model"], task["overrides"], work, task["traffic"]["block_tokens"])
        try:
            rows.append(screen(setup, d, rate=task["rate"], load=None if task["goodput"] else task["traffic"]["load"],
                               slo=task["slo"], traffic=task["traffic"]))
        except Exception as err:  # a deployment that fails is recorded, the search goes on (as a study's points)
            rows.append({**d.as_dict(), "status": "error", "reason": f"{type(err).__name__}: {err}"})
    return rows


def verify_task(task: dict, cache: SetupCache | None = None) -> dict:
    """Replay one finalist (picklable); in a goodput search, correct its screen until the two
    agree (``confirm_goodput``)."""
    cache = cache or _Worker.get()
    work = Workload(**task["workload"])
    d = Deployment(**task["deployment"])
    setup = cache.get(d, task["model"], task["overrides"], work, task["traffic"]["block_tokens"])
    try:
        if task["goodput"]:
            return confirm_goodput(setup, d, task, work)
        return verify(d, task["model"], task["overrides"], task["rate"], work, task["slo"], task["traffic"],
                      step_model=setup.step_model, tpot_ms=task["tpot_ms"])
    except Exception as err:  # recorded as a failed check: the point is not claimed
        return {"verdict": "error", "verdict_reason": f"{type(err).__name__}: {err}"}


AGREEMENT = 0.10  # screen and replay agree on both axes of the front within this fraction
BACK_OFF = (0.85, 0.7, 0.5, 0.35, 0.25, 0.15)  # rates tried below the screen's, as fractions of it
ROUNDS = 6  # replays spent on one finalist
BISECTIONS = 2  # of them, at most this many between the rates that met and missed
SCREEN_KEYS = ("rate_per_s", "capacity_rate_per_s", "est_batch", "est_tpot_ms", "est_tpot_pct_ms", "est_ttft_ms",
               "est_requests", "tokens_per_s_per_chip", "tokens_per_s_per_user", "screen_ok",
               "screen_correction_tpot", "screen_goodput_rate_per_s")


def screen_gap(row: dict, check: dict) -> float:
    """The larger relative difference between screen and replay on the front's axes: goodput
    per chip and per-user rate (1000 / mean TPOT)."""
    gaps = [abs(row["tokens_per_s_per_chip"] / check["replay_goodput_tokens_per_s_per_chip"] - 1),
            abs(row["tokens_per_s_per_user"] / check["replay_tokens_per_s_per_user"] - 1)]
    return max(g if math.isfinite(g) else math.inf for g in gaps)


def confirm_goodput(setup, d: Deployment, task: dict, work: Workload) -> dict:
    """Confirm a finalist's goodput by replay. The screen's highest rate is replayed; while the
    replay misses the SLOs, lower rates are replayed (``BACK_OFF`` x the screen's, then one
    bisection steps, ``BISECTIONS``), at most ``ROUNDS`` replays; the highest rate that met them is the
    point. There the screen is evaluated again (at that rate) and held against the replay
    on both axes of the front; if they differ by more than ``AGREEMENT`` the screen's step
    times are corrected by the ratio of mean TPOTs the first replay measured (at another
    rate) and compared again; a point whose screen still disagrees is not claimed. Returns the
    replay's row with the screen figures at the point (``screen``)."""
    slo, traffic = task["slo"], task["traffic"]
    first = task["row"]

    def replay_at(rate: float) -> dict:
        est = screen(setup, d, rate=rate, load=None, slo=slo, traffic=traffic)
        return verify(d, task["model"], task["overrides"], rate, work, slo, traffic, step_model=setup.step_model,
                      tpot_ms=est.get("est_tpot_ms") or first["est_tpot_ms"])

    met, missed, checks = None, None, []
    for fraction in (1.0, *BACK_OFF):
        rate = first["rate_per_s"] * fraction
        checks.append((rate, replay_at(rate)))
        if checks[-1][1]["verdict"] == "error":
            return {**checks[-1][1], "screen_rounds": len(checks)}
        if checks[-1][1]["verdict"] == "meets-slo":
            met = checks[-1]
            break
        missed = checks[-1]
        if len(checks) >= ROUNDS:
            break
    for _ in range(BISECTIONS):  # between the highest rate that met and the lowest that missed
        if met is None or missed is None or len(checks) >= ROUNDS:
            break
        rate = math.sqrt(met[0] * missed[0])
        check = replay_at(rate)
        checks.append((rate, check))
        if check["verdict"] == "meets-slo":
            met = (rate, check)
        elif check["verdict"] != "error":
            missed = (rate, check)
    if met is None:
        last = checks[-1][1]
        return {**last, "screen_rounds": len(checks), "verdict": "misses-slo",
                "verdict_reason": f"{last['verdict_reason']} (down to {checks[-1][0]:.3g} req/s)"}
    rate, check = met
    row = _screen_window(setup, d, rate, slo, traffic, None)
    gap = screen_gap(row, check)
    if gap > AGREEMENT:
        row0, check0 = first, checks[0][1]
        k = Correction(tpot=check0["tpot_ms_mean"] / row0["est_tpot_ms"])
        row = _screen_window(setup, d, rate, slo, traffic, k)
        gap = screen_gap(row, check)
    out = {**check, "screen_rounds": len(checks), "screen_replay_gap": gap,
           "screen": {**{key: row.get(key) for key in SCREEN_KEYS}, "screen_goodput_rate_per_s": first["rate_per_s"]}}
    if gap > AGREEMENT:
        out.update(verdict="misses-slo", verdict_reason=f"screen and replay differ by {gap:.0%} on the front's axes "
                   "after correcting the screen's step times")
    return out


def _screen_window(setup, d: Deployment, rate: float, slo: dict, traffic: dict, k: Correction | None) -> dict:
    """The screen at ``rate`` with the goodput's figures (output per request from the replay's window)."""
    return screen(setup, d, rate=rate, load=None, slo=slo, traffic=traffic, correction=k, window_output=True)


# -- executors --------------------------------------------------------------------------------


class Executor:
    """Maps a task function over payloads: here, on local processes, or on Dask."""

    def __init__(self, kind: str = "local", jobs: int | None = None, address=None):
        if kind not in ("local", "dask"):
            raise ConfigError("--executor", "executor", "must be local or dask", kind)
        self.kind, self.jobs, self.address = kind, jobs or os.cpu_count() or 1, address
        self.cache = SetupCache()
        self._pool = self._client = None
        self._own_client = False

    def map(self, fn, payloads: list, bar=None, done: dict | None = None) -> list:
        """``fn`` over ``payloads``, results in their order; ``done`` (if given) gets each result
        by its payload's index as it arrives, so an interrupted map keeps what finished."""
        if not payloads:
            return []
        if self.kind == "dask":
            return self._map_dask(fn, payloads, bar, done)
        if self.jobs == 1 or len(payloads) == 1:
            out = []
            for p in payloads:
                out.append(fn(p, self.cache))
                if done is not None:
                    done[len(out) - 1] = out[-1]
                if bar is not None:
                    bar.update()
            return out
        return self._map_pool(fn, payloads, bar, done)

    def _map_pool(self, fn, payloads, bar, done=None):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed


        if self._pool is None:
            ctx = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=ctx, initializer=worker_init,
                                             initargs=(os.getpid(),))
        futures = {self._pool.submit(fn, p): i for i, p in enumerate(payloads)}
        out: list = [None] * len(payloads)
        for future in as_completed(futures):
            out[futures[future]] = future.result()
            if done is not None:
                done[futures[future]] = out[futures[future]]
            if bar is not None:
                bar.update()
        return out

    def _map_dask(self, fn, payloads, bar, done=None):
        from dask.distributed import Client
        from dask.distributed import as_completed as dask_completed

        if self._client is None:
            if isinstance(self.address, Client):
                self._client = self.address
            else:
                try:
                    self._client = Client(self.address, timeout="15s")
                except (OSError, TimeoutError, ValueError) as err:
                    raise ConfigError("--address", "address", "cannot reach a Dask scheduler there "
                                      f"({type(err).__name__})", self.address) from None
                self._own_client = True
        futures = self._client.map(fn, payloads, pure=False)
        where = {f.key: i for i, f in enumerate(futures)}
        out: list = [None] * len(payloads)
        for future in dask_completed(futures):
            out[where[future.key]] = future.result()
            if done is not None:
                done[where[future.key]] = out[where[future.key]]
            if bar is not None:
                bar.update()
        return out

    def close(self) -> None:
        if self._pool is not None:
            stop_pool(self._pool)
            self._pool = None
        if self._client is not None and self._own_client:
            self._client.close()
        self._client = None


# -- the search ------------------------------------------------------------------------------


@dataclass
class SearchResult:
    """Every deployment's row (screen figures, and the replay's for those checked), the
    confirmed front and the chosen point, with the counts and timings."""

    space: Space
    workload: Workload
    rows: list[dict]
    front: list[dict]
    chosen: dict | None
    complete: bool
    counts: dict
    timing: dict = field(default_factory=dict)
    interrupted: bool = False  # Ctrl-C during the replays: the front is of the checks that finished

    def table(self):
        import pandas as pd

        return pd.DataFrame(self.rows)


def _bar(total: int, desc: str, unit: str, progress: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not progress, file=sys.stderr, dynamic_ncols=True,
                mininterval=0.5)


def _workload(space: Space, traffic: dict, slo: dict) -> Workload:
    """The traffic's statistics; a request source that is not there is said against the search
    file's ``traffic.requests`` (a bad request file names itself)."""
    requests = traffic["requests"]
    try:
        return workload(requests, traffic["rate"], traffic["duration_s"], slo["percentile"], traffic["seed"])
    except ConfigError as err:
        raise named_at(err, requests, space.file, "traffic.requests") from None


def _confirm(pool: Executor, base: dict, candidates: list[dict], budget: int, bar, keep: bool) -> tuple[Confirmed, bool]:
    """Replay the candidates' front until it is confirmed (sim.search.front); (the result, whether
    Ctrl-C ended it). ``keep``: an interrupt keeps the replays that finished, their passing ones'
    front and ``complete=False``; else it propagates."""
    checks: dict[int, dict] = {}  # the replays that finished, kept through an interrupt

    def confirm(batch: list[dict]) -> list[dict]:
        bar.total += len(batch)
        bar.refresh()
        tasks = [{**base, "rate": r["rate_per_s"], "tpot_ms": r["est_tpot_ms"], "row": r,
                  "deployment": {k: r[k] for k in Deployment.__dataclass_fields__}} for r in batch]
        finished: dict[int, dict] = {}
        try:
            done = pool.map(verify_task, tasks, bar, finished)
            for r, check in zip(batch, done, strict=True):  # a corrected screen moves the point
                r.update(check.pop("screen", None) or {})
            return done
        finally:  # also when interrupted: the replays of the batch that finished
            checks.update((batch[i]["index"], c) for i, c in finished.items())

    try:
        return confirmed_front(candidates, confirm, budget, lambda row: row["verdict"] == "meets-slo"), False
    except KeyboardInterrupt:
        if not keep:
            raise
        passed = [c for c in candidates if checks.get(c["index"], {}).get("verdict") == "meets-slo"]
        return Confirmed(pareto(passed), checks, complete=False), True


def run_search(space: Space, *, executor: str = "local", jobs: int | None = None, address=None,
               progress: bool = True, progress_kept: bool = False) -> SearchResult:
    """Screen every deployment of ``space`` and confirm the front (module docstring). With
    ``progress_kept``, Ctrl-C (KeyboardInterrupt) during the replays ends the search there: the
    result holds every screened row, the replays that finished, the front of those that passed,
    and ``interrupted``; without it (or during the screen) the interrupt propagates."""
    spec = space.spec
    slo, traffic = spec.slo.model_dump(), spec.traffic.model_dump()
    overrides = tuple(spec.overrides.items())
    t0 = time.perf_counter()
    work = _workload(space, traffic, slo)
    base = {"model": space.model, "overrides": overrides, "workload": asdict(work), "slo": slo, "traffic": traffic,
            "rate": traffic["rate"], "goodput": spec.traffic.goodput}
    groups = list(space.setups.values())
    pool = Executor(executor, jobs, address)
    try:
        t1 = time.perf_counter()
        bar = _bar(len(groups), f"screen {len(space.deployments):,} deployments", "setup", progress)
        try:
            screened = pool.map(screen_task, [{**base, "deployments": [d.as_dict() for d in g]} for g in groups], bar)
        finally:
            bar.close()
        rows = [row for group in screened for row in group]
        order = {d: i for i, d in enumerate(space.deployments)}
        rows.sort(key=lambda r: order[Deployment(**{k: r[k] for k in Deployment.__dataclass_fields__})])
        for i, row in enumerate(rows):
            row["index"] = i
        t2 = time.perf_counter()
        candidates = [r for r in rows if r.get("screen_ok")]
        bar = _bar(0, "confirm the front", "replay", progress)

        try:
            confirmed, interrupted = _confirm(pool, base, candidates, spec.max_replays, bar, progress_kept)
        finally:
            bar.close()
    finally:
        pool.close()
    t3 = time.perf_counter()
    for index, check in confirmed.checked.items():
        rows[index].update(check, checked=True)
    front = [rows[p["index"]] for p in confirmed.front]
    for row in rows:
        row["on_front"] = False
    for row in front:
        row["on_front"] = True
    pick = chosen(front)
    status = Counter(r["status"] for r in rows)
    counts = {"deployments": len(rows), "setups": len(groups), "excluded": sum(n for _, n in space.excluded),
              "errors": status["error"],
              "invalid": status["invalid"], "does_not_fit": status["does-not-fit"], "saturated": status["saturated"],
              "screened": status["screened"], "screen_ok": len(candidates), "replays": len(confirmed.checked),
              "replays_failed": sum(1 for c in confirmed.checked.values() if c["verdict"] != "meets-slo"),
              "rounds": confirmed.rounds, "front": len(front)}
    timing = {"workload_s": t1 - t0, "screen_s": t2 - t1, "confirm_s": t3 - t2, "wall_s": t3 - t0,
              "executor": executor, "jobs": pool.jobs if executor == "local" else None}
    return SearchResult(space, work, rows, front, pick, confirmed.complete, counts, timing, interrupted)


__all__ = ["Executor", "SearchResult", "SetupCache", "run_search", "screen_task", "verify_task"]
