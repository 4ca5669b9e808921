"""Atomic file output: the one way decodesim writes a result file.

Every file is written to a temp file in the target's folder and renamed over the target
(``os.replace``), so a reader sees the old file or the whole new one, and an interrupted
run leaves no partial result that looks complete. Temp files are named ``.<name>.<rand>.tmp``
and removed if the writer fails; files get the umask's mode (a report is for everyone to
read, as a plain ``open()`` would make it).

A place that cannot be written (a folder where a file should go, a file where a folder
should be, a read-only or missing location) is a ``ConfigError`` naming the path, never a
traceback; ``output_problem`` checks a path before any work is done (the commands' ``--out``
arguments use it through ``output_file`` / ``output_dir``), ``make_folder`` creates an output
folder with the same errors, and ``stale_temp_files`` finds what an earlier, killed writer left behind.

Input: ``read_jsonl`` is the one JSON Lines reader (decode traces, routing traces, request
files), streamed line by line, with the same one-line errors for every format that uses it;
``read_table`` reads back a Parquet table decodesim wrote, a damaged or foreign one a ConfigError.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from contextvars import ContextVar
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sim.errors import ConfigError


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


FILE_MODE = _umask_mode()


class AtomicFile:
    """A temp file beside ``path`` for a writer that streams over many calls (row groups of a
    long replay): ``commit`` renames it onto ``path``, ``abort`` removes it. ``suffix`` keeps
    writers that pick a format by extension happy. An unwritable place is a ConfigError
    naming ``path``, raised here, before any work is done."""

    def __init__(self, path: Path | str, suffix: str = ""):
        self.path = Path(path)
        problem = output_problem(self.path)
        if problem:
            raise ConfigError(str(self.path), None, problem)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=suffix + ".tmp")
        except OSError as err:
            raise ConfigError(str(self.path), None, f"cannot write here ({_reason(err)})") from None
        os.close(fd)
        self.tmp = Path(tmp)

    def commit(self) -> None:
        """Give the temp file the umask's mode and rename it onto the target."""
        try:
            os.chmod(self.tmp, FILE_MODE)
            os.replace(self.tmp, self.path)
        except OSError as err:
            self.abort()
            raise ConfigError(str(self.path), None, f"cannot write here ({_reason(err)})") from None

    def abort(self) -> None:
        """Remove the temp file (the target keeps whatever it held before)."""
        try:
            os.unlink(self.tmp)
        except OSError:
            pass


_PENDING: ContextVar[list[AtomicFile] | None] = ContextVar("decodesim_output_set", default=None)


@contextmanager
def atomic_path(path: Path | str, suffix: str = "") -> Iterator[Path]:
    """A temp path beside ``path`` to write; renamed onto ``path`` when the block succeeds
    (inside ``output_set``: when the set is complete), removed when it raises. An unwritable
    place (or an OSError while writing) is a ConfigError naming ``path``."""
    target = AtomicFile(path, suffix)
    try:
        yield target.tmp
    except BaseException as err:
        target.abort()
        if isinstance(err, OSError):
            raise ConfigError(str(target.path), None, f"cannot write here ({_reason(err)})") from None
        raise
    pending = _PENDING.get()
    if pending is None:
        target.commit()
    else:
        pending.append(target)


@contextmanager
def output_set() -> Iterator[None]:
    """Write several files as one result: every file written in the block (through
    ``atomic_path`` and the writers built on it) stays a temp file until the block ends, then all
    are renamed into place (renames need no room, so a full disk fails before any file lands);
    if the block raises, every temp file is removed and no target changes. So a result folder
    holds the old result or the whole new one, never the tables of one run beside the summary of
    another, nor a table with no summary."""
    pending: list[AtomicFile] = []
    token = _PENDING.set(pending)
    try:
        yield
    except BaseException:
        for target in pending:
            target.abort()
        raise
    finally:
        _PENDING.reset(token)
    for i, target in enumerate(pending):
        try:
            target.commit()
        except ConfigError:
            for rest in pending[i + 1:]:
                rest.abort()
            raise


@contextmanager
def writer_lock(folder: Path | str) -> Iterator[None]:
    """Hold an exclusive lock on the output folder ``folder`` (created if missing) while a
    command writes there; a second writer to the same folder is refused at once with a
    ConfigError naming it (rather than two runs' tables mixed in one folder). The lock is
    ``flock`` on the folder itself (no lock file left behind), released when the process ends
    however it ends; where there is no ``fcntl`` (not POSIX) nothing is locked."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    path = Path(folder)
    made = not path.exists()
    make_folder(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as err:
        raise ConfigError(str(path), None, f"cannot open the folder ({_reason(err)})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            made = False
            raise ConfigError(str(path), None, "another decodesim command is writing to this folder; expected one "
                                               "writer per output folder (wait for it or pick another)") from None
        yield
    finally:
        os.close(fd)
        if made:  # a folder this writer made and left empty (it failed before writing) goes again
            try:
                path.rmdir()
            except OSError:
                pass


def _reason(err: OSError) -> str:
    return err.strerror or type(err).__name__


STDOUT = "standard output"  # what an error names for the command's printed output


def os_error_line(err: OSError, stdout_failed: bool = False) -> str:
    """The one line for an I/O failure no writer turned into a ConfigError (output on a full
    disk or a closed stream, a name too long, a folder that went away): the file it names, or
    ``standard output`` (``stdout_failed``), the system's reason and what was expected."""
    where = STDOUT if stdout_failed and err.filename is None else err.filename
    doing = "cannot write" if where == STDOUT else "cannot read or write"
    text = f"{doing} ({_reason(err)}); expected " + (
        "room for the command's output (a full disk or a closed stream?)" if where == STDOUT
        else "a path that can be read or written")
    return f"decodesim: {where}: {text}" if where is not None else f"decodesim: {text}"


def output_problem(path: Path | str, *, folder: bool = False) -> str | None:
    """Why ``path`` cannot be written as a file (``folder``: made or used as a folder), or
    None when it looks writable. Checks without creating anything; a path the system will not
    even look up (a name too long, a loop of symbolic links) is a problem, not an OSError."""
    try:
        return _output_problem(Path(path), folder)
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        return f"cannot be used as a path ({_reason(err) if isinstance(err, OSError) else err})"


def _output_problem(path: Path, folder: bool) -> str | None:
    if path.is_symlink() and not path.exists():
        return f"is a symbolic link to {os.readlink(path)}, which does not exist; expected a path that can be written"
    if folder and path.exists() and not path.is_dir():
        return "exists and is not a folder; expected a folder to write into"
    if not folder and path.is_dir():
        return "is a folder; expected a file path to write"
    if not folder and path.exists() and not path.is_file():
        return "exists and is not a regular file"
    ancestor = path if folder and path.is_dir() else path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if ancestor.exists() and not ancestor.is_dir():
        return f"cannot be created: {ancestor} is a file, not a folder"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot be written: no write permission in {ancestor}"
    return None


# temp files of this module (``.<name>.<8 random>.tmp``, with any suffix before ``.tmp``) and of
# earlier writers (``.<name>.<8 random>`` from tempfile.mkstemp, ``<name>.tmp``)
_TEMP = re.compile(r"\..+\.[a-z0-9_]{8}(\.[A-Za-z0-9]+)?\.tmp|\..+\.[a-z0-9_]{8}|[^.].*\.tmp")


def stale_temp_files(folder: Path | str) -> list[Path]:
    """Temp files an interrupted writer left in ``folder`` (not recursive). Only safe to remove
    when no writer is at work there (the study runner holds the folder's lock)."""
    folder = Path(folder)
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    return sorted(p for p in entries if _TEMP.fullmatch(p.name) and p.is_file() and not p.is_symlink())


def make_folder(path: Path | str) -> Path:
    """Create the folder ``path`` (and its parents) to write results into. A place where no
    folder can be made is a ConfigError naming ``path``: what ``output_problem`` sees, and
    what only trying shows (``/proc`` passes the permission check for root, yet refuses)."""
    path = Path(path)
    problem = output_problem(path, folder=True)
    if problem:
        raise ConfigError(str(path), None, problem)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(str(path), None, f"cannot create the folder ({_reason(err)})") from None
    return path


def write_atomic(path: Path | str, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_with(path: Path | str, writer: Callable[[Path], None], suffix: str = "") -> None:
    """Call ``writer(temp_path)`` and move the result onto ``path`` atomically."""
    with atomic_path(path, suffix) as tmp:
        writer(tmp)


def write_frame(frame, path: Path | str) -> None:
    """Write a DataFrame as Parquet (``path``.parquet) and CSV beside it, each atomically."""
    path = Path(path)
    write_with(path.with_suffix(".parquet"), lambda tmp: frame.to_parquet(tmp, index=False))
    write_with(path.with_suffix(".csv"), lambda tmp: frame.to_csv(tmp, index=False))


def read_jsonl(path: Path | str, expected: str) -> Iterator[tuple[int, object]]:
    """(line number, parsed value) for each non-blank line of a UTF-8 JSON Lines file, read
    as it is consumed (a long file is never held whole). A file that cannot be read or is not
    text (``expected`` completes "not a text file; expected ..."), or a line that is not JSON,
    is a ConfigError naming the file (and the line); what a value must hold is the caller's."""
    name = str(path)
    try:
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ConfigError(name, f"line {number}", f"invalid JSON ({err.msg})") from None
                yield number, value
    except UnicodeDecodeError:
        raise ConfigError(name, None, f"not a text file; expected {expected}") from None
    except OSError as err:
        raise ConfigError(name, None, f"cannot read file ({_reason(err)})") from None


def read_table(path: Path | str, what: str, columns: Iterable[str] = ()):
    """The Parquet table at ``path`` as a DataFrame. ``what`` names the table it must be
    (completes "not ..."); a file that cannot be read, is not Parquet (damaged, or some other
    format) or lacks one of ``columns`` (another command's table) is a ConfigError naming it."""
    import pandas as pd

    name = str(path)
    try:
        frame = pd.read_parquet(path)
    except Exception as err:  # noqa: BLE001 - any reader failure is a damaged or foreign file
        raise ConfigError(name, None, _unreadable(err, what)) from None
    missing = [column for column in columns if column not in frame.columns]
    if missing:
        raise ConfigError(name, None, f"not {what}: it has no column {missing[0]!r}")
    return frame


def _unreadable(err: Exception, what: str) -> str:
    """Why a table could not be read: the system's reason (missing file, no permission), else
    that the bytes are not a Parquet table (pyarrow says so with ValueErrors and errno-less OSErrors)."""
    if isinstance(err, OSError) and err.errno is not None:
        return f"cannot read file ({_reason(err)})"
    return f"not {what}: cannot read it as Parquet ({type(err).__name__})"


def to_json(obj) -> str:
    """JSON of results: numpy scalars as numbers, paths as strings, non-finite floats as null."""
    return json.dumps(_finite(obj), indent=2, default=_plain, allow_nan=False)


def _plain(value):
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
