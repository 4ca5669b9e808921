"""What the subcommands' handlers share: the ``--json`` envelope and byte formatting (the run
options, which the explorer parses too, are sim.options.run).

Every ``--json`` output is one JSON object: ``{"schema_version": "2.0", "kind": "<subcommand>",
...payload}``, described by the versioned JSON Schema ``sim/schema/output.schema.json``
(draft 2020-12; ``sim.schema.output_schema()`` loads it). The same field names are used
everywhere: ``per_token_ms_p50`` / ``per_token_ms_p99`` for latency, ``kv`` for a KV-cache
format, ``weights`` for a weight format, units in every other name. ``schema_version`` is
bumped (major) when a field is renamed or removed, (minor) when one is added.
"""

from __future__ import annotations

from sim.errors import COMMAND_LINE, ConfigError
from sim.io import to_json, write_atomic, write_frame
from sim.schema import SCHEMA_VERSION
from sim.units import GB, KB, MB, TB

__all__ = ["comma_list", "fmt_bytes", "to_json", "write_atomic", "write_frame", "emit_json", "envelope", "Interrupt"]

MAX_LIST = 1000  # items of one comma list (names, rates, batch sizes)


def comma_list(text: str, flag: str, what: str = "names", limit: int = MAX_LIST, each: str = "") -> list[str]:
    """The items of the comma list given as ``flag``, checked before any work: at least one, at
    most ``limit`` (``each``: what one costs, for the message), none empty (``fp16,,int8`` is an
    error, not dropped)."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip():
        raise ConfigError(COMMAND_LINE, flag, f"expected one or more comma-separated {what}", text)
    if len(items) > limit:
        raise ConfigError(COMMAND_LINE, flag, f"expected at most {limit} comma-separated {what}{each}, "
                          f"got {len(items):,}")
    if "" in items:
        raise ConfigError(COMMAND_LINE, flag, f"item {items.index('') + 1} of the comma list is empty", text)
    return items


def fmt_bytes(n: float) -> str:
    for unit, size in (("TB", TB), ("GB", GB), ("MB", MB), ("KB", KB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def envelope(kind: str, payload: dict) -> dict:
    """``payload`` under the versioned envelope every ``--json`` output has."""
    reserved = {"schema_version", "kind"} & set(payload)
    if reserved:
        raise ValueError(f"payload may not set {sorted(reserved)}")
    return {"schema_version": SCHEMA_VERSION, "kind": kind, **payload}


def emit_json(kind: str, payload: dict) -> None:
    """Print one ``--json`` output: the envelope and ``payload`` (sim/schema/output.schema.json)."""
    print(to_json(envelope(kind, payload)))


class Interrupt:
    """SIGINT / SIGTERM while a command works: the first asks the work to stop where it is
    (``interrupt()`` answers True; the command then writes what finished, marked partial); a
    second raises KeyboardInterrupt at once. A signal the parent process ignores (a shell's
    background job) stays ignored; off the main thread (the explorer) nothing is installed.
    ``run``, ``search`` and ``serve`` stop their work through it."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self):
        self.signal: int | None = None
        self._previous: dict = {}

    def __enter__(self):
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread():
            return self
        for name in self.SIGNALS:
            number = getattr(signal, name)
            if signal.getsignal(number) is signal.SIG_IGN:
                continue
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def _handle(self, number, frame):
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = number

    def __call__(self) -> bool:
        return self.signal is not None

    def __exit__(self, *exc):
        import signal

        for number, previous in self._previous.items():
            signal.signal(number, previous)
        return False

    @property
    def exit_code(self) -> int:
        """128 + the signal's number (130 for Ctrl-C), as a shell reports it; 0 when none came."""
        return 128 + self.signal if self.signal is not None else 0
