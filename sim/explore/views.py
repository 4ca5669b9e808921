"""From the page's form to the CLI's own answers: argument list, spec, run, views.

A form is a dict of text fields (``hardware``, ``batch``, ``overrides``, ...). ``run_argv``
turns it into the argument list of ``decodesim run`` (``--batch=16``, one ``--set=`` per
override line), which the run command's own argparse options parse and ``spec_from_args``
validates, exactly as the CLI does; ``sim.run.simulate`` then runs it. So the page's number
is the CLI's figure for the same arguments, and bad input gets the CLI's one-line error
(``FormError``, whose text is what ``decodesim`` prints on stderr).

Names, never paths: every field that the CLI would accept as a file (hardware, model,
formats, stack, routing; ``trace``) must be a name of the bundled lists, also when set
through ``--set``; a name that is not bundled but could only be a name (letters, digits,
``-``, ``_``) goes on to the CLI, which reports it as unknown with the bundled choices.

Bounds the page adds to the CLI's (a local page should answer within seconds): at most
``MAX_STEPS`` decode steps, ``MAX_FIELD_CHARS`` characters a field, ``MAX_OVERRIDES``
overrides; a serving replay of at most ``MAX_SERVE_DURATION_S`` seconds of arrivals and
``MAX_RATES`` rates.
"""

from __future__ import annotations

import argparse
import re
import shlex
from functools import lru_cache
from pathlib import Path

from sim import api
from sim.config.defaults import DISPATCHES, PLACEMENTS, ROUTING_KINDS, RUN_DEFAULTS
from sim.config.loader import validate
from sim.config.software import software_dir
from sim.config.spec import apply_run_overrides
from sim.errors import COMMAND_LINE, ConfigError, SimulationError, error_line
from sim.explore.compute import MAX_STEPS, RUN_FLAGS, FormError, curves_for, plain, roofline_of
from sim.formats.base import list_formats
from sim.options.run import add_run_command_options
from sim.options.serve import add_serve_options
from sim.options.spec import spec_from_args
from sim.paths import bundled, formats_dir, hardware_dir, models_dir
from sim.run import simulate
from sim.serve.spec import ServeSpec
from sim.serve.sweep import grid, run_point

MAX_FIELD_CHARS = 2000
MAX_OVERRIDES = 50
MAX_SERVE_DURATION_S = 120.0
MAX_RATES = 8
MAX_SETUPS = 6
MAX_SERVE_ARRIVALS = 20_000  # rate x seconds of arrivals, per replay
SERVE_REQUESTS = ("synthetic", "azure-conv", "azure-code")

# form fields: RunSpec fields by their run option (sim.explore.compute.RUN_FLAGS), passed as
# --flag=VALUE so text that starts with "-" stays a value
OPTIONAL = frozenset({"tp", "pp", "chips", "software"})  # empty: not given (the CLI's default)
SERVE_FLAGS = {"hardware": "--hardware", "model": "--model", "weights": "--weights", "kv": "--kv",
               "software": "--software", "tp": "--tp", "pp": "--pp", "chips": "--chips",
               "target_ms": "--target-ms", "requests": "--requests", "duration_s": "--duration-s"}
FORM_KEYS = frozenset(RUN_FLAGS) | {"graph", "overrides", "allow_long_context", "label"}
SERVE_KEYS = FORM_KEYS | {"requests", "duration_s", "rates"}
NAME_FIELDS = ("hardware", "model", "weights", "kv", "software", "routing")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


class _Parser(argparse.ArgumentParser):
    """The CLI's parser, raising instead of printing and exiting (same message text)."""

    def error(self, message):
        raise FormError(f"decodesim: {message}")

    def exit(self, status=0, message=None):
        raise FormError(f"decodesim: {(message or 'stopped').strip()}")


@lru_cache(maxsize=1)
def _parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The ``run`` and ``serve`` subcommands' own options (sim.options.run / serve, as the CLI's)."""
    out = []
    for name, add_options in (("run", add_run_command_options), ("serve", add_serve_options)):
        parser = _Parser(prog="decodesim")
        add_options(parser.add_subparsers(dest="command", parser_class=_Parser).add_parser(name))
        out.append(parser)
    return out[0], out[1]


# -- the bundled lists ---------------------------------------------------------------------------


def _default_first(names: tuple[str, ...], field: str) -> list[str]:
    """``names`` with the run's default for ``field`` first (a menu opens on it)."""
    return [RUN_DEFAULTS[field], *(n for n in names if n != RUN_DEFAULTS[field])]


HELP = {
    "hardware": "the accelerator profile (hardware_profiles/): memory levels, compute, links, energy; --hardware",
    "model": "the model (workloads/models/): layers, heads, experts; --model",
    "weights": "the weight format: only formats valid for weights are listed (decodesim formats); --weights",
    "kv": "the KV-cache format: only formats valid for the KV cache are listed; --kv",
    "software": "the software stack, which kernels run each op; empty: the profile's own stack (a wafer's "
                "static-schedule, a GPU's fused), as decodesim run without --software",
    "dispatch": "MoE only: how tokens reach their experts: device (on-chip routing), host_sync (the host "
                "reads the routing, a round trip each layer), sram_zero_copy (experts read in place); --dispatch",
    "placement": "MoE only: where expert weights live: static (hottest pinned in SRAM), all-hbm, lru/lfu "
                 "(an SRAM cache), spread (over the chips: expert parallelism); --placement",
    "routing": "MoE only: which experts tokens pick: uniform, zipf (skewed; --set routing_skew=S) or a "
               "bundled routing trace; --routing",
    "engine": "des: the discrete-event simulation; analytic: the closed form on the same op graph (faster); "
              "--engine",
    "graph": "launch the step as one captured graph or kernel by kernel; empty: the stack's choice; "
             "--graph / --no-graph",
    "batch": "sequences decoded together in each step; --batch",
    "context": "tokens in each sequence's KV cache at the first step; --context",
    "steps": "decode steps simulated (the explorer runs at most 64); --steps",
    "target_ms": "the per-token latency target the verdict is judged against (ms); --target-ms",
    "tp": "tensor-parallel chips; empty: min(chips, 8); --tp",
    "pp": "pipeline stages; empty: chips / tp; --pp",
    "chips": "chip count; empty: the profile's system.chips; --chips",
    "overrides": "any profile, model or run field, one DOTTED.PATH=VALUE a line, e.g. "
                 "hardware.hbm.channel_bandwidth_GBps=30; --set",
    "allow_long_context": "simulate contexts beyond the model's max_context (refused otherwise); "
                          "--allow-long-context",
    "label": "the name this setup has in cards, tables, legends and CSV",
    "requests": "serving: the request source: synthetic (Poisson arrivals, log-normal lengths) or a bundled "
                "Azure trace's lengths; --requests",
    "duration_s": "serving: seconds of arrivals replayed (at most 120; rate x seconds at most 20,000 requests); "
                  "--duration-s",
    "rates": "serving: requested rates (requests per second), a comma list; one replay each; --rates",
    "search_hardware": "search: the profiles to search, a comma list (at most 4); --hardware",
    "ttft_ms": "search: the time-to-first-token target (ms) a deployment must hold at p99; --ttft-ms",
    "tpot_ms": "search: the time-per-output-token target (ms) a deployment must hold at p99; --tpot-ms",
    "search_rate": "search: requests per second every deployment is judged at; empty: each at 90% of its own "
                   "capacity; --rate",
    "max_replays": "search: how many front deployments are confirmed by a serving replay (at most 8); "
                   "--max-replays",
}


@lru_cache(maxsize=1)
def options() -> dict:
    """What the page's menus offer: the bundled names of each list (formats valid as weights
    and as KV apart), the CLI's defaults, the limits and a help line per field."""
    def stems(folder: Path) -> list[str]:
        return sorted(p.stem for p in folder.glob("*.yaml"))

    formats = stems(formats_dir())
    return {
        "hardware": stems(hardware_dir()), "model": stems(models_dir()), "formats": formats,
        "weights": [f.name for f in list_formats("weights")], "kv": [f.name for f in list_formats("kv")],
        "software": [""] + stems(software_dir()),
        "routing": list(ROUTING_KINDS) + sorted(p.stem for p in bundled("workloads", "routing").glob("*.jsonl")),
        "dispatch": _default_first(DISPATCHES, "dispatch"),
        "placement": _default_first(PLACEMENTS, "placement"), "engine": ["des", "analytic"],
        "graph": ["", "graph", "eager"], "requests": list(SERVE_REQUESTS),
        "defaults": {**RUN_DEFAULTS, "software": "", "requests": "synthetic", "duration_s": 30, "rates": "2, 4, 8, 16"},
        "limits": {"steps": MAX_STEPS, "duration_s": MAX_SERVE_DURATION_S, "rates": MAX_RATES, "setups": MAX_SETUPS,
                   "arrivals": MAX_SERVE_ARRIVALS},
        "help": HELP,
    }


def _allowed(field: str) -> list[str]:
    o = options()
    return o["formats"] if field in ("weights", "kv") else [c for c in o[field] if c]


def check_name(field: str, value, where: str = "form") -> None:
    """Raise FormError unless ``value`` is a bundled name of ``field``'s list, or text that can
    only be a name (the CLI then says it is unknown); never a path."""
    if value is None or (field == "software" and value == ""):
        return
    text = str(value)
    if text in _allowed(field) and not Path(text).is_file():
        return
    if _NAME.fullmatch(text) and not Path(text).is_file():
        return
    raise FormError(f"decodesim: {where}: {field}: the explorer reads bundled names only, never a path; expected "
                    f"one of: {', '.join(_allowed(field))}, got {text[:80]!r}")


# -- form -> argument list -----------------------------------------------------------------------


def _text(form: dict, key: str) -> str:
    value = form.get(key, "")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise FormError(f"decodesim: form: {key}: expected text, got {type(value).__name__}")
    text = str(value)
    if len(text) > MAX_FIELD_CHARS or "\x00" in text:
        raise FormError(f"decodesim: form: {key}: expected at most {MAX_FIELD_CHARS} characters of text, "
                        f"got {len(text)}")
    return text.strip()


def _check_form(form, keys: frozenset) -> dict:
    if not isinstance(form, dict):
        raise FormError(f"decodesim: form: expected an object of fields, got {type(form).__name__}")
    unknown = sorted(str(k)[:40] for k in form if k not in keys)
    if unknown:
        raise FormError(f"decodesim: form: {unknown[0]}: unknown field; expected one of: {', '.join(sorted(keys))}")
    return form


def _overrides(form: dict) -> list[str]:
    value = form.get("overrides", "")
    lines = value if isinstance(value, list) else None
    if lines is None:
        lines = _text(form, "overrides").splitlines()
    elif not all(isinstance(v, str) for v in lines):
        raise FormError("decodesim: form: overrides: expected lines of DOTTED.PATH=VALUE text")
    lines = [line.strip() for line in lines if line.strip()]
    if len(lines) > MAX_OVERRIDES or any(len(line) > MAX_FIELD_CHARS for line in lines):
        raise FormError(f"decodesim: form: overrides: expected at most {MAX_OVERRIDES} lines of at most "
                        f"{MAX_FIELD_CHARS} characters")
    return lines


def _common_argv(form: dict, flags: dict) -> list[str]:
    argv = []
    for key, flag in flags.items():
        if key not in form:
            continue
        text = _text(form, key)
        if key in NAME_FIELDS:
            check_name(key, text)
        if text == "" and key in OPTIONAL:
            continue
        argv.append(f"{flag}={text}")
    graph = _text(form, "graph") if "graph" in form else ""
    if graph not in ("", "graph", "eager"):
        raise FormError(f"decodesim: form: graph: expected '' (the stack's), 'graph' or 'eager', got {graph[:40]!r}")
    if graph:
        argv.append("--graph" if graph == "graph" else "--no-graph")
    argv += [f"--set={line}" for line in _overrides(form)]
    return argv


def run_argv(form: dict) -> list[str]:
    """The ``decodesim run`` arguments the form asks for (FormError if it cannot be one)."""
    form = _check_form(form, FORM_KEYS)
    argv = _common_argv(form, RUN_FLAGS)
    flag = form.get("allow_long_context", False)
    if flag not in (True, False, "", "on", "true", "false"):
        raise FormError(f"decodesim: form: allow_long_context: expected true or false, got {str(flag)[:40]!r}")
    if flag in (True, "on", "true"):
        argv.append("--allow-long-context")
    return argv


def command_line(command: str, argv: list[str]) -> str:
    """``decodesim COMMAND ...`` as a shell line (``--flag value``) to rerun a view."""
    words = ["decodesim", command]
    for arg in argv:
        flag, sep, value = arg.partition("=")
        words += [flag, value] if sep else [flag]
    return shlex.join(words)


def spec_of(argv: list[str]):
    """The validated RunSpec of ``decodesim run ARGV``, names checked again after ``--set``."""
    try:
        args = _parsers()[0].parse_args(["run", *argv])
        spec = spec_from_args(args)
        effective = apply_run_overrides(spec)
    except (ConfigError, SimulationError) as err:
        raise FormError(error_line(err, COMMAND_LINE)) from None
    for field in NAME_FIELDS:
        check_name(field, getattr(effective, field), "--set")
    if effective.trace is not None:
        raise FormError("decodesim: --set: trace: the explorer replays no trace files (run `decodesim run --trace` "
                        "for one)")
    if effective.steps > MAX_STEPS:
        raise FormError(f"decodesim: form: steps: the explorer simulates at most {MAX_STEPS} steps a run (use "
                        f"`decodesim run` for more), got {effective.steps}")
    return spec


# -- views ---------------------------------------------------------------------------------------


def setups_of(body) -> list[tuple[str, dict]]:
    """The setups a request names, each with its default label: ``{"setups": [form, ...]}``
    (1 to ``MAX_SETUPS``; labels A, B, C, ...) or ``{"a": form, "b": form | null}``."""
    if isinstance(body, dict) and "setups" in body:
        forms = body["setups"]
        if not isinstance(forms, list) or not 1 <= len(forms) <= MAX_SETUPS:
            raise FormError(f"decodesim: form: setups: expected a list of 1 to {MAX_SETUPS} setups")
        return [(chr(ord("A") + i), form) for i, form in enumerate(forms)]
    if not isinstance(body, dict) or "a" not in body:
        raise FormError("decodesim: form: expected {\"setups\": [{fields}, ...]}")
    out = [("A", body["a"])]
    if body.get("b") is not None:
        out.append(("B", body["b"]))
    return out


def label_of(form: dict, default: str) -> str:
    """The form's ``label`` (at most 40 characters), else ``default``."""
    label = form.get("label", default) if isinstance(form, dict) else default
    return str(label)[:40] if isinstance(label, str) and label.strip() else default


def config_view(form: dict, label: str = "A") -> dict:
    """One configuration: its ``decodesim run --json`` summary, its roofline, its command line."""
    label = label_of(form, label)
    argv = run_argv(form)
    spec = spec_of(argv)
    try:
        result = simulate(spec, keep_ops=True)
        roof = roofline_of(result)
    except (ConfigError, SimulationError) as err:
        raise FormError(error_line(err, COMMAND_LINE)) from None
    return {"label": label, "argv": argv, "command": command_line("run", argv), "summary": plain(result.summary),
            "roofline": plain(roof)}


def curves_of(form: dict, superseded=lambda: False, axes=("batch", "context")) -> dict:
    """The curves (``curves_for``) of the form's configuration."""
    return curves_for(spec_of(run_argv(form)), superseded, axes)


# -- serving -------------------------------------------------------------------------------------


def _rates(form: dict) -> list[float]:
    text = _text(form, "rates") if "rates" in form else "2, 4, 8, 16"
    try:
        rates = [float(v) for v in text.replace(";", ",").split(",") if v.strip()]
    except ValueError:
        raise FormError(f"decodesim: command line: --rates: expected a comma list of numbers, got {text[:80]!r}") \
            from None
    if not rates or any(not 0 < r < 1e6 for r in rates) or len(rates) > MAX_RATES:
        raise FormError(f"decodesim: command line: --rates: expected 1 to {MAX_RATES} numbers > 0 (requests per "
                        f"second), got {text[:80]!r}")
    return sorted(set(rates))


def serve_points(form: dict) -> tuple[list, str]:
    """The serving sweep's points (one ServeSpec per rate) as ``decodesim serve ... --rates``
    builds them (sim.serve.sweep.grid), and its command line."""
    form = _check_form(form, SERVE_KEYS)
    requests = _text(form, "requests") if "requests" in form else "synthetic"
    if requests not in SERVE_REQUESTS:
        raise FormError(f"decodesim: form: requests: the explorer replays bundled sources only; expected one of: "
                        f"{', '.join(SERVE_REQUESTS)}, got {requests[:80]!r}")
    serve_form = {k: v for k, v in form.items() if k in SERVE_FLAGS or k in ("graph", "overrides")}
    serve_form.setdefault("duration_s", "30")
    serve_form["requests"] = requests
    argv = _common_argv(serve_form, SERVE_FLAGS)
    rates = _rates(form)
    try:
        args = _parsers()[1].parse_args(["serve", *argv])
        if args.duration_s is None or not 0 < args.duration_s <= MAX_SERVE_DURATION_S:
            raise FormError(f"decodesim: form: duration_s: the explorer replays at most {MAX_SERVE_DURATION_S:g} s "
                            f"of arrivals, got {args.duration_s}")
        if max(rates) * args.duration_s > MAX_SERVE_ARRIVALS:
            raise FormError(f"decodesim: form: rates: the explorer replays at most {MAX_SERVE_ARRIVALS:,} requests "
                            f"a replay (rate x seconds of arrivals), got {max(rates):g} x {args.duration_s:g} s; use "
                            f"`decodesim serve` for more")
        for path in (a.partition("=")[0] for a in args.overrides):
            if path.strip() in NAME_FIELDS + ("requests", "trace"):
                raise FormError(f"decodesim: --set: {path.strip()}: set it with the form's menus")
        base = validate(ServeSpec, {
            "hardware": args.hardware, "model": args.model, "weights": args.weights, "kv": args.kv,
            "software": args.software, "graph": args.graph, "tp": args.tp, "pp": args.pp, "chips": args.chips,
            "overrides": args.overrides, "requests": args.requests, "rate": rates[0],
            "duration_s": args.duration_s, "target_ms": args.target_ms}, COMMAND_LINE)
        points = grid(base, rates=rates)
    except (ConfigError, SimulationError) as err:
        raise FormError(error_line(err, COMMAND_LINE)) from None
    line = command_line("serve", argv) + " --rates " + ",".join(f"{r:g}" for r in rates)
    return points, line


SERVE_ONLY = ("requests", "duration_s", "rates")
SERVE_UNUSED = ("dispatch", "placement", "routing", "engine", "batch", "context", "steps", "allow_long_context")


def serve_job(body) -> tuple[list[tuple[str, object]], str]:
    """The points of a serving sweep over every setup, ``(label, ServeSpec)`` per setup and
    rate, and the ``decodesim serve`` lines that give the same rows (one a setup). The body is
    ``{"setups": [form, ...], "serving": {"requests", "duration_s", "rates"}}`` or ``{"form":
    form}`` (one setup, the serving fields in it). A setup's ``SERVE_UNUSED`` fields do not
    apply: the replay's scheduler decides batches and contexts."""
    if isinstance(body, dict) and "form" in body:
        labelled, serving = [("A", body["form"])], {}
    else:
        labelled = setups_of(body)
        serving = body.get("serving") or {}
        if not isinstance(serving, dict) or any(k not in SERVE_ONLY for k in serving):
            raise FormError(f"decodesim: form: serving: expected an object of {', '.join(SERVE_ONLY)}")
    points, lines = [], []
    for label, form in labelled:
        if not isinstance(form, dict):
            raise FormError(f"decodesim: form: expected an object of fields, got {type(form).__name__}")
        label = label_of(form, label)
        mine = {k: v for k, v in form.items() if k not in SERVE_UNUSED and k != "label"} | serving
        found, line = serve_points(mine)
        points += [(label, point) for point in found]
        lines.append(line)
    return points, "\n".join(lines)


SEARCH_KEYS = ("model", "hardware", "ttft_ms", "tpot_ms", "rate", "requests", "duration_s", "max_replays")
MAX_SEARCH_HARDWARE = 4
MAX_SEARCH_REPLAYS = 8
MAX_SEARCH_DURATION_S = 60.0


def search_options(form) -> dict:
    """The ``decodesim search`` options (keywords of sim.api.search) the page's search form asks
    for, checked: bundled names only, at most ``MAX_SEARCH_HARDWARE`` profiles,
    ``MAX_SEARCH_REPLAYS`` confirming replays and ``MAX_SEARCH_DURATION_S`` s of arrivals each;
    the CLI's parser checks the rest (FormError with its line)."""
    form = _check_form(form, frozenset(SEARCH_KEYS))
    text = {k: _text(form, k) for k in SEARCH_KEYS if k in form and _text(form, k) != ""}
    hardware = [h.strip() for h in text.get("hardware", "h200-sxm").split(",") if h.strip()]
    if not 1 <= len(hardware) <= MAX_SEARCH_HARDWARE:
        raise FormError(f"decodesim: form: hardware: the explorer searches 1 to {MAX_SEARCH_HARDWARE} profiles, "
                        f"got {len(hardware)}")
    for name in hardware:
        check_name("hardware", name)
    check_name("model", text.get("model", "llama-3-8b"))
    requests = text.get("requests", "synthetic")
    if requests not in SERVE_REQUESTS:
        raise FormError(f"decodesim: form: requests: the explorer replays bundled sources only; expected one of: "
                        f"{', '.join(SERVE_REQUESTS)}, got {requests[:80]!r}")
    options = {"model": text.get("model", "llama-3-8b"), "hardware": ",".join(hardware),
               "ttft_ms": text.get("ttft_ms", "2000"), "tpot_ms": text.get("tpot_ms", "50"),
               "rate": text.get("rate"), "requests": requests, "duration_s": text.get("duration_s", "30"),
               "max_replays": text.get("max_replays", "4"), "jobs": "1", "quiet": True}
    try:
        args = api.parse(api.argv_of("search", options))
    except TypeError as err:
        raise FormError(f"decodesim: form: {err}") from None
    except ConfigError as err:
        raise FormError(error_line(err, COMMAND_LINE)) from None
    if args.duration_s is not None and not 0 < args.duration_s <= MAX_SEARCH_DURATION_S:
        raise FormError(f"decodesim: form: duration_s: the explorer's search replays at most "
                        f"{MAX_SEARCH_DURATION_S:g} s of arrivals, got {args.duration_s:g}")
    if args.max_replays is not None and not 0 <= args.max_replays <= MAX_SEARCH_REPLAYS:
        raise FormError(f"decodesim: form: max_replays: the explorer confirms at most {MAX_SEARCH_REPLAYS} "
                        f"deployments by replay, got {args.max_replays}")
    return {k: v for k, v in options.items() if v is not None}


def search_run(options: dict) -> dict:
    """``decodesim search ... --json`` (sim.api.search) in a worker process: the CLI's object,
    or ``{"error": line}`` for input the search refuses."""
    try:
        return plain(dict(api.search(**options)))
    except (ConfigError, SimulationError) as err:
        return {"error": error_line(err, COMMAND_LINE)}


def serve_row(point) -> dict:
    """One replay of the sweep as ``decodesim serve --rates`` tabulates it (sim.serve.sweep.run_point)."""
    return plain(run_point(point.model_dump_json()))


__all__ = ["FormError", "options", "check_name", "run_argv", "command_line", "spec_of", "config_view",
           "curves_of", "label_of", "serve_points", "serve_row", "serve_job", "setups_of", "HELP", "MAX_STEPS",
           "MAX_SETUPS", "search_options", "search_run"]
