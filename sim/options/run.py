"""The run options (``run``, ``compare``, ``solve``; the explorer's form), the ``run``
command's outputs, and the argparse types for output paths.

``SPEC_ARGS`` names the run options that become RunSpec fields (sim.options.spec). Light: no
validation stack, so ``decodesim --help`` starts without pydantic.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sim.config.defaults import DISPATCHES, PLACEMENTS, RUN_DEFAULTS
from sim.errors import COMMAND_LINE
from sim.io import output_problem


def output_file(text: str) -> Path:
    """An argparse type: a file path that can be written (checked before any work is done)."""
    return _writable(text, folder=False)


def output_dir(text: str) -> Path:
    """An argparse type: a folder that exists or can be made, and can be written into."""
    return _writable(text, folder=True)


def _writable(text: str, folder: bool) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, not an empty text")
    path = Path(text)
    problem = output_problem(path, folder=folder)
    if problem:
        raise argparse.ArgumentTypeError(f"{text}: {problem}")
    return path


def add_run_options(p: argparse.ArgumentParser, *, formats: bool = True) -> None:
    """The options that make one RunSpec (``SPEC_ARGS``); ``formats=False`` leaves out
    ``--weights`` and ``--kv`` for a command that defines its own (compare)."""
    d = argparse.Namespace(**RUN_DEFAULTS)  # RunSpec's defaults, without importing the validation stack
    p.set_defaults(spec_source=COMMAND_LINE)
    p.add_argument("--hardware", default=d.hardware, help=f"profile name or YAML path (default {d.hardware})")
    p.add_argument("--model", default=d.model, help=f"model name or YAML path (default {d.model})")
    p.add_argument("--batch", type=int, default=d.batch, help="sequences per step (default 1)")
    p.add_argument("--context", type=int, default=d.context, help="tokens in each cache at the first step (default 4096)")
    p.add_argument("--trace", default=None, help="decode trace file to replay (JSONL, Parquet or CSV)")
    p.add_argument("--allow-long-context", action="store_true",
                   help="simulate contexts beyond the model's max_context (an error otherwise)")
    if formats:
        p.add_argument("--weights", default=d.weights, help="weight format (default bf16; see `decodesim formats`)")
        p.add_argument("--kv", default=d.kv, help="KV-cache format (default fp16)")
    p.add_argument("--steps", type=int, default=d.steps, help="decode steps to simulate (default 8)")
    p.add_argument("--target-ms", type=float, default=d.target_ms, help="per-token latency target (default 10)")
    p.add_argument("--engine", choices=["des", "analytic"], default=d.engine, help="discrete-event or closed form")
    p.add_argument("--graph", action=argparse.BooleanOptionalAction, default=None,
                   help="run the step as a captured graph or launch kernels one by one (default: the stack's)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel chips (default: min(chips, 8))")
    p.add_argument("--pp", type=int, default=None, help="pipeline stages (default: chips / tp)")
    p.add_argument("--software", default=None, metavar="STACK|PATH",
                   help="software stack (workloads/software/: fused, fused-naive-kv, torch-graph, torch-graph-grouped, "
                        "torch-graph-fused-moe, torch-graph-dense, torch-graph-fp8-static, torch-graph-kv-quant, "
                        "torch-graph-dequant-kv, torch-eager, static-schedule) or a stack YAML: which kernels run "
                        f"each op (default: the profile's own stack where it names one, else {d.software})")
    p.add_argument("--chips", type=int, default=None, help="chip count (overrides the profile's system.chips)")
    p.add_argument("--microbatches", type=int, default=1, metavar="M",
                   help="split each step's sequences into M micro-batches in flight, each on its own streams: "
                        "pipeline stages overlap, and one micro-batch's links overlap another's compute; for a MoE "
                        "model each routes its own tokens (two-batch overlap at M = 2) (default 1, or the stack's "
                        "moe_microbatches)")
    moe = p.add_argument_group("Mixture-of-Experts (models with a moe: section)")
    moe.add_argument("--dispatch", choices=DISPATCHES, default=d.dispatch,
                     help="expert dispatch path (default device)")
    moe.add_argument("--placement", choices=PLACEMENTS, default=d.placement,
                     help="where expert weights live: all in HBM, hottest pinned in SRAM (static), an SRAM "
                          "cache (lru, lfu), or spread over the chips (expert parallelism) (default static)")
    moe.add_argument("--routing", default=d.routing,
                     help="uniform, zipf (see --set routing_skew=S, routing_locality=P) or a routing file (JSONL)")
    moe.add_argument("--attention-dp", dest="attention_dp", type=int, default=1, metavar="G",
                     help="attention data-parallel groups: each of G groups of chips/G holds every attention weight "
                          "(tp inside the group) and decodes batch/G of the sequences; with --placement spread the "
                          "experts spread over all chips (DeepSeek's layout) (default 1)")
    moe.add_argument("--redundant-experts", dest="redundant_experts", type=int, default=0, metavar="R",
                     help="with --placement spread: R extra replicas of each MoE layer's hottest experts, packed "
                          "to even the EP ranks' loads (DeepSeek's EPLB) (default 0)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="DOTTED.PATH=VALUE",
                   help="override any profile, model or run field, e.g. hardware.hbm.channel_bandwidth_GBps=30")


SPEC_ARGS = ("hardware", "model", "batch", "context", "trace", "weights", "kv", "steps", "target_ms", "engine",
             "graph", "tp", "pp", "software", "overrides", "chips", "dispatch", "placement", "routing",
             "allow_long_context", "microbatches", "attention_dp", "redundant_experts")


def add_run_command_options(p: argparse.ArgumentParser) -> None:
    """The ``run`` command's arguments: the run options, then its outputs."""
    add_run_options(p)
    p.add_argument("--out", type=output_dir, default=None, help="write per-step and per-op tables (Parquet + CSV) here")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--band", action="store_true", help="add a p10-p90 band on the per-token latency from the uncertainty of the profile's figures, and the figure groups that decide it (sim/experiments/band.py)")
    p.add_argument("--trace-out", type=output_file, default=None,
                   help="write a Chrome/Perfetto trace JSON of the timeline (every step; see --trace-steps)")
    p.add_argument("--html", type=output_file, default=None, metavar="FILE",
                   help="also write the explorer's view (breakdown, roofline, latency against batch and context) "
                        "as one self-contained HTML file that opens offline")
    p.add_argument("--trace-steps", default=None, metavar="A:B",
                   help="steps the trace keeps, A <= step < B (either end may be left out; default all)")
    p.add_argument("--estimates", type=int, nargs="?", const=3, default=None, metavar="N",
                   help="also name the N (default 3) estimated profile figures that decide the answer: each "
                        "estimate set to -50%% and +50%%, the analytic step rerun, ranked by the ms it moves "
                        "(two analytic runs per estimate)")
