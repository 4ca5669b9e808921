"""``decodesim profiles``: the bundled hardware profiles with their headline figures.

The arguments; sim.commands.handlers.profiles lists them.
"""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("profiles", help="list hardware profiles with headline figures")
    p.add_argument("--sources", metavar="NAME", default=None, help="print every number of one profile with its source")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(handler="sim.commands.handlers.profiles")
