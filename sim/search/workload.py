"""The traffic the search screens against: request-length statistics of a request source.

The screen (sim.search.screen) needs the mean prompt and output lengths (they set the mix of
prefill and decode tokens in a steady-state step), the ``percentile`` prompt (time to first
token) and the longest request (every request must fit the KV pool alone, or the replay
rejects it), the 10th percentile output (the TPOT tail) and, for the record, how variable
output lengths and arrival gaps are. ``replay_window`` / ``window_requests`` give the
requests a finalist's replay sees, which the screen's TTFT queue also uses. They are read from the same source the finalists replay
(sim.serve.requests.open_source): at ``rate`` over ``duration_s`` when a rate is given,
else the whole source (a recorded trace) or ``duration_s`` of it (synthetic arrivals).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np

from sim.errors import ConfigError
from sim.serve.requests import open_source
from sim.units import MS_PER_S

MAX_REQUESTS = 200_000  # requests read for the statistics


@dataclass(frozen=True)
class Workload:
    """Request-length statistics (tokens) and the native rate of the source."""

    requests: str
    description: str
    count: int
    prompt_mean: float
    output_mean: float
    prompt_pct: float  # the SLO percentile of the prompt length
    longest: int  # max(prompt + output - 1): tokens cached at a request's last step
    rate_per_s: float | None  # the source's mean arrival rate
    output_low: float = 2.0  # the 10th percentile output length (the shortest requests set the TPOT tail)
    output_cv2: float = 1.0  # squared coefficient of variation of output lengths (decode durations)
    arrival_cv2: float = 1.0  # ... of the gaps between arrivals (1 for Poisson arrivals)

    @property
    def decode_context(self) -> int:
        """Mean cache length of a decoding sequence: its prompt plus half its output."""
        return max(1, round(self.prompt_mean + self.output_mean / 2))

    @property
    def prefill_per_decode(self) -> float:
        """Prompt tokens computed per output token in a steady state."""
        return self.prompt_mean / self.output_mean

    def as_dict(self) -> dict:
        return {**asdict(self), "decode_context": self.decode_context}


def workload(requests: str, rate: float | None, duration_s: float, percentile: int, seed: int = 0) -> Workload:
    """The statistics of ``requests`` (ConfigError for a bad source)."""
    recorded = requests != "synthetic"
    source = open_source(requests, rate_per_s=rate, duration_s=None if (recorded and rate is None) else duration_s,
                         seed=seed)
    prompt, output, arrival = [], [], []
    for request in source:
        prompt.append(request.prompt_tokens)
        output.append(request.output_tokens)
        arrival.append(request.arrival_s)
        if len(prompt) >= MAX_REQUESTS:
            break
    if not prompt:
        raise ConfigError(requests, "requests", f"no request arrives within {duration_s:g} s at this rate")
    p, o = np.asarray(prompt, dtype=np.int64), np.asarray(output, dtype=np.int64)
    rate_per_s = source.rate_per_s if source.rate_per_s and math.isfinite(source.rate_per_s) else None
    gaps = np.diff(np.asarray(arrival, dtype=np.float64))
    arrival_cv2 = float(gaps.var() / gaps.mean() ** 2) if len(gaps) > 1 and gaps.mean() > 0 else 1.0
    return Workload(requests, source.description, len(p), float(p.mean()), float(max(1.0, o.mean())),
                    float(np.percentile(p, percentile)), int((p + o - 1).max()), rate_per_s,
                    float(max(2.0, np.percentile(o, 10))),
                    float(o.var() / o.mean() ** 2) if o.mean() > 0 else 1.0, arrival_cv2)




def replay_window(traffic: dict, rate: float, work: Workload, tpot_ms: float) -> dict:
    """How a finalist's replay draws its arrivals: ``n`` requests, enough for
    ``replay_lifetimes`` mean request lifetimes (mean output x TPOT: the batch takes about one
    lifetime to build up, so most of the replay is in the steady state) and at least
    ``replay_requests``, arriving over at most ``duration_s``. A recorded trace is time-scaled
    so that its first ``n`` requests arrive at ``rate`` on average (the Azure traces start 2-3x
    sparser than their hour-long mean); synthetic arrivals are Poisson at ``rate``. Returns
    the ServeSpec fields (``rate`` or ``rate_scale``, ``duration_s``)."""
    seconds = max(traffic["replay_lifetimes"] * work.output_mean * tpot_ms / MS_PER_S,
                  traffic["replay_requests"] / rate)
    seconds = min(traffic["duration_s"], seconds)
    if traffic["requests"] == "synthetic":
        return {"rate": rate, "duration_s": seconds}
    arrivals = native_trace(traffic["requests"])[0]
    n = max(2, min(len(arrivals), math.ceil(seconds * rate) + 1))
    span = float(arrivals[n - 1] - arrivals[0])
    if span <= 0:
        return {"rate": rate, "duration_s": seconds}
    scale = rate * span / (n - 1)
    return {"rate_scale": scale, "duration_s": span / scale * (1 + 1e-9) + 1e-9}


def window_requests(traffic: dict, window: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival s, prompt tokens, output tokens) of the requests a replay with ``window``
    (from ``replay_window``) sees, as the replay's source yields them."""
    if "rate_scale" in window:
        arrivals, prompt, output = native_trace(traffic["requests"])
        t = arrivals / window["rate_scale"]
        keep = t < window["duration_s"]
        return t[keep], prompt[keep], output[keep]
    source = open_source(traffic["requests"], rate_per_s=window["rate"], duration_s=window["duration_s"],
                         seed=traffic["seed"])
    rows = [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in source]
    data = np.asarray(rows, dtype=np.float64).reshape(-1, 3)
    return data[:, 0], data[:, 1].astype(np.int64), data[:, 2].astype(np.int64)


@lru_cache(maxsize=4)
def native_trace(requests: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A recorded source's arrivals (s after the first), prompt and output tokens, unscaled."""
    rows = [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in open_source(requests)]
    data = np.asarray(rows, dtype=np.float64).reshape(-1, 3)
    return data[:, 0], data[:, 1].astype(np.int64), data[:, 2].astype(np.int64)


__all__ = ["Workload", "native_trace", "replay_window", "window_requests", "workload"]
