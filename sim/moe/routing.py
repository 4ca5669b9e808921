"""Routing traces: per decode step, layer and token, the top-k expert ids and gate weights.

A ``RoutingTrace`` holds ``experts[step, layer, token, k]`` (int) and ``gates[step, layer,
token, k]`` (float, each row sums to 1) for ``tokens`` token slots; a step with a smaller
batch uses the first ``batch`` slots (slot t is sequence t of the decode trace).

Generators (``generate``), all seeded and deterministic:

* ``uniform``: each token picks k distinct experts uniformly at random;
* ``zipf`` (skew ``s``): expert popularity proportional to 1 / rank^s, the ranking shuffled
  per layer (per-layer variation: each layer has its own hot experts); a token draws k
  distinct experts by successive sampling without replacement (Gumbel top-k over log
  popularity), so s = 0 is uniform;
* ``locality`` (probability ``p``): with probability p a token slot reuses, in each layer,
  the experts its sequence's previous token used (Mixtral's routing analysis reports
  consecutive tokens repeating experts far above chance, anchors.md B2).

Gate weights are a softmax over the chosen experts' scores; the simulator uses them only to
report (combine cost does not depend on them).

File format (``read`` / ``write``), JSON Lines, one record per (step, layer)::

    {"step": 0, "layer": 0, "experts": [[3, 7], [0, 3]], "gates": [[0.6, 0.4], [0.55, 0.45]]}

``experts`` lists one row of k ids per token; ``gates`` is optional (uniform 1/k if absent).
The first line may be a header ``{"routing": {"experts": E, "top_k": k, "layers": L}}``.
Every (step, layer) from 0 to the maxima must be present, with the same token count within
a step.

What is ignored: group-limited routing (DeepSeek's top-4-of-8 groups), capacity factors
and token dropping, router bias updates during the run.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.config.defaults import ROUTING_KINDS
from sim.errors import ConfigError
from sim.io import read_jsonl, write_atomic

KINDS = ROUTING_KINDS  # declared once in sim.config.defaults


@dataclass(frozen=True)
class RoutingTrace:
    experts: np.ndarray  # [steps, layers, tokens, k], int32
    gates: np.ndarray  # [steps, layers, tokens, k], float32
    num_experts: int
    description: str = ""

    @property
    def steps(self) -> int:
        return self.experts.shape[0]

    @property
    def layers(self) -> int:
        return self.experts.shape[1]

    @property
    def tokens(self) -> int:
        return self.experts.shape[2]

    @property
    def top_k(self) -> int:
        return self.experts.shape[3]

    def at(self, step: int, layer: int, batch: int, start: int = 0) -> np.ndarray:
        """[batch, k] expert ids of ``layer`` at ``step`` of the token slots from ``start`` (steps
        wrap around the trace)."""
        if start + batch > self.tokens:
            raise ConfigError("routing", "tokens", f"the routing trace has {self.tokens} token slots; "
                              f"a step of batch {start + batch} needs that many", self.tokens)
        return self.experts[step % self.steps, layer % self.layers, start:start + batch]

    def distinct(self, batch: int | None = None) -> np.ndarray:
        """[steps, layers] number of distinct experts touched by the first ``batch`` tokens."""
        batch = self.tokens if batch is None else batch
        cells = self.steps * self.layers
        flat = self.experts[:, :, :batch].reshape(cells, -1)
        touched = np.zeros((cells, self.num_experts), dtype=bool)
        np.put_along_axis(touched, flat, True, axis=1)
        return touched.sum(axis=1).reshape(self.steps, self.layers)

    def counts(self, batch: int | None = None) -> np.ndarray:
        """[layers, experts] how often each expert is picked over the trace."""
        batch = self.tokens if batch is None else batch
        out = np.zeros((self.layers, self.num_experts), dtype=np.int64)
        for layer in range(self.layers):
            out[layer] = np.bincount(self.experts[:, layer, :batch].ravel(), minlength=self.num_experts)
        return out


def expected_distinct(experts: int, top_k: int, tokens: int) -> float:
    """Closed form for uniform routing: E (1 - (1 - k/E)^T)."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


GENERATE_CELLS = 1 << 22  # expert scores drawn at once by ``generate``


def _top_k(scores: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``top_k`` highest of ``scores`` along the last axis, best first: (indices, scores).
    Picked one at a time (the highest left, then set to -inf), which is the order a sort of the
    top k gives (scores drawn from a continuous distribution do not tie). ``scores`` is used
    up (each pick is overwritten)."""
    top = np.empty(scores.shape[:-1] + (top_k,), dtype=np.intp)
    chosen = np.empty(scores.shape[:-1] + (top_k,), dtype=scores.dtype)
    for j in range(top_k):
        best = scores.argmax(axis=-1)[..., None]
        top[..., j:j + 1] = best
        chosen[..., j:j + 1] = np.take_along_axis(scores, best, axis=-1)
        np.put_along_axis(scores, best, -np.inf, axis=-1)
    return top, chosen


def generate(experts: int, top_k: int, layers: int, steps: int, tokens: int, *, kind: str = "uniform",
             skew: float = 1.0, locality: float = 0.0, seed: int = 0) -> RoutingTrace:
    """A synthetic routing trace (see the module docstring)."""
    if kind not in KINDS:
        raise ConfigError("--routing", "routing", f"expected one of {', '.join(KINDS)} or a routing file", kind)
    if not 0 <= locality <= 1:
        raise ConfigError("--set", "routing_locality", "must be a probability in [0, 1]", locality)
    if skew < 0 or not math.isfinite(skew):
        raise ConfigError("--set", "routing_skew", "must be a finite number >= 0", skew)
    if top_k > experts:
        raise ConfigError("routing", "top_k", f"must be at most the expert count {experts}", top_k)
    rng = np.random.default_rng(seed)
    s = skew if kind == "zipf" else 0.0
    ranks = np.arange(1, experts + 1, dtype=np.float64)
    log_pop = np.empty((layers, experts))
    for layer in range(layers):
        perm = rng.permutation(experts)  # this layer's hot experts
        log_pop[layer, perm] = -s * np.log(ranks)
    ids = np.empty((steps, layers, tokens, top_k), dtype=np.int32)
    gates = np.empty((steps, layers, tokens, top_k), dtype=np.float32)
    if locality == 0:  # no step reads the one before: many at once (the same draws, in the same order)
        per = max(1, GENERATE_CELLS // max(1, layers * tokens * experts))
        for lo in range(0, steps, per):
            scores = rng.gumbel(size=(min(per, steps - lo), layers, tokens, experts))
            if s:  # uniform: every log popularity is -0.0, which adds nothing
                scores += log_pop[None, :, None, :]
            top, chosen = _top_k(scores, top_k)
            ids[lo:lo + per] = top
            weights = np.exp(chosen - chosen.max(axis=3, keepdims=True))
            gates[lo:lo + per] = weights / weights.sum(axis=3, keepdims=True)
    for step in range(steps if locality > 0 else 0):
        scores = log_pop[:, None, :] + rng.gumbel(size=(layers, tokens, experts))
        top, chosen = _top_k(scores, top_k)
        if locality > 0 and step > 0:
            reuse = rng.random(tokens) < locality
            top[:, reuse] = ids[step - 1][:, reuse]
            chosen[:, reuse] = np.log(np.maximum(gates[step - 1][:, reuse], 1e-30))
        ids[step] = top
        weights = np.exp(chosen - chosen.max(axis=2, keepdims=True))
        gates[step] = weights / weights.sum(axis=2, keepdims=True)
    text = f"{kind}" + (f" s={skew:g}" if kind == "zipf" else "") + (f" locality={locality:g}" if locality else "")
    return RoutingTrace(ids, gates, experts, f"{text}, seed {seed}")


# -- files ---------------------------------------------------------------------------------


def write(trace: RoutingTrace, path: str | Path) -> None:
    """Write ``trace`` as JSON Lines (atomically)."""
    lines = [json.dumps({"routing": {"experts": trace.num_experts, "top_k": trace.top_k,
                                     "layers": trace.layers, "description": trace.description}})]
    for step in range(trace.steps):
        for layer in range(trace.layers):
            lines.append(json.dumps({"step": step, "layer": layer, "experts": trace.experts[step, layer].tolist(),
                                     "gates": np.round(trace.gates[step, layer].astype(np.float64), 5).tolist()}))
    write_atomic(path, "\n".join(lines) + "\n")


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read(path: str | Path, experts: int, top_k: int, layers: int) -> RoutingTrace:
    """Read a routing file and check it against the model (``experts``, ``top_k``, and
    ``layers`` MoE layers)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(str(path), None, "routing file not found")
    records = _records(path, experts, top_k, layers)
    ids, gates = _arrays(records, str(path), top_k, layers)
    return RoutingTrace(ids, gates, experts, f"file {path.name}")


Records = dict[tuple[int, int], tuple[list, list | None]]  # (step, layer) -> (expert rows, gate rows or None)


def _records(path: Path, experts: int, top_k: int, layers: int) -> Records:
    """Every (step, layer) record of the file, each checked on its own; the header checked
    against the model."""
    name = str(path)
    records: Records = {}
    for number, rec in read_jsonl(path, "JSON Lines of routing records"):
        where = f"line {number}"
        if not isinstance(rec, dict):
            raise ConfigError(name, where, "expected a JSON object", type(rec).__name__)
        if "routing" in rec:
            _check_header(rec["routing"], name, where, {"experts": experts, "top_k": top_k, "layers": layers})
            continue
        step, layer = _position(rec, name, where, layers)
        rows = _expert_rows(rec["experts"], name, where, experts, top_k)
        records[(step, layer)] = (rows, _gate_rows(rec.get("gates"), name, where, len(rows), top_k))
    if not records:
        raise ConfigError(name, None, "no routing records")
    return records


def _check_header(head, name: str, where: str, model: dict[str, int]) -> None:
    if not isinstance(head, dict):
        raise ConfigError(name, f"{where}: routing", "expected an object {experts, top_k, layers}", head)
    for key, want in model.items():
        if key in head and head[key] != want:
            raise ConfigError(name, f"{where}: routing.{key}", f"the model has {want}", head[key])


def _position(rec: dict, name: str, where: str, layers: int) -> tuple[int, int]:
    missing = {"step", "layer", "experts"} - set(rec)
    if missing:
        raise ConfigError(name, where, f"missing key {sorted(missing)[0]!r}; "
                          "expected step, layer, experts (and optional gates)")
    step, layer = rec["step"], rec["layer"]
    if not (_whole(step) and _whole(layer) and step >= 0 and 0 <= layer < layers):
        raise ConfigError(name, where, f"step must be an int >= 0 and layer in [0, {layers})", (step, layer))
    return step, layer


def _rows_of(rows, width: int) -> bool:
    """Whether ``rows`` is a list of lists of ``width`` items each."""
    return isinstance(rows, list) and all(isinstance(r, list) and len(r) == width for r in rows)


def _expert_rows(rows, name: str, where: str, experts: int, top_k: int) -> list:
    if not rows or not _rows_of(rows, top_k):
        raise ConfigError(name, f"{where}: experts", f"a non-empty list of rows of {top_k} expert ids")
    if any(not _whole(e) or not 0 <= e < experts for r in rows for e in r):
        raise ConfigError(name, f"{where}: experts", f"ids must be ints in [0, {experts})")
    if any(len(set(r)) != len(r) for r in rows):
        raise ConfigError(name, f"{where}: experts", "a token's k experts must be distinct")
    return rows


def _gate_rows(gates, name: str, where: str, tokens: int, top_k: int) -> list | None:
    if gates is None:
        return None
    if not _rows_of(gates, top_k) or len(gates) != tokens:
        raise ConfigError(name, f"{where}: gates", "must match experts row for row")
    if any(not _number(x) for r in gates for x in r):
        raise ConfigError(name, f"{where}: gates", "must be finite numbers")
    return gates


def _arrays(records: Records, name: str, top_k: int, layers: int) -> tuple[np.ndarray, np.ndarray]:
    """[steps, layers, tokens, k] expert ids and gates (uniform 1/k where a record has none),
    ``tokens`` the fewest token rows of any step; every (step, layer) must be present."""
    present = sorted({s for s, _ in records})
    gap = next((i for i, s in enumerate(present) if s != i), None)  # checked before sizing arrays by the steps
    if gap is not None:
        raise ConfigError(name, f"step {gap}, layer 0", "missing record (steps must run 0, 1, 2, ... without gaps)")
    steps = len(present)
    tokens = {s: len(rows) for (s, _), (rows, _) in records.items()}
    width = min(tokens.values())
    ids = np.empty((steps, layers, width, top_k), dtype=np.int32)
    gates = np.full((steps, layers, width, top_k), 1.0 / top_k, dtype=np.float32)
    for step in range(steps):
        for layer in range(layers):
            if (step, layer) not in records:
                raise ConfigError(name, f"step {step}, layer {layer}", "missing record (every step needs every layer)")
            rows, g = records[(step, layer)]
            if len(rows) != tokens[step]:
                raise ConfigError(name, f"step {step}, layer {layer}",
                                  f"expected {tokens[step]} token rows as in the step's other layers", len(rows))
            ids[step, layer] = np.asarray(rows[:width], dtype=np.int32)
            if g is not None:
                gates[step, layer] = np.asarray(g[:width], dtype=np.float32)
    return ids, gates
