"""The ``serve`` command's options (one replay, a sweep, a serving study; the explorer's
serving tab parses them too). Light, like sim.options.run: the loader loads only when a
number option is parsed.
"""

from __future__ import annotations

import argparse
import re

from sim.errors import COMMAND_LINE
from sim.options.run import output_dir
from sim.serve.clients import CLIENTS
from sim.serve.scheduler import DEFAULT_MAX_BATCH, DEFAULT_MAX_TOKENS_PER_STEP, POLICIES, VLLM_BLOCK_TOKENS


def _decimal(text: str) -> float:
    """An argparse type: a plain decimal number (no hex, underscores, inf, nan or subnormals)."""
    # deferred: this module is imported on every start to build the parser; the loader
    # (pydantic, PyYAML) only when a serve option is parsed
    from sim.config.loader import parse_number

    try:
        return parse_number(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _whole(text: str) -> int:
    """An argparse type: a plain decimal whole number (``-1`` passes here; ranges are checked later)."""
    stripped = text.strip()
    if not re.fullmatch(r"[+-]?(0|[1-9][0-9]{0,29})", stripped):
        raise argparse.ArgumentTypeError(f"expected a whole number in plain decimal, got {text!r}")
    return int(stripped)


def _workers(text: str) -> int:
    """An argparse type: a number of worker processes, a whole number >= 1."""
    n = _whole(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number of worker processes >= 1, got {text!r}")
    return n


def add_serve_options(p: argparse.ArgumentParser) -> None:
    """The ``serve`` command's arguments."""
    p.set_defaults(spec_source=COMMAND_LINE)
    p.add_argument("--hardware", default="h200-sxm", help="profile name or path; a comma list sweeps")
    p.add_argument("--model", default="llama-3-8b", help="model name or path; a comma list sweeps")
    p.add_argument("--weights", default="bf16", help="weight format (default bf16)")
    p.add_argument("--kv", default="fp16", help="KV-cache format; a comma list sweeps (e.g. fp16,int8,kivi-2)")
    p.add_argument("--software", default="fused", metavar="STACK|PATH",
                   help="software stack (workloads/software/) or a stack YAML (default fused)")
    p.add_argument("--graph", action=argparse.BooleanOptionalAction, default=None,
                   help="captured graphs or kernels launched one by one (default: the stack's; eager is slow to replay)")
    p.add_argument("--tp", type=_whole, default=None, help="tensor-parallel chips (default: min(chips, 8))")
    p.add_argument("--pp", type=_whole, default=None, help="pipeline stages (default: chips / tp)")
    p.add_argument("--chips", type=_whole, default=None, help="chip count (overrides the profile's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="DOTTED.PATH=VALUE",
                   help="override a profile or model field, as in `decodesim run --set`")
    p.add_argument("--requests", default="azure-conv",
                   help="azure-conv, azure-code (the full Azure 2023 hour), synthetic, or a request file "
                        "(.jsonl/.csv/.parquet with arrival_s, prompt_tokens, output_tokens)")
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--rate-scale", type=_decimal, default=None, help="replay a recorded trace at K x its rate")
    rate.add_argument("--rate", type=_decimal, default=None, help="requests per second (synthetic: the Poisson rate)")
    rate.add_argument("--rates", default=None, help="sweep: comma list of requests per second")
    rate.add_argument("--rate-scales", default=None, help="sweep: comma list of rate scales")
    p.add_argument("--duration-s", type=_decimal, default=None,
                   help="replay arrivals before this many seconds (synthetic default 600; traces: all)")
    p.add_argument("--prompt-median", type=_whole, default=1024, help="synthetic: median prompt tokens")
    p.add_argument("--output-median", type=_whole, default=256, help="synthetic: median output tokens")
    p.add_argument("--seed", type=_whole, default=0, help="synthetic arrivals' seed")
    p.add_argument("--max-batch", type=_whole, default=None,
                   help=f"most sequences per step (vLLM max_num_seqs; default: the policy's, {DEFAULT_MAX_BATCH} "
                        "for chunked)")
    p.add_argument("--block-tokens", type=_whole, default=None,
                   help=f"tokens per KV block (default: the policy's, {VLLM_BLOCK_TOKENS} for chunked, vLLM's)")
    p.add_argument("--max-tokens-per-step", type=_whole, default=None,
                   help="token budget per step (vLLM max_num_batched_tokens; default: the policy's, "
                        f"{DEFAULT_MAX_TOKENS_PER_STEP} for chunked)")
    p.add_argument("--policy", choices=list(POLICIES), default="chunked",
                   help="the engine's scheduler: chunked (vLLM V1 chunked prefill, default), separate (vLLM V0), "
                        "vllm-v1 (at its >= 70 GiB defaults), trtllm-no-evict, trtllm-max-util, sglang; each "
                        "brings its engine's documented limits (docs/serving.md)")
    p.add_argument("--target-ms", type=_decimal, default=10.0, help="p99 TPOT target (default 10)")
    p.add_argument("--ttft-target-ms", type=_decimal, default=None,
                   help="TTFT limit of a request that counts toward goodput (with TPOT <= --target-ms)")
    p.add_argument("--client", choices=list(CLIENTS), default="open-loop",
                   help="open-loop: requests at their timestamps (default); closed-loop: --concurrency N in "
                        "flight; offline: every request at 0")
    p.add_argument("--speculate-k", type=_whole, default=None,
                   help="speculative decoding: tokens drafted per verify step (default: none)")
    p.add_argument("--acceptance", default=None,
                   help="speculation: acceptance rate (default 0.7), or a comma list, one per drafted position")
    p.add_argument("--drafter", default=None,
                   help="speculation: eagle or mtp (heads: the target with one layer, default eagle) or a draft model")
    p.add_argument("--prefill-chips", default=None, metavar="P[,P...]",
                   help="disaggregated serving: the prefill pool's chips (tensor parallel); a comma list sweeps "
                        "the pool split (the decode pool then takes the profile's other chips unless given)")
    p.add_argument("--decode-chips", default=None, metavar="D[,D...]",
                   help="disaggregated serving: the decode pool's chips; the KV moves over the profile's links")
    p.add_argument("--concurrency", type=_whole, default=None,
                   help="requests in flight: closed-loop's N, or a cap on an open loop (vLLM --max-concurrency)")
    p.add_argument("--study", default=None, help="run a serving study YAML (kind: serve)")
    p.add_argument("--jobs", type=_workers, default=None, help="worker processes for sweeps (default: cores)")
    p.add_argument("--out", type=output_dir, default=None,
                   help="one replay: steps/requests Parquet, summary.json, over-time plot; sweep: table, "
                        "latency-vs-rate plot, report.md")
    p.add_argument("--replot", action="store_true",
                   help="sweep or study: redraw the plot and report from DIR/table.parquet without replaying")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar on stderr (it is shown only on a terminal, after 2 s)")
