#!/usr/bin/env python3
"""NCCL collectives for decode: all-reduce of batch x hidden bf16 activations (tensor parallel) and
all-to-all of expert-parallel dispatch sizes, one process per GPU.

NVLink multicast (NVLS) is kept off: the environment variables below are forced before torch (and
so NCCL) is imported, in the parent and in every spawned worker, and no multimem/multicast API is
used. On this workplace's machines a program that uses multicast can take the host's GPUs out of
service.

Sizes:
  all_reduce : bytes = batch * hidden * 2, batch in 1..64, hidden in {4096, 8192}
  all_to_all : per-rank send buffer = tokens * hidden * 2 bytes split evenly over the world
               (tokens * hidden * 2 / world per peer), tokens in {1..1024}, hidden {4096, 7168}
Timing: per trial, n_inner back-to-back collectives between two CUDA events, / n_inner; median over
trials; the reported time is the max over ranks of each rank's median. Eager and, where capture
works, CUDA-graph replay of n_inner captured collectives.

World size 1 (a one-GPU machine) is a plumbing check only: NCCL performs a local copy; nothing
crosses a link. Rows are then labelled plumbing_check=true.

  python3 calibration/collectives.py --out $OUT [--world-size N] [--csv-name collectives.csv]
  python3 calibration/collectives.py --cpu --out /tmp/co     (gloo on CPU, plumbing only)
"""
import os

# must precede any import that could initialise NCCL
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from harness import CsvOut, machine_facts, nvidia_smi_snapshot, pct, write_json  # noqa: E402
from sweep import axis  # noqa: E402

# the sizes: calibration/sweeps/collectives.yaml
AR_BATCH = axis("collectives", "all_reduce", "batch", "full")
AR_HIDDEN = axis("collectives", "all_reduce", "hidden", "full")
A2A_TOKENS = axis("collectives", "all_to_all", "tokens", "full")
A2A_HIDDEN = axis("collectives", "all_to_all", "hidden", "full")


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _time_trials(fn, n_inner, trials, cuda, dev):
    """Returns per-op microseconds for each trial."""
    out = []
    for _ in range(trials):
        dist.barrier(device_ids=[dev.index]) if cuda else dist.barrier()
        if cuda:
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            torch.cuda.synchronize()
            out.append(e0.elapsed_time(e1) * 1e3 / n_inner)
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6 / n_inner)
    return out


def worker(rank, world, port, args, result_q):
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
    cuda = not args.cpu
    try:
        if cuda:
            torch.cuda.set_device(rank)
            dev = torch.device("cuda", rank)
            dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                    world_size=world, device_id=dev)
        else:
            dev = torch.device("cpu")
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                    world_size=world)
        dt = torch.bfloat16 if cuda else torch.float32
        n_inner = args.n_inner if cuda else 4
        trials = args.trials if cuda else 3
        rows = []

        # correctness: all-reduce sum of rank+1 == world*(world+1)/2
        t = torch.full((1024,), float(rank + 1), device=dev, dtype=torch.float32)
        dist.all_reduce(t)
        ok_ar = bool(torch.all(t == world * (world + 1) / 2))
        # all-to-all: chunk j from rank r holds r*1000+j; after a2a, chunk r at rank j holds r*1000+j
        src = torch.cat([torch.full((8,), float(rank * 1000 + j), device=dev) for j in range(world)])
        dstb = torch.empty_like(src)
        dist.all_to_all_single(dstb, src)
        exp = torch.cat([torch.full((8,), float(r * 1000 + rank), device=dev) for r in range(world)])
        ok_a2a = bool(torch.equal(dstb, exp))

        def measure(op, size_label, hidden, nbytes, make_fn):
            fn_eager = make_fn()
            for _ in range(3):
                fn_eager()
            if cuda:
                torch.cuda.synchronize()
            us = _time_trials(fn_eager, n_inner, trials, cuda, dev)
            rows.append(dict(op=op, mode="eager", size=size_label, hidden=hidden, bytes=nbytes,
                             median_us=statistics.median(us), p10_us=pct(us, 10), p90_us=pct(us, 90),
                             n_inner=n_inner, trials=trials))
            if not cuda or args.no_graph:
                return
            try:
                g = torch.cuda.CUDAGraph()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    fn_eager()
                torch.cuda.current_stream().wait_stream(s)
                torch.cuda.synchronize()
                with torch.cuda.graph(g):
                    fn_eager()
                g.replay()
                torch.cuda.synchronize()
                us = _time_trials(g.replay, n_inner, trials, cuda, dev)
                rows.append(dict(op=op, mode="graph", size=size_label, hidden=hidden, bytes=nbytes,
                                 median_us=statistics.median(us), p10_us=pct(us, 10), p90_us=pct(us, 90),
                                 n_inner=n_inner, trials=trials))
                del g
            except Exception as e:  # noqa: BLE001
                rows.append(dict(op=op, mode="graph", size=size_label, hidden=hidden, bytes=nbytes,
                                 note=f"graph capture failed: {e!r}"[:200]))

        for hidden in AR_HIDDEN:
            for b in AR_BATCH:
                x = torch.randn(b, hidden, device=dev, dtype=dt)

                def mk(x=x):
                    def f():
                        for _ in range(n_inner):
                            dist.all_reduce(x)
                    return f
                measure("all_reduce", b, hidden, b * hidden * 2, mk)
        for hidden in A2A_HIDDEN:
            for tok in A2A_TOKENS:
                nel = tok * hidden
                nel = (nel + world - 1) // world * world
                inp = torch.randn(nel, device=dev, dtype=dt)
                outb = torch.empty_like(inp)

                def mk(inp=inp, outb=outb):
                    def f():
                        for _ in range(n_inner):
                            dist.all_to_all_single(outb, inp)
                    return f
                measure("all_to_all", tok, hidden, nel * 2, mk)

        # max over ranks of the per-rank medians
        med = torch.tensor([r.get("median_us", float("nan")) for r in rows], dtype=torch.float64,
                           device=dev if cuda else "cpu")
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
        for r, m in zip(rows, med.tolist()):
            r["median_us_max_over_ranks"] = m
        if rank == 0:
            result_q.put({"rows": rows, "ok_allreduce": ok_ar, "ok_all_to_all": ok_a2a,
                          "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None})
        dist.barrier(device_ids=[dev.index]) if cuda else dist.barrier()
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        result_q.put({"error": repr(e), "rank": rank})


CSV_FIELDS = ["op", "mode", "world_size", "plumbing_check", "size", "hidden", "bytes", "median_us",
              "p10_us", "p90_us", "median_us_max_over_ranks", "algbw_GBps", "busbw_GBps",
              "n_inner", "trials", "gpu_name", "driver", "torch", "nccl", "note"]
PLUMBING_NOTE = "PLUMBING CHECK ONLY: world size 1, NCCL does a local copy, no link is measured"


def parse_args():
    """The command line's options."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--world-size", type=int, default=None)
    ap.add_argument("--csv-name", default=None)
    ap.add_argument("--n-inner", type=int, default=20)
    ap.add_argument("--trials", type=int, default=25)
    ap.add_argument("--no-graph", action="store_true")
    ap.add_argument("--cpu", action="store_true")
    return ap.parse_args()


def _topology():
    """nvidia-smi's topology matrix, or the error that kept it from running."""
    try:
        return subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
    except Exception as e:  # noqa: BLE001
        return repr(e)


def run_facts(cuda, world):
    """Machine facts before the run: world size, the NVLS environment and, on GPUs, nvidia-smi's state
    and topology."""
    facts = machine_facts(cuda)
    facts["world_size"] = world
    facts["env"] = {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                   "NVSHMEM_DISABLE_NVLS")}
    if cuda:
        facts["nvidia_smi_before"] = nvidia_smi_snapshot()
        facts["nvidia_smi_topo"] = _topology()
    return facts


def run_workers(world, args):
    """Spawns one worker per rank, waits for all of them, and returns what they reported."""
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, args, q)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    results = []
    while not q.empty():
        results.append(q.get())
    return results


def _driver(facts):
    """The driver version from the nvidia-smi snapshot taken before the run ("" without one)."""
    lines = (facts.get("nvidia_smi_before") or {}).get("query", "").splitlines()
    if len(lines) > 1 and "," in lines[1]:
        return lines[1].split(",")[1].strip()
    return ""


def csv_row(r, world, facts, driver, nccl):
    """The CSV row of one measured collective: its bandwidths from the max over ranks of the medians,
    and the machine it ran on."""
    m = r.get("median_us_max_over_ranks")
    alg = r["bytes"] / (m * 1e-6) / 1e9 if m and m == m else float("nan")
    fac = (2 * (world - 1) / world) if r["op"] == "all_reduce" else ((world - 1) / world)
    note = PLUMBING_NOTE if world == 1 else ""
    return dict(world_size=world, plumbing_check=world == 1, algbw_GBps=alg, busbw_GBps=alg * fac,
                gpu_name=facts.get("gpu_name", "cpu"), driver=driver, torch=torch.__version__,
                nccl=nccl, note=(r.get("note", "") + (" " if r.get("note") else "") + note).strip(),
                **{k: v for k, v in r.items() if k != "note"})


def write_csv(path, res, world, facts):
    """Writes rank 0's rows to the CSV."""
    out = CsvOut(path, CSV_FIELDS)
    driver = _driver(facts)
    for r in res["rows"]:
        out.row(**csv_row(r, world, facts, driver, res["nccl"]))
    out.close()


def print_results(csv_name, res):
    """Prints the correctness checks and one line per measured collective."""
    print(f"wrote {csv_name}: {len(res['rows'])} rows; allreduce ok={res['ok_allreduce']} "
          f"a2a ok={res['ok_all_to_all']}", flush=True)
    for r in res["rows"]:
        print(f"  {r['op']:10s} {r['mode']:5s} size={r['size']:5d} hidden={r['hidden']:5d} "
              f"bytes={r['bytes']:9d}  {r.get('median_us_max_over_ranks', float('nan')):9.2f} us "
              f"{r.get('note', '')}", flush=True)


def main():
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    cuda = not args.cpu
    world = args.world_size or (torch.cuda.device_count() if cuda else 2)
    csv_name = args.csv_name or ("collectives_ws1.csv" if world == 1 else "collectives.csv")
    facts = run_facts(cuda, world)
    t0 = time.time()
    results = run_workers(world, args)
    facts["elapsed_s"] = time.time() - t0
    res = next((r for r in results if "rows" in r), None)
    errs = [r for r in results if "error" in r]
    facts["errors"] = errs
    if res is not None:
        facts["correct_allreduce"] = res["ok_allreduce"]
        facts["correct_all_to_all"] = res["ok_all_to_all"]
        facts["nccl"] = res["nccl"]
        write_csv(os.path.join(args.out, csv_name), res, world, facts)
        print_results(csv_name, res)
    else:
        print("!! no results", errs, flush=True)
    if cuda:
        facts["nvidia_smi_after"] = nvidia_smi_snapshot()
    write_json(os.path.join(args.out, csv_name.replace(".csv", "_machine.json")), facts)
    rc = 0 if res is not None and not errs else 1
    sys.exit(rc)


if __name__ == "__main__":
    main()
