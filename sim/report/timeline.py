"""Chrome/Perfetto trace JSON (Trace Event Format) of a run's timeline, from the event log.

Events come from the engine's log records ``Span(step, layer, op, resource, kind,
t_start_ns, t_end_ns, bytes, flops)`` (sim.engine.records). Layout:

* process 0, "host": host spans (``resource == "host"``: graph launches, syncs, kernel
  dispatch) and one slice per decode step on a "decode steps" thread;
* one process per pipeline stage (``pid = stage + 1``), named with its chips: tensor
  parallelism makes the ``tp`` chips of a stage identical, so one is simulated and stands
  for all of them. A span belongs to the stage of its layer; layer -1 ops (embedding, LM
  head, sampling) go to the first stage before the last stage starts and to the last one
  after;
* inside a stage, one thread per resource (memory levels, compute, links, the on-chip
  network, ``kernels`` and any resource the log names), split into lanes where spans of one
  resource overlap (``hbm``, ``hbm #2``, ...): concurrent flows on a memory level, and for
  compute the groups of tiles running different ops at once ("tile group" lanes). Kernel
  spans (``resource == "kernels"``, ``op = "<op>/<kernel>"``, ``kind`` = kernel class) are
  named by the kernel, with the op and class in their arguments;
* flow arrows from each host launch or dispatch slice (``host.graph_launch``,
  ``host.dispatch``) to the first device slice of the op it launches;
* counter tracks per stage and resource that moved bytes: "<resource> bandwidth (GB/s)",
  the summed rate of its transfers, and "<resource> bytes in flight", the total size of the
  transfers started and not yet finished, both stepwise at every start and end.

Steps follow each other on one time axis: step ``s`` starts at the sum of the earlier
steps' times (``step_times_ns``, else each step's last span end). Times are written in
microseconds as the format expects; ``displayTimeUnit`` is ns. ``steps=(a, b)`` keeps steps
a <= s < b.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

from sim.units import ns_to_us

HOST_PID = 0
HOST = "host"
KERNELS = "kernels"
COMPUTE = "compute"
RESOURCE_ORDER = ("kernels", "compute", "hbm", "l2", "smem", "sram", "noc", "link", "pcie")


@dataclass(frozen=True)
class Layout:
    """Where the spans go: step origins, the pipeline stages' layers and chips per stage."""

    step_times_ns: dict[int, float] = field(default_factory=dict)  # step -> its duration
    stage_layers: tuple[tuple[int, ...], ...] = ()  # per stage, its layers (empty: one stage)
    tp: int = 1
    levels: tuple[str, ...] = ()  # memory levels, for naming


def trace_of(result, steps: tuple[int, int] | None = None) -> str:
    """The trace JSON of a RunResult (its log, its steps' times, its stages)."""
    res = result.resolved
    stages = tuple(tuple(res.stage_layers(s)) for s in range(res.pp)) if res is not None else ()
    levels = tuple(level.name for level in res.hardware.memory) if res is not None else ()
    layout = Layout({row["step"]: float(row["time_ns"]) for row in result.steps if "time_ns" in row}, stages,
                    res.tp if res is not None else 1, levels)
    return chrome_trace(result.log, steps=steps, layout=layout)


def chrome_trace(log: list[tuple], step: int | None = None, *, steps: tuple[int, int] | None = None,
                 layout: Layout | None = None) -> str:
    """Trace Event Format JSON of ``log`` (``step``: one step only; ``steps``: a range)."""
    if step is not None:
        steps = (step, step + 1)
    return json.dumps({"traceEvents": trace_events(log, steps=steps, layout=layout), "displayTimeUnit": "ns",
                       "otherData": {"producer": "decodesim", "steps": list(steps) if steps else "all"}})


def trace_events(log: list[tuple], *, steps: tuple[int, int] | None = None, layout: Layout | None = None) -> list[dict]:
    """The trace's events: metadata, slices ("X") and counters ("C")."""
    layout = layout or Layout()
    rows = [r for r in log if steps is None or steps[0] <= r[0] < steps[1]]
    offsets = _step_offsets(log, layout)
    stage_of = _stage_assigner(rows, layout)
    tracks: dict[tuple[int, str], _Lanes] = {}
    placed = []
    moved: dict[tuple[int, str], list[tuple[float, float, int]]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: (r[0], r[5], r[6], r[3], r[1], r[2], r[4])):
        s, resource, nbytes = r[0], r[3], r[7]
        pid = HOST_PID if resource == HOST else stage_of(r) + 1
        start, end = offsets.get(s, 0.0) + r[5], offsets.get(s, 0.0) + max(r[5], r[6])
        lane = tracks.setdefault((pid, resource), _Lanes()).place(start, end)
        placed.append((r, start, end, pid, lane))
        if nbytes > 0 and resource not in (HOST, KERNELS, COMPUTE):
            moved[(pid, resource)].append((start, end, nbytes))
    tid = _thread_ids({resource for _, resource in tracks})
    events = [_slice(r, start, end, pid, tid(r[3], lane)) for r, start, end, pid, lane in placed]
    events += flow_events(events)
    events += _step_slices(sorted({r[0] for r in rows}), offsets, layout, log)
    for (pid, resource), spans in sorted(moved.items()):
        events += counter_events(pid, resource, spans)
    return _metadata(tracks, layout, tid) + events


# -- placement --------------------------------------------------------------------------------


class _Lanes:
    """Lanes of one resource: a span goes to the first lane free at its start."""

    def __init__(self):
        self.ends: list[float] = []

    def place(self, start: float, end: float) -> int:
        for i, busy_until in enumerate(self.ends):
            if busy_until <= start:
                self.ends[i] = end
                return i
        self.ends.append(end)
        return len(self.ends) - 1


def _thread_ids(resources: set[str]):
    """Thread ids, stable across runs: known resources in a fixed order, then the others by
    name; lanes of one resource numbered within its block of 1000 (thread 1 is the host's
    decode-step track)."""
    order = [r for r in RESOURCE_ORDER if r in resources] + sorted(resources - set(RESOURCE_ORDER))
    rank = {r: i for i, r in enumerate(order)}
    return lambda resource, lane: 1000 * (rank[resource] + 1) + lane


def _step_offsets(log: list[tuple], layout: Layout) -> dict[int, float]:
    """Where each step starts on the trace's time axis (ns)."""
    ends: dict[int, float] = {}
    for r in log:
        ends[r[0]] = max(ends.get(r[0], 0.0), r[6])
    duration = {s: layout.step_times_ns.get(s, end) for s, end in ends.items()}
    for s, t in layout.step_times_ns.items():
        duration.setdefault(s, t)
    offsets, clock = {}, 0.0
    for s in sorted(duration):
        offsets[s] = clock
        clock += duration[s]
    return offsets


def _stage_assigner(rows: list[tuple], layout: Layout):
    """A function from a span to its pipeline stage (0 when there is one stage)."""
    if len(layout.stage_layers) <= 1:
        return lambda r: 0
    stage = {layer: i for i, layers in enumerate(layout.stage_layers) for layer in layers}
    last = len(layout.stage_layers) - 1
    last_start: dict[int, float] = {}
    for r in rows:
        if stage.get(r[1]) == last:
            last_start[r[0]] = min(last_start.get(r[0], float("inf")), r[5])

    def assign(r) -> int:
        if r[1] in stage:
            return stage[r[1]]
        return last if r[5] >= last_start.get(r[0], float("inf")) else 0

    return assign


# -- events -----------------------------------------------------------------------------------


def _slice(r, start: float, end: float, pid: int, tid: int) -> dict:
    s, layer, op, resource, kind, _t0, _t1, nbytes, flops = r
    args = {"step": int(s), "layer": int(layer), "op": op, "kind": kind, "bytes": int(nbytes), "flops": int(flops),
            "resource": resource}
    if resource == KERNELS and "/" in op:
        owner, kernel = op.split("/", 1)
        name = kernel
        args.update(op=owner, kernel=kernel, kernel_class=kind)
    else:
        name = f"{op} L{layer}" if layer >= 0 else op
    return {"name": name, "cat": kind, "ph": "X", "ts": ns_to_us(start), "dur": ns_to_us(end - start), "pid": pid,
            "tid": tid, "args": args}


LAUNCH_KINDS = ("host.graph_launch", "host.dispatch", "host.launch")  # host spans that start device work


def flow_events(slices: list[dict]) -> list[dict]:
    """Flow arrows (Trace Event Format ``s`` / ``f`` pairs at the middle of the slices they bind to) from
    each host launch or dispatch slice to the first device slice of the op it launches
    (same step, layer and op; a kernel slice counts for its op) that starts no earlier."""
    device: dict[tuple, list[dict]] = defaultdict(list)
    for e in slices:
        if e["args"]["resource"] != HOST:
            a = e["args"]
            device[(a["step"], a["layer"], a["op"])].append(e)
    for found in device.values():
        found.sort(key=lambda e: (e["ts"], e["tid"]))
    out: list[dict] = []
    for e in slices:
        a = e["args"]
        if a["resource"] != HOST or a["kind"] not in LAUNCH_KINDS:
            continue
        target = next((d for d in device.get((a["step"], a["layer"], a["op"]), ()) if d["ts"] >= e["ts"]), None)
        if target is None:
            continue
        flow = len(out) // 2 + 1
        name = "graph launch" if a["kind"] == "host.graph_launch" else "launch"
        out.append({"name": name, "cat": "launch", "ph": "s", "id": flow, "ts": _middle(e), "pid": e["pid"],
                    "tid": e["tid"], "args": {}})
        out.append({"name": name, "cat": "launch", "ph": "f", "bp": "e", "id": flow, "ts": _middle(target),
                    "pid": target["pid"], "tid": target["tid"], "args": {}})
    return out


def _middle(e: dict) -> float:
    """A time inside slice ``e`` and no other slice of its lane (flow events bind to the slice
    that encloses them; a slice that ends where the next begins shares only its edges)."""
    return e["ts"] + e["dur"] / 2


def counter_events(pid: int, resource: str, spans: list[tuple[float, float, int]]) -> list[dict]:
    """Stepwise counters of one resource: summed transfer rate (GB/s) and bytes in flight."""
    changes: dict[float, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for start, end, nbytes in spans:
        rate = nbytes / (end - start) if end > start else 0.0  # bytes per ns == GB/s
        changes[start][0] += rate
        changes[start][1] += nbytes
        changes[end][0] -= rate
        changes[end][1] -= nbytes
    out: list[dict] = []
    rate = in_flight = 0.0
    last = (None, None)
    for t in sorted(changes):
        rate += changes[t][0]
        in_flight += changes[t][1]
        value = (round(max(rate, 0.0), 6), round(max(in_flight, 0.0)))
        if value == last:
            continue
        last = value
        out.append({"name": f"{resource} bandwidth (GB/s)", "ph": "C", "ts": ns_to_us(t), "pid": pid, "tid": 0,
                    "args": {"GB/s": value[0]}})
        out.append({"name": f"{resource} bytes in flight", "ph": "C", "ts": ns_to_us(t), "pid": pid, "tid": 0,
                    "args": {"bytes": value[1]}})
    return out


def _step_slices(steps: list[int], offsets: dict[int, float], layout: Layout, log: list[tuple]) -> list[dict]:
    ends: dict[int, float] = {}
    for r in log:
        ends[r[0]] = max(ends.get(r[0], 0.0), r[6])
    out = []
    for s in steps:
        duration = layout.step_times_ns.get(s, ends.get(s, 0.0))
        out.append({"name": f"step {s}", "cat": "step", "ph": "X", "ts": ns_to_us(offsets.get(s, 0.0)),
                    "dur": ns_to_us(duration), "pid": HOST_PID, "tid": 1, "args": {"step": int(s),
                                                                                    "time_ns": float(duration)}})
    return out


def _metadata(tracks: dict[tuple[int, str], _Lanes], layout: Layout, tid) -> list[dict]:
    """Process and thread names (and sort order) for every track the events use."""
    stages = max(1, len(layout.stage_layers))
    out = [_meta("process_name", HOST_PID, 0, "host (CPU: launches, syncs, dispatch)"),
           _meta("process_sort_index", HOST_PID, 0, sort_index=0),
           _meta("thread_name", HOST_PID, 1, "decode steps"), _meta("thread_sort_index", HOST_PID, 1, sort_index=1)]
    used = {pid for pid, _ in tracks} | {1}
    for stage in range(stages):
        pid = stage + 1
        if pid not in used:
            continue
        first, last = stage * layout.tp, stage * layout.tp + layout.tp - 1
        chips = f"chip {first}" if layout.tp == 1 else f"chips {first}-{last} (tp {layout.tp}: one simulated)"
        label = f"stage {stage}: {chips}" if stages > 1 else chips
        out += [_meta("process_name", pid, 0, label), _meta("process_sort_index", pid, 0, sort_index=pid)]
    for (pid, resource), lanes in sorted(tracks.items()):
        for lane in range(len(lanes.ends)):
            number = tid(resource, lane)
            out += [_meta("thread_name", pid, number, _track_name(resource, lane, layout)),
                    _meta("thread_sort_index", pid, number, sort_index=number)]
    return out


def _track_name(resource: str, lane: int, layout: Layout) -> str:
    if resource == COMPUTE:
        return f"compute (tile group {lane + 1})"
    if resource == KERNELS:
        return f"kernels (stream {lane + 1})"
    kind = "memory level" if resource in layout.levels else None
    base = f"{resource} ({kind})" if kind else resource
    return base if lane == 0 else f"{base} #{lane + 1}"


def _meta(name: str, pid: int, tid: int, label: str | None = None, sort_index: int | None = None) -> dict:
    args = {"name": label} if label is not None else {"sort_index": sort_index}
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}
