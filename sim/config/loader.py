"""The one YAML reader, the one validator and the one override syntax.

``load_yaml`` reads a file with ``yaml.safe_load`` only. ``validate`` builds a frozen
pydantic model and turns any ``ValidationError`` into a ``ConfigError`` that names the file,
the dotted key path and what was expected. ``apply_overrides`` implements the dotted-path
syntax shared by ``--set`` and study sweeps:

* ``hbm.channel_bandwidth_GBps=900``: set a value (for a sourced quantity, its ``value``;
  the quantity's ``source`` becomes ``override``);
* in studies, ``{scale: 2}`` multiplies the current value.

Paths are checked against the schema, so a misspelt path is an error, not a new key.
"""

from __future__ import annotations

import copy
import math
import re
import sys
import typing
from pathlib import Path
from typing import Any

import pydantic
import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from sim.config.defaults import MEMORY_KINDS
from sim.errors import ConfigError

MAX_BYTES = 4_000_000  # a configuration file larger than this is not one
MAX_DEPTH = 40  # nesting of mappings and lists
MAX_ALIASES = 200  # YAML aliases (``*name``) per file


try:  # libyaml's scanner and parser (5x faster); composing stays in Python, where the limits are
    from yaml._yaml import CParser as _EventSource
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _EventSource(Reader, Scanner, Parser):
        """PyYAML's pure-Python reader, scanner and parser, started as CParser is."""

        def __init__(self, stream):
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)


class _StrictLoader(Composer, _EventSource, SafeConstructor, Resolver):
    """Safe loading with limits: duplicate keys are errors (YAML would keep the last one
    silently), nesting and aliases are bounded before anything is built. Events come from
    libyaml where PyYAML has it; nodes are composed here and built by the safe constructor."""

    def __init__(self, stream):
        _EventSource.__init__(self, stream)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _Limit(f"more than {MAX_ALIASES} YAML aliases", self.peek_event().start_mark)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Limit(f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _Limit(Exception):
    def __init__(self, problem: str, mark):
        super().__init__(problem)
        self.problem, self.mark = problem, mark


def _no_duplicate_keys(root, source: str) -> None:
    """YAML keeps the last of two equal keys silently; here it is an error naming the key's
    path. Each node is visited once (an alias is not walked again)."""
    seen_nodes: set[int] = set()
    stack = [(root, "")]
    while stack:
        node, where = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys = set()
            for key_node, value_node in node.value:
                key = key_node.value
                path = f"{where}.{key}" if where else str(key)
                if key in keys:
                    raise ConfigError(source, path, "duplicate key (a key may appear once)")
                keys.add(key)
                stack.append((value_node, path))
        elif isinstance(node, yaml.SequenceNode):
            for i, child in enumerate(node.value):
                stack.append((child, f"{where}.{i}"))


def parse_yaml(text: str, source: str):
    """Parse YAML ``text`` (named ``source`` in errors) with the loader's limits."""
    if len(text) > MAX_BYTES:
        raise ConfigError(source, None, f"file too large ({len(text)} bytes; at most {MAX_BYTES})")
    try:
        loader = _StrictLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _no_duplicate_keys(node, source)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except _Limit as err:
        where = f"line {err.mark.line + 1}, column {err.mark.column + 1}: " if err.mark else ""
        raise ConfigError(source, None, f"{where}{err.problem}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise ConfigError(source, None, f"YAML syntax error at {where}: {problem}") from None
    except RecursionError:
        raise ConfigError(source, None, f"nested deeper than {MAX_DEPTH} levels") from None


def load_yaml(path: str | Path) -> dict:
    """Read one YAML configuration file: a mapping at the top, safe loading with limits."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_BYTES:
            raise ConfigError(str(path), None, f"file too large ({path.stat().st_size} bytes; at most {MAX_BYTES})")
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(str(path), None, "file not found") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError, OSError) as err:
        raise ConfigError(str(path), None, f"cannot read file ({type(err).__name__})") from None
    data = parse_yaml(text, str(path))
    if data is None:
        raise ConfigError(str(path), None, "the file is empty (or only comments); expected a mapping at the top level")
    if not isinstance(data, dict):
        kind = {list: "a list", str: "text", int: "a number", float: "a number", bool: "a boolean"}.get(
            type(data), type(data).__name__)
        raise ConfigError(str(path), None, f"expected a mapping at the top level, not {kind}")
    return data


def dotted(loc: tuple) -> str:
    return ".".join(str(part) for part in loc)


def validate(model: type[pydantic.BaseModel], data: Any, file: str | Path | None, prefix: str = ""):
    """Build ``model`` from ``data``; a ValidationError becomes one ConfigError."""
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as err:
        raise config_error(model, err, str(file) if file else None, prefix, data) from None


def config_error(model, err: pydantic.ValidationError, file, prefix="", data=None) -> ConfigError:
    """The one-line ConfigError for the first problem of a pydantic ValidationError."""
    first = err.errors(include_url=False)[0]
    raw_loc = tuple(first["loc"])
    # a union's tag follows a list index (memory.0.hbm); a dict key of the same name stays (energy's hbm)
    loc = _named(tuple(part for i, part in enumerate(raw_loc)
                       if not (_is_union_tag(part) and (part.startswith("function-") or
                                                        (i > 0 and isinstance(raw_loc[i - 1], int))))), data)
    path = ".".join(p for p in (prefix, dotted(loc)) if p)
    kind = first["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model, raw_loc[:-1])
        hint = f"; allowed keys: {', '.join(allowed)}" if allowed else ""
        return ConfigError(file, path, f"unknown key{hint}")
    if kind == "missing":
        return ConfigError(file, path, "required key is missing")
    message = first["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    got = first.get("input", ...)
    if isinstance(got, (dict, list)) and kind not in ("dict_type", "list_type", "model_type"):
        got = ...
    return ConfigError(file, path, message[0].lower() + message[1:], got)


def _named(loc: tuple, data) -> tuple:
    """Replace list indices by the item's ``name`` where it has one (memory.0 -> memory.hbm)."""
    out, node = [], data
    for part in loc:
        if isinstance(part, int) and isinstance(node, list) and part < len(node):
            item = node[part]
            out.append(item["name"] if isinstance(item, dict) and isinstance(item.get("name"), str) else part)
            node = item
        else:
            out.append(part)
            node = node.get(part) if isinstance(node, dict) else None
    return tuple(out)


def _is_union_tag(part) -> bool:
    # pydantic adds the tag of a discriminated union or the name of a function validator
    return isinstance(part, str) and (part.startswith("function-") or part in _UNION_TAGS)


_UNION_TAGS = frozenset(MEMORY_KINDS)  # the memory levels' kind tags (sim.config.hardware)


def _field_model(annotation):
    """The pydantic model (or the list of models) inside an annotation, if any."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _field_model(typing.get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    if origin in (list, tuple):
        return _field_model(typing.get_args(annotation)[0])
    if origin is dict:
        return _field_model(typing.get_args(annotation)[1])
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        models = [m for m in (_field_model(a) for a in typing.get_args(annotation)) if m]
        return models[0] if len(models) == 1 else (models or None)
    return None


def _allowed_keys(model, loc) -> list[str]:
    current = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        if isinstance(current, list):
            current = _union_member(current, part)
            continue
        field = current.model_fields.get(part)
        current = _field_model(field.annotation) if field else None
    if isinstance(current, type) and issubclass(current, pydantic.BaseModel):
        return sorted(current.model_fields)
    return []


# ---------------------------------------------------------------- overrides


MAX_ASSIGNMENT = 1024  # characters of one DOTTED.PATH=VALUE text


class _AssignmentLoader(yaml.SafeLoader):
    """Safe YAML for ``--set`` values that reads numbers only in plain decimal: YAML 1.1 would
    read ``0x10`` as 16, ``1_000`` as 1000, ``010`` as 8 and ``1:30`` as 90."""


class _Numeral(Exception):
    def __init__(self, text: str):
        self.text = text


_DECIMAL = re.compile(r"[+-]?(0|[1-9]\d*)(\.\d*)?([eE][+-]?\d+)?|[+-]?\.\d+([eE][+-]?\d+)?")


def _decimal_int(loader, node):
    text = loader.construct_scalar(node)
    if not _DECIMAL.fullmatch(text):
        raise _Numeral(text)
    return int(text)


def _decimal_float(loader, node):
    text = loader.construct_scalar(node)
    if text.lower().lstrip("+-") in (".inf", ".nan"):
        raise _Numeral(text)
    if not _DECIMAL.fullmatch(text):
        raise _Numeral(text)
    return float(text)


_AssignmentLoader.add_constructor("tag:yaml.org,2002:int", _decimal_int)
_AssignmentLoader.add_constructor("tag:yaml.org,2002:float", _decimal_float)


def parse_number(text: str) -> float:
    """A plain decimal number (``16``, ``0.5``, ``1e9``), finite and not subnormal; ValueError
    otherwise (hex, octal, underscores, ``inf``, ``nan``, ``1e-320``, empty text)."""
    text = text.strip()
    if not _DECIMAL.fullmatch(text):
        raise ValueError(f"expected a plain decimal number, got {text!r}")
    value = float(text)
    if not math.isfinite(value) or (value != 0 and abs(value) < sys.float_info.min):
        raise ValueError(f"expected a finite, normal number, got {text!r}")
    return value


def parse_assignment(text: str, where: str = "--set") -> tuple[str, Any]:
    """``a.b.c=VALUE`` -> (path, value); the value is read as YAML (safe), so 900 is an int.

    Strict: numbers must be plain decimal (no hex, octal, binary, underscores or ``1:30``),
    finite and not subnormal (``1e-320`` is below the smallest normal double and would be a
    typo for any quantity), and the whole text at most ``MAX_ASSIGNMENT`` characters."""
    if len(text) > MAX_ASSIGNMENT:
        raise ConfigError(where, text[:40] + "...", f"expected DOTTED.PATH=VALUE of at most {MAX_ASSIGNMENT:,} "
                          f"characters, got {len(text):,}")
    if "=" not in text:
        raise ConfigError(where, text, "expected DOTTED.PATH=VALUE")
    path, raw = text.split("=", 1)
    path = path.strip()
    if not path or any(not part for part in path.split(".")):
        raise ConfigError(where, text, "expected DOTTED.PATH=VALUE (path parts may not be empty)")
    try:
        value = yaml.load(raw, Loader=_AssignmentLoader) if raw.strip() else ""  # noqa: S506 - a SafeLoader
    except _Numeral as err:
        raise ConfigError(where, path, "numbers must be plain decimal (like 16, 0.5 or 1e9; no hex, octal, "
                          "underscores, infinities or NaN)", err.text) from None
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        value = float(value)  # YAML 1.1 reads 1e9 (no dot) as text; on the command line it is a number
    _check_numbers(value, path, where)
    return path, value


def _check_numbers(value: Any, path: str, where: str) -> None:
    """Refuse non-finite and subnormal floats anywhere in an override value."""
    if isinstance(value, dict):
        for child in value.values():
            _check_numbers(child, path, where)
    elif isinstance(value, list):
        for child in value:
            _check_numbers(child, path, where)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(where, path, "expected a finite number", value)
        if value != 0 and abs(value) < sys.float_info.min:
            raise ConfigError(where, path, f"expected 0 or a number of magnitude at least {sys.float_info.min:g} "
                              "(this one is subnormal: a typo?)", value)


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")


def apply_override(
    data: dict, path: str, value: Any, model: type[pydantic.BaseModel], file: str, source: str = "override"
) -> dict:
    """Return a copy of raw ``data`` with ``path`` set to ``value`` (or scaled by it).

    ``value`` may be ``{"scale": f}`` (multiply the current number) or ``{"add": x}``.
    A path must exist in the schema; setting a sourced quantity sets its ``value`` and
    records ``source``.
    """
    data = copy.deepcopy(data)
    parts = path.split(".")
    node: Any = data
    schema: Any = model
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        key: Any = part
        if isinstance(node, list):
            key = _list_index(node, part, file, ".".join(parts[: i + 1]))
        elif isinstance(node, dict):
            if isinstance(schema, type) and issubclass(schema, pydantic.BaseModel):
                if part not in schema.model_fields and part not in node:
                    allowed = ", ".join(sorted(schema.model_fields))
                    raise ConfigError(file, ".".join(parts[: i + 1]), f"no such key; allowed keys: {allowed}")
        else:
            raise ConfigError(file, ".".join(parts[:i]), "is a value, not a section; cannot descend into it")
        child_schema = _child_schema(schema, part)
        if isinstance(node, list) and isinstance(schema, list) and isinstance(node[key], dict):
            child_schema = _union_member(schema, node[key].get("kind"))
        if last:
            node[key] = _new_value(node.get(key) if isinstance(node, dict) else node[key], value, source,
                                   file, path)
            return data
        if isinstance(node, dict) and key not in node:
            node[key] = {}
        node = node[key]
        schema = child_schema
        if _is_quantity(node) and not last and parts[i + 1] not in ("value", "source", "estimate"):
            raise ConfigError(file, ".".join(parts[: i + 2]), "no such key below a sourced quantity")
    return data


def _list_index(node: list, part: str, file: str, where: str) -> int:
    if part.lstrip("-").isdigit():
        index = int(part)
        if -len(node) <= index < len(node):
            return index % len(node)
        raise ConfigError(file, where, f"index out of range (list has {len(node)} items)")
    for index, item in enumerate(node):
        if isinstance(item, dict) and item.get("name") == part:
            return index
    names = [item.get("name") for item in node if isinstance(item, dict) and "name" in item]
    raise ConfigError(file, where, f"no list item named {part!r}; names: {', '.join(map(str, names))}")


def _union_member(models: list, kind):
    for candidate in models:
        if candidate.__name__.lower() == str(kind).lower():
            return candidate
    return None


def _child_schema(schema, part):
    if isinstance(schema, list):
        for candidate in schema:
            if part in candidate.model_fields:
                return _field_model(candidate.model_fields[part].annotation)
        return None
    if isinstance(schema, type) and issubclass(schema, pydantic.BaseModel):
        field = schema.model_fields.get(part)
        return _field_model(field.annotation) if field else None
    return schema


def _is_quantity(node) -> bool:
    return isinstance(node, dict) and "value" in node and "source" in node


def _new_value(current, value, source, file, path):
    if isinstance(value, dict) and set(value) <= {"scale", "add"} and value:
        base = current["value"] if _is_quantity(current) else current
        if not isinstance(base, (int, float)) or isinstance(base, bool):
            raise ConfigError(file, path, "a scale or add override needs a number to act on", base)
        step = value.get("scale", 1)
        if not isinstance(step, (int, float)) or isinstance(step, bool) or not math.isfinite(step):
            raise ConfigError(file, path, "scale must be a number", step)
        result = base * step + value.get("add", 0)
        if isinstance(base, int) and float(result).is_integer():
            result = int(result)
        value = result
    if _is_quantity(current) and not isinstance(value, dict):
        updated = dict(current)
        updated["value"] = value
        updated["source"] = f"{source} (was {current['value']!r}: {current['source']})"
        updated["estimate"] = current.get("estimate", False)
        return updated
    return value
