"""A study folder: the places a study writes, and what it saved, read back and checked.

``decodesim study`` writes ``results.parquet`` / ``.csv``, ``study.json``, ``timing.json``,
``cache/``, ``detail/`` (the detail point's ``meta.json`` and op and event tables) and the
drawings (``plots/``, ``report.md``, ``report.html``); ``decodesim plot`` redraws the drawings
from the saved files. ``check_places`` refuses, before any work, a folder where one of those
cannot go (a file where ``plots/`` belongs); ``load_saved`` reads every saved file and checks
it holds what the plots and the report read, so a folder damaged since it was written (a
truncated or foreign file, another command's table) is one ConfigError naming the damaged
file and what it should hold, before anything is drawn, never a traceback from the plotting code.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from sim.config.loader import validate
from sim.errors import ConfigError
from sim.io import output_problem, read_table
from sim.study.spec import StudySpec

if TYPE_CHECKING:
    import pandas as pd

SAVED_FILES = ("results.parquet", "results.csv", "study.json", "timing.json")
DRAWINGS = ("plots/", "report.md", "report.html")  # a trailing slash: a folder
LATENCY = "per_token_ms_p99"  # the column the plots and the report rank points by
RESULT_COLUMNS = ("point", "group", "seed", "status", "error")  # every study table's, before the axes
EVENT_COLUMNS = ("resource", "t_start_ns", "t_end_ns", "bytes")
OP_COLUMNS = ("name", "flops")
OP_TIMES = (("t_start_ns", "start_ns"), ("t_end_ns", "end_ns"))  # current name, name before issue 22


# -- the places a study writes ------------------------------------------------------------------


def study_places(out: Path, *, detail: bool = True, report: bool = True) -> list[str]:
    """What a study writes in ``out``, as names relative to it (a folder ends in ``/``): the
    detail run's folder and the drawings only when they are made."""
    return ["cache/", *SAVED_FILES, *(["detail/"] if detail else []), *(DRAWINGS if report else [])]


def check_places(out: Path, names: list[str]) -> None:
    """Refuse a study folder where one of ``names`` (``study_places``) cannot be written, before
    any work is done: a file where a folder goes, a folder where a file goes, no permission."""
    for name in names:
        path = out / name.rstrip("/")
        problem = output_problem(path, folder=name.endswith("/"))
        if problem:
            raise ConfigError(str(path), None, problem)


# -- what a study saved ---------------------------------------------------------------------------


class _Saved(BaseModel):
    """The keys of a saved JSON file that the plots and the report read; the others are let be."""

    model_config = ConfigDict(extra="allow")


class _Excluded(_Saved):
    where: dict[str, Any]
    reason: str
    points: int


class Settings(_Saved):
    """``study.json`` (sim.study.runner.write_settings)."""

    name: str
    file: str | None
    description: str | None = ""
    question: str | None = ""
    study: StudySpec
    axes: dict[str, Annotated[list[Any], Field(min_length=1)]] = Field(default_factory=dict)
    simulator: str
    base_spec: dict[str, Any]
    hardware_file: str | None
    model_file: str | None
    hardware_headline: dict[str, Any] = Field(default_factory=dict)
    hardware_sources: list[tuple[Any, Any, Any, Any]] = Field(default_factory=list)
    excluded: list[_Excluded] = Field(default_factory=list)


class Timing(_Saved):
    """``timing.json`` (sim.study.runner._run_study): the report's "Runs" line."""

    points: int
    simulated: int
    cached: int
    failed: int
    wall_s: float
    points_per_s: float
    executor: str
    jobs: int | None


class DetailMeta(_Saved):
    """``detail/meta.json`` of a detail run that succeeded (sim.study.runner.run_detail)."""

    store: str
    levels: list[str]
    peaks_GBps: dict[str, float]
    matrix_peak_TFLOPs: float
    matmul_dtype: str
    vector_peak_Tops: float | None = None
    vector_efficiency: float = 1.0
    assignments: list[tuple[str, Any]] = Field(default_factory=list)


@dataclass(frozen=True)
class Saved:
    """A study folder's saved files, checked."""

    table: pd.DataFrame
    settings: dict
    timing: dict | None  # None: no timing.json (the report leaves out its "Runs" line)
    detail: dict | None  # detail/meta.json of a detail run with tables to plot, else None


def load_saved(out: Path) -> Saved:
    """Read and check every file of the study folder ``out`` that the plots and the report
    read; the first missing or damaged one is a ConfigError naming it."""
    for name in ("results.parquet", "study.json"):
        if not (out / name).is_file():
            raise ConfigError(str(out), name, "missing; expected a folder written by `decodesim study`")
    settings = read_json_as(Settings, out / "study.json")
    timing = read_json_as(Timing, out / "timing.json") if (out / "timing.json").exists() else None
    table = read_results(out, list(settings["axes"]))
    return Saved(table, settings, timing, read_detail(out / "detail"))


def read_results(out: Path, axes: Sequence[str] = ()) -> pd.DataFrame:
    """``results.parquet`` of the study folder ``out``: a table with the columns every study
    table has (``axes``: the study's swept axes too), and a latency where a point ran."""
    path = out / "results.parquet"
    table = read_table(path, _what(path), [*RESULT_COLUMNS, *axes])
    if LATENCY not in table.columns and (table["status"] == "ok").any():
        raise ConfigError(str(path), None, f"not {_what(path)}: it has points that ran but no column {LATENCY!r}")
    return table


def read_detail(folder: Path) -> dict | None:
    """The detail run's ``meta.json``, checked with the op and event tables it describes; None
    when there is nothing to plot (no detail run, a run that failed, no event log)."""
    meta_path = folder / "meta.json"
    if not meta_path.exists():
        return None
    meta = check_json(_Saved, read_json(meta_path), meta_path)
    if meta.get("error") or not (folder / "events.parquet").exists():
        return None
    check_json(DetailMeta, meta, meta_path)
    read_table(folder / "events.parquet", _what(folder / "events.parquet"), EVENT_COLUMNS)
    ops_path = folder / "ops.parquet"
    ops = read_table(ops_path, _what(ops_path), OP_COLUMNS)
    for names in OP_TIMES:
        if not set(names) & set(ops.columns):
            raise ConfigError(str(ops_path), None, f"not {_what(ops_path)}: it has no column {names[0]!r}")
    return meta


def read_json_as(model: type[_Saved], path: Path) -> dict:
    """The JSON object in ``path``, checked against ``model`` (``check_json``)."""
    return check_json(model, read_json(path), path)


def check_json(model: type[_Saved], data: Any, path: Path) -> dict:
    """``data``, read from ``path``, if it holds what ``model`` asks: a missing key or a value
    of the wrong kind is a ConfigError naming the file and the key."""
    if not isinstance(data, dict):
        raise ConfigError(str(path), None, f"not {_what(path)}: expected a JSON object", data)
    try:
        validate(model, data, path)
    except ConfigError as err:
        raise ConfigError(err.file, err.key_path, f"not {_what(path)}: {err.expected}", err.got) from None
    return data


def read_json(path: Path) -> Any:
    """The JSON value in ``path``; a file that cannot be read, is not text or is not JSON is a
    ConfigError naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(str(path), None, f"not {_what(path)}: not a text file") from None
    except OSError as err:
        raise ConfigError(str(path), None, f"cannot read file ({err.strerror or type(err).__name__})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(str(path), None, f"not {_what(path)}: invalid JSON ({err.msg}, line {err.lineno})") \
            from None


def _what(path: Path) -> str:
    """What the saved file ``path`` should be, for an error that says it is not."""
    kind = "table" if path.suffix == ".parquet" else "JSON"
    owner = "a detail run's" if path.parent.name == "detail" else "a study folder's"
    return f"{owner} {path.name} (expected the {kind} that decodesim study writes)"


__all__ = ["load_saved", "read_results", "read_detail", "check_places", "study_places", "Saved", "Settings",
           "Timing", "DetailMeta"]
