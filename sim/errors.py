"""Errors that reach the user.

A ``ConfigError`` names the file (or the command line), the key path inside it and what was
expected. The CLI prints ``error_line(err)`` as one line on stderr and exits with status 2;
nothing else in the package turns bad input into a traceback.
"""

from __future__ import annotations

COMMAND_LINE = "command line"  # the source an error names for a value given as an option


class ConfigError(Exception):
    """Bad input: a missing file, bad YAML, an unknown or missing key, a wrong value."""

    def __init__(self, file: str | None, key_path: str | None, expected: str, got: object = ...):
        self.file = file  # None: no file to name (a run's hardware, model, format or stack given by name)
        self.key_path = key_path or ""
        self.expected = expected
        self.got = got
        super().__init__(str(self))

    def in_file(self, file: str) -> ConfigError:
        """This error said against ``file`` where it names no file of its own."""
        return self if self.file is not None else ConfigError(file, self.key_path, self.expected, self.got)

    def __str__(self) -> str:
        text = "".join(f"{part}: " for part in (self.file, self.key_path) if part) + self.expected
        if self.got is not ...:
            text += f", got {_short(self.got)}"
        return " ".join(text.split())


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SimulationError(Exception):
    """A configuration that is valid data but cannot be simulated (for example, a
    placement that asks for more SRAM than the chip has). Reported like a ConfigError."""


def error_line(err: ConfigError | SimulationError, source: str | None = None) -> str:
    """The one line the CLI prints for ``err`` (and the explorer, which answers as the CLI does);
    ``source`` names where the setup came from (the command line), for an error that names no file."""
    if source and isinstance(err, ConfigError):
        err = err.in_file(source)
    return f"decodesim: {err}"
