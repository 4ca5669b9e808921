"""decodesim from Python: every command of the CLI as a function that takes the CLI's options
as keywords and returns the CLI's own answer. See docs/api.md (a test runs it).

* ``simulate(spec=None, *, set=(), **options)`` (also ``run``): one ``decodesim run`` as a
  ``RunResult``: ``.summary`` is the ``run --json`` object (less its ``schema_version`` and
  ``kind``), ``.tables()`` the per-op, per-step and per-resource pandas tables.
* ``serve(**options)``, ``search(**options)``, ``study(file, **options)``,
  ``compare(**options)``, ``command(name, *positional, **options)``: the command's ``--json``
  object, as an ``Output`` (a dict; ``.table()`` gives its records as a pandas DataFrame).

Keywords are the options' names with ``_`` for ``-`` (``target_ms=5`` is ``--target-ms 5``);
``set=["PATH=VALUE", ...]`` is ``--set`` given once per item; ``True`` gives a flag, ``False``
its ``--no-`` form (where there is one) or nothing; a list gives a comma list (``kv=["fp16",
"int8"]`` is ``--kv fp16,int8``). An option the command does not have is a ``TypeError``
naming the ones it has; bad values raise the CLI's ``ConfigError`` (its ``str()`` is the
line the CLI prints).

The commands other than ``run`` go through their CLI handlers, whose ``--json`` output is
captured (the process's stdout and stderr are redirected for the call, under a lock: call
them from one thread at a time), so each answer is the CLI's by construction.
"""

from __future__ import annotations

import argparse
import io
import json
import threading
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd

from sim.cli import build_parser, handler
from sim.errors import COMMAND_LINE, ConfigError
from sim.run import RunResult
from sim.run import simulate as _simulate

_LOCK = threading.Lock()
_PARSER: list[argparse.ArgumentParser] = []


class Output(dict):
    """A command's ``--json`` object (a dict), with its records as pandas tables."""

    def table(self, key: str | None = None) -> pd.DataFrame:
        """The records under ``key`` (default: ``rows``, else the only list of records, else
        ``summary``) as a DataFrame; a single record is one row."""
        if key is None:
            lists = [k for k, v in self.items() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)]
            key = "rows" if "rows" in self else (lists[0] if len(lists) == 1 else "summary")
        if key not in self:
            raise KeyError(f"{key!r}: this output has {', '.join(self)}")
        value = self[key]
        return pd.DataFrame([value] if isinstance(value, dict) else value)


def _subparser(name: str) -> argparse.ArgumentParser:
    if not _PARSER:
        _PARSER.append(build_parser())
    for action in _PARSER[0]._subparsers._group_actions:  # the subcommands (argparse keeps them here)
        if name in action.choices:
            return action.choices[name]
    raise TypeError(f"decodesim has no command {name!r}")


def argv_of(name: str, options: dict) -> list[str]:
    """The ``decodesim NAME ...`` argument list the keywords ask for (see the module docstring)."""
    actions = {a.dest: a for a in _subparser(name)._actions if a.option_strings and a.dest != "help"}
    argv = [name]
    for key, value in options.items():
        dest = "overrides" if key == "set" else key
        action = actions.get(dest)
        if action is None or dest == "json":
            allowed = sorted("set" if d == "overrides" else d for d in actions if d != "json")
            raise TypeError(f"{name}() got an unexpected keyword {key!r}; the options of decodesim {name} are: "
                            f"{', '.join(allowed)}")
        if value is not None:
            argv += _words(action, value)
    return argv


def _words(action: argparse.Action, value) -> list[str]:
    """The words one option's value gives (a flag, its ``--no-`` form, ``--opt=v`` once or per item)."""
    if isinstance(action, argparse.BooleanOptionalAction):
        flag = action.option_strings[0]
        return [flag if value else "--no-" + flag[2:]]
    flag = max(action.option_strings, key=len)
    if action.nargs == 0:  # store_true and the like
        return [flag] if value else []
    if isinstance(action, argparse._AppendAction):
        return [f"{flag}={item}" for item in ([value] if isinstance(value, str) else list(value))]
    text = ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
    return [f"{flag}={text}"]


def parse(argv: list[str]) -> argparse.Namespace:
    """The CLI's parse of ``decodesim ARGV`` (its parser's error as a ConfigError, not an exit)."""
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            return build_parser().parse_args(argv)
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        message = lines[-1].removeprefix("decodesim: ") if lines else "bad arguments"
        option, sep, rest = message.partition(": ")
        if option.startswith("argument ") and sep:  # "argument --ttft-ms: invalid float value: 'x'"
            raise ConfigError(COMMAND_LINE, option.removeprefix("argument ").split("/")[0], rest) from None
        raise ConfigError(COMMAND_LINE, argv[0], message) from None


def simulate(spec=None, *, set=(), keep_ops: bool = False, keep_log: bool = False, check_capacity: bool = True,
             **options) -> RunResult:
    """``decodesim run`` from Python: the run options as keywords (RunSpec's fields, which the
    CLI's options set), ``set=["PATH=VALUE", ...]`` as ``--set``, or a RunSpec / dict ``spec``.
    Returns the RunResult (``.summary`` is the ``run --json`` object without ``schema_version``
    and ``kind``; ``.tables()``). Bad input raises ConfigError ("simulate(): batch: ...")."""
    kwargs = {"keep_ops": keep_ops, "keep_log": keep_log, "check_capacity": check_capacity}
    items = [set] if isinstance(set, str) else list(set)
    if spec is not None:
        if items or options:
            raise TypeError("simulate(): give a spec or keyword options, not both")
        return _simulate(spec, **kwargs)
    if items:
        options["overrides"] = [*_as_list(options.get("overrides")), *items]
    return _simulate(None, **kwargs, **options)


def _as_list(value) -> list:
    return [] if value is None else [value] if isinstance(value, str) else list(value)


run = simulate


def command(name: str, *positional: str, **options) -> Output:
    """Any subcommand's ``--json`` object (``decodesim NAME POSITIONAL... --OPTIONS --json``)."""
    argv = argv_of(name, options)
    argv[1:1] = [str(p) for p in positional]
    out, err = io.StringIO(), io.StringIO()
    with _LOCK:
        args = parse([*argv, "--json"])
        with redirect_stdout(out), redirect_stderr(err):
            code = int(handler(args.handler)(args) or 0)
    if code != 0:
        raise ConfigError(COMMAND_LINE, name, f"exited {code}: {err.getvalue().strip()[:500]}", " ".join(argv[1:]))
    return Output(json.loads(out.getvalue()))


def serve(**options) -> Output:
    """``decodesim serve ... --json``: one replay (``["summary"]``) or a sweep (``["rows"]``)."""
    return command("serve", **options)


def search(**options) -> Output:
    """``decodesim search ... --json``: the deployments screened and the front confirmed."""
    return command("search", **options)


def study(file, **options) -> Output:
    """``decodesim study FILE ... --json``: the plan, and what ran."""
    return command("study", str(file), **options)


def compare(**options) -> Output:
    """``decodesim compare ... --json``: formats against the fp16 reference."""
    return command("compare", **options)


__all__ = ["simulate", "run", "serve", "search", "study", "compare", "command", "Output", "argv_of", "parse"]
