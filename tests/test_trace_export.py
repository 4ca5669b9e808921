"""The Chrome/Perfetto trace: a schema check of the Trace Event Format (required keys per
phase, integer pid/tid, numeric ts/dur, numeric counter args, every process and thread
named), and its layout: every step (or a chosen range), one process per pipeline stage,
lanes that never overlap, counters that integrate to the bytes moved, kernel slices.

The ``perfetto`` package's trace processor downloads a binary on first use, which an
offline machine cannot do, so the reader here is this schema check."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from sim.engine.records import Span
from sim.report.timeline import Layout, chrome_trace, trace_events
from tests.conftest import run_cli

PHASES = {"X", "C", "M", "s", "f"}
META = {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_trace(doc: dict) -> list[dict]:
    """Assert ``doc`` is a valid Trace Event Format object; returns its events."""
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    events = doc["traceEvents"]
    named_pids, named_threads = set(), set()
    for e in events:
        assert e.get("ph") in PHASES, e
        assert isinstance(e.get("name"), str) and e["name"], e
        for key in ("pid", "tid"):
            assert isinstance(e.get(key), int) and not isinstance(e[key], bool), (key, e)
        assert isinstance(e.get("args"), dict), e
        if e["ph"] == "X":
            assert _number(e.get("ts")) and _number(e.get("dur")) and e["dur"] >= 0 and e["ts"] >= 0, e
            assert isinstance(e.get("cat"), str), e
        elif e["ph"] == "C":
            assert _number(e.get("ts")) and e["args"], e
            assert all(_number(v) for v in e["args"].values()), e
        elif e["ph"] in ("s", "f"):
            assert isinstance(e.get("id"), int) and _number(e.get("ts")) and isinstance(e.get("cat"), str), e
            assert e["ph"] == "s" or e.get("bp") == "e", e
        else:
            assert e["name"] in META, e
            if e["name"].endswith("_name"):
                assert isinstance(e["args"].get("name"), str) and e["args"]["name"], e
            else:
                assert isinstance(e["args"].get("sort_index"), int), e
            if e["name"] == "process_name":
                named_pids.add(e["pid"])
            if e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert set(starts) == set(finishes), "every flow has one start and one finish"
    for flow, start in starts.items():
        assert finishes[flow]["ts"] >= start["ts"], (start, finishes[flow])
    for e in events:
        if e["ph"] in ("X", "C", "s", "f"):
            assert e["pid"] in named_pids, f"process {e['pid']} has no process_name"
        if e["ph"] == "X":
            assert (e["pid"], e["tid"]) in named_threads, f"thread {e['pid']}/{e['tid']} has no thread_name"
    return events


def slices(events):
    return [e for e in events if e["ph"] == "X"]


def test_lanes_never_overlap_on_one_thread(pipeline_trace):
    by_thread = defaultdict(list)
    for e in slices(pipeline_trace):
        by_thread[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():
        spans.sort()
        for (_a0, a1), (b0, _b1) in zip(spans, spans[1:], strict=False):
            assert b0 >= a1 - 1e-9


@pytest.fixture(scope="module")
def pipeline_run():
    from sim.config.spec import RunSpec
    from sim.run import simulate

    return simulate(RunSpec(model="llama-3.2-1b", chips=4, tp=2, pp=2, steps=3, context=1024), keep_log=True)


@pytest.fixture(scope="module")
def pipeline_trace(pipeline_run):
    from sim.report.timeline import trace_of

    return check_trace(json.loads(trace_of(pipeline_run)))


def test_every_step_and_one_process_per_stage(pipeline_run, pipeline_trace):
    names = {e["pid"]: e["args"]["name"] for e in pipeline_trace if e["name"] == "process_name"}
    assert names[0].startswith("host")
    assert names[1].startswith("stage 0: chips 0-1") and names[2].startswith("stage 1: chips 2-3")
    x = slices(pipeline_trace)
    assert {e["args"]["step"] for e in x} == {0, 1, 2}
    layers = {pid: {e["args"]["layer"] for e in x if e["pid"] == pid and e["args"]["layer"] >= 0} for pid in (1, 2)}
    stages = pipeline_run.resolved
    assert layers[1] == set(stages.stage_layers(0)) and layers[2] == set(stages.stage_layers(1))


def test_steps_follow_each_other_on_one_time_axis(pipeline_run, pipeline_trace):
    steps = [e for e in slices(pipeline_trace) if e["cat"] == "step"]
    assert [e["args"]["step"] for e in steps] == [0, 1, 2]
    for a, b in zip(steps, steps[1:], strict=False):
        assert b["ts"] == pytest.approx(a["ts"] + a["dur"])
    for e in slices(pipeline_trace):
        step = steps[e["args"]["step"]]
        assert step["ts"] - 1e-6 <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + 1e-6


def test_counters_integrate_to_the_bytes_moved(pipeline_run, pipeline_trace):
    moved = defaultdict(float)
    for e in slices(pipeline_trace):
        if e["args"].get("resource") == "hbm":
            moved[e["pid"]] += e["args"]["bytes"]
    assert sum(moved.values()) == sum(s.bytes for s in pipeline_run.log if s.resource == "hbm")
    for pid, total in moved.items():
        points = sorted((e["ts"], e["args"]["GB/s"]) for e in pipeline_trace
                        if e["ph"] == "C" and e["pid"] == pid and e["name"] == "hbm bandwidth (GB/s)")
        integral = sum(rate * (t1 - t0) * 1e3 for (t0, rate), (t1, _r) in zip(points, points[1:], strict=False))
        assert integral == pytest.approx(total, rel=1e-3)  # GB/s x ns = bytes
        assert points[-1][1] == 0
        in_flight = [e["args"]["bytes"] for e in pipeline_trace
                     if e["ph"] == "C" and e["pid"] == pid and e["name"] == "hbm bytes in flight"]
        assert min(in_flight) == 0 and max(in_flight) > 0


def test_trace_steps_range_from_the_cli(tmp_path):
    out = tmp_path / "t.json"
    code, _out, err = run_cli("run", "--steps", "3", "--context", "1024", "--trace-out", str(out),
                              "--trace-steps", "1:3")
    assert code == 0, err
    events = check_trace(json.loads(out.read_text()))
    assert {e["args"]["step"] for e in slices(events)} == {1, 2}
    code, _out, err = run_cli("run", "--steps", "3", "--trace-out", str(out), "--trace-steps", "2:1")
    assert code == 2 and "--trace-steps" in err


def test_kernel_host_and_unknown_resources_get_their_own_tracks():
    log = [Span(0, -1, "embed", "host", "host.graph_launch", 0.0, 500.0, 0, 0),
           Span(0, 0, "qkv/sm90_gemm_bf16", "kernels", "gemm", 600.0, 900.0, 4096, 1 << 20),
           Span(0, 0, "qkv/splitk_reduce", "kernels", "reduce", 700.0, 950.0, 512, 0),  # overlaps: second stream
           Span(0, 0, "qkv", "hbm", "read:weights", 600.0, 900.0, 4096, 0),
           Span(0, 0, "qkv", "tensor_cluster", "tile.compute", 600.0, 900.0, 0, 1 << 20)]
    doc = json.loads(chrome_trace(log, layout=Layout(step_times_ns={0: 1000.0}, levels=("hbm",))))
    events = check_trace(doc)
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"kernels (stream 1)", "kernels (stream 2)", "hbm (memory level)", "tensor_cluster", "host"} <= threads
    kernels = [e for e in slices(events) if e["args"].get("resource") == "kernels"]
    assert {e["name"] for e in kernels} == {"sm90_gemm_bf16", "splitk_reduce"}
    assert {e["args"]["kernel_class"] for e in kernels} == {"gemm", "reduce"}
    assert {e["args"]["op"] for e in kernels} == {"qkv"}
    host = [e for e in slices(events) if e["args"].get("resource") == "host"]
    assert host and all(e["pid"] == 0 for e in host)
    assert [e["name"] for e in events if e["ph"] == "C"] == ["hbm bandwidth (GB/s)", "hbm bytes in flight"] * 2


def test_thread_ids_are_stable_between_processes():
    log = [Span(0, 0, "a", name, "k", 0.0, 1.0, 1, 0) for name in ("zeta", "alpha", "hbm")]
    first = trace_events(log)
    assert trace_events(list(reversed(log))) == first


def _enclosing(events, flow_event):
    """The slice a flow event binds to: on its thread, containing its time."""
    return [e for e in slices(events) if e["pid"] == flow_event["pid"] and e["tid"] == flow_event["tid"]
            and e["ts"] <= flow_event["ts"] <= e["ts"] + e["dur"]]


def test_flows_go_from_each_launch_to_the_device_work_it_starts():
    """Issue 22: an arrow from every host launch or dispatch slice to its op's first device
    slice (the kernel slice where the log has kernels), read back from the trace JSON."""
    log = [Span(0, -1, "embed", "host", "host.graph_launch", 0.0, 500.0, 0, 0),
           Span(0, -1, "embed", "hbm", "read:weights", 600.0, 700.0, 1024, 0),
           Span(0, 0, "qkv", "host", "host.dispatch", 500.0, 800.0, 0, 0),
           Span(0, 0, "qkv/sm90_gemm_bf16", "kernels", "gemm", 900.0, 1200.0, 4096, 1 << 20),
           Span(0, 0, "qkv", "hbm", "read:weights", 900.0, 1200.0, 4096, 0),
           Span(0, 0, "qkv", "host", "host.sync", 1200.0, 1300.0, 0, 0)]  # a sync starts nothing
    events = check_trace(json.loads(chrome_trace(log, layout=Layout(step_times_ns={0: 1400.0}, levels=("hbm",)))))
    starts = [e for e in events if e["ph"] == "s"]
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == 2
    for start in starts:
        (source,) = _enclosing(events, start)
        (target,) = _enclosing(events, finishes[start["id"]])
        assert source["args"]["resource"] == "host" and source["args"]["kind"] != "host.sync"
        assert target["args"]["op"] == source["args"]["op"] and target["pid"] != 0
    targets = {_enclosing(events, f)[0]["name"] for f in finishes.values()}
    assert targets == {"embed", "sm90_gemm_bf16"}  # qkv's arrow ends on its kernel, not its HBM read


def test_a_real_run_has_launch_flows(tmp_path):
    out = tmp_path / "t.json"
    code, _out, err = run_cli("run", "--steps", "2", "--context", "512", "--trace-out", str(out))
    assert code == 0, err
    events = check_trace(json.loads(out.read_text()))
    flows = [e for e in events if e["ph"] == "s"]
    assert len(flows) >= 2  # one graph launch per step at least
    for f in flows:
        assert _enclosing(events, f)[0]["args"]["kind"] == "host.graph_launch"
