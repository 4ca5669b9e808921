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
from dataclasses import dataclass
from pathlib import Path

from sim.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Step:
    index: int
    seq_ids: tuple[int, ...]
    contexts: tuple[int, ...]

    @property
    def batch(self) -> int:
        return len(self.contexts)


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
        clock += step_ms / 1e3
    return steps


def synthetic_requests(n: int, rate_per_s: float, prompt_median: int, output_median: int,
                       sigma: float = 0.8, seed: int = 0) -> list[Request]:
    import numpy as np  # only for generating requests: keeps numpy out of start-up

    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, n))
    prompts = np.maximum(1, rng.lognormal(math.log(prompt_median), sigma, n).astype(int))
    outputs = np.maximum(1, rng.lognormal(math.log(output_median), sigma, n).astype(int))
    return [Request(float(a), int(p), int(o)) for a, p, o in zip(arrivals, prompts, outputs, strict=True)]


def azure_requests(path: str | Path, limit: int | None = None) -> list[Request]:
    import pandas as pd

    frame = pd.read_csv(path, nrows=limit)
    missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(frame.columns)
    if missing:
        raise ConfigError(str(path), sorted(missing)[0], "required column is missing")
    times = pd.to_datetime(frame["TIMESTAMP"], format="mixed")
    seconds = (times - times.iloc[0]).dt.total_seconds().to_numpy()
    return [Request(float(t), int(p), int(o)) for t, p, o in
            zip(seconds, frame["ContextTokens"], frame["GeneratedTokens"], strict=True)]


# -- files -------------------------------------------------------------------------------


def write(steps: list[Step], path: str | Path) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".parquet":
        _frame(steps).to_parquet(tmp, index=False)
    elif path.suffix == ".csv":
        _frame(steps).to_csv(tmp, index=False)
    else:
        with open(tmp, "w") as out:
            for s in steps:
                out.write(json.dumps({"step": s.index, "seqs": [list(p) for p in zip(s.seq_ids, s.contexts, strict=True)]}) + "\n")
    tmp.replace(path)


def _frame(steps):
    import pandas as pd

    rows = [(s.index, sid, ctx) for s in steps for sid, ctx in zip(s.seq_ids, s.contexts, strict=True)]
    return pd.DataFrame(rows, columns=["step", "seq_id", "context"])


def read(path: str | Path) -> list[Step]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), None, "trace file not found")
    if path.suffix in (".parquet", ".csv"):
        return _read_table(path)
    steps = []
    with open(path) as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(str(path), f"line {number}", f"invalid JSON ({err.msg})") from None
            steps.append(_step(record, path, number, len(steps)))
    if not steps:
        raise ConfigError(str(path), None, "trace has no steps")
    return steps


def _step(record, path, number, index) -> Step:
    where = f"line {number}"
    if not isinstance(record, dict) or "seqs" not in record:
        raise ConfigError(str(path), where, 'expected {"step": N, "seqs": [[seq_id, context], ...]}')
    seqs = record["seqs"]
    if not isinstance(seqs, list) or not seqs:
        raise ConfigError(str(path), f"{where}.seqs", "expected a non-empty list of [seq_id, context]")
    ids, contexts = [], []
    for pair in seqs:
        if (not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool)
                                                                      for v in pair)):
            raise ConfigError(str(path), f"{where}.seqs", "each entry must be [seq_id, context] integers", pair)
        if pair[1] < 1:
            raise ConfigError(str(path), f"{where}.seqs", "context must be >= 1", pair[1])
        ids.append(pair[0])
        contexts.append(pair[1])
    return Step(record.get("step", index), tuple(ids), tuple(contexts))


def _read_table(path: Path) -> list[Step]:
    import pandas as pd

    try:
        frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except Exception as err:  # noqa: BLE001 - any reader failure is bad input
        raise ConfigError(str(path), None, f"cannot read trace table ({type(err).__name__})") from None
    for column in ("step", "seq_id", "context"):
        if column not in frame.columns:
            raise ConfigError(str(path), column, "required column is missing")
    if (frame["context"] < 1).any():
        raise ConfigError(str(path), "context", "every context must be >= 1")
    steps = []
    for step, group in frame.groupby("step", sort=True):
        steps.append(Step(int(step), tuple(int(v) for v in group["seq_id"]), tuple(int(v) for v in group["context"])))
    if not steps:
        raise ConfigError(str(path), None, "trace has no steps")
    return steps
