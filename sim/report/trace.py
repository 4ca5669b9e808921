"""Chrome/Perfetto trace JSON of one step's timeline: one track per resource.

Events come from the engine's log tuples (step, layer, op, resource, kind, t_start_ns,
t_end_ns, bytes, flops); times are written in microseconds as the format expects.
"""

from __future__ import annotations

import json


def chrome_trace(log: list[tuple], step: int | None = None) -> str:
    rows = [r for r in log if step is None or r[0] == step]
    resources = sorted({r[3] for r in rows})
    tid = {name: i + 1 for i, name in enumerate(resources)}
    events = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid[name], "args": {"name": name}}
              for name in resources]
    for s, layer, op, resource, kind, t0, t1, nbytes, flops in rows:
        events.append({"name": f"{op} L{layer}" if layer >= 0 else op, "cat": kind, "ph": "X", "pid": 1,
                       "tid": tid[resource], "ts": t0 / 1e3, "dur": max(0.0, (t1 - t0) / 1e3),
                       "args": {"kind": kind, "bytes": nbytes, "flops": flops, "layer": layer, "step": s}})
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ns"})
