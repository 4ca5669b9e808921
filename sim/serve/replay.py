"""The serving replay: a client sends requests, steps take the step model's time.

The client (sim.serve.clients: open loop at the requests' timestamps, the default; closed
loop at a fixed concurrency; offline) decides when each request arrives. The clock (integer
nanoseconds) starts at 0, the first arrival. Each iteration: requests whose
arrival time has come join the waiting queue (one that can never fit, because its prompt and
output exceed the model's context or alone overflow the KV pool, is rejected and counted);
if nothing runs or waits, the clock jumps to the next arrival; otherwise the scheduler
decides the step's work, the step model gives its duration (rounded to the nanosecond) and
the clock advances by it. Requests that arrive during a step join before the next one.

Outputs, streamed (memory holds only live requests plus a few numbers per finished one):

* per step (``steps.parquet``): ``step, t_start_s, step_ms, batch`` (sequences in the step),
  ``decode_seqs, prefill_seqs, prefill_tokens, sampled_tokens, running, waiting`` (after
  scheduling), ``in_system`` (running + waiting), ``kv_blocks, kv_bytes, kv_occupancy``
  (after the step's reservations), ``preempted``;
* per request (``requests.parquet``): ``rid, arrival_s, prompt_tokens, output_tokens,
  admitted_s, first_token_s, finish_s, ttft_ms, tpot_ms, e2e_ms, preemptions,
  recomputed_tokens, status`` (``done`` or ``rejected``; times relative to the first
  arrival);
* ``summary.json``: sim.serve.metrics' figures, the setup and the step model's statistics.

Parquet files are written in row groups of ``ROW_GROUP`` rows through
``pyarrow.parquet.ParquetWriter`` to a temporary name and renamed when complete
(``sim.io.AtomicFile``).

Stopping early: ``stop`` (a callable, checked before every step; the command line sets it
from SIGINT / SIGTERM) ends the replay where it is. The tables are closed with the rows of
what finished (requests still running are not written), and the summary says
``partial: true`` with ``stopped_at_s`` (simulated seconds after the first arrival). An
exception instead (a second Ctrl-C) removes the temporary tables. ``progress(clock_s,
requests_done)`` is called every ``PROGRESS_EVERY`` steps and once at the end.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sim.energy import MeteredStepModel
from sim.errors import COMMAND_LINE, ConfigError
from sim.io import AtomicFile
from sim.serve.clients import Client
from sim.serve.disagg import serve_disagg
from sim.serve.metrics import Metrics
from sim.serve.requests import Request
from sim.serve.scheduler import Scheduler, Sequence
from sim.serve.spec import ServeSetup, ServeSpec, build
from sim.serve.speculative import HEAD_DRAFTERS, SpeculativeStepModel
from sim.serve.stepmodel import SimulatorStepModel, StepModel, serve_resolved
from sim.units import ns_to_ms, ns_to_s, s_to_ns

ROW_GROUP = 65_536
PROGRESS_EVERY = 512  # steps between progress calls

STEP_SCHEMA = pa.schema([
    ("step", pa.int64()), ("t_start_s", pa.float64()), ("step_ms", pa.float64()), ("batch", pa.int32()),
    ("decode_seqs", pa.int32()), ("prefill_seqs", pa.int32()), ("prefill_tokens", pa.int32()),
    ("sampled_tokens", pa.int32()), ("running", pa.int32()), ("waiting", pa.int32()), ("in_system", pa.int32()),
    ("kv_blocks", pa.int64()), ("kv_bytes", pa.int64()), ("kv_occupancy", pa.float64()), ("preempted", pa.int32()),
])
REQUEST_SCHEMA = pa.schema([
    ("rid", pa.int64()), ("arrival_s", pa.float64()), ("prompt_tokens", pa.int32()), ("output_tokens", pa.int32()),
    ("admitted_s", pa.float64()), ("first_token_s", pa.float64()), ("finish_s", pa.float64()),
    ("ttft_ms", pa.float64()), ("tpot_ms", pa.float64()), ("e2e_ms", pa.float64()), ("preemptions", pa.int32()),
    ("recomputed_tokens", pa.int64()), ("status", pa.string()),
])


class TableWriter:
    """Rows buffered column-wise and written to Parquet in row groups; a no-op without a
    path. The file appears (atomically renamed) on ``close``."""

    def __init__(self, path: Path | None, schema: pa.Schema, row_group: int = ROW_GROUP):
        self.path, self.schema, self.row_group = path, schema, row_group
        self.columns: list[list] = [[] for _ in schema.names]
        self.rows = 0
        self._writer = None
        self._file = None
        if path is not None:
            self._file = AtomicFile(path)
            self._writer = pq.ParquetWriter(self._file.tmp, schema)

    def append(self, *values) -> None:
        if self._writer is None:
            return
        for column, value in zip(self.columns, values, strict=True):
            column.append(value)
        self.rows += 1
        if len(self.columns[0]) >= self.row_group:
            self._flush()

    def _flush(self) -> None:
        if self.columns[0]:
            arrays = [pa.array(col, type=f.type) for col, f in zip(self.columns, self.schema, strict=True)]
            self._writer.write_table(pa.Table.from_arrays(arrays, schema=self.schema))
            self.columns = [[] for _ in self.schema.names]

    def close(self) -> None:
        if self._writer is None:
            return
        self._flush()
        self._writer.close()
        self._file.commit()
        self._writer = None

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._file.abort()
            self._writer = None


def replay(source: Iterable[Request] | Client, model: StepModel, scheduler: Scheduler, *, target_ms: float = 10.0,
           max_context: int | None = None, out_dir: str | Path | None = None, window_s: float | None = None,
           stop: Callable[[], bool] | None = None, progress: Callable[[float, int], None] | None = None,
           ttft_target_ms: float | None = None) -> dict:
    """Replay ``source`` (requests sent open loop at their timestamps, or a ``Client``) through
    ``scheduler`` with step times from ``model``; returns the metrics summary
    (sim.serve.metrics) and writes the tables to ``out_dir`` if given. ``window_s``: the
    arrival window replayed (for the offered rate; default the arrivals' span);
    ``ttft_target_ms``: the TTFT part of the goodput SLO (the TPOT part is ``target_ms``);
    ``stop`` and ``progress``: see the module docstring."""
    out = Path(out_dir) if out_dir is not None else None
    steps = TableWriter(out / "steps.parquet" if out else None, STEP_SCHEMA)
    requests = TableWriter(out / "requests.parquet" if out else None, REQUEST_SCHEMA)
    metrics = Metrics(target_ms, ttft_target_ms)
    client = source if isinstance(source, Client) else Client(source)
    try:
        stopped_ns = _loop(client, model, scheduler, metrics, steps, requests, max_context, stop, progress)
    except BaseException:
        steps.abort()
        requests.abort()
        raise
    steps.close()
    requests.close()
    return metrics.summary(window_s=window_s, stopped_ns=stopped_ns)


def _loop(client: Client, model, scheduler: Scheduler, metrics: Metrics, steps: TableWriter, requests: TableWriter,
          max_context, stop=None, progress=None) -> int | None:
    """Run the replay; returns None when it ran to the end, else the clock (ns after the
    first arrival) at which ``stop`` ended it."""
    pool = scheduler.pool
    clock = index = 0
    while not client.exhausted or scheduler.busy:
        if stop is not None and stop():
            return clock
        if progress is not None and index % PROGRESS_EVERY == 0:
            progress(ns_to_s(clock), metrics.requests_done)
        _arrivals(client, clock, scheduler, metrics, requests, max_context)
        if not scheduler.busy:
            due = client.next_ns()
            if due is None:
                break
            clock = max(clock, due)
            continue
        work = scheduler.schedule(clock)
        if not work.work:
            raise RuntimeError("scheduler made no progress with requests waiting (a bug: every admitted "
                               "request fits the pool alone)")
        decode, prefill = work.split()
        dt = max(1, round(model.step_ns(decode, prefill)))
        prefill_tokens = sum(chunk for chunk, _ in prefill)
        running, waiting = len(scheduler.running), len(scheduler.waiting)
        kv_blocks, kv_bytes, occupancy = pool.used_blocks, pool.used_bytes, pool.occupancy
        sampled, finished = scheduler.complete(work, clock + dt)
        metrics.step(dt, len(work.work), running + waiting, waiting, occupancy, prefill_tokens, sampled, work.itl_ns)
        steps.append(index, ns_to_s(clock), ns_to_ms(dt), len(work.work), len(decode), len(prefill),
                     prefill_tokens, sampled, running, waiting, running + waiting, kv_blocks, kv_bytes, occupancy,
                     work.preempted)
        clock += dt
        index += 1
        for seq in finished:
            metrics.finished(seq)
            client.finished(seq.finish_ns)
            _request_row(requests, seq, 0, "done")
    if progress is not None:
        progress(ns_to_s(clock), metrics.requests_done)
    return None


def _arrivals(client: Client, clock: int, scheduler: Scheduler, metrics: Metrics, requests: TableWriter,
              max_context) -> None:
    """Every request the client sends by ``clock`` joins the queue (or is rejected)."""
    while True:
        due = client.next_ns()
        if due is None or due > clock:
            return
        t, request = client.pop()
        if not _arrive(request, t, scheduler, metrics, requests, max_context):
            client.finished(t)


def _arrive(request: Request, t_ns: int, scheduler: Scheduler, metrics: Metrics, requests: TableWriter,
            max_context) -> bool:
    """Request ``request`` arrives at ``t_ns``: it joins the queue (True) or is rejected."""
    seq = Sequence(request.rid, t_ns, request.prompt_tokens, request.output_tokens)
    metrics.arrived(seq.arrival_ns)
    longest = seq.prompt + seq.output - 1  # tokens cached at the last step
    if (max_context is not None and longest > max_context) or not scheduler.pool.fits_alone(longest):
        metrics.rejected += 1
        _request_row(requests, seq, 0, "rejected")
        return False
    scheduler.arrive(seq)
    return True


def _request_row(requests: TableWriter, seq: Sequence, origin: int, status: str) -> None:
    def seconds(ns):
        return ns_to_s(ns - origin) if ns >= 0 else math.nan

    done = status == "done"
    tpot = ns_to_ms(seq.finish_ns - seq.first_token_ns) / (seq.output - 1) if done and seq.output > 1 else math.nan
    requests.append(seq.rid, seconds(seq.arrival_ns), seq.prompt, seq.output, seconds(seq.admitted_ns),
                    seconds(seq.first_token_ns), seconds(seq.finish_ns),
                    ns_to_ms(seq.first_token_ns - seq.arrival_ns) if done else math.nan, tpot,
                    ns_to_ms(seq.finish_ns - seq.arrival_ns) if done else math.nan, seq.preemptions,
                    seq.recomputed_tokens, status)


# -- a replay from a spec ---------------------------------------------------------------------


def serve(spec: ServeSpec | ServeSetup, out_dir: str | Path | None = None, *, step_model: StepModel | None = None,
          stop: Callable[[], bool] | None = None, progress: Callable[[float, int], None] | None = None) -> dict:
    """Build (if needed) and replay one serving setup; returns the summary (setup, metrics,
    step-model statistics, wall time). ``out_dir`` receives the tables; ``stop`` and
    ``progress`` as in ``replay``."""
    wall = time.perf_counter()
    asked = spec.spec if isinstance(spec, ServeSetup) else spec
    if asked.prefill_chips is not None:
        return {**serve_disagg(asked), "wall_s": time.perf_counter() - wall}
    setup = spec if isinstance(spec, ServeSetup) else build(spec)
    model = step_model or SimulatorStepModel(setup.resolved)
    metered = None
    if setup.spec.speculate_k:  # energy is not metered under speculation (two step models)
        model = SpeculativeStepModel(model, SimulatorStepModel(_drafter(setup.spec)), setup.spec.speculate_k,
                                     setup.spec.acceptance)
    elif setup.resolved.hardware.energy is not None and step_model is None:
        metered = MeteredStepModel(model, setup.resolved)
    spec = setup.spec
    scheduler = Scheduler(setup.pool(), max_batch=spec.max_batch,
                          max_tokens_per_step=spec.max_tokens_per_step, policy=spec.policy)
    client = Client(setup.source, spec.client, spec.concurrency)
    figures = replay(client, metered or model, scheduler, target_ms=spec.target_ms,
                     max_context=setup.resolved.model.max_context, out_dir=out_dir,
                     window_s=setup.source.window_s if spec.client == "open-loop" else None, stop=stop,
                     progress=progress, ttft_target_ms=spec.ttft_target_ms)
    if metered is not None:
        figures.update(metered.summary(figures["simulated_s"], figures["output_tokens"]))
    summary = {**setup.describe(), **figures, "wall_s": time.perf_counter() - wall}
    if isinstance(model, SpeculativeStepModel):
        model = model.target
    if isinstance(model, SimulatorStepModel):
        summary["step_model"] = {**model.stats, "exact": model.exact, "fallback_reason": model.fallback_reason}
        moe = model.moe_figures(s_to_ns(figures["simulated_s"]))
        if moe is not None:
            summary["moe"] = moe
    return summary


def _drafter(spec: ServeSpec):
    """The drafter's resolved setup; a drafter that cannot be resolved is said against --drafter."""
    try:
        return serve_resolved(spec.draft_spec())
    except ConfigError as err:
        if spec.drafter in HEAD_DRAFTERS or err.file not in (None, COMMAND_LINE):
            raise
        raise ConfigError(COMMAND_LINE, "--drafter", err.expected, spec.drafter) from None


__all__ = ["replay", "serve", "TableWriter", "STEP_SCHEMA", "REQUEST_SCHEMA", "PROGRESS_EVERY"]
