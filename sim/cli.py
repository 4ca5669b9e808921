"""The ``decodesim`` command line: subcommands that return exit codes.

Each subcommand declares its arguments in its own module under ``sim.commands``, which
exposes ``register(subparsers)``; modules are discovered, so a new subcommand is a new file.
Those modules are light (every start imports all of them to build the parser); what a
command does lives in ``sim.commands.handlers.<name>``, named by the parser's ``handler``
default and imported only when that command runs, so a handler imports what it needs at
its top. The options the explorer parses too (the run options, ``run``'s and ``serve``'s) are
defined in sim.options, below both front ends, and registered from there. Bad input
(``ConfigError``) becomes one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import io
import os
import pkgutil
import sys

import sim.commands as commands
from sim.errors import ConfigError, SimulationError, error_line
from sim.io import os_error_line


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, like every other bad input
        sys.stderr.write(f"decodesim: {message}\n")
        sys.exit(2)


def version() -> str:
    """decodesim's version: the installed package's metadata, else (a checkout run with
    ``python -m sim``) the ``version`` line of the pyproject.toml beside the package."""
    from importlib import metadata
    from pathlib import Path

    try:
        return metadata.version("decodesim")
    except metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        try:
            for line in pyproject.read_text().splitlines():
                if line.startswith("version = "):
                    return line.split("=", 1)[1].strip().strip('"') + " (not installed)"
        except OSError:
            pass
        return "unknown (not installed)"


class _Version(argparse.Action):
    """``--version``, looked up only when asked (importlib.metadata costs ~20 ms of start-up)."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"decodesim {version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="decodesim", description="LLM decode latency on accelerator memory hierarchies")
    parser.add_argument("--version", action=_Version, nargs=0, help="print decodesim's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.ispkg:  # sim.commands.handlers: what the commands do, imported on demand
            continue
        module = importlib.import_module(f"sim.commands.{info.name}")
        if hasattr(module, "register"):
            module.register(sub)
    return parser


@functools.lru_cache(maxsize=1)
def _parser() -> argparse.ArgumentParser:
    """The parser, built once per process (12 ms; parse_args leaves it unchanged, so calls of
    ``main`` in one process, as the tests make, can share it)."""
    return build_parser()


def handler(target):
    """The function that runs a command: ``target`` itself, or (a module name) that module's
    ``handle``. The import is the one deferred on purpose: a command's handler module, and
    the simulator stack it imports, load only when that command runs."""
    if isinstance(target, str):
        return importlib.import_module(target).handle
    return target


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = None
    try:
        try:
            args = _parser().parse_args(argv or ["run"])
            code = _dispatch(args)
        except SystemExit:  # --help, --version, a usage error: what they printed must reach stdout too
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # here, not at exit: a full disk or closed pipe is then one line below
        return code
    except (ConfigError, SimulationError) as err:
        sys.stderr.write(error_line(err, getattr(args, "spec_source", None)) + "\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("decodesim: interrupted\n")
        return 130
    except BrokenPipeError:  # `decodesim ... | head -1`: the reader has what it wanted
        _discard_stdout()
        return 0
    except OSError as err:  # an I/O failure no writer turned into a ConfigError: one line, exit 2
        on_stdout = err.filename is None  # every file writer names its file (sim.io); print() cannot
        if on_stdout:
            _discard_stdout()
        sys.stderr.write(os_error_line(err, on_stdout) + "\n")
        return 2


def _dispatch(args) -> int:
    """Run the command ``args`` names (its handler's exit status); none named: the help, status 2."""
    if not getattr(args, "handler", None):
        _parser().print_help()
        return 2
    return int(handler(args.handler)(args) or 0)


def _discard_stdout() -> None:
    """Point stdout at /dev/null, dropping what it still holds, so that the flush at exit cannot
    fail again and print a traceback of its own."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):  # no file behind stdout (a test's)
        pass


if __name__ == "__main__":
    sys.exit(main())
