"""How a validation case is measured: timing through calibration/harness.py (graph replays
and synchronized eager steps), the profiler pass and its kernel-trace parser, and the Runner that
walks the cases within the budget and writes steps.csv, profiles.csv, kernels_<model>_<stack>.csv
and routing.csv (schemas in whole_step.py's docstring).
"""
from __future__ import annotations

import bisect
import contextlib
import gc
import json
import os
import statistics
import tempfile
import time
import traceback
import zlib
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

import harness
import torch
from harness import CsvOut, log, pct

from cases import ARCH, Case, Shape, load_shape, tiny_shape
from comparison import check_grouped, status_of
from model import KV_SLACK_TOKENS, DecodeStep, GroupedConfig, Weights, annotating, build_weights

GB = 1e9

STEP_FIELDS = ["case_id", "model", "stack", "execution", "weights", "batch", "context", "median_ms",
               "p10_ms", "p90_ms", "reps", "kernels_per_step", "error", "skipped_reason", "layers_run",
               "experts_touched_mean", "host_syncs_per_step", "check_rel_err", "wall_s", "kv"]
KERNEL_FIELDS = ["case_id", "model", "stack", "execution", "weights", "batch", "context", "scope", "index",
                 "op", "op_source", "kernel", "grid", "block", "registers_per_thread", "shared_memory",
                 "duration_us"]
ROUTING_FIELDS = ["case_id", "layer", "expert", "tokens"]
PROFILE_FIELDS = ["case_id", "model", "stack", "execution", "weights", "batch", "context", "kernels_per_step",
                  "eager_step_kernels", "graph_replay_kernels", "layer0_kernels", "outside_kernels", "memcpy",
                  "memset", "annotations", "error", "note", "wall_s"]


# ----------------------------------------------------------------------------- timing


def summary_ms(times_ms):
    return {"median_ms": statistics.median(times_ms), "p10_ms": pct(times_ms, 10), "p90_ms": pct(times_ms, 90),
            "reps": len(times_ms)}


def capture_graph(step: DecodeStep, warmup: int = 2):
    """Warm up on a side stream (the loop's routing is read here), then capture one step."""
    graph, _ = harness.capture_graph(lambda i: step(), 1, warmup_calls=warmup)
    torch.cuda.synchronize()
    return graph


def time_graph(graph, reps: int):
    """Milliseconds of replays, each bracketed by CUDA events and synchronized (one untimed replay
    first; no backlog: a step's host submission is part of what a serving loop pays)."""
    graph.replay()
    torch.cuda.synchronize()
    return [harness.replay_us(graph) / 1e3 for _ in range(reps)]


def time_eager(step: DecodeStep, reps: int, warmup: int, cuda: bool):
    """Host-clock milliseconds of whole eager steps, each followed by a synchronize."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    return [us / 1e3 for us in harness.host_times_us(lambda i: step(), reps, warmup, sync)]


# ----------------------------------------------------------------------------- profiling


def profile_trace(fn, cuda: bool) -> dict:
    """Run fn once under torch.profiler; return the Chrome trace as a dict."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as fh:
            return json.load(fh)


class Ranges:
    """Named time ranges (profiler annotations), nested or disjoint; finds the innermost one
    containing a time: the latest-starting range that has not ended (a nested range starts
    after, and ends before, the range around it)."""

    def __init__(self, ranges):
        self.ranges = sorted(ranges)
        self.starts = [r[0] for r in self.ranges]

    def innermost(self, ts) -> str:
        for j in range(bisect.bisect_right(self.starts, ts) - 1, -1, -1):
            start, end, name = self.ranges[j]
            if end >= ts:
                return name
        return ""


def parse_kernels(trace: dict) -> list[dict]:
    """Device kernels in time order, each with the op annotation it was launched under."""
    events = trace.get("traceEvents", [])
    cpu_ranges = Ranges((e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in events
                        if e.get("cat") == "user_annotation" and "ts" in e)
    gpu_ranges = Ranges((e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in events
                        if e.get("cat") == "gpu_user_annotation" and "ts" in e)
    launch_ts = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launch_ts[e["args"]["correlation"]] = e["ts"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    rows, previous = [], ""
    for e in kernels:
        args = e.get("args", {})
        op, source = "", ""
        corr = args.get("correlation")
        if corr in launch_ts:
            op, source = cpu_ranges.innermost(launch_ts[corr]), "launch"
        if not op:
            op, source = gpu_ranges.innermost(e["ts"] + e.get("dur", 0) / 2), "gpu_range"
        if not op:
            op, source = previous, "previous"
        previous = op
        rows.append({"op": op, "op_source": source, "kernel": e["name"], "grid": args.get("grid", ""),
                     "block": args.get("block", ""), "registers_per_thread": args.get("registers per thread", ""),
                     "shared_memory": args.get("shared memory", ""), "duration_us": e.get("dur", "")})
    return rows


def count_device_events(trace: dict) -> dict:
    """Kernels, memcpys and memsets in a trace."""
    cats = [e.get("cat") for e in trace.get("traceEvents", [])]
    return {"kernels": cats.count("kernel"), "memcpy": cats.count("gpu_memcpy"), "memset": cats.count("gpu_memset")}


def _selftest_parser():
    """The kernel-to-op mapping on a made-up trace (the CPU has no kernel events)."""
    trace = {"traceEvents": [
        {"cat": "user_annotation", "name": "L0.experts", "ts": 5, "dur": 20},
        {"cat": "user_annotation", "name": "L0.qkv", "ts": 10, "dur": 10},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 22, "dur": 1, "args": {"correlation": 3}},
        {"cat": "kernel", "name": "after_nested", "ts": 55, "dur": 1, "args": {"correlation": 3}},
        {"cat": "user_annotation", "name": "lm_head", "ts": 30, "dur": 10},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 12, "dur": 1, "args": {"correlation": 1}},
        {"cat": "cuda_driver", "name": "cuLaunchKernel", "ts": 32, "dur": 1, "args": {"correlation": 2}},
        {"cat": "kernel", "name": "gemv", "ts": 50, "dur": 3, "args": {"correlation": 1, "grid": [1, 2, 1]}},
        {"cat": "kernel", "name": "gemv2", "ts": 60, "dur": 3, "args": {"correlation": 2}},
        {"cat": "kernel", "name": "orphan", "ts": 70, "dur": 1, "args": {"correlation": 9}},
    ]}
    rows = parse_kernels(trace)
    assert [(r["kernel"], r["op"], r["op_source"]) for r in rows] == [
        ("gemv", "L0.qkv", "launch"), ("after_nested", "L0.experts", "launch"), ("gemv2", "lm_head", "launch"),
        ("orphan", "lm_head", "previous")], rows
    assert count_device_events(trace)["kernels"] == 4


# ----------------------------------------------------------------------------- the runner


class Runner:
    """Runs cases one by one under a time budget; every failure becomes a row."""

    def __init__(self, args):
        self.args = args
        self.cuda = not args.cpu
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.budget = harness.Budget(args.budget_s)
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.steps = CsvOut(str(self.out / "steps.csv"), STEP_FIELDS)
        self.routing_csv = CsvOut(str(self.out / "routing.csv"), ROUTING_FIELDS)
        self.profiles_csv = CsvOut(str(self.out / "profiles.csv"), PROFILE_FIELDS)
        self.case_of: dict = {}
        self.profiles_not_run: list[str] = []
        self.kernel_csvs: dict = {}
        self.weights_key = None
        self.weights: Weights | None = None
        self.weights_error = {}
        self.profiled: dict = {}
        self.checks: dict = {}
        self.results: list[dict] = []
        self.not_run: list[str] = []
        sm = torch.cuda.get_device_properties(0).multi_processor_count if self.cuda else 4
        self.grouped_cfg = GroupedConfig(sm_count=sm) if self.cuda else GroupedConfig(block_k=32, sm_count=sm)

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return self.budget.elapsed_s()

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    # -- model weights ---------------------------------------------------------------
    def shape_of(self, model: str) -> Shape:
        s = load_shape(model)
        if self.args.cpu:
            return tiny_shape(s)
        if self.args.quick:
            return replace(s, layers=min(s.layers, 2))
        return s

    def free_weights(self):
        self.weights, self.weights_key = None, None
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def free_bytes(self) -> float:
        if not self.cuda:
            return float("inf")
        free, _ = torch.cuda.mem_get_info()
        return free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()

    def get_weights(self, case: Case) -> Weights:
        key = (case.model, case.weights)
        if key == self.weights_key:
            return self.weights
        if key in self.weights_error:
            raise MemoryError(self.weights_error[key])
        self.free_weights()
        shape = self.shape_of(case.model)
        need = shape.weight_bytes(case.weights != "bf16")
        if need > 0.97 * self.free_bytes():
            self.weights_error[key] = f"weights need {need / GB:.1f} GB, {self.free_bytes() / GB:.1f} GB free"
            raise MemoryError(self.weights_error[key])
        t = time.time()
        fp8 = {"bf16": False, "fp8": True, "fp8-static": "static"}[case.weights]
        self.weights = build_weights(shape, ARCH[case.model], fp8, self.device)
        self.sync()
        self.weights_key = key
        log(f"  built {case.model} {case.weights}: {shape.layers} layers, {need / GB:.2f} GB "
            f"in {time.time() - t:.1f} s")
        return self.weights

    # -- one case --------------------------------------------------------------------
    def fits(self, case: Case, shape: Shape) -> str:
        """'' if the KV cache and the step's workspace fit, else the reason."""
        kv = shape.kv_bytes_per_token * case.batch * (case.context + KV_SLACK_TOKENS)
        work = case.batch * shape.vocab * 6 + 2 * GB
        free = self.free_bytes()
        if kv + work > 0.97 * free:
            return f"KV cache {kv / GB:.1f} GB + workspace {work / GB:.1f} GB > {free / GB:.1f} GB free"
        return ""

    def new_step(self, case: Case, row: dict) -> DecodeStep | None:
        """The case's decode step, or None with the skip reason in row."""
        if case.stack == "torch-graph" and case.execution == "loop_sync":
            raise ValueError("loop_sync synchronizes with the host and cannot be captured")
        weights = self.get_weights(case)
        row["layers_run"] = weights.shape.layers
        reason = self.fits(case, weights.shape)
        if reason:
            row["skipped_reason"] = reason
            return None
        return DecodeStep(weights, case.batch, case.context, case.execution, self.device,
                          seed=zlib.crc32(case.id.encode()), grouped_cfg=self.grouped_cfg, kv=case.kv)

    def cleanup(self):
        """Free what a case left behind (its KV cache, its graph's pool)."""
        gc.collect()
        if self.cuda:
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def error_text(self, case: Case, e: Exception, row: dict):
        """A skip (weights that do not fit) or a one-line error, into row."""
        if isinstance(e, MemoryError) and str(e) == self.weights_error.get((case.model, case.weights)):
            row["skipped_reason"] = str(e)
        else:
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
            if self.args.verbose:
                traceback.print_exc()

    def time_case(self, case: Case) -> dict:
        """Build, check (grouped), time and read the routing of one case; never raises."""
        row = {"case_id": case.id, "model": case.model, "stack": case.stack, "execution": case.execution,
               "weights": case.weights, "batch": case.batch, "context": case.context, "kv": case.kv}
        t = time.time()
        step = graph = None
        try:
            step = self.new_step(case, row)
            if step is not None:
                if case.execution == "grouped":
                    row["check_rel_err"] = self.grouped_check(case, step)
                with torch.no_grad():
                    graph = self.measure(case, step, row)
                    self.record_moe(case, step, row)
                self.sync()
        except Exception as e:  # noqa: BLE001
            self.error_text(case, e, row)
        finally:
            del step, graph
            self.cleanup()
            row["wall_s"] = round(time.time() - t, 2)
        return row

    def measure(self, case: Case, step: DecodeStep, row: dict):
        """Time the step as its stack runs it; returns the CUDA graph (or None)."""
        graph = None
        if case.stack == "torch-graph" and self.cuda:
            graph = capture_graph(step)
            times = time_graph(graph, self.args.graph_reps)
        else:  # torch-eager, and every stack under --cpu
            times = time_eager(step, self.args.eager_reps, 3 if not self.args.cpu else 1, self.cuda)
        row.update(summary_ms(times))
        return graph

    def record_moe(self, case: Case, step: DecodeStep, row: dict):
        """Routing of the measured step (grouped and dense_all never read it: one more eager
        step with a host sync per layer reads it), experts touched and host syncs."""
        if not step.s.moe:
            return
        if any(r is None for r in step.routing):
            step.recording = True
            step()
            step.recording = False
        touched = [sum(1 for n in counts if n) for counts in step.routing]
        row["experts_touched_mean"] = round(statistics.mean(touched), 3)
        row["host_syncs_per_step"] = sum(1 + 2 * n for n in touched) if case.execution == "loop_sync" else 0
        for layer, counts in enumerate(step.routing):
            for expert, n in enumerate(counts):
                if n:
                    self.routing_csv.row(case_id=case.id, layer=layer, expert=expert, tokens=n)

    def grouped_check(self, case: Case, step: DecodeStep):
        with torch.no_grad():
            result = check_grouped(step, with_reference=self.args.cpu)
        self.checks[case.id] = result
        ok = result["grouped_vs_loop"] < 2e-2
        log(f"  grouped check {case.id}: {result} {'ok' if ok else 'FAILED (> 2e-2)'}")
        return round(result["grouped_vs_loop"], 6)

    # -- profiling -------------------------------------------------------------------
    def kernel_csv(self, case: Case) -> CsvOut:
        key = (case.model, case.stack)
        if key not in self.kernel_csvs:
            self.kernel_csvs[key] = CsvOut(str(self.out / f"kernels_{case.model}_{case.stack}.csv"), KERNEL_FIELDS)
        return self.kernel_csvs[key]

    def profile_case(self, case: Case) -> dict:
        """Rebuild a measured case and profile it; never raises."""
        facts = {"case_id": case.id, "model": case.model, "stack": case.stack, "execution": case.execution,
                 "weights": case.weights, "batch": case.batch, "context": case.context, "kv": case.kv}
        t = time.time()
        step = graph = None
        try:
            step = self.new_step(case, facts)
            if step is None:
                raise MemoryError(facts.pop("skipped_reason"))
            with torch.no_grad():
                if case.stack == "torch-graph" and self.cuda:
                    graph = capture_graph(step)
                else:
                    time_eager(step, 0, 2, self.cuda)  # warm-up (and the loop's routing)
                self.profile(case, step, graph, facts)
            self.sync()
        except Exception as e:  # noqa: BLE001
            facts["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
            if self.args.verbose:
                traceback.print_exc()
        finally:
            del step, graph
            self.cleanup()
            facts["wall_s"] = round(time.time() - t, 2)
        return facts

    def profile(self, case: Case, step: DecodeStep, graph, facts: dict):
        """Annotated eager step (names every kernel's op) and, for a graph, one profiled replay."""
        with annotating():
            trace = profile_trace(step, self.cuda)
        kernels = parse_kernels(trace)
        eager_counts = count_device_events(trace)
        facts["annotations"] = sum(1 for e in trace.get("traceEvents", []) if e.get("cat") == "user_annotation")
        facts["eager_step_kernels"] = eager_counts["kernels"]
        facts["memcpy"], facts["memset"] = eager_counts["memcpy"], eager_counts["memset"]
        facts["layer0_kernels"] = sum(1 for k in kernels if k["op"].startswith("L0."))
        facts["outside_kernels"] = sum(1 for k in kernels if not k["op"].startswith("L"))
        facts["op_source"] = {src: sum(1 for k in kernels if k["op_source"] == src)
                              for src in ("launch", "gpu_range", "previous")}
        per_layer: dict = {}
        for k in kernels:
            if k["op"].startswith("L"):
                layer = k["op"].split(".")[0]
                per_layer[layer] = per_layer.get(layer, 0) + 1
        facts["kernels_per_layer"] = per_layer
        csv = self.kernel_csv(case)
        index = 0
        for k in kernels:
            scope = "layer0" if k["op"].startswith("L0.") else ("outside" if not k["op"].startswith("L") else "")
            if scope:
                csv.row(case_id=case.id, model=case.model, stack=case.stack, execution=case.execution,
                        weights=case.weights, batch=case.batch, context=case.context, scope=scope, index=index,
                        **k)
                index += 1
        facts["kernels_per_step"] = eager_counts["kernels"]
        if self.cuda and not eager_counts["kernels"]:
            facts["error"] = "the profiler recorded no kernel events"
        if graph is not None:
            replay = count_device_events(profile_trace(graph.replay, True))
            facts["graph_replay_kernels"] = replay["kernels"]
            if replay["kernels"]:
                facts["kernels_per_step"] = replay["kernels"]
            else:  # CUPTI saw nothing of the replay: keep the eager count, and say so
                facts["note"] = "graph replay: no kernel events recorded; kernels_per_step is the eager count"

    # -- the sweep -------------------------------------------------------------------
    def profile_key(self, case: Case):
        """One profile per (model, stack, execution, weights); per code path under --quick."""
        return case.path if self.args.quick else case.group

    def skip_rows(self, cases: list[Case], reason: str):
        for c in cases:
            row = {"case_id": c.id, "model": c.model, "stack": c.stack, "execution": c.execution,
                   "weights": c.weights, "batch": c.batch, "context": c.context, "kv": c.kv,
                   "skipped_reason": reason}
            self.steps.row(**row)
            self.results.append(row)

    def time_all(self, cases: list[Case]):
        """Phase 1: time every case while the timing share of the budget lasts."""
        limit = self.args.budget_s - self.args.profile_reserve_s
        for n, case in enumerate(cases):
            if self.elapsed() > limit:
                self.not_run = [c.id for c in cases[n:]]
                self.skip_rows(cases[n:], "budget")
                log(f"timing budget of {limit:.0f} s reached: {len(self.not_run)} cases not run")
                break
            row = self.time_case(case)
            self.steps.row(**row)
            self.results.append(row)
            log(f"[{self.elapsed():6.1f} s] {n + 1}/{len(cases)} {case.id}: {status_of(row)}")

    def profile_all(self):
        """Phase 2 (after all timing, so the profiler cannot slow or crash a timing): one
        profiled step per group, at its smallest measured case, while the budget lasts."""
        chosen: dict = OrderedDict()
        for row in self.results:
            if row.get("median_ms") is None or row.get("error"):
                continue
            case = self.case_of[row["case_id"]]
            key = case.id if self.args.profile_all else self.profile_key(case)
            best = chosen.get(key)
            if best is None or (case.batch, case.context) < (best.batch, best.context):
                chosen[key] = case
        for n, case in enumerate(chosen.values()):
            if self.elapsed() > self.args.budget_s:
                self.profiles_not_run = [c.id for c in list(chosen.values())[n:]]
                log(f"budget reached: {len(self.profiles_not_run)} profiles not run")
                break
            facts = self.profile_case(case)
            self.profiled[case.id] = facts
            self.profiles_csv.row(**facts)
            log(f"[{self.elapsed():6.1f} s] profile {n + 1}/{len(chosen)} {case.id}: "
                f"{facts.get('error') or str(facts.get('kernels_per_step')) + ' kernels'}")

    def run(self, cases: list[Case]):
        self.case_of = {c.id: c for c in cases}
        self.time_all(cases)
        self.profile_all()
        self.free_weights()

    def write_steps_with_kernels(self):
        """Rewrite steps.csv with the profiled kernel counts (atomically; the row-by-row file
        written during the run stays valid if the process dies before this)."""
        for row in self.results:
            facts = self.profiled.get(row["case_id"])
            if facts and "kernels_per_step" in facts:
                row["kernels_per_step"] = facts["kernels_per_step"]
        path = self.out / "steps.csv"
        tmp = self.out / ".steps.csv.tmp"
        out = CsvOut(str(tmp), STEP_FIELDS)
        for row in self.results:
            out.row(**row)
        out.close()
        os.replace(tmp, path)

    def close(self):
        self.steps.close()
        self.routing_csv.close()
        self.profiles_csv.close()
        for csv in self.kernel_csvs.values():
            csv.close()
        self.write_steps_with_kernels()
