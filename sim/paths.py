"""Where bundled profiles and workloads live: the checkout, or the installed package.

From a checkout, ``hardware_profiles/`` and ``workloads/`` beside ``sim/`` are used. After
``pip install .`` the same folders are installed as package data under ``sim/_bundled/``,
with what ``decodesim validate`` and ``moe-report`` read (the H200 calibration CSVs and fit,
the validation set's data, the MoE report's hypothetical profile).
"""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path

from sim.errors import ConfigError

_PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = _PACKAGE.parent


@cache
def in_checkout() -> bool:
    """True when running from a source checkout (not an installed package); asked once per
    process (where the package runs from does not change while it runs)."""
    return (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "hardware_profiles").is_dir()


@cache
def bundled(*parts: str) -> Path:
    """The bundled folder ``parts`` (e.g. ``bundled("workloads", "models")``): beside sim/ in a
    checkout, under sim/_bundled/ when installed (pyproject.toml maps the same folders); found
    once per process, as ``in_checkout``."""
    checkout = _CHECKOUT.joinpath(*parts)
    if checkout.is_dir() and in_checkout():
        return checkout
    return _PACKAGE.joinpath("_bundled", *parts)


def hardware_dir() -> Path:
    return bundled("hardware_profiles")


def models_dir() -> Path:
    return bundled("workloads", "models")


def formats_dir() -> Path:
    return bundled("workloads", "formats")


def traces_dir() -> Path:
    return bundled("workloads", "traces")


def studies_dir() -> Path:
    return bundled("workloads", "studies")


def resolve(name_or_path: str, folder: Path, what: str, suffixes=(".yaml", ".yml"), builtin=()) -> Path:
    """A bundled name (``h200-sxm``) or a path to a file. Raises ConfigError if neither, listing
    the bundled names and ``builtin`` (names the caller answers itself, e.g. generated routing)."""
    # os.path on strings: a study resolves its profiles once per point
    try:
        if os.path.splitext(name_or_path)[1] in suffixes or "/" in name_or_path or os.path.isfile(name_or_path):
            candidate = Path(name_or_path)
            if not candidate.is_file():
                problem = f"is a folder; expected a {what} file" if candidate.is_dir() else f"{what} file not found"
                raise ConfigError(str(candidate), None, problem)
            return candidate
        for suffix in suffixes:
            path = _bundled_path(folder, f"{name_or_path}{suffix}")
            if path.is_file():
                return path
    except (OSError, ValueError) as err:  # a name the system will not look up (too long, a NUL byte)
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ConfigError(None, what, f"not a usable {what} name or path ({reason})", name_or_path) from None
    known = [*builtin, *sorted({p.name[: -len(suffix)] for suffix in suffixes for p in folder.glob(f"*{suffix}")})]
    raise ConfigError(
        None, what, f"unknown {what} {name_or_path!r}; expected a path or one of: {', '.join(known)}"
    )


@cache
def _bundled_path(folder: Path, name: str) -> Path:
    """``folder / name``, built once per process (whether it is a file is asked every time)."""
    return folder / name


BUNDLED_FOLDERS = ("hardware_profiles", "workloads")


def display_path(path: str | Path | None, base: str | Path | None = None) -> str | None:
    """A path as a report shows it, never as an absolute path of the machine it ran on:
    a bundled file relative to the checkout (``hardware_profiles/h200-sxm.yaml``, also for a
    file of another checkout or installation), any other file relative to ``base`` (the
    report's folder; default the working directory)."""
    if path is None:
        return None
    target = Path(path)
    if not target.is_absolute():
        return str(path)
    target = target.resolve()
    for root in (_CHECKOUT, _PACKAGE / "_bundled"):
        if target.is_relative_to(root):
            return str(target.relative_to(root))
    parts = target.parts
    for i in range(len(parts) - 2, 0, -1):  # a bundled file of another checkout or install
        if parts[i] in BUNDLED_FOLDERS:
            return str(Path(*parts[i:]))
    start = Path(base).resolve() if base is not None else Path.cwd()
    return os.path.relpath(target, start)


def relative_text(text: str) -> str:
    """``text`` (an error message, a setting) without absolute prefixes of bundled files:
    ``/home/x/decodesim/workloads/formats/a.yaml`` -> ``workloads/formats/a.yaml``."""
    for root in (_PACKAGE / "_bundled", _CHECKOUT):
        text = text.replace(f"{root}{os.sep}", "")
    folders = "|".join(BUNDLED_FOLDERS)
    return re.sub(rf"(?<![\w.])/(?:[^\s:'\"`/]+/)*?({folders})/", r"\1/", text)  # other checkouts, installs
