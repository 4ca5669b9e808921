"""The explorer's worker process: ``python -m sim.explore.worker`` runs one task read from stdin
and writes its results to stdout, one JSON line each, so the server can end the work at once
by ending the process (a cancelled replay or search keeps no core busy).

Tasks (one JSON object on stdin):

* ``{"kind": "serve", "points": [ServeSpec JSON, ...]}``: one line per point, the row
  ``decodesim serve --rates`` tabulates (sim.serve.sweep.run_point).
* ``{"kind": "search", "options": {...}}``: one line, ``decodesim search --json``
  (sim.explore.views.search_run: sim.api.search with the checked options).

A failure is a line ``{"error": "decodesim: ..."}``, never a traceback; the task's own
prints go to stderr, so stdout carries results only. The process is started with a fresh
interpreter (no fork of the server's threads, no re-import of the server's main module).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

from sim.explore.compute import plain
from sim.explore.views import search_run
from sim.serve.sweep import run_point

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding sim/


def start() -> subprocess.Popen:
    """A worker process (``python -m sim.explore.worker``), reading its task from a pipe."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT),
                                                                       os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-m", "sim.explore.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=PACKAGE_ROOT)


def send(proc: subprocess.Popen, task: dict) -> None:
    """Give the worker its task (one JSON object; the pipe is then closed)."""
    proc.stdin.write(json.dumps(task).encode())
    proc.stdin.close()


def results(proc: subprocess.Popen):
    """The worker's result lines as dicts, until it ends (or is ended)."""
    for line in proc.stdout:
        yield json.loads(line)
    proc.wait()


def stop(proc: subprocess.Popen) -> None:
    """End the worker now (its work stops with it) and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None and not pipe.closed:
            pipe.close()


def _run(task: dict, emit) -> None:
    if task.get("kind") == "serve":
        for point in task["points"]:
            emit(plain(run_point(point)))
    elif task.get("kind") == "search":
        emit(search_run(task["options"]))
    else:
        emit({"error": f"decodesim: worker: unknown task {str(task.get('kind'))[:40]!r}"})


def main() -> int:
    out = sys.stdout

    def emit(obj: dict) -> None:
        out.write(json.dumps(obj, allow_nan=False) + "\n")
        out.flush()

    try:
        task = json.loads(sys.stdin.read())
        with redirect_stdout(sys.stderr):
            _run(task, emit)
    except Exception as err:  # say it as a result line: the server shows it on the page
        emit({"error": f"decodesim: internal error in the worker ({type(err).__name__}): {err}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
