"""``decodesim stack --from-profile TRACE``: write a software-stack YAML from a profiler trace of
one decode step of the user's own code (sim/calibrate/trace_stack.py says how it reads it)."""

from __future__ import annotations

from pathlib import Path

from sim.options.run import output_file


def register(sub) -> None:
    p = sub.add_parser("stack", help="write a software stack from a PyTorch profiler trace of one decode step",
                       description="Read a PyTorch profiler trace (Kineto / Chrome JSON, .json or .json.gz) of one "
                                   "decode step and write the software-stack YAML: the kernels of each op with their "
                                   "classes, graph or eager launch, host dispatch per class; ambiguous kernels listed.")
    p.add_argument("--from-profile", dest="trace", type=Path, required=True, metavar="TRACE",
                   help="the profiler trace of one decode step (torch.profiler ... export_chrome_trace)")
    p.add_argument("--like", default=None, help="bundled stack whose measured implementation tables and dispatch "
                                                "figures are kept (default: torch-graph or torch-eager by launch)")
    p.add_argument("--name", default=None, help="the stack's name (default: the trace file's stem)")
    p.add_argument("--out", type=output_file, default=None, metavar="PATH", help="write the YAML to PATH "
                                                                                  "(default: print it)")
    p.add_argument("--json", action="store_true", help="print the facts (ops, classes, ambiguous kernels) as JSON")
    p.set_defaults(handler="sim.commands.handlers.stack")
