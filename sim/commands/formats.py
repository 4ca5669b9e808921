"""``decodesim formats``: every format with its effective bits and reduction against fp16.

KV formats are shown at one context (``--context``) for the K and V row widths of one
model's cache (``--model``); weight formats on a 4096 x 4096 matrix. ``--report PATH``
writes the Markdown report (byte table, fidelity table, the claims check) instead.
"""

from __future__ import annotations

from sim.options.run import output_file


def register(sub) -> None:
    p = sub.add_parser("formats", help="list weight and KV formats: effective bits, reduction vs fp16",
                       description="List every bundled format with its effective bits per value (metadata, "
                                   "outliers and the full-precision window included) and its reduction against fp16.")
    p.add_argument("--model", default="llama-3-8b", help="model whose KV row widths are used (default llama-3-8b)")
    p.add_argument("--context", type=int, default=4096, help="tokens in the cache (default 4096)")
    p.add_argument("--role", choices=["kv", "weights"], default=None, help="only KV or only weight formats")
    p.add_argument("--json", action="store_true", help="print JSON rows instead of the table")
    p.add_argument("--report", type=output_file, default=None, metavar="PATH",
                   help="write the formats report (Markdown) to PATH, e.g. reports/formats.md")
    p.set_defaults(handler="sim.commands.handlers.formats")


