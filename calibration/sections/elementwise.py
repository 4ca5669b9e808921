"""kernels.py's elementwise section: copies, adds, casts, activations, row norms, softmax, sums
and concatenation over 4 KiB .. 1 GiB; argmax and softmax over logits rows; indexed row
copies, adds and gathers in a large table.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F
from sweep import coverage_order

from sections.bench import Bench, Config, MAX_REPS, dtype_name, esize, round_to

def ew_simple_specs():
    """(impl, kclass, in dtypes, out dtype, eager kernels, intermediate bytes/elem, op).

    op(ins, out) runs one invocation on a rotation slot.
    """
    bf, f32 = torch.bfloat16, torch.float32
    return [
        ("copy_", "elementwise", [bf], bf, 0, lambda x, y: y.copy_(x[0])),
        ("add", "elementwise", [bf, bf], bf, 0, lambda x, y: torch.add(x[0], x[1], out=y)),
        ("mul", "elementwise", [bf, bf], bf, 0, lambda x, y: torch.mul(x[0], x[1], out=y)),
        ("silu", "elementwise", [bf], bf, 0, lambda x, y: torch.ops.aten.silu.out(x[0], out=y)),
        ("silu_mul", "elementwise", [bf, bf], bf, 4, lambda x, y: torch.mul(F.silu(x[0]), x[1], out=y)),
        ("cast_bf16_fp32", "elementwise", [bf], f32, 0, lambda x, y: y.copy_(x[0])),
        ("cast_fp32_bf16", "elementwise", [f32], bf, 0, lambda x, y: y.copy_(x[0])),
        ("sum", "reduction", [bf], None, 0, lambda x, y: x[0].sum()),
        ("cat2", "concat", [bf, bf], "cat", 0, lambda x, y: torch.cat([x[0], x[1]], out=y)),
    ]


def elementwise_configs(b: Bench) -> list:
    """All elementwise-section configurations."""
    cfgs = []
    for size in coverage_order(b.axis("elementwise", "sizes_bytes")):
        for spec in ew_simple_specs():
            cfgs.append(_ew_simple_cfg(b, size, *spec))
        cfgs += _row_op_cfgs(b, size)
    cfgs += _logit_cfgs(b)
    cfgs += _index_cfgs(b)
    return cfgs


def _ew_simple_cfg(b: Bench, size, impl, kclass, in_dts, out_dt, inter_per_elem, op) -> Config:
    """A 1-D elementwise/reduction/concat op whose bytes read + written total `size`."""
    per_elem = sum(esize(d) for d in in_dts)
    if out_dt == "cat":
        per_elem *= 2
    elif out_dt is not None:
        per_elem += esize(out_dt)
    n = round_to(size // per_elem, 256)
    in_bytes = n * sum(esize(d) for d in in_dts)
    if out_dt == "cat":
        out_spec, out_bytes = ((2 * n,), in_dts[0]), in_bytes
    elif out_dt is None:
        out_spec, out_bytes = None, 4
    else:
        out_spec, out_bytes = ((n,), out_dt), n * esize(out_dt)
    specs = [((n,), d) for d in in_dts] + ([out_spec] if out_spec else [])
    per_slot = in_bytes + (out_bytes if out_spec else 0)
    n_slots = b.slots_for(per_slot)
    note = "eager: silu then mul (2 kernels)" if impl == "silu_mul" else ""
    moves_only = impl.startswith(("copy", "cast", "cat"))
    meta = dict(impl=impl, kclass=kclass, dtype=dtype_name(in_dts[0]), elements=n, size_bytes=size,
                bytes_read=in_bytes, bytes_written=out_bytes, bytes_intermediate=inter_per_elem * n,
                flops=0 if moves_only else n, note=note)

    def build():
        slots = b.carve(specs, n_slots)
        k = len(in_dts)
        return lambda i: op(slots[i % n_slots][:k], slots[i % n_slots][k] if out_spec else None)
    return Config(f"elementwise:{impl}:n{n}", "elementwise", meta, build,
                  est_us=3.0 + per_slot / 2.5e12 * 1e6, n_slots=n_slots, bytes_per_slot=per_slot)


def hf_rmsnorm(x, w, eps=1e-6):
    """RMSNorm as Hugging Face's LlamaRMSNorm writes it (fp32 statistics, bf16 output)."""
    h = x.float()
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(x.dtype)


def _row_op_cfgs(b: Bench, size) -> list:
    """F.rms_norm, HF RMSNorm and softmax over bf16 rows of width 4096 (rows = size / 8 KiB)."""
    W = b.axis("elementwise", "row_width")
    rows = max(1, size // (2 * W))
    n = rows * W
    nb = 2 * n
    w = torch.ones(W, dtype=torch.bfloat16, device=b.dev)
    n_slots = b.slots_for(2 * nb)
    specs = [((rows, W), torch.bfloat16), ((rows, W), torch.bfloat16)]
    items = [
        ("F.rms_norm", "row_norm", 0, "", lambda x, y: F.rms_norm(x, (W,), weight=w, eps=1e-6)),
        ("hf_rmsnorm_fp32", "row_norm", 32 * n,
         "x.float(); pow(2).mean(-1); +eps; rsqrt; mul; .to(bf16); *w (eager group); "
         "bytes_intermediate ~ 32 B/elem estimate", lambda x, y: hf_rmsnorm(x, w)),
        ("softmax", "row_softmax", 0, "", lambda x, y: torch.ops.aten._softmax.out(x, -1, False, out=y)),
    ]
    cfgs = []
    for impl, kclass, inter, note, op in items:
        meta = dict(impl=impl, kclass=kclass, dtype="bf16", elements=n, rows=rows, row_width=W,
                    size_bytes=size, bytes_read=nb + (2 * W if "rms" in impl else 0), bytes_written=nb,
                    bytes_intermediate=inter, flops=4 * n, note=note)

        def build(op=op):
            slots = b.carve(specs, n_slots)
            return lambda i: op(slots[i % n_slots][0], slots[i % n_slots][1])
        cfgs.append(Config(f"elementwise:{impl}:rows{rows}_w{W}", "elementwise", meta, build,
                           est_us=3.0 + 2 * nb / 2.5e12 * 1e6, n_slots=n_slots, bytes_per_slot=2 * nb))
    return cfgs


def _logit_cfgs(b: Bench) -> list:
    """argmax (bf16 and fp32 logits) and fp32 softmax over vocab-width rows."""
    widths = b.axis("elementwise", "logit_widths")
    row_counts = b.axis("elementwise", "logit_rows")
    cfgs = []
    for W in widths:
        for rows in row_counts:
            for impl, dt in (("argmax", torch.bfloat16), ("argmax", torch.float32),
                             ("softmax_vocab", torch.float32)):
                nb = rows * W * esize(dt)
                out_b = rows * 8 if impl == "argmax" else nb
                n_slots = b.slots_for(nb)
                meta = dict(impl=impl, kclass="row_reduce" if impl == "argmax" else "row_softmax",
                            dtype=dtype_name(dt), elements=rows * W, rows=rows, row_width=W,
                            bytes_read=nb, bytes_written=out_b, flops=rows * W)

                def build(rows=rows, W=W, dt=dt, impl=impl, n_slots=n_slots):
                    xs = [s[0] for s in b.carve([((rows, W), dt)], n_slots)]
                    if impl == "argmax":
                        return lambda i: torch.argmax(xs[i % n_slots], dim=-1)
                    return lambda i: torch.softmax(xs[i % n_slots], dim=-1)
                cfgs.append(Config(f"elementwise:{impl}:{dtype_name(dt)}_rows{rows}_w{W}", "elementwise",
                                   meta, build, est_us=4.0 + (nb + out_b) / 2e12 * 1e6,
                                   n_slots=n_slots, bytes_per_slot=nb))
    return cfgs


def _index_cfgs(b: Bench) -> list:
    """index_copy_ / index_add_ of B rows into a 1 GB table; index_select / embedding gathers."""
    table_bytes = b.axis("elementwise", "index_table_bytes")
    Bs = b.axis("elementwise", "index_batches")
    cfgs = []
    scatter_row_bytes = b.axis("elementwise", "scatter_row_bytes")
    gather_widths = b.axis("elementwise", "gather_widths")
    for B in Bs:
        for rb in scatter_row_bytes:
            for impl in ("index_copy_", "index_add_"):
                cfgs.append(_index_cfg(b, impl, B, rb // 2, table_bytes))
        for W in gather_widths:
            for impl in ("index_select", "F.embedding"):
                cfgs.append(_index_cfg(b, impl, B, W, table_bytes))
    return cfgs


def _index_cfg(b: Bench, impl, B, W, table_bytes) -> Config:
    """One indexed-row op: B rows of W bf16 elements against a table of table_bytes.

    Each of the up to MAX_REPS invocations of a replay has its own B random row indices, and
    between replays all indices are drawn again, so the touched rows are not L2-resident.
    """
    row_b = 2 * W
    n_rows = table_bytes // row_b
    rows_b = B * row_b
    idx_b = B * 8
    if impl in ("index_copy_", "index_add_"):
        kclass = "scatter"
        rd = rows_b + idx_b + (rows_b if impl == "index_add_" else 0)
        wr = rows_b
    else:
        kclass = "gather"
        rd, wr = rows_b + idx_b, rows_b
    meta = dict(impl=impl, kclass=kclass, dtype="bf16", rows=B, row_width=W, elements=B * W,
                size_bytes=table_bytes, bytes_read=rd, bytes_written=wr, flops=0,
                note=f"table {n_rows} rows x {W} bf16; fresh random row indices per invocation")
    n_sets = MAX_REPS if b.cuda else 4
    idx_all = torch.zeros(n_sets, B, dtype=torch.int64, device=b.dev)

    def refresh():
        idx_all.random_(0, n_rows)

    def build():
        table = b.carve([((n_rows, W), torch.bfloat16)], 1)[0][0]
        refresh()
        idx = list(idx_all.unbind(0))
        src = [torch.randn(B, W, device=b.dev, dtype=torch.bfloat16) for _ in range(4)]
        out = torch.empty(B, W, device=b.dev, dtype=torch.bfloat16)
        if impl == "index_copy_":
            return lambda i: table.index_copy_(0, idx[i % n_sets], src[i % 4])
        if impl == "index_add_":
            return lambda i: table.index_add_(0, idx[i % n_sets], src[i % 4])
        if impl == "index_select":
            return lambda i: torch.index_select(table, 0, idx[i % n_sets], out=out)
        return lambda i: F.embedding(idx[i % n_sets], table)
    return Config(f"elementwise:{impl}:B{B}_w{W}", "elementwise", meta, build, est_us=4.0,
                  n_slots=1, bytes_per_slot=table_bytes, between=refresh)
