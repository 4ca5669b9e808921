"""What ``decodesim compare`` does: KV formats side by side for one setup."""

from __future__ import annotations

from sim.commands.common import comma_list, emit_json
from sim.config.hardware import kernel_costs_origin
from sim.config.software import load_stack
from sim.errors import COMMAND_LINE, ConfigError
from sim.experiments.compare import attention_rows, compare_rows, kv_qualities
from sim.options.spec import spec_from_args
from sim.run import simulate
from sim.setup import format_for, load_profile

MAX_FORMATS = 64  # KV formats (and stacks) per compare: each is a simulated run and a fidelity measurement


def handle(args) -> int:
    each = " (each is a simulated run)"
    names = comma_list(args.kv, "--kv", "formats", MAX_FORMATS, each)
    stacks = comma_list(args.kernels, "--kernels", "stacks", MAX_FORMATS, each) if args.kernels is not None else []
    if args.fidelity_tokens <= 0:
        raise ConfigError(COMMAND_LINE, "--fidelity-tokens", "must be > 0", args.fidelity_tokens)
    spec = spec_from_args(args)
    published = _published(args.published_kernel)
    for name in names:  # every format and stack refused before the first run, not after the others ran
        format_for("kv", name)
    for stack in stacks:
        load_stack(stack)
    rows = compare_rows(spec, names, fidelity_tokens=args.fidelity_tokens)
    qualities = []
    if not args.no_qualities:
        qualities = kv_qualities(spec, names, published)
    kernels = []
    if args.kernels:
        kernels = attention_rows(spec, names, stacks)
    if args.json:
        setup = {k: v for k, v in spec.model_dump().items() if k != "kv"}
        emit_json("compare", {"spec": setup, "kv_formats": names, "rows": rows, "kernels": kernels,
                              "kv_qualities": qualities,
                              "published_kernel": {"fraction": published[0], "source": published[1]} if published else None})
        return 0
    print(render(spec, rows))
    if qualities:
        print(render_qualities(qualities, published))
    if kernels:
        print(render_kernels(kernels))
    if (not args.no_qualities and not qualities or args.kernels and not kernels) and _reference_misfits(spec):
        print("  kernel qualities" + (" and --kernels" if args.kernels else "") + ": not shown: the fp16 reference "
              "does not fit this setup (a verdict against fp16 needs an fp16 step to set it against)")
    return 0


def _reference_misfits(spec) -> bool:
    """Whether the fp16-KV run of ``spec`` does not fit (then nothing is judged against it)."""
    return simulate(spec.model_copy(update={"kv": "fp16"})).summary["verdict"] == "does-not-fit"


def _published(text: str | None) -> tuple[float, str] | None:
    """``0.85,BitDecoding (arXiv:2503.18773) Fig. 9`` -> (0.85, source); bad input is a ConfigError."""
    if text is None:
        return None
    value, _, source = text.partition(",")
    try:
        fraction = float(value)
    except ValueError:
        raise ConfigError(COMMAND_LINE, "--published-kernel", "expected FRACTION,SOURCE with FRACTION a number",
                          text) from None
    if not 0 < fraction <= 1 or not source.strip():
        raise ConfigError(COMMAND_LINE, "--published-kernel",
                          "expected FRACTION in (0, 1] of the HBM peak and a SOURCE naming the paper or benchmark", text)
    return fraction, source.strip()


def render_qualities(rows: list[dict], published) -> str:
    cols = [("measured", "as run"), ("best_measured", "best measured"), ("byte_limit", "byte limit")]
    if published:
        cols.append(("published", f"published ({published[0]:g} of HBM)"))
    lines = ["  KV verdict at kernel qualities: ms/token with the format (fp16 under the same kernel) and whether it "
             "beats fp16",
             "  " + f"{'KV format':<19}" + "".join(f"{label:>30}" for _, label in cols)]
    for r in rows:
        cells = []
        for key, _ in cols:
            c = r[key]
            cells.append(f"{c['ms']:.3f} ({c['fp16_ms']:.3f}) {'beats' if c['beats_fp16'] else 'loses'}")
        lines.append("  " + f"{r['kv']:<19}" + "".join(f"{c:>30}" for c in cells))
    lines.append("  as run: the stack's own attention kernels (measured); best measured: one kernel reading the "
                 "quantized cache at the measured efficiency and per-value dequantization cost of the best "
                 "dequantizing kernel measured on the H200 (fused stack's triton_group, calibration/kv_attention.py); "
                 "byte limit: the quantized bytes at the attention class's rate, dequantization free"
                 + (f"; published: {published[1]}" if published else ""))
    return "\n".join(lines)


def render_kernels(rows: list[dict]) -> str:
    lines = ["  attention kernels: per-token ms, attention ms per step, attention vs fp16, KV rate reached, "
             "break-even (how many times cheaper per value the kernel must be to match fp16's step)",
             f"  {'stack':<17}{'KV format':<19}{'ms/token':>9}{'attn ms':>9}{'vs fp16':>8}{'KV GB/s':>9}{'break-even':>11}"]
    for r in rows:
        be = r["break_even"]
        be_txt = "-" if be is None else ("never" if be == float("inf") else ("meets" if be <= 1.0 else f"{be:.2f}x"))
        lines.append(f"  {r['software']:<17}{r['kv']:<19}{r['step_ms']:>9.3f}{r['attention_ms']:>9.3f}"
                     f"{r['attention_vs_baseline']:>8.2f}{r['kv_GBps']:>9.0f}{be_txt:>11}")
    return "\n".join(lines)


def render(spec, rows: list[dict]) -> str:
    where = f"trace {spec.trace}" if spec.trace else f"batch {spec.batch}, context {spec.context}"
    lines = [f"decodesim compare: {spec.model} on {spec.hardware}, weights {spec.weights}, {where}, "
             f"target {spec.target_ms:g} ms",
             f"  kernel costs: {kernel_costs_origin(load_profile(spec.hardware))}",
             f"  {'KV format':<19}{'ms/token':>9}{'cut':>9}{'KV KiB/tok':>11}{'reduct.':>8}{'KV bytes':>9}"
             f"{'dequant':>8}{'attn err':>9}{'KL':>9}  {'bound':<9}verdict"]
    for r in rows:
        if r["per_token_ms_p50"] is None:
            ms = cut = share = deq = "-"
        else:
            ms = f"{r['per_token_ms_p50']:.3f}"
            cut = f"{r['latency_cut_pct']:.1f}%" if r["latency_cut_pct"] is not None else "-"
            share = f"{r['kv_bytes_share_pct']:.1f}%" if r["kv_bytes_share_pct"] is not None else "-"
            deq = f"{r['dequant_ms']:.2f}"
        lines.append(f"  {r['kv']:<19}{ms:>9}{cut:>9}{r['kv_stored_bytes_per_token'] / 1024:>11.1f}"
                     f"{r['reduction_pct']:>7.1f}%{share:>9}{deq:>8}{r['output_rel_error']:>9.4f}"
                     f"{r['attn_kl']:>9.5f}  {r['bound']:<9}{r['verdict']}")
    lines.append(f"  KV KiB/tok: KV stored per token over all layers at the context; KV bytes: KV (incl. "
                 f"outliers) share of the bytes read from the backing store per step; dequant: ms per step "
                 f"on the vector units; attn err: attention-output relative error (KL: of the attention "
                 f"probabilities) on {rows[0]['fidelity_tokens']} tokens of synthetic KV")
    if any(r.get("J_per_token") for r in rows):
        lines.append("  energy per token: " + "; ".join(
            f"{r['kv']} {r['J_per_token']:.3f} J" + (
                f" ({abs(r['energy_cut_pct']):.1f}% {'less' if r['energy_cut_pct'] >= 0 else 'more'} than fp16)"
                if r.get("energy_cut_pct") is not None and r["kv"] != "fp16" else "")
            for r in rows if r.get("J_per_token")))
    return "\n".join(lines)
