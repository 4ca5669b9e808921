"""Decode traces: which sequences are active at each step, and their context lengths.

A trace is a list of ``Step``s. Each step lists its active sequences as (sequence id,
context length after this step's token). Sequences join and leave between steps
(continuous batching). Generators:

* ``fixed(batch, context, steps)``: ``batch`` sequences that start at ``context`` tokens and
  grow by one token per step;
* ``from_requests(requests, max_batch, ...)``: requests (arrival s, prompt tokens, output
  tokens) admitted first come first served while fewer than ``max_batch`` are active; each
  decodes its output tokens one per step and leaves. Prefill is not simulated: a request
  joins the decode batch with its prompt in the cache. Steps advance a clock by
  ``step_ms`` (a nominal step time), which decides who has arrived.
* ``synthetic_requests(...)``: Poisson arrivals with log-normal prompt and output lengths.
* ``azure_requests(path)``: the Azure LLM inference trace 2023 CSV (TIMESTAMP,
  ContextTokens, GeneratedTokens).

File format (``decodesim run --trace FILE``): JSON Lines, one object per step,
``{"step": 0, "seqs": [[seq_id, context], ...]}``; or Parquet / CSV with columns
``step, seq_id, context`` (one row per active sequence per step).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from sim.errors import ConfigError
from sim.io import read_jsonl, write_with
from sim.units import ms_to_s

MAX_CONTEXT = 1_000_000_000  # sim.config.model.MAX_CONTEXT (not imported: this module loads without pydantic)


class Step(NamedTuple):
    """One decode step of a trace: its index, the sequences it decodes and their contexts
    (a tuple: made once per step of a run, so made at C speed)."""

    index: int
    seq_ids: tuple[int, ...]
    contexts: tuple[int, ...]

    @property
    def batch(self) -> int:
        return len(self.contexts)


def length_counts(contexts: tuple[int, ...]):
    """Each distinct context length of ``contexts`` with how many sequences have it (pairs, in
    first-use order): the costs of sequences of one length are counted once. A fixed trace's
    step has one length, counted without a tally."""
    if contexts and contexts.count(contexts[0]) == len(contexts):
        return ((contexts[0], len(contexts)),)
    return Counter(contexts).items()


def fixed(batch: int, context: int, steps: int) -> list[Step]:
    ids = tuple(range(batch))
    return [Step(i, ids, (context + i,) * batch) for i in range(steps)]


@dataclass(frozen=True, slots=True)
class Request:
    arrival_s: float
    prompt: int
    output: int


def from_requests(requests: list[Request], max_batch: int, step_ms: float = 10.0,
                  max_steps: int | None = None, max_context: int | None = None) -> list[Step]:
    pending = sorted(enumerate(requests), key=lambda item: (item[1].arrival_s, item[0]))
    start = pending[0][1].arrival_s if pending else 0.0
    active: dict[int, list[int]] = {}  # id -> [context, tokens left]
    steps: list[Step] = []
    clock = start
    i = 0
    while (i < len(pending) or active) and (max_steps is None or len(steps) < max_steps):
        while i < len(pending) and len(active) < max_batch and pending[i][1].arrival_s <= clock:
            rid, req = pending[i]
            prompt = req.prompt if max_context is None else min(req.prompt, max_context - req.output)
            active[rid] = [max(1, prompt), max(1, req.output)]
            i += 1
        if not active:
            clock = max(clock, pending[i][1].arrival_s)
            continue
        ids = tuple(sorted(active))
        for rid in ids:
            active[rid][0] += 1
        steps.append(Step(len(steps), ids, tuple(active[rid][0] for rid in ids)))
        for rid in ids:
            active[rid][1] -= 1
            if active[rid][1] <= 0:
                del active[rid]
        clock += ms_to_s(step_ms)
    return steps


def synthetic_requests(n: int, rate_per_s: float, prompt_median: int, output_median: int,
                       sigma: float = 0.8, seed: int = 0) -> list[Request]:
    import numpy as np  # only for generating requests: keeps numpy out of start-up

    for name, value, low in (("rate_per_s", rate_per_s, 0), ("prompt_median", prompt_median, 0),
                             ("output_median", output_median, 0), ("sigma", sigma, None)):
        finite = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not finite or (value <= low if low is not None else value < 0):
            raise ConfigError("synthetic_requests()", name, "must be a finite number " + ("> 0" if low == 0 else ">= 0"),
                              value)
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, n))
    prompts = np.maximum(1, rng.lognormal(math.log(prompt_median), sigma, n).astype(int))
    outputs = np.maximum(1, rng.lognormal(math.log(output_median), sigma, n).astype(int))
    return [Request(float(a), int(p), int(o)) for a, p, o in zip(arrivals, prompts, outputs, strict=True)]


def azure_requests(path: str | Path, limit: int | None = None) -> list[Request]:
    """Requests of the Azure LLM inference trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens)."""
    import pandas as pd

    try:
        frame = pd.read_csv(path, nrows=limit)
    except Exception as err:  # noqa: BLE001 - any reader failure is bad input
        raise ConfigError(str(path), None, f"cannot read the Azure trace CSV ({type(err).__name__})") from None
    missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(frame.columns)
    if missing:
        raise ConfigError(str(path), sorted(missing)[0], "required column is missing")
    if frame.empty:
        raise ConfigError(str(path), None, "the Azure trace has no rows")
    try:
        times = pd.to_datetime(frame["TIMESTAMP"], format="mixed")
    except (ValueError, TypeError, OverflowError):
        raise ConfigError(str(path), "TIMESTAMP", "expected date-times such as 2023-11-16 18:15:46.6805900") from None
    seconds = (times - times.iloc[0]).dt.total_seconds().to_numpy()
    tokens = [_whole_column(frame[c], Path(path), c) for c in ("ContextTokens", "GeneratedTokens")]
    return [Request(float(t), p, o) for t, p, o in zip(seconds, *tokens, strict=True)]


# -- files -------------------------------------------------------------------------------


def write(steps: list[Step], path: str | Path) -> None:
    """Write ``steps`` as JSON Lines, Parquet or CSV (by suffix), atomically."""
    path = Path(path)
    if path.suffix == ".parquet":
        write_with(path, lambda tmp: _frame(steps).to_parquet(tmp, index=False))
    elif path.suffix == ".csv":
        write_with(path, lambda tmp: _frame(steps).to_csv(tmp, index=False))
    else:
        write_with(path, lambda tmp: _write_jsonl(steps, tmp))


def _write_jsonl(steps: list[Step], path: Path) -> None:
    with open(path, "w") as out:
        for s in steps:
            pairs = [list(p) for p in zip(s.seq_ids, s.contexts, strict=True)]
            out.write(json.dumps({"step": s.index, "seqs": pairs}) + "\n")


def _frame(steps):
    import pandas as pd

    rows = [(s.index, sid, ctx) for s in steps for sid, ctx in zip(s.seq_ids, s.contexts, strict=True)]
    return pd.DataFrame(rows, columns=["step", "seq_id", "context"])


def read(path: str | Path, steps: int | None = None) -> list[Step]:
    """Read and check a trace file: JSON Lines, or a Parquet / CSV table with columns step,
    seq_id, context (others are ignored); ``check`` below says what a trace must satisfy.

    ``steps``: the first this many steps only (``None``: all; ``decodesim run --trace FILE
    --steps N`` asks for N). JSON Lines stops reading after the N-th step, so what follows
    it is never parsed (a line there may even be invalid); a table is read whole, its
    columns checked as whole numbers, and only the steps with the N smallest step numbers
    are built. ``check`` runs on the steps read, so a problem after them goes unnoticed.
    """
    if steps is not None and steps < 1:
        raise ValueError(f"steps must be >= 1 or None, got {steps}")
    path = Path(path)
    if not path.exists():
        raise ConfigError(str(path), None, "trace file not found")
    if not path.is_file():
        raise ConfigError(str(path), None, "is not a file; expected a trace file (JSONL, Parquet or CSV)")
    out = _read_table(path, steps) if path.suffix in (".parquet", ".csv") else _read_jsonl(path, steps)
    check(out, str(path))
    return out


def _read_jsonl(path: Path, limit: int | None) -> list[Step]:
    steps: list[Step] = []
    for number, record in read_jsonl(path, "JSON Lines (one step per line), or a .parquet / .csv table"):
        steps.append(_step(record, path, number, len(steps)))
        if len(steps) == limit:  # the lines after it are never parsed (read_jsonl reads as consumed)
            break
    return steps


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _step(record, path, number, index) -> Step:
    where = f"line {number}"
    if not isinstance(record, dict) or "seqs" not in record:
        raise ConfigError(str(path), where, 'expected {"step": N, "seqs": [[seq_id, context], ...]}')
    extra = sorted(set(record) - {"step", "seqs"})
    if extra:
        raise ConfigError(str(path), f"{where}.{extra[0]}", "unknown key; allowed keys: step, seqs")
    step = record.get("step", index)
    if not _whole(step) or step < 0:
        raise ConfigError(str(path), f"{where}.step", "must be a whole number >= 0", step)
    seqs = record["seqs"]
    if not isinstance(seqs, list) or not seqs:
        raise ConfigError(str(path), f"{where}.seqs", "expected a non-empty list of [seq_id, context]")
    ids, contexts = [], []
    for pair in seqs:
        if not isinstance(pair, list) or len(pair) != 2 or not all(_whole(v) for v in pair):
            raise ConfigError(str(path), f"{where}.seqs", "each entry must be [seq_id, context] integers", pair)
        ids.append(pair[0])
        contexts.append(pair[1])
    return Step(step, tuple(ids), tuple(contexts))


def _read_table(path: Path, limit: int | None) -> list[Step]:
    import numpy as np
    import pandas as pd

    if path.stat().st_size == 0:
        raise ConfigError(str(path), None, "trace file is empty")
    try:
        frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except Exception as err:  # noqa: BLE001 - any reader failure is bad input
        raise ConfigError(str(path), None, f"cannot read trace table ({type(err).__name__})") from None
    columns = {}
    for column in ("step", "seq_id", "context"):
        if column not in frame.columns:
            raise ConfigError(str(path), column, "required column is missing")
        columns[column] = _whole_values(frame[column], path, column)
    if limit is not None:  # the rows of the first ``limit`` step numbers
        numbers = np.unique(columns["step"])
        if len(numbers) > limit:
            kept = columns["step"] <= numbers[limit - 1]
            columns = {column: values[kept] for column, values in columns.items()}
    by_step: dict[int, tuple[list[int], list[int]]] = {}
    for step, seq, context in zip(*(map(int, columns[c]) for c in ("step", "seq_id", "context")), strict=True):
        ids, contexts = by_step.setdefault(step, ([], []))
        ids.append(seq)
        contexts.append(context)
    return [Step(step, tuple(ids), tuple(contexts)) for step, (ids, contexts) in sorted(by_step.items())]


def _whole_column(series, path: Path, column: str) -> list[int]:
    """The column as Python ints; the first value that is not a whole number is the error."""
    return [int(v) for v in _whole_values(series, path, column)]


def _whole_values(series, path: Path, column: str):
    """The column as a float array of whole numbers; the first value that is not one is the error."""
    import numpy as np
    import pandas as pd

    if series.dtype == bool:
        raise ConfigError(str(path), column, "expected whole numbers, got booleans")
    values = pd.to_numeric(series, errors="coerce").astype(float).to_numpy()
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (values != np.floor(values))
    if bad.any():
        row = int(bad.argmax())
        where = f"row {row + 2}" if path.suffix == ".csv" else f"row {row}"  # CSV: line numbers (header is 1)
        value = series.iloc[row]
        raise ConfigError(str(path), f"{column} ({where})", "expected a whole number",
                          value.item() if hasattr(value, "item") else value)
    return values


def check(steps: list[Step], source: str) -> None:
    """A trace must make sense as decode: steps in increasing order, each sequence once per
    step with a context >= 1 (at most ``MAX_CONTEXT``), and a sequence that stays from one
    step to the next grows by one token per step (contexts never shrink)."""
    if not steps:
        raise ConfigError(source, None, "trace has no steps")
    last_seen: dict[int, tuple[int, int]] = {}  # seq id -> (step, context) when last active
    previous: Step | None = None
    for step in steps:
        where = f"step {step.index}"
        if previous is not None and step.index <= previous.index:
            raise ConfigError(source, where, f"steps must increase (step {step.index} follows step {previous.index})")
        if len(set(step.seq_ids)) != len(step.seq_ids):
            raise ConfigError(source, where, f"sequence id {_repeated(step.seq_ids)} appears more than once in one step")
        for seq, context in zip(step.seq_ids, step.contexts, strict=True):
            if not 1 <= context <= MAX_CONTEXT:
                raise ConfigError(source, f"{where}.seq {seq}", f"context must be in [1, {MAX_CONTEXT:,}]", context)
            seen = last_seen.get(seq)
            if seen is not None:
                _check_growth(source, where, seq, seen, (step.index, context), previous)
            last_seen[seq] = (step.index, context)
        previous = step


def _repeated(ids) -> int:
    seen = set()
    for seq in ids:
        if seq in seen:
            return seq
        seen.add(seq)
    raise AssertionError("no repeated id")


def _check_growth(source, where, seq, seen, now, previous: Step) -> None:
    (seen_step, seen_context), (step, context) = seen, now
    if seen_step == previous.index and context != seen_context + (step - seen_step):
        raise ConfigError(source, f"{where}.seq {seq}", f"context must grow by one token per step while a sequence "
                          f"is active ({seen_context} at step {seen_step})", context)
    if context <= seen_context:
        raise ConfigError(source, f"{where}.seq {seq}", f"context must not shrink or repeat when a sequence "
                          f"returns ({seen_context} at step {seen_step})", context)
