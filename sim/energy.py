"""Energy of a simulated decode step, split by the same rows as its latency breakdown.

What it models: a step's energy is the chips' static power over the step's time, the host's
power over the same time, and the dynamic energy of what the ops moved and computed: every
flow of every op (the bytes the engine moved, per memory level, on-chip network, host link and
chip links) at that tier's pJ/bit, every matrix FLOP at its dtype's pJ/FLOP, every vector
operation (element-wise work, dequantization) at the vector unit's pJ/FLOP. The figures are
the profile's ``energy:`` section (sim.config.energy); on the H200 they are fitted to NVML
energy measurements of kernel-class microbenchmarks (calibration/energy/).

How it splits: an op's dynamic energy goes to the row its time goes to (loads by what the
bytes are: ``weights``, ``kv``, ``activations`` ...; FLOPs to its compute row, dequantization
to ``dequant``; an op that belongs to one phase row gives it all), and static plus host
energy is spread over the rows in proportion to their time. So the rows sum to the step's
energy exactly (conservation), idle power x time is a floor under any step, and, at equal
time, fewer bytes never cost more.

What it ignores: power capping and DVFS (a chip above its power limit would throttle: the
summary flags a predicted average power above ``power_limit_W``), temperature, the energy of
kernel launches themselves, data-dependent switching (zeros cost as much as random data).

Units: pJ inside, J and W in the outputs; times in ns.
"""

from __future__ import annotations

from typing import NamedTuple

from sim.costs import CATEGORY_ROW, MEMO_LIMIT, CostModel
from sim.lowering.decode import lower_step
from sim.results import PrefixSums, op_key
from sim.units import J_PER_PJ, S_PER_NS


class StepEnergy(NamedTuple):
    """One step's energy in J: by breakdown row and by component (static, host, each memory
    level or link, matrix, vector); both sum to ``total_J``. ``floor_J`` is idle power x time."""

    total_J: float
    by_row: dict[str, float]
    by_component: dict[str, float]
    floor_J: float
    time_ns: float
    tokens: int


class EnergyModel:
    """Energy of steps on one hardware profile (which must have an ``energy:`` section), run
    on ``tp x pp`` chips: every op runs on the ``tp`` chips of its stage, each moving its shard."""

    def __init__(self, hw, tp: int = 1, pp: int = 1):
        e = hw.energy
        if e is None:
            raise ValueError(f"hardware profile {hw.name!r} has no energy section")
        self.energy = e
        self.tp = tp
        self.chips = tp * pp
        self.pj_per_bit: dict[str, float] = {lv.name: e.tier_pJ(lv.name, lv.kind) for lv in hw.memory}
        self.pj_per_bit.update(noc=e.noc_pJ_per_bit.value, pcie=e.host_link_pJ_per_bit.value,
                               link=e.chip_link_pJ_per_bit.value,
                               scaleout=(e.scaleout_pJ_per_bit or e.chip_link_pJ_per_bit).value)
        self.vector_pj = e.vector_pJ_per_flop.value
        self.static_W = e.static_W.value * self.chips
        self.host_W = e.host_W.value * self.chips
        self.idle_W = e.idle_W.value * self.chips
        self.power_limit_W = e.power_limit_W.value * self.chips if e.power_limit_W is not None else None
        self._memo: dict[tuple, tuple[dict, dict]] = {}
        self._matrix_pj_of: dict[str, float] = {}  # dtype -> pJ per matrix FLOP
        self._dynamic = PrefixSums(({}, {}))  # the ops' dynamic energy, resumed between steps

    # -- one op --------------------------------------------------------------------------
    def op_pj(self, op, cost, keep: bool = True) -> tuple[dict[str, float], dict[str, float]]:
        """(pJ by breakdown row, pJ by component) of one op on one chip (``keep``: memoised per op key)."""
        key = op_key(op)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._op_pj(op, cost)
            if keep:
                if len(self._memo) >= MEMO_LIMIT:
                    self._memo.clear()
                self._memo[key] = hit
        return hit

    def _op_pj(self, op, cost) -> tuple[dict[str, float], dict[str, float]]:
        rows: dict[str, float] = {}
        parts: dict[str, float] = {}
        pj_per_bit, whole = self.pj_per_bit, op.row  # an op that belongs to one phase row gives it all
        for link, size, _weight, _cap, category, _write, _tile_cap in cost.flows:
            pj = size * 8 * pj_per_bit[link]
            row = whole or CATEGORY_ROW.get(category, category)
            rows[row] = rows.get(row, 0.0) + pj
            parts[link] = parts.get(link, 0.0) + pj
        compute_row, dequant_row = whole or op.compute_row, whole or "dequant"
        matrix_pj = self._matrix_pj_of
        for k in op.work.kernels_run or (op.work,):
            per_flop = matrix_pj.get(k.dtype)
            matrix = k.matrix_flops * (per_flop if per_flop is not None else self._matrix_pj(k.dtype))
            vector = (k.vector_ops - k.dequant_ops) * self.vector_pj
            dequant = k.dequant_ops * self.vector_pj
            rows[compute_row] = rows.get(compute_row, 0.0) + (matrix + vector)
            rows[dequant_row] = rows.get(dequant_row, 0.0) + dequant
            parts["matrix"] = parts.get("matrix", 0.0) + matrix
            parts["vector"] = parts.get("vector", 0.0) + (vector + dequant)
        return ({k: v for k, v in rows.items() if v}, {k: v for k, v in parts.items() if v})

    def _matrix_pj(self, dtype: str) -> float:
        """pJ per matrix FLOP of ``dtype`` (the profile's figure, read once per dtype)."""
        pj = self._matrix_pj_of.get(dtype)
        if pj is None:
            pj = self._matrix_pj_of[dtype] = self.energy.matrix_pJ(dtype)
        return pj

    # -- one step --------------------------------------------------------------------------
    def step(self, keys: dict, op_costs: list, breakdown_ns: dict[str, float], time_ns: float,
             tokens: int) -> StepEnergy:
        """A step's energy from its distinct ops (``keys``: op key -> [count, an op]), their
        costs, its breakdown (ns by row) and its time. As the ledger's sums do
        (sim.results.Ledger.graph_sums_from), the dynamic sums are resumed between steps
        (sim.results.PrefixSums)."""
        by_row, by_part = self._dynamic.over(list(keys.values()), self._add_ops, op_costs)
        return spread(by_row, by_part, breakdown_ns, time_ns, self.static_W, self.host_W, self.idle_W, tokens)

    def _add_ops(self, base: tuple, entries, op_costs: list, keep: bool) -> tuple:
        """``base`` dynamic sums (J by row, J by component) plus ``entries``' ops on every chip of their stage."""
        by_row, by_part = dict(base[0]), dict(base[1])
        for n, op in entries:
            rows, parts = self.op_pj(op, op_costs[op.idx], keep)
            add_dynamic(by_row, by_part, n * self.tp, rows, parts)
        return by_row, by_part


def add_dynamic(by_row: dict, by_part: dict, n: int, rows: dict[str, float], parts: dict[str, float]) -> None:
    """Add ``n`` ops' dynamic energy (pJ by row, pJ by component) to the sums, in J."""
    for row, pj in rows.items():  # plain dicts: their lookups are the interpreter's fastest
        by_row[row] = by_row.get(row, 0.0) + n * pj * J_PER_PJ
    for part, pj in parts.items():
        by_part[part] = by_part.get(part, 0.0) + n * pj * J_PER_PJ


def split(records, breakdown_ns: dict[str, float], time_ns: float, static_W: float, host_W: float,
          idle_W: float, tokens: int) -> StepEnergy:
    """Sum ops' dynamic energy (``records``: (count, pJ by row, pJ by component)) and spread
    static and host power x ``time_ns`` over the rows in proportion to ``breakdown_ns``."""
    by_row: dict[str, float] = {}
    by_part: dict[str, float] = {}
    for n, rows, parts in records:
        add_dynamic(by_row, by_part, n, rows, parts)
    return spread(by_row, by_part, breakdown_ns, time_ns, static_W, host_W, idle_W, tokens)


def spread(by_row: dict, by_part: dict, breakdown_ns: dict[str, float], time_ns: float, static_W: float,
           host_W: float, idle_W: float, tokens: int) -> StepEnergy:
    """The step's energy: the dynamic sums (J; fresh dicts, completed here) plus static and
    host power x ``time_ns``, spread over the rows in proportion to ``breakdown_ns``."""
    seconds = time_ns * S_PER_NS
    static, host = static_W * seconds, host_W * seconds
    by_part["static"] = by_part.get("static", 0.0) + static
    by_part["host"] = by_part.get("host", 0.0) + host
    timed = {row: t for row, t in breakdown_ns.items() if t > 0}
    total_t = sum(timed.values())
    if total_t > 0:
        for row, t in timed.items():
            by_row[row] = by_row.get(row, 0.0) + (static + host) * (t / total_t)
    elif static + host:
        by_row["launch_sync"] = by_row.get("launch_sync", 0.0) + static + host
    total = sum(by_part.values())
    return StepEnergy(total, by_row, by_part, idle_W * seconds, time_ns, tokens)


def summarize(steps: list[StepEnergy], power_limit_W: float | None = None) -> dict:
    """The run's energy: J per token (every sequence of a step gets one), average power, the
    chips' part alone (``chip_*``: what the chips' own counters see, the host left out), the
    idle floor, and the per-row and per-component splits in J per token. ``power_limit_W`` is
    all chips' limit together; the chips' average power above it is flagged."""
    tokens = sum(s.tokens for s in steps)
    total = sum(s.total_J for s in steps)
    seconds = sum(s.time_ns for s in steps) * S_PER_NS
    rows: dict[str, float] = {}
    parts: dict[str, float] = {}
    for s in steps:
        for k, v in s.by_row.items():
            rows[k] = rows.get(k, 0.0) + v
        for k, v in s.by_component.items():
            parts[k] = parts.get(k, 0.0) + v
    avg_W = total / seconds if seconds else 0.0
    chip = total - parts.get("host", 0.0)
    chip_W = chip / seconds if seconds else 0.0
    return {
        "J_per_token": total / tokens, "tokens_per_J": tokens / total if total else None,
        "J_per_step_mean": total / len(steps), "avg_W": avg_W,
        "chip_J_per_token": chip / tokens, "chip_avg_W": chip_W,
        "floor_J_per_token": sum(s.floor_J for s in steps) / tokens,
        "by_row_J_per_token": {k: v / tokens for k, v in sorted(rows.items(), key=lambda kv: -kv[1])},
        "by_component_J_per_token": {k: v / tokens for k, v in sorted(parts.items(), key=lambda kv: -kv[1])},
        "power_limit_W": power_limit_W,
        "above_power_limit": bool(power_limit_W is not None and chip_W > power_limit_W),
    }


def render_lines(e: dict) -> list[str]:
    """The run's energy as text lines for ``decodesim run``."""
    lines = [f"  energy: {e['J_per_token']:.3f} J per token ({e['tokens_per_J']:.2f} tokens/J), average "
             f"{e['avg_W']:.0f} W; chips alone {e['chip_J_per_token']:.3f} J/token at {e['chip_avg_W']:.0f} W"
             f" (idle floor {e['floor_J_per_token']:.3f} J/token)"]
    if e.get("above_power_limit"):
        lines.append(f"  energy: the chips' predicted {e['chip_avg_W']:.0f} W is above their {e['power_limit_W']:.0f} W "
                     "limit: they would throttle (slower, less energy per operation than predicted)")
    total = e["J_per_token"] or 1.0
    lines.append("  energy split (J per token):")
    for row, j in e["by_row_J_per_token"].items():
        if j >= 1e-4 * total:
            lines.append(f"    {row:<16}{j:9.4f}  {100 * j / total:5.1f}%")
    parts = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in e["by_component_J_per_token"].items() if v >= 0.005 * total)
    lines.append(f"  energy by component: {parts}")
    return lines


class MeteredStepModel:
    """A serving step model (``step_ns``) with energy: times come from ``inner``; the chips
    draw static power over every step and idle power between steps, the host its power over
    the whole window, and the ops' dynamic energy is evaluated exactly (a full lowering) on
    every ``sample_every``-th step, the first included, and scaled to all steps by their mean
    (a systematic sample: the replay's steps vary slowly with the batch and the contexts)."""

    def __init__(self, inner, setup, sample_every: int = 64):
        self.inner, self.setup, self.sample_every = inner, setup, sample_every
        self.model = EnergyModel(setup.hardware, setup.tp, setup.pp)
        self.costs = getattr(inner, "costs", None) or CostModel(setup.hardware, setup.stack)
        self.steps = 0
        self.busy_ns = 0.0
        self.samples: list[float] = []

    def step_ns(self, decode_contexts, prefill=()) -> float:
        t = self.inner.step_ns(decode_contexts, prefill)
        if self.steps % self.sample_every == 0:
            self.samples.append(self.dynamic_J(tuple(decode_contexts), tuple(prefill)))
        self.steps += 1
        self.busy_ns += t
        return t

    def dynamic_J(self, decode_contexts, prefill) -> float:
        """The ops' dynamic energy of one step on all its chips (J): the graph of the step just
        timed where the inner model gives it (``graph``: a MoE step's own expert loads), else a
        full lowering."""
        made = getattr(self.inner, "graph", None)
        graph = made(decode_contexts, prefill) if made is not None else lower_step(self.setup, decode_contexts,
                                                                                  prefill=prefill)
        pj = 0.0
        for op in graph.ops:
            _rows, parts = self.model._op_pj(op, self.costs.cost_once(op.work))
            pj += sum(parts.values())
        return pj * J_PER_PJ * self.model.tp

    def summary(self, window_s: float, output_tokens: int) -> dict:
        """Flat figures for the serve summary (J per output token, average power)."""
        m = self.model
        busy_s = self.busy_ns * S_PER_NS
        dynamic = (sum(self.samples) / len(self.samples)) * self.steps if self.samples else 0.0
        chip = m.static_W * busy_s + m.idle_W * max(0.0, window_s - busy_s) + dynamic
        total = chip + m.host_W * window_s
        tokens = max(1, output_tokens)
        return {"J_per_output_token": total / tokens, "chip_J_per_output_token": chip / tokens,
                "energy_avg_W": total / window_s if window_s else 0.0,
                "energy_dynamic_share": dynamic / total if total else 0.0, "energy_sampled_steps": len(self.samples)}
