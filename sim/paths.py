"""Where bundled profiles and workloads live: the checkout, or the installed package.

From a checkout, ``hardware_profiles/`` and ``workloads/`` beside ``sim/`` are used. After
``pip install .`` the same folders are installed as package data under ``sim/_bundled/``,
with what ``decodesim validate`` and ``moe-report`` read (the H200 calibration CSVs and fit,
the validation set's data, the MoE report's hypothetical profile).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = _PACKAGE.parent


def in_checkout() -> bool:
    """True when running from a source checkout (not an installed package)."""
    return (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "hardware_profiles").is_dir()


def bundled(*parts: str) -> Path:
    """The bundled folder ``parts`` (e.g. ``bundled("workloads", "models")``): beside sim/ in a
    checkout, under sim/_bundled/ when installed (pyproject.toml maps the same folders)."""
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


def resolve(name_or_path: str, folder: Path, what: str, suffixes=(".yaml", ".yml")) -> Path:
    """A bundled name (``h200-sxm``) or a path to a file. Raises ConfigError if neither."""
    from sim.errors import ConfigError

    candidate = Path(name_or_path)
    if candidate.suffix in suffixes or "/" in name_or_path or candidate.is_file():
        if not candidate.is_file():
            raise ConfigError(str(candidate), None, f"{what} file not found")
        return candidate
    for suffix in suffixes:
        path = folder / f"{name_or_path}{suffix}"
        if path.is_file():
            return path
    known = sorted(p.stem for p in folder.glob("*.y*ml"))
    raise ConfigError(
        None, what, f"unknown {what} {name_or_path!r}; expected a path or one of: {', '.join(known)}"
    )
