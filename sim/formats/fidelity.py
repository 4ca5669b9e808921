"""Numerical fidelity of KV formats: what a format costs in accuracy, on KV tensors.

For one layer's K and V (``KVSample``) and a set of decode queries, ``measure(fmt, sample)``
stores K and V through the reference quantizer (sim.formats.reference) and reports:

* ``k_rel_error``, ``v_rel_error``: ||X_hat - X||_F / ||X||_F (K after RoPE, as attention sees it);
* ``score_rel_error``: the same for the attention logits q.k / sqrt(d) of every query;
* ``attn_kl``: mean KL(P || P_hat) of the attention probabilities, nats per query;
* ``output_rel_error``: ||O_hat - O||_F / ||O||_F of the attention outputs P V.

Inputs. ``synthetic(SyntheticKV(...))`` draws KV with the structure that makes KV
quantization hard (parameters below, all configurable, fixed seed):

* K before RoPE: per channel, a Student-t(``k_dof``) noise of unit variance times a per-channel
  scale (lognormal, sigma ``k_channel_sigma``) plus a per-channel mean (normal, std
  ``k_channel_mean``); in each head ``k_outlier_channels`` channels are outliers, their scale
  and mean multiplied by ``k_outlier_scale`` (the few high-magnitude K channels of real LLMs);
  then RoPE (Llama's rotate-half pairing, base ``rope_theta``) at positions 0..tokens-1;
* V: Student-t(``v_dof``) entries (heavier tails) times a per-token lognormal scale
  (sigma ``v_token_sigma``), so some tokens are much larger than others;
* queries: ``queries`` per query head (``q_per_kv`` query heads per KV head), normal with
  std ``query_std``, after RoPE at position ``tokens``.

``load_kv(path)`` reads user tensors: an .npz with ``k`` and ``v`` (and optionally ``q``), or
a pair of .npy files; shapes [tokens, kv_heads, head_dim] or [tokens, channels] (then
``head_dim`` splits the channels). K is taken as stored after RoPE unless ``k_rope="pre"``;
a pre-RoPE format gets the inverse rotation first.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from sim.errors import ConfigError
from sim.formats.reference import fake_quant_kv

MAX_SYNTHETIC_VALUES = 50_000_000  # K (and V, and the queries) values drawn for synthetic KV: 400 MB in float64


@dataclass(frozen=True)
class SyntheticKV:
    tokens: int = 2048
    kv_heads: int = 8
    head_dim: int = 128
    q_per_kv: int = 4
    queries: int = 8
    k_outlier_channels: int = 4
    k_outlier_scale: float = 8.0
    k_channel_sigma: float = 0.3
    k_channel_mean: float = 0.5
    k_dof: float = 5.0
    v_dof: float = 3.0
    v_token_sigma: float = 0.5
    query_std: float = 1.0
    rope_theta: float = 500000.0
    seed: int = 0

    def __post_init__(self):
        for name in ("tokens", "kv_heads", "head_dim", "q_per_kv", "queries"):
            if getattr(self, name) <= 0:
                raise ConfigError("synthetic KV", name, "must be > 0", getattr(self, name))
        if self.head_dim % 2:
            raise ConfigError("synthetic KV", "head_dim", "must be even (RoPE rotates channel pairs)", self.head_dim)
        if not 0 <= self.k_outlier_channels <= self.head_dim:
            raise ConfigError("synthetic KV", "k_outlier_channels", f"must be in [0, head_dim={self.head_dim}]",
                              self.k_outlier_channels)
        for name in ("k_dof", "v_dof"):
            if getattr(self, name) <= 2:
                raise ConfigError("synthetic KV", name, "must be > 2 (finite variance)", getattr(self, name))
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if not math.isfinite(value):
                raise ConfigError("synthetic KV", item.name, "must be a finite number", value)
        if self.seed < 0:
            raise ConfigError("synthetic KV", "seed", "must be >= 0", self.seed)
        values = self.tokens * self.kv_heads * self.head_dim
        queries = self.queries * self.q_per_kv * self.kv_heads * self.head_dim
        if max(values, queries) > MAX_SYNTHETIC_VALUES:
            raise ConfigError("synthetic KV", "tokens", f"tokens x kv_heads x head_dim (and queries x q_per_kv x "
                              f"kv_heads x head_dim) must be at most {MAX_SYNTHETIC_VALUES:,}", max(values, queries))
        if self.rope_theta <= 0:
            raise ConfigError("synthetic KV", "rope_theta", "must be > 0", self.rope_theta)


@dataclass
class KVSample:
    """One layer's K (before RoPE) and V as [tokens x channels], and post-RoPE queries."""

    k_pre: np.ndarray
    v: np.ndarray
    q: np.ndarray  # [kv_heads, queries per KV head, head_dim], after RoPE
    head_dim: int
    rope_theta: float
    label: str = "synthetic"
    params: dict = field(default_factory=dict)

    @property
    def kv_heads(self) -> int:
        return self.k_pre.shape[1] // self.head_dim

    def rope(self, x: np.ndarray, inverse: bool = False) -> np.ndarray:
        return rope(x, self.head_dim, self.rope_theta, inverse=inverse)

    def exact(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(K after RoPE, scores, probabilities, outputs) of the unquantized cache, computed once."""
        if "_exact" not in self.__dict__:
            k_post = self.rope(self.k_pre)
            self.__dict__["_exact"] = (k_post, *attention(self.q, k_post, self.v, self.head_dim))
        return self.__dict__["_exact"]


def rope(x: np.ndarray, head_dim: int, theta: float, positions=None, inverse: bool = False) -> np.ndarray:
    """Rotate-half RoPE on [tokens x (heads x head_dim)] at positions 0..tokens-1."""
    tokens = x.shape[0]
    pos = np.arange(tokens) if positions is None else np.asarray(positions)
    half = head_dim // 2
    freq = theta ** (-np.arange(half) * 2 / head_dim)
    angle = pos[:, None] * freq[None, :] * (-1 if inverse else 1)
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    h = x.reshape(tokens, -1, head_dim)
    a, b = h[..., :half], h[..., half:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(x.shape)


def synthetic(p: SyntheticKV = SyntheticKV()) -> KVSample:
    rng = np.random.default_rng(p.seed)
    width = p.kv_heads * p.head_dim
    t_k = rng.standard_t(p.k_dof, size=(p.tokens, width)) / np.sqrt(p.k_dof / (p.k_dof - 2))
    scale = np.exp(p.k_channel_sigma * rng.standard_normal(width))
    mean = p.k_channel_mean * rng.standard_normal(width)
    for h in range(p.kv_heads):
        picks = h * p.head_dim + rng.choice(p.head_dim, p.k_outlier_channels, replace=False)
        scale[picks] *= p.k_outlier_scale
        mean[picks] *= p.k_outlier_scale
    k_pre = t_k * scale + mean
    t_v = rng.standard_t(p.v_dof, size=(p.tokens, width)) / np.sqrt(p.v_dof / (p.v_dof - 2))
    v = t_v * np.exp(p.v_token_sigma * rng.standard_normal((p.tokens, 1)))
    q = p.query_std * rng.standard_normal((p.queries * p.q_per_kv, width))
    q = rope(q, p.head_dim, p.rope_theta, positions=np.full(q.shape[0], p.tokens))
    q = q.reshape(-1, p.kv_heads, p.head_dim).transpose(1, 0, 2)
    return KVSample(k_pre, v, q, p.head_dim, p.rope_theta, "synthetic", asdict(p))


def load_kv(path: str | Path, v_path: str | Path | None = None, *, head_dim: int = 128,
            k_rope: str = "post", rope_theta: float = 500000.0, queries: int = 32, seed: int = 0,
            query_std: float | None = None) -> KVSample:
    """User KV tensors (see the module docstring). Random queries unless the file has ``q``."""
    path = Path(path)
    arrays = _read_arrays(path, Path(v_path) if v_path else None)
    k, v = (_as_matrix(arrays[name], name, head_dim, path) for name in ("k", "v"))
    if k.shape != v.shape:
        raise ConfigError(str(path), "v", f"must have the shape of k {k.shape}", v.shape)
    k_pre = rope(k, head_dim, rope_theta, inverse=True) if k_rope == "post" else k
    tokens, width = k.shape
    heads = width // head_dim
    if "q" in arrays:
        q = np.asarray(arrays["q"], dtype=np.float64)
        if q.ndim != 3 or q.shape[2] != head_dim or q.shape[1] % heads:
            raise ConfigError(str(path), "q", f"expected [queries, q_heads (a multiple of {heads}), {head_dim}]",
                              q.shape)
        group = q.shape[1] // heads
        q = q.reshape(q.shape[0], heads, group, head_dim).transpose(1, 0, 2, 3).reshape(heads, -1, head_dim)
    else:
        rng = np.random.default_rng(seed)
        std = query_std if query_std is not None else 1.0 / np.sqrt(np.mean(k.var(axis=0)) + 1e-12)
        q = std * rng.standard_normal((queries, width))
        q = rope(q, head_dim, rope_theta, positions=np.full(queries, tokens))
        q = q.reshape(queries, heads, head_dim).transpose(1, 0, 2)
    return KVSample(k_pre, v, q, head_dim, rope_theta, str(path), {"tokens": tokens, "kv_heads": heads,
                                                                  "head_dim": head_dim, "k_rope": k_rope})


def _read_arrays(path: Path, v_path: Path | None) -> dict:
    def read(p: Path, key: str):
        if not p.is_file():
            raise ConfigError(str(p), None, "file not found")
        try:
            data = np.load(p, allow_pickle=False)
        except (ValueError, OSError):  # numpy's own text suggests loading pickles: never here
            raise ConfigError(str(p), None, "not a numpy .npy/.npz file of numbers (pickled object arrays "
                              "are not read)") from None
        if isinstance(data, np.lib.npyio.NpzFile):
            with data:
                return {name: data[name] for name in data.files}
        return {key: data}

    arrays = read(path, "k")
    if v_path is not None:
        arrays.update({"v": read(v_path, "v")["v"]} if v_path.suffix == ".npy" else read(v_path, "v"))
    for name in ("k", "v"):
        if name not in arrays:
            raise ConfigError(str(path), name, f"array {name!r} is missing; expected an .npz with 'k' and 'v' "
                                               "(and optionally 'q'), or --v V.npy", sorted(arrays))
    return arrays


def _as_matrix(a, name: str, head_dim: int, path: Path) -> np.ndarray:
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.floating):
        raise ConfigError(str(path), name, "must be a floating-point array", str(a.dtype))
    if a.ndim == 3:
        if a.shape[2] != head_dim:
            raise ConfigError(str(path), name, f"last axis must be head_dim {head_dim} for "
                                               "[tokens, kv_heads, head_dim]", a.shape)
        a = a.reshape(a.shape[0], -1)
    elif a.ndim != 2 or a.shape[1] % head_dim:
        raise ConfigError(str(path), name, f"expected [tokens, kv_heads, {head_dim}] or [tokens, channels] "
                                           f"with channels a multiple of {head_dim}", a.shape)
    if a.shape[0] < 1 or not np.isfinite(a).all():
        raise ConfigError(str(path), name, "must be non-empty and finite", a.shape)
    return a.astype(np.float64)


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    denom = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / denom) if denom > 0 else 0.0


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, head_dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scores, probabilities and outputs per KV head: q [H, n, d], k and v [T, H*d]."""
    tokens = k.shape[0]
    kh = k.reshape(tokens, -1, head_dim).transpose(1, 0, 2)
    vh = v.reshape(tokens, -1, head_dim).transpose(1, 0, 2)
    scores = q @ kh.transpose(0, 2, 1) / np.sqrt(head_dim)
    probs = _softmax(scores)
    return scores, probs, probs @ vh


def measure(fmt, sample: KVSample, seed: int = 0) -> dict:
    """Fidelity of ``fmt`` on ``sample`` (see the module docstring for the metrics)."""
    k_post, s, p, o = sample.exact()
    k_hat, v_hat, stats = fake_quant_kv(fmt, sample.k_pre, sample.v, rope=sample.rope, seed=seed)
    s_hat, p_hat, o_hat = attention(sample.q, k_hat, v_hat, sample.head_dim)
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = np.where(p > 0, p * (np.log(p) - np.log(np.maximum(p_hat, 1e-300))), 0.0).sum(axis=-1)
    return {
        "kv": fmt.name, "k_rel_error": _rel(k_hat, k_post), "v_rel_error": _rel(v_hat, sample.v),
        "score_rel_error": _rel(s_hat, s), "attn_kl": float(kl.mean()), "output_rel_error": _rel(o_hat, o),
        **stats,
    }


def score_std(sample: KVSample) -> float:
    """The spread of the exact attention logits (a check that the sample is neither uniform
    nor one-hot attention)."""
    return float(sample.exact()[1].std(axis=-1).mean())
