"""The explorer's HTTP server: the standard library's ``http.server`` on 127.0.0.1, for its user only.

Routes (JSON in and out unless said):

* ``GET /``: the page (``page.html`` beside this module, with this session's token in a
  ``<meta>`` element); ``GET /plotly.min.js``: the plotly package's bundled script. Nothing
  else is served: no route reads a path it is given.
* ``GET /api/options``: the bundled names the menus offer (formats valid as weights and as
  KV apart), the CLI's defaults and a help line per field.
* ``POST /api/view`` ``{"setups": [form, ...]}`` (or the older ``{"a": form, "b": form | null}``):
  each setup's ``decodesim run --json`` summary, its headline card (HTML), the figures
  (breakdown, rooflines) and the tables shown, also as CSV.
* ``POST /api/curves`` ``{"setups": [...], "seq": n, "axis": "batch" | "context" | null}``:
  latency against batch and/or context; a later request (higher ``seq``) stops an earlier
  one between points, and none runs longer than ``CURVES_BUDGET_S``.
* ``POST /api/export`` ``{"setups": [...], "serve": job | null}``: the whole view as one
  self-contained HTML file (sim.explore.html), recomputed from the forms.
* ``POST /api/serve`` ``{"setups": [form, ...], "serving": {requests, duration_s, rates}}`` (or
  ``{"form": ...}``): start a serving sweep (one short replay per setup and rate, in a worker
  process, sim.explore.worker; a new one stops the old); ``GET /api/serve?job=ID``: its progress, rows, figures;
  ``POST /api/serve/cancel`` ``{"job": ID}``: stop it (the worker process is ended, so no
  replay goes on after the page cancels it).

* ``POST /api/search`` ``{"search": {model, hardware, ttft_ms, tpot_ms, rate, requests,
  duration_s, max_replays}}``: start ``decodesim search`` (sim.api.search, bounded: see
  sim.explore.views.search_options) in a worker process; ``GET /api/search?job=ID``: its
  front, chosen deployment and front plot; ``POST /api/search/cancel`` ``{"job": ID}`` ends it.

Who may drive it (a web page in the user's own browser must not): the ``Host`` header must
name a loopback host (``127.0.0.1``, ``localhost``, ``[::1]``, or one given with
``decodesim explore --allow-host NAME``) and the ``Origin`` header, where sent, that same
host at the server's port (this refuses cross-site requests and DNS rebinding); every
``/api/`` request must carry the session's token (``X-Decodesim-Token``), which only the
page served here holds.

Bounded work: one thread (``_Intake``) reads every connection's request without blocking,
so a client that connects and sends nothing, or sends slowly, holds no worker; a request
not complete within ``REQUEST_DEADLINE_S`` gets 408, a request line over
``MAX_LINE_BYTES`` 414, a head over ``MAX_HEAD_BYTES`` 431, a body over ``MAX_BODY_BYTES``
413, and past ``MAX_WORKERS`` running plus ``MAX_QUEUED`` waiting requests 503. Complete
requests run on ``MAX_WORKERS`` threads; a response that cannot be sent within
``SEND_TIMEOUT_S`` ends its connection.

Every status answers JSON ``{"error": "decodesim: ..."}`` (the page reads it): bad input 400
with the CLI's line, a refused header or token 403, another method 405, any other failure
500 with one line; the server goes on serving. A client that goes away mid-request is one
log line on stderr, never a traceback.
"""

from __future__ import annotations

import copy
import hmac
import io
import itertools
import json
import secrets
import selectors
import socket
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from sim.api import argv_of as api_argv
from sim.explore import figures
from sim.explore import html as export
from sim.explore import worker
from sim.explore import views
from sim.explore.views import FormError

HERE = Path(__file__).resolve().parent
DEFAULT_PORT = 8765
AXES = ("batch", "context")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
TOKEN_HEADER = "X-Decodesim-Token"
MAX_BODY_BYTES = 256 * 1024
MAX_LINE_BYTES = 8 * 1024
MAX_HEAD_BYTES = 16 * 1024
MAX_WORKERS = 8
MAX_QUEUED = 32
MAX_PENDING = 1024  # connections still sending their request; past it the oldest is closed
REQUEST_DEADLINE_S = 10.0
SEND_TIMEOUT_S = 30.0
CURVES_BUDGET_S = 60.0


def _log(line: str) -> None:
    sys.stderr.write(line.replace("\n", " ") + "\n")
    sys.stderr.flush()


def _error_body(text: str) -> bytes:
    return json.dumps({"error": " ".join(f"decodesim: {text}".split())[:500]}).encode()


# -- serving sweeps in a worker process ----------------------------------------------------------


def _end(job: dict) -> None:
    """Mark ``job`` cancelled and end its worker process (its work stops with it)."""
    job["cancelled"] = True
    proc = job.get("proc")
    if proc is not None and proc.poll() is None:
        proc.kill()


class _Jobs:
    """Serving sweeps: the newest one runs, in a worker process of its own
    (sim.explore.worker); cancelling a job, or starting a new one, ends that process, so no
    replay goes on after the page stops it."""

    KEEP = 4  # finished jobs kept for the page to read

    def __init__(self):
        self.lock = threading.Lock()
        self.jobs: dict[int, dict] = {}
        self.ids = itertools.count(1)

    def start(self, body: dict) -> dict:
        points, command = views.serve_job(body)
        with self.lock:
            for job in self.jobs.values():
                _end(job)
            job_id = next(self.ids)
            job = {"id": job_id, "total": len(points), "rows": [], "finished": False, "error": None,
                   "cancelled": False, "command": command, "target_ms": points[0][1].target_ms,
                   "labels": list(dict.fromkeys(label for label, _p in points)), "proc": worker.start()}
            self.jobs = {k: v for k, v in self.jobs.items() if not v["finished"] or k > job_id - self.KEEP}
            self.jobs[job_id] = job
        threading.Thread(target=self._run, args=(job, points), daemon=True, name=f"serve-{job_id}").start()
        return self.status(job_id)

    def cancel(self, job_id) -> dict:
        if not isinstance(job_id, int) or isinstance(job_id, bool):
            raise FormError("decodesim: form: job: expected a job number")
        with self.lock:
            if job_id in self.jobs:
                _end(self.jobs[job_id])
        return self.status(job_id)

    def _run(self, job: dict, points) -> None:
        proc = job["proc"]
        try:
            worker.send(proc, {"kind": "serve", "points": [p.model_dump_json() for _label, p in points]})
            labels = iter(label for label, _p in points)
            for row in worker.results(proc):
                if "error" in row and len(row) == 1:
                    job["error"] = row["error"]
                    break
                with self.lock:
                    job["rows"].append({"setup": next(labels), **row})
        except (OSError, ValueError) as err:  # the worker ended (cancelled) mid-line, or never started
            if not job["cancelled"]:
                job["error"] = f"decodesim: the replay's worker failed ({type(err).__name__}): {err}"
                _log(job["error"])
        finally:
            worker.stop(proc)
            job["finished"] = True

    def status(self, job_id: int) -> dict:
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                raise FormError(f"decodesim: form: job: no serving job {job_id} (start one with Run replay)")
            rows = list(job["rows"])
            out = {k: job[k] for k in ("id", "total", "finished", "error", "cancelled", "command", "target_ms",
                                       "labels")}
        serving = {"rows": rows, "target_ms": out["target_ms"]}
        return {**out, "done": len(rows), "rows": rows, "plots": export.serving_plots(serving),
                "table": export.serving_table(rows), "csv": export.serving_csv(rows)}


class _Searches:
    """Searches from the page (``decodesim search``, sim.api.search), one at a time, each in a
    worker process of its own that a cancel, or a new search, ends."""

    def __init__(self):
        self.lock = threading.Lock()
        self.jobs: dict[int, dict] = {}
        self.ids = itertools.count(1)

    def start(self, body) -> dict:
        if not isinstance(body, dict) or not isinstance(body.get("search"), dict):
            raise FormError("decodesim: form: expected {\"search\": {fields}}")
        options = views.search_options(body["search"])
        with self.lock:
            for job in self.jobs.values():
                _end(job)
            job_id = next(self.ids)
            job = {"id": job_id, "finished": False, "cancelled": False, "error": None, "result": None,
                   "started": time.monotonic(), "elapsed_s": 0.0, "proc": worker.start(),
                   "command": views.command_line("search", api_argv("search", options)[1:])}
            self.jobs = {k: v for k, v in self.jobs.items() if k > job_id - _Jobs.KEEP}
            self.jobs[job_id] = job
        threading.Thread(target=self._run, args=(job, options), daemon=True, name=f"search-{job_id}").start()
        return self.status(job_id)

    def _run(self, job: dict, options: dict) -> None:
        proc = job["proc"]
        try:
            worker.send(proc, {"kind": "search", "options": options})
            for result in worker.results(proc):
                job["error"] = result.get("error")
                job["result"] = None if job["error"] else result
        except (OSError, ValueError) as err:
            if not job["cancelled"]:
                job["error"] = f"decodesim: the search's worker failed ({type(err).__name__}): {err}"
                _log(job["error"])
        finally:
            worker.stop(proc)
            job["elapsed_s"] = time.monotonic() - job["started"]
            job["finished"] = True

    def cancel(self, body) -> dict:
        job_id = body.get("job") if isinstance(body, dict) else None
        if not isinstance(job_id, int) or isinstance(job_id, bool):
            raise FormError("decodesim: form: expected {\"job\": ID}")
        with self.lock:
            if job_id in self.jobs:
                _end(self.jobs[job_id])
        return self.status(job_id)

    def status(self, job_id: int) -> dict:
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                raise FormError(f"decodesim: form: job: no search {job_id} (start one with Search)")
            out = {k: job[k] for k in ("id", "finished", "cancelled", "error", "command")}
            out["elapsed_s"] = job["elapsed_s"] if job["finished"] else time.monotonic() - job["started"]
            result = job["result"]
        if result is not None:
            front = result.get("front") or []
            out.update(front=front, chosen=result.get("chosen"), counts=result.get("counts"),
                       plots={"fig-search": figures.search_front(front, result.get("chosen"))},
                       csv=export.records_csv(front))
        return out


# -- what the routes compute ---------------------------------------------------------------------


class Explorer:
    """The explorer's state: the serving jobs, the newest curves request, and the views and
    curves already computed (by argument list: a run is deterministic, so the same
    arguments give the same figures; ``CACHE_ENTRIES`` kept, oldest dropped first)."""

    CACHE_ENTRIES = 128

    def __init__(self):
        self.jobs = _Jobs()
        self.searches = _Searches()
        self.curves_seq = 0
        self.lock = threading.Lock()
        self.cache: dict[tuple, dict] = {}
        self.curves_budget_s = CURVES_BUDGET_S

    def _cached(self, kind: str, form, label: str, make) -> dict:
        argv = tuple(views.run_argv(form))  # checks the form first
        key = (kind, views.label_of(form, label), argv)
        with self.lock:
            hit = self.cache.get(key)
        if hit is not None:
            return copy.deepcopy(hit)
        value = make()
        if not value.get("superseded"):
            with self.lock:
                self.cache[key] = copy.deepcopy(value)
                while len(self.cache) > self.CACHE_ENTRIES:
                    self.cache.pop(next(iter(self.cache)))
        return value

    def _view(self, form, label: str) -> dict:
        return self._cached("view", form, label, lambda: views.config_view(form, label))

    def _curves(self, form, superseded=lambda: False, axes=AXES) -> dict:
        out: dict = {}
        for axis in axes:
            one = self._cached(f"curves-{axis}", form, "", lambda a=axis: views.curves_of(form, superseded, (a,)))
            if one.get("superseded"):
                return one
            out.update(one)
        return out

    def view(self, body: dict) -> dict:
        forms = views.setups_of(body)
        found = [self._view(form, label) for label, form in forms]
        return {"views": found, "cards": [export.headline(v) for v in found], "plots": export.view_plots(found),
                "table": export.summary_table(found) + export.breakdown_table(found),
                "csv": {"summary": export.summary_csv(found), "breakdown": export.breakdown_csv(found)}}

    def curves(self, body: dict) -> dict:
        forms = views.setups_of(body)
        axis = body.get("axis")
        if axis is not None and axis not in AXES:
            raise FormError(f"decodesim: form: axis: expected one of: {', '.join(AXES)}, got {str(axis)[:40]!r}")
        axes = AXES if axis is None else (axis,)
        seq = body.get("seq", 0)
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise FormError("decodesim: form: seq: expected a whole number")
        with self.lock:
            self.curves_seq = max(self.curves_seq, seq)
        deadline = time.monotonic() + self.curves_budget_s

        def superseded() -> bool:
            return self.curves_seq > seq or time.monotonic() > deadline

        found = []
        for label, form in forms:
            curves = self._curves(form, superseded, axes)
            if curves.get("superseded"):
                if self.curves_seq > seq:
                    return {"superseded": True}
                raise FormError(f"decodesim: curves: stopped after {self.curves_budget_s:g} s (the explorer bounds "
                                f"each request); run `decodesim run --batch B` for single points")
            found.append(_curve_view(label, form, curves))
        plots = export.view_plots(found)
        return {"plots": {f"fig-{a}": plots[f"fig-{a}"] for a in axes}, "seq": seq}

    def export(self, body: dict) -> str:
        forms = views.setups_of(body)
        found = [self._view(form, label) for label, form in forms]
        for view, (_label, form) in zip(found, forms, strict=True):
            view["curves"] = self._curves(form)
        serving = None
        job_id = body.get("serve")
        if job_id is not None:
            if not isinstance(job_id, int) or isinstance(job_id, bool):
                raise FormError("decodesim: form: serve: expected a job number")
            serving = self.jobs.status(job_id)
        return export.view_document(found, serving, title="decodesim: " + " vs ".join(
            f"{v['label']} = {v['summary']['model']} on {v['summary']['hardware']}" for v in found))


def _curve_view(label: str, form: dict, curves: dict) -> dict:
    spec = views.spec_of(views.run_argv(form))
    return {"label": views.label_of(form, label), "summary": {"target_ms": spec.target_ms}, "curves": curves}


# -- reading requests without a thread each ------------------------------------------------------


def _reply_raw(sock: socket.socket, status: int, reason: str, text: str) -> None:
    """A JSON error answer sent straight on a socket (from the intake, before any handler)."""
    body = _error_body(text)
    head = (f"HTTP/1.0 {status} {reason}\r\nContent-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n").encode()
    try:
        sock.send(head + body)  # small: fits the socket's buffer; a client that does not read loses it
    except OSError:
        pass


def _content_length(head: bytes) -> int | None:
    """The Content-Length of a request head (0 when absent; None when not a number)."""
    for line in head.split(b"\n")[1:]:
        name, _sep, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            value = value.strip()
            return int(value) if value.isdigit() and len(value) < 20 else None
    return 0


class _Pending:
    """A connection whose request is still arriving."""

    __slots__ = ("addr", "data", "deadline", "closing")

    def __init__(self, addr, deadline: float):
        self.addr, self.data, self.deadline, self.closing = addr, bytearray(), deadline, False


class _Intake:
    """One thread that reads every connection's request without blocking (a selector), so
    idle and slow clients hold no worker thread. A complete request goes to the server's
    workers; a refused one gets its JSON error here, is half-closed, and what the client
    still sends is read and dropped for a moment (so the answer is not lost to a reset)."""

    LINGER_S = 2.0

    def __init__(self, server: ExplorerServer):
        self.server = server
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        self.lock = threading.Lock()
        self.arrived: list = []
        self.pending: dict[socket.socket, _Pending] = {}
        self.stopped = False
        self.thread = threading.Thread(target=self._loop, daemon=True, name="explore-intake")
        self.thread.start()

    def add(self, sock: socket.socket, addr) -> None:
        with self.lock:
            self.arrived.append((sock, addr))
        self._wake()

    def _wake(self) -> None:
        try:
            self.wake_w.send(b"x")
        except OSError:  # the wake-up pipe is full: the loop is awake anyway
            pass

    def stop(self) -> None:
        self.stopped = True
        self._wake()
        self.thread.join(timeout=5)
        for sock in list(self.pending):
            self._drop(sock)
        self.selector.close()
        self.wake_r.close()
        self.wake_w.close()

    def _loop(self) -> None:
        while not self.stopped:
            for key, _mask in self.selector.select(timeout=0.25):
                if key.fileobj is self.wake_r:
                    try:
                        self.wake_r.recv(4096)
                    except OSError:
                        pass
                else:
                    self._read(key.fileobj)
            self._admit()
            self._expire()

    def _admit(self) -> None:
        with self.lock:
            arrived, self.arrived = self.arrived, []
        for sock, addr in arrived:
            sock.setblocking(False)
            self.pending[sock] = _Pending(addr, time.monotonic() + self.server.request_deadline_s)
            self.selector.register(sock, selectors.EVENT_READ)
        while len(self.pending) > MAX_PENDING:  # the oldest waiting connection goes first
            oldest = next(iter(self.pending))
            _reply_raw(oldest, 503, "Service Unavailable", "too many connections waiting; try again")
            self._drop(oldest)

    def _expire(self) -> None:
        now = time.monotonic()
        late = [s for s, p in self.pending.items() if p.deadline < now]
        silent = 0
        for sock in late:
            pending = self.pending[sock]
            if not pending.closing:
                _reply_raw(sock, 408, "Request Timeout",
                           f"no complete request within {self.server.request_deadline_s:g} s")
                silent += not pending.data
                if pending.data:
                    _log(f"decodesim explore: {_peer(pending.addr)} sent no complete request within "
                         f"{self.server.request_deadline_s:g} s; closed")
            self._drop(sock)
        if silent:
            _log(f"decodesim explore: closed {silent} connection(s) that sent nothing within "
                 f"{self.server.request_deadline_s:g} s")

    def _drop(self, sock: socket.socket) -> None:
        self.pending.pop(sock, None)
        try:
            self.selector.unregister(sock)
        except (KeyError, ValueError):
            pass
        try:
            sock.close()
        except OSError:
            pass

    def _read(self, sock: socket.socket) -> None:
        pending = self.pending.get(sock)
        if pending is None:
            return
        try:
            chunk = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:  # the client went away (or finished sending after a refusal)
            self._drop(sock)
            return
        if pending.closing:
            return  # a refused request's rest: read and dropped
        pending.data += chunk
        self._check(sock, pending)

    def _refuse(self, sock: socket.socket, pending: _Pending, status: int, reason: str, text: str) -> None:
        _reply_raw(sock, status, reason, text)
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        pending.closing = True
        pending.data = bytearray()
        pending.deadline = time.monotonic() + self.LINGER_S

    def _check(self, sock: socket.socket, pending: _Pending) -> None:
        data = pending.data
        line_end = data.find(b"\n")
        if (line_end < 0 and len(data) > MAX_LINE_BYTES) or line_end > MAX_LINE_BYTES:
            self._refuse(sock, pending, 414, "URI Too Long", f"request line longer than {MAX_LINE_BYTES} bytes")
            return
        end = data.find(b"\r\n\r\n")
        end = end + 4 if end >= 0 else (data.find(b"\n\n") + 2 if data.find(b"\n\n") >= 0 else -1)
        if end < 0:
            if len(data) > MAX_HEAD_BYTES:
                self._refuse(sock, pending, 431, "Request Header Fields Too Large",
                             f"request head longer than {MAX_HEAD_BYTES} bytes")
            return
        length = _content_length(bytes(data[:end]))
        if length is not None and length > MAX_BODY_BYTES:
            self._refuse(sock, pending, 413, "Content Too Large",
                         f"form: expected a JSON body of at most {MAX_BODY_BYTES} bytes, got {length}")
            return
        if len(data) < end + (length or 0):
            return
        self.pending.pop(sock)
        self.selector.unregister(sock)
        if not self.server.dispatch(sock, pending.addr, bytes(data[:end + (length or 0)])):
            _reply_raw(sock, 503, "Service Unavailable", "the explorer is busy; try again in a moment")
            sock.close()


def _peer(addr) -> str:
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else str(addr)


# -- the server and its handler ------------------------------------------------------------------


class ExplorerServer(HTTPServer):
    """``HTTPServer`` whose connections are read by an ``_Intake`` and answered by at most
    ``MAX_WORKERS`` threads; ``token`` is this session's, ``hosts`` the names the ``Host``
    and ``Origin`` headers may give."""

    request_queue_size = 128
    daemon_threads = True

    def __init__(self, address, handler, allow_hosts=()):
        super().__init__(address, handler)
        self.token = secrets.token_urlsafe(24)
        self.hosts = frozenset(LOOPBACK_HOSTS) | {h.lower() for h in allow_hosts}
        self.request_deadline_s = REQUEST_DEADLINE_S
        self.workers = ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="explore-worker")
        self.busy = 0
        self.busy_lock = threading.Lock()
        self.buffers: dict[socket.socket, bytes] = {}
        self.intake = _Intake(self)

    def process_request(self, request, client_address):
        self.intake.add(request, client_address)

    def dispatch(self, sock: socket.socket, addr, data: bytes) -> bool:
        """Give a complete request to a worker; False when ``MAX_WORKERS + MAX_QUEUED`` are taken."""
        with self.busy_lock:
            if self.busy >= MAX_WORKERS + MAX_QUEUED:
                return False
            self.busy += 1
        self.buffers[sock] = data
        self.workers.submit(self._answer, sock, addr)
        return True

    def _answer(self, sock: socket.socket, addr) -> None:
        try:
            sock.setblocking(True)
            self.finish_request(sock, addr)
        except Exception:
            self.handle_error(sock, addr)
        finally:
            self.buffers.pop(sock, None)
            self.shutdown_request(sock)
            with self.busy_lock:
                self.busy -= 1

    def take_buffer(self, sock: socket.socket) -> bytes:
        return self.buffers.pop(sock, b"")

    def handle_error(self, request, client_address):
        """One line on stderr, never a traceback: a client that went away, or our bug."""
        err = sys.exc_info()[1]
        if isinstance(err, (ConnectionError, TimeoutError, OSError)):
            _log(f"decodesim explore: {_peer(client_address)} went away mid-request ({type(err).__name__})")
        else:
            _log(f"decodesim explore: internal error answering {_peer(client_address)} ({type(err).__name__}): {err}")

    def server_close(self):
        super().server_close()
        self.intake.stop()
        self.workers.shutdown(wait=False, cancel_futures=True)
        explorer = self.RequestHandlerClass.explorer
        for jobs in (explorer.jobs, explorer.searches):
            with jobs.lock:
                for job in jobs.jobs.values():
                    _end(job)  # their worker processes end


class Handler(BaseHTTPRequestHandler):
    """Routes of the explorer (see the module docstring)."""

    server_version = "decodesim-explore"
    default_request_version = "HTTP/1.0"  # every answer has its status line and headers, even to garbage
    timeout = SEND_TIMEOUT_S  # the socket's timeout while the answer is sent
    explorer: Explorer  # set by make_server
    server: ExplorerServer

    def setup(self):
        super().setup()
        self.rfile = io.BytesIO(self.server.take_buffer(self.request))  # read whole by the intake

    def log_message(self, format, *args):  # quiet: the terminal shows only failures
        return

    def _send(self, status: int, payload: bytes, kind: str, extra: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store" if kind.startswith("application/json") or
                         kind.startswith("text/html") else "max-age=3600")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "no-referrer")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _json(self, status: int, obj, extra: dict | None = None) -> None:
        self._send(status, json.dumps(obj, allow_nan=False).encode(), "application/json; charset=utf-8", extra)

    def send_error(self, code, message=None, explain=None):
        """Every error the standard library answers (bad request line, 414, 501, ...) as JSON."""
        self.close_connection = True
        text = message or self.responses.get(code, ("error",))[0]
        try:
            self._send(code, _error_body(f"{code} {text}"), "application/json; charset=utf-8")
        except OSError:
            pass

    def parse_request(self):
        if not super().parse_request():
            return False
        refusal = self._refusal()
        if refusal:
            self.close_connection = True
            self._send(403, _error_body(refusal), "application/json; charset=utf-8")
            return False
        return True

    def _refusal(self) -> str | None:
        """Why this request may not drive the explorer, or None (see the module docstring)."""
        hosts, port = self.server.hosts, self.server.server_address[1]
        host = (self.headers.get("Host") or "").strip().lower()
        name, _sep, given_port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
        if not _sep:
            name, given_port = host, ""
        if name not in hosts or (given_port and given_port != str(port)):
            return (f"Host: expected one of {', '.join(sorted(hosts))} at port {port} (the explorer answers its "
                    f"own machine only; decodesim explore --allow-host NAME adds a name), got {host[:80]!r}")
        origin = self.headers.get("Origin")
        if origin is not None and origin.strip().lower() not in {f"http://{h}:{port}" for h in hosts}:
            return (f"Origin: expected the explorer's own page (http://127.0.0.1:{port}), got {origin[:80]!r}; "
                    f"other sites may not drive it")
        if urlsplit(self.path).path.startswith("/api/"):
            given = self.headers.get(TOKEN_HEADER) or ""
            if not hmac.compare_digest(given.encode("utf-8", "replace"), self.server.token.encode()):
                return (f"{TOKEN_HEADER}: missing or wrong; the API answers the page this server sent "
                        f"(reload http://127.0.0.1:{port}/)")
        return None

    def _guard(self, work) -> None:
        try:
            work()
        except FormError as err:
            self._json(400, {"error": str(err)})
        except (ConnectionError, TimeoutError) as err:
            _log(f"decodesim explore: {_peer(self.client_address)} went away mid-request ({type(err).__name__})")
            self.close_connection = True
        except Exception as err:
            line = f"decodesim: internal error ({type(err).__name__}): {err}"
            where = traceback.extract_tb(err.__traceback__)[-1]
            _log(f"{line} [{Path(where.filename).name}:{where.lineno}]")
            self._json(500, {"error": " ".join(line.split())[:500]})

    def do_GET(self):
        self._guard(self._get)

    def do_HEAD(self):
        self._guard(self._get)

    def do_POST(self):
        self._guard(self._post)

    def _not_allowed(self):
        self.close_connection = True
        self._json(405, {"error": f"decodesim: 405 method {self.command} not allowed; the explorer answers GET, "
                                  f"HEAD and POST"}, {"Allow": "GET, HEAD, POST"})

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _not_allowed

    def _get(self):
        url = urlsplit(self.path)
        if url.path in ("/", "/index.html"):
            page = (HERE / "page.html").read_text(encoding="utf-8").replace(
                "__DECODESIM_TOKEN__", self.server.token).replace("__PLOTLY_CONFIG__", json.dumps(export.PLOTLY_CONFIG))
            self._send(200, page.encode(), "text/html; charset=utf-8",
                       {"Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline'; "
                                                   "style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
                                                   "connect-src 'self'; frame-ancestors 'none'"})
        elif url.path == "/plotly.min.js":
            self._send(200, export.plotly_js().encode(), "text/javascript; charset=utf-8")
        elif url.path == "/api/options":
            self._json(200, views.options())
        elif url.path in ("/api/serve", "/api/search"):
            job = parse_qs(url.query).get("job", [""])[0]
            if not job.isdigit() or len(job) > 12:
                raise FormError(f"decodesim: form: job: expected a job number, got {job[:40]!r}")
            jobs = self.explorer.jobs if url.path == "/api/serve" else self.explorer.searches
            self._json(200, jobs.status(int(job)))
        else:
            self._json(404, {"error": f"decodesim: no such page {url.path[:80]!r}"})

    def _body(self):
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            raise FormError(f"decodesim: form: expected a JSON body of at most {MAX_BODY_BYTES} bytes")
        raw = self.rfile.read(length)
        try:
            return json.loads(raw.decode("utf-8") or "null")
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise FormError("decodesim: form: expected a JSON object") from None

    def _post(self):
        url = urlsplit(self.path)
        routes = {"/api/view": self.explorer.view, "/api/curves": self.explorer.curves,
                  "/api/serve": self.explorer.jobs.start, "/api/serve/cancel": self._cancel,
                  "/api/search": self.explorer.searches.start, "/api/search/cancel": self.explorer.searches.cancel}
        if url.path in routes:
            self._json(200, routes[url.path](self._body()))
        elif url.path == "/api/export":
            page = self.explorer.export(self._body()).encode()
            self._send(200, page, "text/html; charset=utf-8",
                       {"Content-Disposition": "attachment; filename=\"decodesim-view.html\""})
        else:
            self._json(404, {"error": f"decodesim: no such route {url.path[:80]!r}"})

    def _cancel(self, body) -> dict:
        if not isinstance(body, dict) or "job" not in body:
            raise FormError("decodesim: form: expected {\"job\": ID}")
        return self.explorer.jobs.cancel(body["job"])


def make_server(port: int = DEFAULT_PORT, host: str = "127.0.0.1", allow_hosts=()) -> ExplorerServer:
    """The explorer's server bound to ``host:port`` (port 0: any free port), not yet serving;
    ``allow_hosts`` adds names the ``Host`` and ``Origin`` headers may give."""
    handler = type("ExplorerHandler", (Handler,), {"explorer": Explorer()})
    return ExplorerServer((host, port), handler, allow_hosts)


__all__ = ["make_server", "Explorer", "ExplorerServer", "Handler", "DEFAULT_PORT", "TOKEN_HEADER", "MAX_BODY_BYTES"]
