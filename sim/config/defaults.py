"""The run's default answers (hardware, model, formats, workload), in plain Python.

``RunSpec`` (sim.config.spec) takes its field defaults from here, and the command line shows
them in ``--help`` without importing the validation stack, so ``decodesim --help`` starts
without pydantic.
"""

from __future__ import annotations

RUN_DEFAULTS = {
    "hardware": "h200-sxm",
    "model": "llama-3-8b",
    "weights": "bf16",
    "kv": "fp16",
    "batch": 1,
    "context": 4096,
    "steps": 8,
    "target_ms": 10.0,
    "engine": "des",
    "software": "fused",  # a stack of workloads/software/ or a stack YAML path
    "dispatch": "device",
    "placement": "static",
    "routing": "uniform",
}

# Names declared once; the spec's literals, the command line's choices, the lowering, the
# placement and the explorer read them from here.
DISPATCHES = ("host_sync", "device", "sram_zero_copy")  # MoE dispatch paths (sim.lowering.moe)
PLACEMENTS = ("all-hbm", "static", "lru", "lfu", "spread")  # MoE expert placements (sim.moe.placement)
ROUTING_KINDS = ("uniform", "zipf")  # generated routing (sim.moe.routing); anything else names a routing file
MEMORY_KINDS = ("hbm", "ddr", "sram")  # memory-tier kinds of a hardware profile (sim.config.hardware)
