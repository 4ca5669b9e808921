"""Who sends the requests, and when: the benchmark client modes of the serving replay.

A client turns a request source (sim.serve.requests) into arrivals at the server, in
integer nanoseconds after the replay's start (the first request of a source arrives at 0):

* ``open-loop`` (the default): each request arrives at its timestamp (a recorded trace, or
  Poisson arrivals), whatever the server does, as vLLM's ``benchmark_serving`` sends them at
  ``--request-rate``. ``concurrency`` N, if given, caps the requests in flight (vLLM's
  ``--max-concurrency``): a request is sent at its timestamp or, if N are in flight then,
  when the first of them finishes.
* ``closed-loop``: N requests in flight at all times (``concurrency`` N, required): the first
  N are sent at 0 and each finish sends the next, whatever their timestamps say (vLLM's
  benchmark at ``--request-rate inf --max-concurrency N``; the source's order and lengths are
  kept).
* ``offline``: every request at 0 (vLLM's offline throughput benchmark, MLPerf's Offline
  scenario); the server's limits decide how many run at once.

A request the server rejects (it can never fit) counts as finished at its arrival, so a
closed loop never stalls. Names are declared once, in ``CLIENTS``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import TYPE_CHECKING

from sim.errors import COMMAND_LINE, ConfigError
from sim.units import s_to_ns

if TYPE_CHECKING:  # the sources (numpy, pandas) stay out of the command line's start
    from sim.serve.requests import Request

CLIENTS = ("open-loop", "closed-loop", "offline")


class Client:
    """Arrivals of ``source`` under one client mode (module docstring)."""

    def __init__(self, source: Iterable[Request], mode: str = "open-loop", concurrency: int | None = None):
        if mode not in CLIENTS:
            raise ConfigError(COMMAND_LINE, "client", f"expected one of {', '.join(CLIENTS)}", mode)
        if mode == "closed-loop" and concurrency is None:
            raise ConfigError(COMMAND_LINE, "concurrency", "a closed-loop client needs --concurrency N", None)
        if mode == "offline" and concurrency is not None:
            raise ConfigError(COMMAND_LINE, "concurrency", "does not apply to an offline client (every request "
                              "is sent at 0)", concurrency)
        if concurrency is not None and concurrency < 1:
            raise ConfigError(COMMAND_LINE, "concurrency", "must be >= 1", concurrency)
        self.mode = mode
        self._timestamps = mode == "open-loop"
        self._it = iter(source)
        self._pending = next(self._it, None)
        self._free: list[int] | None = [0] * concurrency if concurrency else None  # when each slot frees (a heap)

    @property
    def exhausted(self) -> bool:
        """No request is left to send."""
        return self._pending is None

    def next_ns(self) -> int | None:
        """When the next request will be sent, or None (none left, or every slot busy)."""
        if self._pending is None:
            return None
        t = round(s_to_ns(self._pending.arrival_s)) if self._timestamps else 0
        if self._free is not None:
            if not self._free:
                return None
            t = max(t, self._free[0])
        return t

    def pop(self) -> tuple[int, Request]:
        """The next request and its send time (call after ``next_ns`` said one is due)."""
        t = self.next_ns()
        if t is None:
            raise RuntimeError("no request is due")
        if self._free is not None:
            heapq.heappop(self._free)
        request, self._pending = self._pending, next(self._it, None)
        return t, request

    def finished(self, t_ns: int) -> None:
        """A request left the server at ``t_ns``: its slot frees."""
        if self._free is not None:
            heapq.heappush(self._free, t_ns)


__all__ = ["CLIENTS", "Client"]
