"""Triton kernels of the launch, streaming-read and gather classes (kernels.py's launch and grid
sections; microbench.py's HBM, L2 and gather sections). Defined only where Triton imports.
"""
from __future__ import annotations

try:
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except Exception:  # noqa: BLE001
    HAVE_TRITON = False

if HAVE_TRITON:
    # ---- kernels.py
    @triton.jit
    def _launch_kernel(out_ptr, STORE: tl.constexpr):
        """Empty program (STORE=False) or one int32 store per program (STORE=True)."""
        pid = tl.program_id(0)
        if STORE:
            tl.store(out_ptr + pid, pid)

    @triton.jit(do_not_specialize=["chunk_elems", "n_elem"])
    def _chunk_read_kernel(x_ptr, out_ptr, chunk_elems, n_elem, BLOCK: tl.constexpr):
        """Program p sums elements [p*chunk, (p+1)*chunk) of x; one fp32 partial per program."""
        pid = tl.program_id(0)
        start = pid.to(tl.int64) * chunk_elems
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for off in range(0, chunk_elems, BLOCK):
            idx = off + tl.arange(0, BLOCK)
            offs = start + idx
            acc += tl.load(x_ptr + offs, mask=(idx < chunk_elems) & (offs < n_elem), other=0.0)
        tl.store(out_ptr + pid, tl.sum(acc, axis=0))

    @triton.jit(do_not_specialize=["n_elem", "iters"])
    def _strided_read_kernel(x_ptr, out_ptr, n_elem, iters, BLOCK: tl.constexpr):
        """Persistent read: program p reads blocks p, p+P, p+2P, ...; one partial per program."""
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for it in range(iters):
            offs = (it * nprog + pid).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n_elem, other=0.0)
        tl.store(out_ptr + pid, tl.sum(acc, axis=0))

    # ---- microbench.py
    @triton.jit
    def _read_kernel(x_ptr, out_ptr, n_elem, iters, BLOCK: tl.constexpr):
        """Persistent streaming read: every element read exactly once, one fp32 partial per program.
        iters = cdiv(n_elem, nprog * BLOCK)."""
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for it in range(iters):
            offs = (it * nprog + pid) * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n_elem, other=0.0)
        tl.store(out_ptr + pid, tl.sum(acc, axis=0))

    @triton.jit
    def _l2_multipass_kernel(x_ptr, out_ptr, n_elem, passes, iters, BLOCK: tl.constexpr):
        """Reads the whole buffer `passes` times; loads bypass L1 (.cg) and each pass shifts which
        program reads which block, so after the first pass the data comes from L2."""
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for p in range(passes):
            vpid = (pid + p * 37) % nprog
            for it in range(iters):
                offs = (it * nprog + vpid) * BLOCK + tl.arange(0, BLOCK)
                acc += tl.load(x_ptr + offs, mask=offs < n_elem, other=0.0, cache_modifier=".cg")
        tl.store(out_ptr + pid, tl.sum(acc, axis=0))

    @triton.jit
    def _gather_kernel(tab_ptr, idx_ptr, out_ptr, n_rows, G: tl.constexpr, BR: tl.constexpr):
        """out[r, :] = tab[idx[r], :]; rows of G int32 (granule = 4*G bytes)."""
        pid = tl.program_id(0)
        r = pid * BR + tl.arange(0, BR)
        rm = r < n_rows
        ix = tl.load(idx_ptr + r, mask=rm, other=0)
        c = tl.arange(0, G)
        v = tl.load(tab_ptr + ix[:, None] * G + c[None, :], mask=rm[:, None], other=0)
        tl.store(out_ptr + r[:, None].to(tl.int64) * G + c[None, :], v, mask=rm[:, None])
