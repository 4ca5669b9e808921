"""Multi-chip profiles built from their single-chip bases, so the per-chip figures stay in step.

``h200-sxm-x8`` is eight ``h200-sxm`` GPUs on one HGX board (NVLink4 through NVSwitch);
``groq-lpu-576`` is 576 ``groq-lpu`` chips (72 GroqNodes of 8). Each is the base file's text
with its name, description and ``system.chips`` replaced and a header in front; the links
block is the base's (h200-sxm.yaml and groq-lpu.yaml carry the chip's links). When a base
changes (e.g. the H200 calibration fit lands in h200-sxm.yaml), run
``python -m sim.report.multichip`` to rewrite both; tests/test_profiles.py fails while they
differ.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sim.config.hardware import HardwareProfile
from sim.config.loader import validate
from sim.paths import hardware_dir

import yaml


@dataclass(frozen=True)
class System:
    name: str
    base: str
    description: str
    chips: int
    chips_source: str
    estimate: bool
    header: str


SYSTEMS = (
    System("h200-sxm-x8", "h200-sxm",
           "8x NVIDIA H200 SXM (HGX), NVLink4 450 GB/s/dir per GPU through NVSwitch; per GPU 141 GB HBM3e at 4.8 TB/s",
           8, "HGX H200 8-GPU board (MLPerf v4.1 system H200-SXM-141GBx8, N11)", False,
           "# 8x NVIDIA H200 SXM on one HGX board, all-to-all over NVLink4 through 4 NVSwitch3 chips\n"
           "# (hardware_facts.md 1, N11/N13). Per-chip figures are h200-sxm.yaml's, copied by\n"
           "# `python -m sim.report.multichip` (re-run it when h200-sxm.yaml changes); the system block\n"
           "# adds the chips. Tensor parallelism over the 8 GPUs: weights split, two all-reduces per\n"
           "# layer over \"link\".\n"),
    System("groq-lpu-576", "groq-lpu", "576 Groq LPUs (72 GroqNodes of 8), C2C links; per chip 230 MB SRAM at 80 TB/s",
           576, "576 chips for Llama-2-70B (anchors.md C1, S: HN comment citing Groq)", True,
           "# A Groq LPU system of 576 chips, as reported for Llama-2-70B at 300 t/s/u (anchors.md C1:\n"
           "# \"576 chips (reported)\", S): 8 chips per 4U GroqNode (hardware_facts.md 5, Q2), 72 nodes.\n"
           "# Per-chip figures are groq-lpu.yaml's, copied by `python -m sim.report.multichip`.\n"
           "# Default mapping: tensor parallel over the 8 chips of a node, a pipeline over the 72 nodes.\n"),
)

PER_CHIP = ("memory", "compute", "noc", "host")


def render(system: System, base_text: str | None = None) -> str:
    text = base_text if base_text is not None else (hardware_dir() / f"{system.base}.yaml").read_text()
    body = text[text.index("\nname: ") + 1:]  # drop the base's header comment
    body = re.sub(r"^name: .*$", f"name: {system.name}", body, count=1, flags=re.M)
    body = re.sub(r"^description: .*$", f'description: "{system.description}"', body, count=1, flags=re.M)
    chips = (f'  chips: {{value: {system.chips}, source: "{system.chips_source}"'
             + (", estimate: true}" if system.estimate else "}"))
    body, n = re.subn(r"^  chips: \{.*\}$", chips, body, count=1, flags=re.M)
    if n != 1:
        raise ValueError(f"{system.base}.yaml: no one-line system.chips entry to replace")
    return system.header + body


def write_all() -> list[Path]:
    out = []
    for system in SYSTEMS:
        text = render(system)
        path = hardware_dir() / f"{system.name}.yaml"
        validate(HardwareProfile, yaml.safe_load(text), path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with open(fd, "w") as handle:
            handle.write(text)
        Path(tmp).replace(path)
        out.append(path)
    return out


if __name__ == "__main__":
    for written in write_all():
        print(f"wrote {written}")
