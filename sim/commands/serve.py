"""``decodesim serve``: serving replay (TTFT, TPOT, throughput, KV occupancy).

One replay: ``decodesim serve --requests azure-conv --rate-scale 2 --out DIR``. A sweep:
``--rates 2,4,8`` (or ``--rate-scales``) and/or comma lists in ``--kv``, ``--hardware``,
``--model``. A serving study: ``--study FILE`` (default output ``reports/<name>/``). See
docs/serving.md.

The arguments (sim.options.serve, which the explorer parses too); sim.commands.handlers.serve runs
them.
"""

from __future__ import annotations

from sim.options.serve import add_serve_options


def register(sub) -> None:
    p = sub.add_parser("serve", help="serving replay (open-loop, closed-loop or offline clients): TTFT, TPOT, throughput, KV occupancy",
                       description="Replay request arrivals through an engine's continuous-batching scheduler (vLLM, TensorRT-LLM, SGLang) "
                                   "with paged KV memory; each step takes the simulated step time.")
    add_serve_options(p)
    p.set_defaults(handler="sim.commands.handlers.serve")
