"""I/O failures on every command (issue 43): a full disk, a closed pipe, a name too long, a
dangling symbolic link, a second writer to one folder, Ctrl-C during ``run --out``. Each is one
line on stderr naming the file (or standard output) and exit status 2 (130 for an interrupt),
never a traceback, and nothing partial left looking complete.

The few cases that need a real process (stdout on /dev/full, a pipe its reader closed, a signal)
run as subprocesses; the rest run the CLI in this process. No assertion is about time: the
subprocess timeouts only bound a hang.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

HANG_S = 120  # a hang bound only
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
QUICK = ["--steps", "1", "--engine", "analytic"]


def _one_line(err: str, *expect: str) -> None:
    assert err.startswith("decodesim: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for text in expect:
        assert text in err, err


def _cli(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim", *argv], env=ENV, capture_output=True, text=True,
                          timeout=HANG_S, **kw)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("argv", [["run", *QUICK], ["run", *QUICK, "--json"], ["profiles"],
                                  ["--version"]])
def test_output_on_a_full_disk_is_one_line_exit_2(argv):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "sim", *argv], env=ENV, stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=HANG_S)
    assert proc.returncode == 2, proc.stderr
    _one_line(proc.stderr, "standard output: cannot write (No space left on device)")


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly():
    proc = subprocess.Popen([sys.executable, "-m", "sim", "run", "--steps", "300", "--engine", "analytic", "--json"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()  # `| head -1`
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=HANG_S) == 0 and stderr == "", stderr


def test_ctrl_c_during_run_keeps_the_steps_done_marked_partial(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "sim", "run", "--steps", "20000", "--context", "1024", "--batch", "8", "--out",
                             str(out)], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        import time

        deadline = time.monotonic() + HANG_S  # a hang bound: wait for the folder (its lock) to exist
        while not out.is_dir():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "hang"
            time.sleep(0.05)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    _one_line(stderr, "interrupted after", "of 20000 steps", "marked partial", "summary.json")
    assert "PARTIAL: interrupted after" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partial"] is True and 1 <= summary["steps_done"] < 20000
    import pandas as pd

    assert len(pd.read_parquet(out / "steps.parquet")) == summary["steps_done"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_a_stop_between_steps_keeps_the_whole_steps():
    from sim.run import simulate

    asked = []
    result = simulate(steps=50, batch=2, keep_ops=True, keep_log=True, stop=lambda: asked.append(1) or len(asked) > 2)
    assert result.summary["partial"] is True and result.summary["steps_done"] == 3 == len(result.steps)
    assert {r["step"] for r in result.ops} == {0, 1, 2}
    full = simulate(steps=3, batch=2)
    assert "partial" not in full.summary and full.summary["per_token_ms_p50"] == result.summary["per_token_ms_p50"]


def test_a_second_writer_to_one_out_folder_is_refused(tmp_path):
    from sim.io import writer_lock

    out = tmp_path / "out"
    with writer_lock(out):
        code, _o, err = run_cli("run", *QUICK, "--out", str(out))
    assert code == 2
    _one_line(err, str(out), "another decodesim command is writing to this folder")
    assert not out.exists()  # the holder made it and wrote nothing: removed again
    code, _o, err = run_cli("run", *QUICK, "--out", str(out))  # the lock went with its holder
    assert code == 0, err and (out / "summary.json").is_file()


def test_a_full_disk_midway_leaves_no_table_without_its_summary(tmp_path, monkeypatch):
    """ENOSPC on the fourth file of a run: no file of it lands (no table beside an old summary),
    no temp file stays, a folder the run made is removed again, an earlier result stays whole."""
    import sim.io

    real_with, calls = sim.io.write_with, []

    def failing_with(path, writer, suffix=""):
        def write(tmp):
            calls.append(tmp)
            if len(calls) == 4:
                raise OSError(errno.ENOSPC, "No space left on device")
            writer(tmp)
        real_with(path, write, suffix)

    old = tmp_path / "old"
    assert run_cli("run", *QUICK, "--out", str(old))[0] == 0
    before = {p.name: p.read_bytes() for p in old.iterdir()}
    monkeypatch.setattr(sim.io, "write_with", failing_with)
    for out in (tmp_path / "new", old):
        calls.clear()
        code, _o, err = run_cli("run", "--steps", "2", "--engine", "analytic", "--out", str(out))
        assert code == 2 and len(calls) == 4
        _one_line(err, str(out), "cannot write here (No space left on device)")
    assert not (tmp_path / "new").exists()
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before


@pytest.mark.parametrize("flag", ["--out", "--trace-out", "--html"])
def test_a_name_too_long_or_a_dangling_link_is_one_line(tmp_path, flag):
    long_name = str(tmp_path / ("x" * 300))
    code, _o, err = run_cli("run", *QUICK, flag, long_name)
    assert code == 2
    _one_line(err, "cannot be used as a path (File name too long)")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone" / "away")
    code, _o, err = run_cli("run", *QUICK, flag, str(link))
    assert code == 2
    _one_line(err, str(link), "symbolic link", "which does not exist")


def test_an_os_error_without_a_file_names_standard_output(monkeypatch):
    import sim.commands.handlers.run as handler

    def boom(_summary):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(handler, "render", boom)
    code, _o, err = run_cli("run", *QUICK)
    assert code == 2
    _one_line(err, "standard output: cannot write (Input/output error)")


def test_a_read_only_place_is_refused_before_any_work(tmp_path, monkeypatch):
    import sim.io

    monkeypatch.setattr(sim.io.os, "access", lambda *_a, **_k: False)  # as a non-root user sees a read-only folder
    code, _o, err = run_cli("run", *QUICK, "--out", str(tmp_path / "ro" / "out"))
    assert code == 2
    _one_line(err, "no write permission in")
    assert not (tmp_path / "ro").exists()


def test_io_cases_leave_no_temp_files(tmp_path):
    out = tmp_path / "o"
    assert run_cli("run", *QUICK, "--out", str(out), "--trace-out", str(tmp_path / "t.json"))[0] == 0
    names = sorted(p.name for p in Path(tmp_path).rglob("*"))
    assert not [n for n in names if n.startswith(".") or n.endswith(".tmp")], names
