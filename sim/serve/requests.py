"""Request sources for the serving replay: who arrives when, with how many tokens.

A request is ``(arrival_s, prompt_tokens, output_tokens)``; a source yields them in arrival
order (ties keep file order), with arrival times relative to the first request (which
arrives at 0 s). Sources:

* ``azure-conv`` / ``azure-code``: the Azure LLM inference trace 2023, full length (an hour
  each: 19,366 conversation and 8,819 code requests; CC-BY 4.0, attribution in
  ``workloads/traces/README.md``). The CSVs are read from ``workloads/traces/`` (the bundled
  ``azure-*-2023-full.csv.gz`` copies), else from ``$DECODESIM_AZURE_DIR``, else from
  ``../shared/traces/azure-llm-inference-2023/`` beside the checkout. Any CSV with the
  columns TIMESTAMP, ContextTokens, GeneratedTokens is read the same way.
* ``synthetic``: Poisson arrivals at ``rate_per_s`` with log-normal prompt and output
  lengths (medians ``prompt_median`` and ``output_median``, log-space sigma ``sigma``),
  drawn from ``numpy.random.default_rng(seed)``; generated lazily until ``duration_s``.
* a request file: JSON Lines (``{"arrival_s": 0.0, "prompt_tokens": 512, "output_tokens":
  64}`` per line) or CSV/Parquet with the columns ``arrival_s, prompt_tokens,
  output_tokens``.

Rate: ``rate_scale = k`` replays a recorded trace at k x its rate by dividing every arrival
time by k (the same requests, compressed in time); ``rate_per_s = r`` for a recorded trace
means ``k = r / native rate`` (native rate = (requests - 1) / span of the arrivals). Only
requests arriving before ``duration_s`` (after scaling) are replayed; the replay then runs
until every admitted request has finished.

Bounded work, checked before any replay: ``duration_s`` at most ``MAX_DURATION_S``, a mean
rate at most ``MAX_RATE_PER_S`` and at most ``MAX_REQUESTS`` requests in the window (for
synthetic arrivals: rate x duration). A request file must list arrivals in non-decreasing
order (an unsorted file is an error naming the first line out of order) with token counts
in [1, ``MAX_TOKENS``].
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.errors import COMMAND_LINE, ConfigError
from sim.io import read_jsonl
from sim.paths import traces_dir

AZURE = {"azure-conv": "AzureLLMInferenceTrace_conv.csv", "azure-code": "AzureLLMInferenceTrace_code.csv"}
BUNDLED = {"azure-conv": "azure-conv-2023-full.csv.gz", "azure-code": "azure-code-2023-full.csv.gz"}
SHARED_DIR = Path(__file__).resolve().parents[3] / "shared" / "traces" / "azure-llm-inference-2023"
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
FILE_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
SYNTHETIC_CHUNK = 4096  # requests drawn per batch of random numbers
MAX_DURATION_S = 7 * 86_400.0  # a week of arrivals
MAX_RATE_PER_S = 10_000.0  # mean requests per second
# requests per replay: 17,301 requests of azure-conv took 60 s (3.5 ms each) on the 2-core dev
# machine, so this is about an hour of wall time
MAX_REQUESTS = 1_000_000
MAX_TOKENS = 10_000_000  # prompt or output tokens of one request
MAX_ARRIVAL_S = 1e9  # seconds after the first arrival (about 32 years)


@dataclass(frozen=True, slots=True)
class Request:
    """One request: when it arrives (s after the first) and its token counts."""

    rid: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class RequestSource:
    """A described, replayable stream of requests (iterate it to get them in order)."""

    name: str
    description: str
    native_rate_per_s: float | None  # recorded traces only
    rate_scale: float
    duration_s: float | None
    _arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # recorded: arrival_s, prompt, output
    _synthetic: dict | None = None

    def __iter__(self) -> Iterator[Request]:
        if self._synthetic is not None:
            yield from _synthetic_stream(**self._synthetic, duration_s=self.duration_s)
            return
        arrival, prompt, output = self._arrays
        limit = math.inf if self.duration_s is None else self.duration_s
        for rid in range(len(arrival)):
            t = float(arrival[rid]) / self.rate_scale
            if t >= limit:
                return
            yield Request(rid, t, int(prompt[rid]), int(output[rid]))

    @property
    def rate_per_s(self) -> float:
        """Nominal mean arrival rate of the stream (the Poisson rate, or native x scale);
        the offered rate of a replay is measured over its window (sim.serve.metrics)."""
        if self._synthetic is not None:
            return self._synthetic["rate_per_s"]
        return self.native_rate_per_s * self.rate_scale if self.native_rate_per_s else math.nan

    @property
    def window_s(self) -> float | None:
        """The arrival window replayed: ``duration_s`` if given, else None (the arrivals' span)."""
        return self.duration_s

    @property
    def span_s(self) -> float:
        """Simulated seconds over which requests arrive (for progress)."""
        if self.duration_s is not None:
            return self.duration_s
        return float(self._arrays[0][-1]) / self.rate_scale if self._arrays is not None else 0.0

    @property
    def expected_requests(self) -> float:
        """Requests in the window: counted for a recorded trace, rate x duration for synthetic."""
        if self._synthetic is not None:
            return self._synthetic["rate_per_s"] * self.duration_s
        arrival = self._arrays[0]
        if self.duration_s is None:
            return len(arrival)
        return int(np.searchsorted(arrival / self.rate_scale, self.duration_s, side="left"))


def open_source(requests: str, *, rate_scale: float | None = None, rate_per_s: float | None = None,
                duration_s: float | None = None, seed: int = 0, prompt_median: int = 1024,
                output_median: int = 256, sigma: float = 0.8) -> RequestSource:
    """The request source named ``requests`` (``azure-conv``, ``azure-code``, ``synthetic``
    or a file path), at the asked rate and duration."""
    _check_rates(rate_scale, rate_per_s, duration_s)
    if requests == "synthetic":
        if rate_scale is not None:
            raise ConfigError(COMMAND_LINE, "--rate-scale", "scales a recorded trace; give synthetic "
                              "arrivals a --rate")
        return _bounded(_synthetic_source(rate_per_s or 10.0, duration_s or 600.0, seed, prompt_median,
                                          output_median, sigma))
    return _bounded(_recorded_source(requests, rate_scale, rate_per_s, duration_s))


def named_at(err: ConfigError, requests: str, file: str, key: str) -> ConfigError:
    """``err`` from opening the request source ``requests``: a source that is not there said
    against ``file`` and ``key`` (where it was named); any other error (a bad request file names
    itself) as it is."""
    if err.file != requests or Path(requests).is_file():
        return err
    return ConfigError(file, key, err.expected, requests)


def _check_rates(rate_scale: float | None, rate_per_s: float | None, duration_s: float | None) -> None:
    """The command line's rate and duration: at most one of rate scale and rate, each finite,
    positive and within the limits."""
    if rate_scale is not None and rate_per_s is not None:
        raise ConfigError(COMMAND_LINE, "--rate-scale/--rate", "give at most one of them")
    for key, value in (("rate_scale", rate_scale), ("rate", rate_per_s), ("duration_s", duration_s)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ConfigError(COMMAND_LINE, key, "must be a finite number > 0", value)
    if duration_s is not None and duration_s > MAX_DURATION_S:
        raise ConfigError(COMMAND_LINE, "duration_s", f"must be at most {MAX_DURATION_S:,.0f} s (a week)",
                          duration_s)
    if rate_per_s is not None and rate_per_s > MAX_RATE_PER_S:
        raise ConfigError(COMMAND_LINE, "rate", f"must be at most {MAX_RATE_PER_S:,.0f} requests per second",
                          rate_per_s)


def _recorded_source(requests: str, rate_scale: float | None, rate_per_s: float | None,
                     duration_s: float | None) -> RequestSource:
    """A recorded trace (Azure or a request file) replayed at ``rate_scale`` x its native rate,
    or at the scale that gives ``rate_per_s``."""
    arrays, label = _recorded(requests)
    arrival = arrays[0]
    native = (len(arrival) - 1) / arrival[-1] if len(arrival) > 1 and arrival[-1] > 0 else None
    if rate_per_s is not None:
        if native is None:
            raise ConfigError(label, "arrival_s", "a --rate needs at least two distinct arrival times")
        rate_scale = rate_per_s / native
    scale = rate_scale or 1.0
    description = f"{label}: {len(arrival)} requests" + (f", native {native:.3g} req/s" if native else "") + (
        f", replayed at {scale:.4g}x" if scale != 1 else "")
    return RequestSource(requests, description, native, scale, duration_s, arrays)


def _bounded(source: RequestSource) -> RequestSource:
    """``source`` if its work is within the limits, else a ConfigError (before any replay)."""
    rate = source.rate_per_s
    if math.isfinite(rate) and rate > MAX_RATE_PER_S:
        raise ConfigError(COMMAND_LINE, "rate_scale", f"replays the trace at {rate:,.4g} requests per second; "
                          f"expected at most {MAX_RATE_PER_S:,.0f}", source.rate_scale)
    expected = source.expected_requests
    if expected > MAX_REQUESTS:
        raise ConfigError(COMMAND_LINE, "duration_s", f"the window holds about {expected:,.0f} requests; "
                          f"expected at most {MAX_REQUESTS:,} per replay (shorten --duration-s or lower the rate)",
                          source.duration_s)
    return source


# -- recorded traces ------------------------------------------------------------------------


def azure_path(name: str) -> Path:
    """Where the full-length Azure CSV of ``azure-conv`` / ``azure-code`` is found."""
    candidates = [traces_dir() / BUNDLED[name]]
    if os.environ.get("DECODESIM_AZURE_DIR"):
        candidates.append(Path(os.environ["DECODESIM_AZURE_DIR"]) / AZURE[name])
    candidates.append(SHARED_DIR / AZURE[name])
    for path in candidates:
        if path.is_file():
            return path
    raise ConfigError(name, None, "the Azure 2023 trace CSV was not found; looked in "
                      + ", ".join(str(p) for p in candidates) + " (set DECODESIM_AZURE_DIR)")


def _recorded(requests: str) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], str]:
    path = azure_path(requests) if requests in AZURE else Path(requests)
    if requests not in AZURE and not path.is_file():
        raise ConfigError(requests, None, "request source not found; expected azure-conv, azure-code, "
                          "synthetic or a request file (.jsonl, .csv, .parquet)")
    frame = _read_frame(path)
    if set(AZURE_COLUMNS) <= set(frame.columns):
        arrays = _azure_arrays(frame, path)
    else:
        arrays = _file_arrays(frame, path)
    return arrays, (f"{requests} ({path.name})" if requests in AZURE else str(path))


REQUEST_FILES = (".jsonl", ".csv", ".csv.gz", ".parquet")  # read by their names' endings


def _read_frame(path: Path):
    import pandas as pd

    if not path.name.endswith(REQUEST_FILES):  # its content would be guessed: say what is read instead
        raise ConfigError(str(path), None, f"a request file's name ends in {', '.join(REQUEST_FILES)} "
                          "(the ending says how it is read)")
    try:
        if path.suffix == ".jsonl":
            return _read_jsonl(path)
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        return pd.read_csv(path)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - any reader failure is bad input
        raise ConfigError(str(path), None, f"cannot read request file ({type(err).__name__}: {err})") from None


def _read_jsonl(path: Path):
    import pandas as pd

    rows = []
    for number, record in read_jsonl(path, "JSON Lines of requests"):
        if not isinstance(record, dict) or set(FILE_COLUMNS) - set(record):
            raise ConfigError(str(path), f"line {number}", 'expected {"arrival_s": S, "prompt_tokens": P, '
                              '"output_tokens": O}', record)
        rows.append([record[c] for c in FILE_COLUMNS])
    return pd.DataFrame(rows, columns=list(FILE_COLUMNS))


def _azure_arrays(frame, path: Path):
    import pandas as pd

    stamps = frame["TIMESTAMP"]
    times = pd.to_datetime(stamps.where(stamps.map(lambda v: isinstance(v, str))), format="mixed", errors="coerce")
    if times.isna().any():  # a cell that is no date and time: the first one named (its CSV line: row + 2)
        row = int(times.isna().to_numpy().nonzero()[0][0])
        raise ConfigError(str(path), f"TIMESTAMP (row {row + 1})", "expected a date and time such as "
                          "2023-11-16 18:15:46.6805900", stamps.astype(object).iloc[row])
    seconds = (times - times.min()).dt.total_seconds().to_numpy()
    return _checked(seconds, frame["ContextTokens"].to_numpy(), frame["GeneratedTokens"].to_numpy(), path,
                    ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))


def _file_arrays(frame, path: Path):
    missing = [c for c in FILE_COLUMNS if c not in frame.columns]
    if missing:
        raise ConfigError(str(path), missing[0], "required column is missing; a request file has the columns "
                          + ", ".join(FILE_COLUMNS) + " (or the Azure trace's " + ", ".join(AZURE_COLUMNS) + ")")
    arrival = frame["arrival_s"].to_numpy()
    return _checked(arrival, frame["prompt_tokens"].to_numpy(), frame["output_tokens"].to_numpy(), path,
                    FILE_COLUMNS, sorted_file=True)


def _not_a_number(value) -> bool:
    """A cell that is no number: a boolean, bytes, an empty cell, or text that does not read as one
    (a CSV column with one bad cell reaches here as text throughout, so that cell is the one to name)."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return True
        return False
    return isinstance(value, (bool, bytes)) or value is None


def _check_cells(raw: np.ndarray, name: str, path: Path) -> None:
    """Refuse a column holding anything but numbers, naming the first cell that is wrong (else
    the first number written as text)."""
    if raw.dtype != bool and raw.dtype.kind not in "OUS":
        return
    cells = raw.tolist()
    odd = ([(i, v) for i, v in enumerate(cells) if _not_a_number(v)]
           or [(i, v) for i, v in enumerate(cells) if isinstance(v, str)])
    if raw.dtype == bool or odd:
        row, got = odd[0] if odd else (0, bool(raw[0]))
        raise ConfigError(str(path), f"{name} (row {row + 1})", "must be numbers (not text, booleans or "
                          "empty cells)", got)


def _row(bad: np.ndarray) -> int:
    """The 1-based data row of the first True in ``bad``."""
    return int(np.argmax(bad)) + 1


def _checked(arrival, prompt, output, path: Path, names, sorted_file: bool = False
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validated arrays sorted by arrival (stable), arrivals relative to the first;
    ``sorted_file``: arrivals out of order are an error (request files), not re-sorted."""
    if len(arrival) == 0:
        raise ConfigError(str(path), None, "no requests")
    columns = []
    for name, values, kind in zip(names, (arrival, prompt, output), (float, int, int), strict=True):
        _check_cells(np.asarray(values), name, path)
        try:
            array = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            raise ConfigError(str(path), name, "must be numbers") from None
        if not np.isfinite(array).all():
            raise ConfigError(str(path), name, "must be finite numbers")
        if kind is int:
            bad = (array != np.round(array)) | (array < 1) | (array > MAX_TOKENS)
            if bad.any():
                raise ConfigError(str(path), f"{name} (row {_row(bad)})",
                                  f"token counts must be whole numbers in [1, {MAX_TOKENS:,}]", float(array[bad][0]))
            array = array.astype(np.int64)
        else:
            bad = (array < 0) | (array > MAX_ARRIVAL_S) | ((array != 0) & (np.abs(array) < np.finfo(np.float64).tiny))
            if bad.any():
                raise ConfigError(str(path), f"{name} (row {_row(bad)})",
                                  f"arrival times must be seconds in [0, {MAX_ARRIVAL_S:,.0f}]", float(array[bad][0]))
        columns.append(array)
    if sorted_file and len(columns[0]) > 1:
        back = np.diff(columns[0]) < 0
        if back.any():
            first = int(np.argmax(back)) + 1
            raise ConfigError(str(path), f"{names[0]} (row {first + 1})", "arrivals must be in non-decreasing "
                              f"order; row {first + 1} arrives before row {first}", float(columns[0][first]))
    order = np.argsort(columns[0], kind="stable")
    arrival = columns[0][order]
    return arrival - arrival[0], columns[1][order], columns[2][order]


# -- synthetic arrivals -----------------------------------------------------------------------


def _synthetic_source(rate_per_s, duration_s, seed, prompt_median, output_median, sigma) -> RequestSource:
    for key, value in (("prompt_median", prompt_median), ("output_median", output_median)):
        if value < 1:
            raise ConfigError(COMMAND_LINE, key, "must be >= 1", value)
    if sigma < 0:
        raise ConfigError(COMMAND_LINE, "sigma", "must be >= 0", sigma)
    params = dict(rate_per_s=rate_per_s, seed=seed, prompt_median=prompt_median, output_median=output_median,
                  sigma=sigma)
    description = (f"synthetic: Poisson {rate_per_s:g} req/s for {duration_s:g} s, log-normal prompt "
                   f"(median {prompt_median}) and output (median {output_median}), sigma {sigma:g}, seed {seed}")
    return RequestSource("synthetic", description, None, 1.0, duration_s, None, params)


def _synthetic_stream(rate_per_s, seed, prompt_median, output_median, sigma, duration_s) -> Iterator[Request]:
    rng = np.random.default_rng(seed)
    clock, rid, first = 0.0, 0, None
    while True:
        gaps = rng.exponential(1.0 / rate_per_s, SYNTHETIC_CHUNK)
        prompts = np.maximum(1, rng.lognormal(math.log(prompt_median), sigma, SYNTHETIC_CHUNK).astype(np.int64))
        outputs = np.maximum(1, rng.lognormal(math.log(output_median), sigma, SYNTHETIC_CHUNK).astype(np.int64))
        for gap, prompt, output in zip(gaps, prompts, outputs, strict=True):
            clock += float(gap)
            first = clock if first is None else first
            t = clock - first
            if duration_s is not None and t >= duration_s:
                return
            yield Request(rid, t, int(prompt), int(output))
            rid += 1


__all__ = ["Request", "RequestSource", "open_source", "azure_path"]
