"""What ``decodesim stack --from-profile`` does: read the trace, write the stack, list what is ambiguous."""

from __future__ import annotations

import json
import sys

import yaml

from sim.calibrate.trace_stack import read_trace, stack_from_trace
from sim.config.loader import load_yaml, validate
from sim.config.software import SoftwareStack
from sim.io import write_atomic
from sim.paths import bundled


def handle(args) -> int:
    _, launch = read_trace(args.trace)
    like_name = args.like or ("torch-graph" if launch == "graph" else "torch-eager")
    like_path = bundled("workloads", "software") / f"{like_name}.yaml"
    like = load_yaml(like_path if like_path.exists() else like_name)
    name = args.name or args.trace.name.split(".")[0]
    stack, ambiguous, facts = stack_from_trace(args.trace, like, name)
    validate(SoftwareStack, stack, args.out or args.trace)
    text = (f"# {name}: written by `decodesim stack --from-profile {args.trace.name}`; check the ambiguous kernels "
            f"({len(ambiguous)}) below and the classes before relying on it.\n"
            + "".join(f"# ambiguous: {k[:150]}\n" for k in ambiguous)
            + yaml.safe_dump(stack, sort_keys=False, default_flow_style=None, width=200))
    if args.out is not None:
        write_atomic(args.out, text)
    if args.json:
        print(json.dumps({**facts, "like": like_name, "written": str(args.out) if args.out else None}, indent=1))
        return 0
    if args.out is None:
        sys.stdout.write(text)
        return 0
    print(f"{args.trace}: {launch} launch, {facts['layers']} layers, {facts['kernels']} kernels "
          f"({facts['per_layer']} per layer); measured tables from {like_name}")
    for op, classes in facts["ops"].items():
        print(f"  {op:<12} {len(classes):>3}  {' '.join(classes)}")
    print(f"  ambiguous kernels: {len(ambiguous)}" + "".join(f"\n    {k[:120]}" for k in ambiguous))
    print(f"wrote {args.out}")
    return 0
