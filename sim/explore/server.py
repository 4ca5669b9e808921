"""The explorer's HTTP server: the standard library's ``ThreadingHTTPServer`` on 127.0.0.1.

Routes (JSON in and out unless said):

* ``GET /``: the page (``page.html`` beside this module); ``GET /plotly.min.js``: the
  plotly package's bundled script. Nothing else is served: no route reads a path it is given.
* ``GET /api/options``: the bundled names the menus offer, and the CLI's defaults.
* ``POST /api/view`` ``{"a": form, "b": form | null}``: each configuration's ``decodesim run
  --json`` summary, its headline card (HTML) and the figures (breakdown, rooflines).
* ``POST /api/curves`` ``{"a": ..., "b": ..., "seq": n, "axis": "batch" | "context" | null}``:
  latency against batch and/or context; a later request (higher ``seq``) stops an earlier
  one between points.
* ``POST /api/export`` ``{"a": ..., "b": ..., "serve": job | null}``: the whole view as one
  self-contained HTML file (sim.explore.html), recomputed from the forms.
* ``POST /api/serve`` ``{"form": ...}``: start a serving sweep (one short replay per rate,
  in a background thread; a new one stops the old); ``GET /api/serve?job=ID``: its progress,
  rows and figures.

Bad input answers 400 with ``{"error": "decodesim: ..."}``, the CLI's line. Any other
failure answers 500 with one line, and the server goes on serving.
"""

from __future__ import annotations

import copy
import itertools
import json
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from sim.explore import html as export
from sim.explore import views
from sim.explore.views import FormError

HERE = Path(__file__).resolve().parent
MAX_BODY_BYTES = 256 * 1024
DEFAULT_PORT = 8765
AXES = ("batch", "context")


class _Jobs:
    """Serving sweeps in background threads; the newest one runs, earlier ones stop."""

    def __init__(self):
        self.lock = threading.Lock()
        self.jobs: dict[int, dict] = {}
        self.ids = itertools.count(1)

    def start(self, form: dict) -> dict:
        points, command = views.serve_points(form)
        with self.lock:
            for job in self.jobs.values():
                job["cancelled"] = True
            job_id = next(self.ids)
            job = {"id": job_id, "total": len(points), "rows": [], "finished": False, "error": None,
                   "cancelled": False, "command": command, "target_ms": points[0].target_ms}
            self.jobs = {k: v for k, v in self.jobs.items() if not v["finished"] or k > job_id - 4}
            self.jobs[job_id] = job
        threading.Thread(target=self._run, args=(job, points), daemon=True, name=f"serve-{job_id}").start()
        return self.status(job_id)

    def _run(self, job: dict, points) -> None:
        try:
            for point in points:
                if job["cancelled"]:
                    break
                row = views.serve_row(point)
                with self.lock:
                    job["rows"].append(row)
        except Exception as err:  # a bug in a replay: say so on the page, keep serving
            job["error"] = f"decodesim: internal error in the replay ({type(err).__name__}): {err}"
            _log(job["error"])
        finally:
            job["finished"] = True

    def status(self, job_id: int) -> dict:
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                raise FormError(f"decodesim: form: job: no serving job {job_id} (start one with Run replay)")
            rows = list(job["rows"])
            out = {k: job[k] for k in ("id", "total", "finished", "error", "cancelled", "command", "target_ms")}
        serving = {"rows": rows, "target_ms": out["target_ms"]}
        plots = export.serving_plots(serving)
        return {**out, "done": len(rows), "rows": rows, "plots": plots, "table": export.serving_table(rows)}


class Explorer:
    """The explorer's state: the serving jobs, the newest curves request, and the views and
    curves already computed (by argument list: a run is deterministic, so the same
    arguments give the same figures; ``CACHE_ENTRIES`` kept, oldest dropped first)."""

    CACHE_ENTRIES = 128

    def __init__(self):
        self.jobs = _Jobs()
        self.curves_seq = 0
        self.lock = threading.Lock()
        self.cache: dict[tuple, dict] = {}

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
        forms = _forms(body)
        found = [self._view(form, label) for label, form in forms]
        return {"views": found, "cards": [export.headline(v) for v in found], "plots": export.view_plots(found),
                "table": export.breakdown_table(found)}

    def curves(self, body: dict) -> dict:
        forms = _forms(body)
        axis = body.get("axis")
        if axis is not None and axis not in AXES:
            raise FormError(f"decodesim: form: axis: expected one of: {', '.join(AXES)}, got {str(axis)[:40]!r}")
        axes = AXES if axis is None else (axis,)
        seq = body.get("seq", 0)
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise FormError("decodesim: form: seq: expected a whole number")
        with self.lock:
            self.curves_seq = max(self.curves_seq, seq)

        def superseded() -> bool:
            return self.curves_seq > seq

        found = []
        for label, form in forms:
            curves = self._curves(form, superseded, axes)
            if curves.get("superseded"):
                return {"superseded": True}
            found.append(_curve_view(label, form, curves))
        plots = export.view_plots(found)
        return {"plots": {f"fig-{a}": plots[f"fig-{a}"] for a in axes}, "seq": seq}

    def export(self, body: dict) -> str:
        forms = _forms(body)  # checks body is an object
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


def _forms(body) -> list[tuple[str, dict]]:
    if not isinstance(body, dict) or "a" not in body:
        raise FormError("decodesim: form: expected {\"a\": {fields}, \"b\": {fields} or null}")
    out = [("A", body["a"])]
    if body.get("b") is not None:
        out.append(("B", body["b"]))
    return out


def _log(line: str) -> None:
    sys.stderr.write(line.replace("\n", " ") + "\n")
    sys.stderr.flush()


class Handler(BaseHTTPRequestHandler):
    """Routes of the explorer (see the module docstring)."""

    server_version = "decodesim-explore"
    explorer: Explorer  # set by make_server

    def log_message(self, format, *args):  # quiet: the terminal shows only failures
        return

    def _send(self, status: int, payload: bytes, kind: str, extra: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store" if kind.startswith("application/json") else "max-age=3600")
        self.send_header("X-Content-Type-Options", "nosniff")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _json(self, status: int, obj) -> None:
        self._send(status, json.dumps(obj, allow_nan=False).encode(), "application/json; charset=utf-8")

    def _guard(self, work) -> None:
        try:
            work()
        except FormError as err:
            self._json(400, {"error": str(err)})
        except (BrokenPipeError, ConnectionResetError):
            pass
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

    def _get(self):
        url = urlsplit(self.path)
        if url.path in ("/", "/index.html"):
            self._send(200, (HERE / "page.html").read_bytes(), "text/html; charset=utf-8")
        elif url.path == "/plotly.min.js":
            self._send(200, export.plotly_js().encode(), "text/javascript; charset=utf-8")
        elif url.path == "/api/options":
            self._json(200, views.options())
        elif url.path == "/api/serve":
            job = parse_qs(url.query).get("job", [""])[0]
            if not job.isdigit() or len(job) > 12:
                raise FormError(f"decodesim: form: job: expected a job number, got {job[:40]!r}")
            self._json(200, self.explorer.jobs.status(int(job)))
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
        routes = {"/api/view": self.explorer.view, "/api/curves": self.explorer.curves}
        if url.path in routes:
            self._json(200, routes[url.path](self._body()))
        elif url.path == "/api/export":
            page = self.explorer.export(self._body()).encode()
            self._send(200, page, "text/html; charset=utf-8",
                       {"Content-Disposition": "attachment; filename=\"decodesim-view.html\""})
        elif url.path == "/api/serve":
            body = self._body()
            if not isinstance(body, dict) or "form" not in body:
                raise FormError("decodesim: form: expected {\"form\": {fields}}")
            self._json(200, self.explorer.jobs.start(body["form"]))
        else:
            self._json(404, {"error": f"decodesim: no such route {url.path[:80]!r}"})


def make_server(port: int = DEFAULT_PORT, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """The explorer's server bound to ``host:port`` (port 0: any free port), not yet serving."""
    handler = type("ExplorerHandler", (Handler,), {"explorer": Explorer()})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


__all__ = ["make_server", "Explorer", "Handler", "DEFAULT_PORT"]
