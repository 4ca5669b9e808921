"""Profiles built from a base profile, so shared figures stay in step.

Multi-chip systems copy their single-chip base. ``h100-sxm`` is derived from ``h200-sxm``:
the same GH100 die, clocks and SMs, with the H100's own memory system (5 HBM3 stacks at
3.35 TB/s, 80 GB, 50 MB L2 from the datasheet) and the figures `decodesim calibrate` measured
on an H100 (calibration/data/h100/overlay.json); whatever is still the H200's is relabelled
"borrowed from h200-sxm", so no figure claims a measurement of another chip.

``gb200-nvl72`` is 72 ``b200`` dies at the GB200's 1200 W rates and 186 GB per GPU, in one
NVLink domain.

``h200-sxm-x8`` is eight ``h200-sxm`` GPUs on one HGX board (NVLink4 through NVSwitch);
``h200-sxm-x16`` two such boards joined by InfiniBand NDR (the scale-out links);
``groq-lpu-576`` is 576 ``groq-lpu`` chips (72 GroqNodes of 8). Each is the base file's text
with its name, description and ``system.chips`` replaced and a header in front; the links
block is the base's (h200-sxm.yaml and groq-lpu.yaml carry the chip's links). When a base
changes (e.g. the H200 calibration fit lands in h200-sxm.yaml), run
``python -m sim.report.multichip`` to rewrite both; tests/test_profiles.py fails while they
differ.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from sim.calibrate import overlay
from sim.config.hardware import HardwareProfile, borrow
from sim.config.loader import validate
from sim.io import write_atomic
from sim.paths import hardware_dir
from sim.units import GFLOP_PER_TFLOP


@dataclass(frozen=True)
class System:
    name: str
    base: str
    description: str
    chips: int
    chips_source: str
    estimate: bool
    header: str
    tensor_parallel: tuple[int, str] | None = None  # system.tensor_parallel: (default tp, its source)
    scaleout: str = ""  # a system.scaleout block (YAML, indented two spaces) between groups of chips


SYSTEMS = (
    System("h200-sxm-x8", "h200-sxm",
           "8x NVIDIA H200 SXM (HGX), NVLink4 450 GB/s/dir per GPU through NVSwitch; per GPU 141 GB HBM3e at 4.8 TB/s",
           8, "HGX H200 8-GPU board (MLPerf v4.1 system H200-SXM-141GBx8, N11)", False,
           "# 8x NVIDIA H200 SXM on one HGX board, all-to-all over NVLink4 through 4 NVSwitch3 chips\n"
           "# (sources.md 1, N11/N13). Per-chip figures are h200-sxm.yaml's, copied by\n"
           "# `python -m sim.report.multichip` (re-run it when h200-sxm.yaml changes); the system block\n"
           "# adds the chips. Tensor parallelism over the 8 GPUs: weights split, two all-reduces per\n"
           "# layer over \"link\".\n"),
    System("h200-sxm-x16", "h200-sxm",
           "2 nodes of 8 NVIDIA H200 SXM (HGX), NVLink4 inside a node, 8x400 Gb/s InfiniBand NDR per node between them",
           16, "two HGX H200 8-GPU boards (MLPerf v4.1 system H200-SXM-141GBx8, N11), joined by InfiniBand", False,
           "# Two HGX H200 nodes (8 GPUs each, NVLink4 through NVSwitch inside a node, sources.md 1,\n"
           "# N11/N13) joined by a rail-optimised InfiniBand NDR fabric: one 400 Gb/s ConnectX-7 per GPU.\n"
           "# Per-chip figures are h200-sxm.yaml's, copied by `python -m sim.report.multichip`. Default\n"
           "# mapping: tensor parallel over the 8 GPUs of a node, a pipeline of the two nodes; an\n"
           "# expert-parallel all-to-all over all 16 (--placement spread --attention-dp 2) sends the rows for\n"
           "# the other node over the scale-out links and the rest over NVLink.\n",
           scaleout=("  scaleout:\n"
                     '    chips_per_group: {value: 8, source: "8 GPUs per HGX H200 node (MLPerf v4.1 system H200-SXM-141GBx8: accelerators_per_node 8, N11)"}\n'
                     '    bandwidth_GBps: {value: 50, source: "one 400 Gb/s InfiniBand NDR ConnectX-7 per GPU = 50 GB/s per direction (NVIDIA DGX H200 datasheet: 8 x single-port ConnectX-7 VPI at up to 400 Gb/s; HGX AI Factory reference architecture 2-8-9-400: 400 Gb/s per GPU; DeepEP measures 43-58 GB/s RDMA per H800 over the same CX7 400 Gb/s, anchors.md)"}\n'
                     '    latency_ns: {value: 3000, source: "GPU-initiated RDMA write through the NIC and one leaf switch and back, a few us (DeepEP low-latency kernels: 77 us for 128 tokens at EP8 rising to 118 us at EP16, anchors.md, bound the per-hop cost from above)", estimate: true}\n'
                     '    per_message_overhead_ns: {value: 5000, source: "NCCL/DeepEP kernel launch and synchronisation per collective, as for NVLink in h200-sxm-x8", estimate: true}\n')),
    System("groq-lpu-576", "groq-lpu", "576 Groq LPUs (72 GroqNodes of 8), C2C links; per chip 230 MB SRAM at 80 TB/s",
           576, "576 chips for Llama-2-70B (anchors.md C1, S: HN comment citing Groq)", True,
           "# A Groq LPU system of 576 chips, as reported for Llama-2-70B at 300 t/s/u (anchors.md C1:\n"
           "# \"576 chips (reported)\", S): 8 chips per 4U GroqNode (sources.md 5, Q2), 72 nodes.\n"
           "# Per-chip figures are groq-lpu.yaml's, copied by `python -m sim.report.multichip`.\n"
           "# Default mapping: tensor parallel over the 8 chips of a node, a pipeline over the 72 nodes;\n"
           "# stages hold half-layer units balanced by bytes (system.partition: balanced). Inside a node the\n"
           "# 8 cards are fully connected; nodes are joined in a Dragonfly over 4 global ports per card.\n",
           scaleout=("  scaleout:\n"
                     '    chips_per_group: {value: 8, source: "8 GroqCards per GroqNode, fully connected by 7 cable pairs each (HC34 notes; sources.md 5, Q2)"}\n'
                     '    bandwidth_GBps: {value: 56, source: "4 global (inter-node) ports per card (HC34 notes, Dragonfly) x ~14 GB/s per C2C link per direction (Linley Newsletter 2020-11-10: 4 lanes x 28 Gb/s cabled)", estimate: true}\n'
                     '    latency_ns: {value: 1000, source: "one C2C hop, as inside the node; the ISCA 22 paper bounds the whole Dragonfly at < 3 us end to end", estimate: true}\n'
                     '    per_message_overhead_ns: {value: 0, source: "statically scheduled transfers (Q3)", estimate: true}\n')),
    System("cerebras-wse3-x4", "cerebras-wse3",
           "4 Cerebras CS-3 systems (WSE-3 wafers) over 100 GbE; per wafer 44 GB SRAM at 21 PB/s",
           4, "'70B models fit on as few as four systems' (Cerebras inference launch blog, Aug 2024; docs/spatial.md CB-MAP)",
           False,
           "# Four CS-3 systems, as Cerebras serves Llama-3.1-70B in 16-bit (docs/spatial.md, CB-MAP).\n"
           "# Per-wafer figures are cerebras-wse3.yaml's, copied by `python -m sim.report.multichip`.\n"
           "# Default mapping: a layer pipeline over the 4 wafers (tp 1, as the base profile says),\n"
           "# half-layer units balanced by bytes.\n"),
    System("sambanova-sn40l-8", "sambanova-sn40l",
           "8 SambaNova SN40L RDUs (one SN40L-8 node); per socket 520 MB SRAM, 64 GB HBM, 1.5 TB DDR",
           8, "an SN40L node of 8 RDUs (Prabhakar, SN40L seminar abstract, IISc; docs/spatial.md SN-IISC)", False,
           "# Eight SN40L sockets of one node. Per-socket figures are sambanova-sn40l.yaml's, copied by\n"
           "# `python -m sim.report.multichip`. Default mapping: tensor parallel over the 8 sockets.\n"),
    System("sambanova-sn40l-16", "sambanova-sn40l",
           "16 SambaNova SN40L RDUs (one SambaRack SN40L-16); per socket 520 MB SRAM, 64 GB HBM, 1.5 TB DDR",
           16, "16 RDUs per SambaRack SN40L-16 (SambaNova docs, SambaRack overview; docs/spatial.md SN-DOCS)", False,
           "# A SambaRack of 16 SN40L sockets. Per-socket figures are sambanova-sn40l.yaml's, copied by\n"
           "# `python -m sim.report.multichip`. Default mapping: tensor parallel over all 16 sockets (the\n"
           "# decoder spread over 16 RDUs, docs/spatial.md SN-MAP).\n",
           tensor_parallel=(16, "a Llama decoder mapped across 16 RDUs with tensor parallelism (docs/spatial.md, SN-MAP; S)")),
    System("tpu-v5e-16", "tpu-v5e",
           "16 Google TPU v5e chips (a 4x4 pod slice, 2D torus ICI); per chip 16 GB HBM2e at 819 GB/s",
           16, "a 4x4 v5e slice (Cloud TPU v5e docs: 2D torus, 8 chips per host, 256-chip pod; G1)", False,
           "# A 4x4 slice of TPU v5e chips on the ICI 2D torus (Cloud TPU v5e documentation, G1). Per-chip\n"
           "# figures are tpu-v5e.yaml's, copied by `python -m sim.report.multichip`. Two hosts of 8 chips;\n"
           "# XLA shards the model tensor-parallel over the slice by default here.\n",
           tensor_parallel=(16, "tensor parallel over the whole slice (a common JetStream/MaxText decode sharding); "
                                "pass --tp/--pp for others")),
)

PER_CHIP = ("memory", "compute", "noc", "host")


def render(system: System, base_text: str | None = None) -> str:
    text = base_text if base_text is not None else (hardware_dir() / f"{system.base}.yaml").read_text()
    body = text[text.index("\nname: ") + 1:]  # drop the base's header comment
    body = re.sub(r"^name: .*$", f"name: {system.name}", body, count=1, flags=re.M)
    body = re.sub(r"^description: .*$", f'description: "{system.description}"', body, count=1, flags=re.M)
    chips = (f'  chips: {{value: {system.chips}, source: "{system.chips_source}"'
             + (", estimate: true}" if system.estimate else "}"))
    if system.tensor_parallel is not None:
        tp, source = system.tensor_parallel
        chips += f'\n  tensor_parallel: {{value: {tp}, source: "{source}"}}'
    if system.scaleout:
        chips += "\n" + system.scaleout.rstrip("\n")
    body, n = re.subn(r"^  chips: \{.*\}$", chips, body, count=1, flags=re.M)
    if n != 1:
        raise ValueError(f"{system.base}.yaml: no one-line system.chips entry to replace")
    return system.header + body


H100_HBM = {  # the H100 SXM5's own memory system (sources.md 1, N3/N9/N5; anchors.md D3)
    "stacks": {"value": 5, "source": "5 of 6 HBM3 stacks active, 10 x 512-bit MCs of 12 (sources.md 1, N3/N9)"},
    "channel_bandwidth_GBps": {"value": 20.94, "estimate": True,
                               "source": "3350 GB/s (H100 SXM datasheet, N3/N5) / 160 pseudo-channels"},
    "capacity_GB": {"value": 80, "source": "H100 SXM5 80 GB HBM3 (sources.md 1, N3/N9)"},
    "stream_efficiency": {"value": 0.914, "estimate": True,
                          "source": "FlashMLA 3000 of 3350 GB/s on H800, the H100 SXM memory system (anchors.md D3) "
                                    "= 0.8955, / (1 - refresh 0.02)"},
}
H100_L2 = {"capacity_MB": {"value": 50, "source": "H100 L2 50 MB (sources.md 1, N9)"}}


H100_OVERLAY = Path("calibration/data/h100/overlay.json")  # `decodesim calibrate` on an H100 (figures with sources)
H100_RULE = "the same GH100 die, clocks and software stack; taken as is, not measured on an H100"


def h100_overlay() -> dict:
    """The figures `decodesim calibrate` measured on an H100 (calibration/data/h100/overlay.json), if committed."""
    path = Path(__file__).resolve().parents[2] / H100_OVERLAY
    return json.loads(path.read_text()) if path.exists() else {}


def render_h100() -> str:
    raw = yaml.safe_load((hardware_dir() / "h200-sxm.yaml").read_text())
    raw["name"] = "h100-sxm"
    raw["description"] = "NVIDIA H100 SXM5, one GPU: 80 GB HBM3 at 3.35 TB/s, 132 SMs, 50 MB L2"
    hbm = raw["memory"][0]
    hbm.update(H100_HBM)
    next(level for level in raw["memory"] if level["name"] == "l2").update(H100_L2)
    borrow(raw, "h200-sxm", "NVIDIA H200", "calibration/data/h200", H100_RULE)
    figs = h100_overlay()
    if figs:
        raw = overlay.apply(raw, figs)
    measured = ("the kernel classes, host overheads, HBM stream and latency, L2 rate and matrix efficiency measured "
                "on an H100 by `decodesim calibrate` (calibration/data/h100/overlay.json); the rest "
                if figs else "")
    header = ("# NVIDIA H100 SXM5 (80 GB HBM3, GH100 die with 132 SMs), generated from h200-sxm.yaml by\n"
              "# `python -m sim.report.multichip`: the H100's own HBM3 stacks, capacity and 50 MB L2 (datasheet);\n"
              f"# {measured}borrowed from the H200 (same die and software), each such source saying so.\n"
              "# Do not edit by hand.\n")
    return header + yaml.safe_dump(raw, sort_keys=False, default_flow_style=None, width=200)


GB200_TDP_W = 1200  # GB200 (NVL72), per GPU (sources.md 1, N4)
GB200_TFLOPS = {"bf16": 2500, "fp16": 2500, "fp8": 5000, "int8": 5000, "fp4": 10000}  # dense, N4 (int8 as fp8)
BLACKWELL_BF16_PER_CLOCK = 8192  # dense bf16 FLOP per clock per SM (b200.yaml)
H200_STATIC, H200_IDLE = 0.195, 0.18  # the H200's measured static/TDP and idle/TDP (calibration/energy/)


def render_gb200_nvl72() -> str:
    """gb200-nvl72: 72 b200 dies as the GB200 NVL72 rack runs them (1200 W each, GB200 clocks,
    186 GB of HBM3e per GPU), in one NVLink domain; the energy figures follow the same
    TDP rule as b200's (calibration/energy/SOURCES.md)."""
    raw = yaml.safe_load((hardware_dir() / "b200.yaml").read_text())
    raw["name"] = "gb200-nvl72"
    raw["description"] = ("NVIDIA GB200 NVL72: 72 Blackwell GPUs (1200 W each) in one NVLink5 domain; per GPU "
                          "186 GB HBM3e at 8 TB/s, 2.5 / 5 / 10 dense PFLOP/s bf16 / fp8 / fp4")
    hbm = raw["memory"][0]
    hbm["capacity_GB"] = {"value": 186, "source": "13.4 TB of HBM3e per NVL72 rack / 72 GPUs (NVIDIA's GB200 NVL72 "
                          "figures as quoted by N18)", "estimate": True}
    hbm["channel_bandwidth_GBps"]["source"] = "taken as the B200's: " + hbm["channel_bandwidth_GBps"]["source"]
    clock = GB200_TFLOPS["bf16"] * GFLOP_PER_TFLOP / (raw["compute"]["tiles"]["value"] * BLACKWELL_BF16_PER_CLOCK)
    raw["compute"]["clock_GHz"] = {"value": round(clock, 3), "source": "~2.06 GHz implied: GB200 2500 TFLOP/s dense "
                                   "bf16 (sources.md 1, N4: GB200 at 1200 W) / (148 SM x 8192 FLOP/clk); fp8 5000 and "
                                   "fp4 10000 TFLOP/s give the same clock", "estimate": True}
    raw["system"]["chips"] = {"value": 72, "source": "72 Blackwell GPUs and 36 Grace CPUs in one NVLink domain of "
                              "130 TB/s (= 72 x 1.8 TB/s bidir, N4) (N18)"}
    energy = raw["energy"]
    tdp = f"GB200 TDP {GB200_TDP_W} W (sources.md 1, N4)"
    static = round(H200_STATIC * GB200_TDP_W, 1)
    for dtype, entry in energy["matrix_pJ_per_flop"].items():
        peak = GB200_TFLOPS[dtype]
        entry.update(value=round((GB200_TDP_W - static) / peak, 4 if dtype == "fp4" else 3),
                     source=f"(TDP - static_W) / dense {dtype} peak: {GB200_TDP_W} W ({tdp}) less {static} W over "
                            f"{peak} TFLOP/s (N4); the H200's measured bf16 figure is 1.6x this rule's")
    energy["static_W"] = {"value": static, "source": f"19.5% of {GB200_TDP_W} W ({tdp}): the H200's measured "
                          "static/TDP ratio (136.7 of 700 W, calibration/energy/)", "estimate": True}
    energy["idle_W"] = {"value": round(H200_IDLE * GB200_TDP_W, 1), "source": f"18% of {GB200_TDP_W} W: the H200's "
                        "measured idle/TDP ratio (125.7 of 700 W, calibration/energy/)", "estimate": True}
    energy["power_limit_W"] = {"value": GB200_TDP_W, "source": tdp}
    header = ("# NVIDIA GB200 NVL72, generated from b200.yaml by `python -m sim.report.multichip` (do not edit by\n"
              "# hand): the same Blackwell die (148 SMs, L2, host and per-kernel figures), at the GB200's 1200 W\n"
              "# rates (2.5 / 5 / 10 dense PFLOP/s bf16 / fp8 / fp4, N4) and 186 GB of HBM3e per GPU, 72 GPUs in\n"
              "# one NVLink5 domain (NVLink Switch trays: every GPU reaches every other at 900 GB/s per\n"
              "# direction). Not modelled: the Grace host's NVLink-C2C link (the PCIe figure is kept) and the\n"
              "# HBM bandwidth, taken as the B200's 8 TB/s. Sources: docs/sources.md.\n")
    return header + yaml.safe_dump(raw, sort_keys=False, default_flow_style=None, width=200)


def _write(path: Path, text: str) -> None:
    validate(HardwareProfile, yaml.safe_load(text), path)
    write_atomic(path, text)


def write_all(folder: Path | None = None) -> list[Path]:
    """Write h100-sxm and every derived system to ``folder`` (default: the bundled profiles),
    each validated before it is written."""
    folder = folder or hardware_dir()
    out = []
    h100 = folder / "h100-sxm.yaml"
    _write(h100, render_h100())
    out.append(h100)
    gb200 = folder / "gb200-nvl72.yaml"
    _write(gb200, render_gb200_nvl72())
    out.append(gb200)
    for system in SYSTEMS:
        path = folder / f"{system.name}.yaml"
        _write(path, render(system))
        out.append(path)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="rewrite the derived hardware profiles from their bases")
    parser.add_argument("--out", type=Path, default=None, help="folder to write to (default: hardware_profiles/)")
    for written in write_all(parser.parse_args().out):
        print(f"wrote {written}")
