"""``decodesim fidelity``: the numerical error of KV formats on synthetic or user KV tensors.

For each format: relative Frobenius error of K (after RoPE) and V, attention-logit error,
KL divergence of the attention probabilities and attention-output error, for random decode
queries (sim.formats.fidelity). Synthetic KV parameters are set with ``--synthetic
KEY=VALUE`` (the keys of ``SyntheticKV``: tokens, kv_heads, head_dim, k_outlier_channels,
k_outlier_scale, k_dof, v_dof, v_token_sigma, query_std, seed, ...); user tensors come from
``--input kv.npz`` (arrays k, v, optionally q) or ``--input k.npy --v v.npy``.
"""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("fidelity", help="measure KV-format error: K/V, attention scores, KL, outputs",
                       description="Quantize KV tensors with each format's numpy reference quantizer and "
                                   "report reconstruction, attention-score, KL and attention-output errors.")
    p.add_argument("--kv", required=True, help="comma-separated KV formats (names or YAML paths)")
    p.add_argument("--input", default=None, metavar="FILE", help="user KV: .npz with k and v (and q), or k .npy")
    p.add_argument("--v", dest="v_path", default=None, metavar="FILE", help="V as .npy when --input is K as .npy")
    p.add_argument("--head-dim", type=int, default=128, help="head dimension of user tensors (default 128)")
    p.add_argument("--k-rope", choices=["post", "pre"], default="post",
                   help="whether user K was stored after (default) or before RoPE")
    p.add_argument("--rope-theta", type=float, default=500000.0, help="RoPE base of user tensors (default 5e5)")
    p.add_argument("--queries", type=int, default=32, help="random queries per KV head for user tensors")
    p.add_argument("--synthetic", action="append", default=[], metavar="KEY=VALUE",
                   help="synthetic-KV parameter, e.g. tokens=4096 or k_outlier_scale=12 (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="seed for synthetic KV, queries and codebook fitting")
    p.add_argument("--json", action="store_true", help="print JSON rows")
    p.set_defaults(handler="sim.commands.handlers.fidelity")


