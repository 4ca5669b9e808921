"""Software stacks as data: how each op of the lowering runs as kernels.

A stack (``workloads/software/*.yaml``) says, for each op of a decode step, which kernels
run it: how many, what each reads and writes, and its kernel class. The same model on the
same chip runs at very different speeds under different stacks (plain PyTorch eager, the
same kernels captured in a CUDA graph, a fused serving stack), because the number of kernels
and how good each is belong to the software, not the hardware.

Ops are matched by name (``attn_norm``, ``qkv``, ``rope_append``, ``attention``, ``o_proj``,
``gate_up``, ``silu_mul``, ``down``, ``lm_head``, ``argmax``, the MoE ops, ...) through
``groups`` that name several ops at once (``rmsnorm: [attn_norm, ffn_norm, final_norm]``).
An op no entry names runs as one kernel of its default class that reads and writes its
bytes once (the byte model).

A kernel's traffic is stated in the op's *roles* (the lowering labels each access: ``x``
input activations, ``w`` weights, ``y`` outputs, ``res`` a residual input, ``kv`` the cache
read, ``cache`` the cache write, ``idx`` routing indices, ...): ``reads: [x, w]`` reads
those roles' bytes once; listing a role in two kernels reads it twice. ``temp: k`` adds an
intermediate tensor of ``k`` times the op's output-activation bytes, written and read back
by this kernel (an unfused temporary); ``temp_of: kv`` counts it in another size instead.
Temporaries a later kernel reads are named: ``makes: {k16: "kv_dense:0.5"}`` writes one of
half the bf16 size of the KV the op reads (a dequantized K copy), and a later kernel of the
op says ``uses: [k16]`` to read it. Sizes are the op's roles (their bytes) or what the op
knows besides (``SIZES``: ``kv_dense``, the cache the op reads at bf16; ``new_kv``, the new
token's K and V at bf16), each with an optional share (``kv_dense:0.5``). Work (matrix
FLOPs, vector operations) goes to the kernels of classes that do it.

Choices that depend on the run rather than on the op: ``matrix_prologue`` gives the kernels
that run before each matrix kernel of a quantized matmul dtype (``fp8``): a list, or
``{use: static, choices: {static: [...], per_tensor: [...], per_token: [...], fused: []}}``
(the activation's quantization: a constant scale and one cast; a per-tensor amax; a per-row
amax; fused into the GEMM). ``kv_formats.<format>.<op>`` gives an op's kernels when the KV
cache is in that format (``workloads/formats/<format>.yaml``): the new token's
quantize-and-append (``rope_append``), a dequantizing cache's copies before attention. A
stack that has a ``kv_formats`` section must name every quantized format it is run with.
``moe`` picks how routed experts execute (``loop``, ``grouped``, ``grouped_mm``: PyTorch's
grouped GEMM with device-side offsets, ``dense_all``); ``experts@<moe>`` entries give each
execution's kernels. A kernel of any class but attention may name an implementation of
``impls`` whose measured ``efficiency`` scales the rate its reads and writes of the backing
store reach, against its class's: PyTorch's grouped GEMM (``grouped_mm``), the generic
element-by-element kernels PyTorch runs for byte casts, broadcast operands and strided views
(``byte_cast``, ``broadcast``, ``strided``, ``byte_stack``).

Every key is checked: an op key that names no op of the lowering (``ops.rms_norm``), a group
member that is no op, or an unknown field is an error naming the file and the key path.

Where a stack overlaps kernels (``overlap``: programmatic dependent launch hides part of
each kernel's start-up under its predecessor) it says so with a source. Host dispatch per
kernel in eager mode is the stack's (the framework's) cost, measured on the host it names,
plus the framework calls the modeling code makes before the kernel that launch nothing
(``calls``: an ``nn.Module`` call, a view, a transpose, a slice; each costed from
``host_calls_ns``). Neither is paid when the step replays as a captured graph.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Literal

from pydantic import Field, field_validator, model_validator

from sim.config.loader import load_yaml, validate
from sim.config.quantity import Frac, Num, Share, Strict
from sim.errors import ConfigError
from sim.kernel_classes import CLASSES, KVQuant, names
from sim.kernel_classes import check as check_classes
from sim.paths import bundled
from sim.paths import resolve as resolve_path

ROLES = ("x", "w", "y", "res", "kv", "cache", "idx", "link", "pcie", "noc", "fetch")
SIZES = ("kv_dense", "new_kv")  # sizes an op knows besides its roles (sim.lowering.ops)
# the ops the lowering emits (sim.lowering.decode, .moe, .ops; tests/test_stacks.py checks the list)
OPS = ("embed", "attn_norm", "qkv", "q_norm", "k_norm", "rope_append", "attention", "attention_prefill", "o_proj",
       "allreduce_attn", "ffn_norm", "gate_up", "silu_mul", "down", "allreduce_ffn", "final_norm", "lm_head",
       "argmax", "gather_tokens", "recv_activations", "embed_scale", "post_attn_norm", "post_ffn_norm",
       "logit_softcap", "shared_expert", "router", "routing_to_host", "dispatch",
       "dispatch_all_to_all", "experts", "combine_all_to_all", "combine")
MOE_EXECUTIONS = ("loop", "grouped", "grouped_mm", "dense_all")
# ``op@variant`` keys: an execution's kernels, fused projections' (Phi-3), the (1 + w) RMSNorm (Gemma);
# ``attention@d256``: attention's kernels for a head dimension (kernels whose rate depends on it)
OP_VARIANTS = (*MOE_EXECUTIONS, "fused", "unit_offset")
PROLOGUES = ("static", "per_tensor", "per_token", "fused")


def _size_name(spec: str) -> str:
    return spec.partition(":")[0]


class Kernel(Strict):
    """One kernel of an op: its class, the roles it reads and writes, its temporaries."""

    name: str
    kclass: Literal[names()] = Field(alias="class")  # a class of sim.kernel_classes
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    temp: float = Field(default=0.0, ge=0, le=64)  # intermediate bytes, in units of the op's output bytes
    temp_of: str = "y"  # the size ``temp`` counts in: a role or one of SIZES, with an optional share
    makes: dict[str, str] = Field(default_factory=dict)  # named temporaries it writes: name -> size
    uses: tuple[str, ...] = ()  # named temporaries of earlier kernels it reads
    impl: str | None = None  # an implementation with measured efficiency (attention, matrix kernels)
    launches: int = Field(default=1, ge=1, le=4096)
    per_expert: bool = False  # repeated once per touched expert (a per-expert loop)
    dispatched: bool = True  # the host launches it itself (False: launched by a library call before it)
    calls: tuple[str, ...] = ()  # framework calls the host makes before it that launch no kernel (eager)

    @field_validator("reads", "writes")
    @classmethod
    def _roles(cls, roles: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [r for r in roles if r.partition(":")[0] not in ROLES]
        if unknown:
            raise ValueError(f"unknown role {unknown[0]!r}; roles: {', '.join(ROLES)}")
        return roles

    @field_validator("temp_of")
    @classmethod
    def _temp_size(cls, spec: str) -> str:
        _check_size(spec)
        return spec

    @field_validator("makes")
    @classmethod
    def _made_sizes(cls, table: dict) -> dict:
        for spec in table.values():
            _check_size(spec)
        return table


def _check_size(spec: str) -> None:
    name, _, share = spec.partition(":")
    if name not in (*ROLES, *SIZES):
        raise ValueError(f"unknown size {name!r}; sizes: {', '.join((*ROLES, *SIZES))}")
    if share:
        try:
            value = float(share)
        except ValueError:
            raise ValueError(f"the share of {spec!r} must be a number in (0, 64]") from None
        if not 0 < value <= 64:
            raise ValueError(f"the share of {spec!r} must lie in (0, 64]")


class OpKernels(Strict):
    """The kernels of one op (or group of ops). ``stream`` runs the op on a side stream: it
    forks from the main stream where it is issued and the first later op named ``join``
    waits for it (e.g. a shared expert beside the router and the routed experts)."""

    kernels: tuple[Kernel, ...] = Field(min_length=1)
    source: str = ""
    stream: str | None = None
    join: str | None = None

    @model_validator(mode="after")
    def _join(self):
        if (self.stream is None) != (self.join is None):
            raise ValueError("stream and join go together (a side stream must join the main stream)")
        return self

    @model_validator(mode="after")
    def _temporaries(self):
        made: set[str] = set()
        for k in self.kernels:
            missing = [u for u in k.uses if u not in made]
            if missing:
                raise ValueError(f"kernel {k.name}: uses {missing[0]!r}, which no earlier kernel of the op makes "
                                 f"(made before it: {', '.join(sorted(made)) or 'none'})")
            made |= set(k.makes)
        used = {u for k in self.kernels for u in k.uses}
        unused = sorted(made - used)
        if unused:
            raise ValueError(f"temporary {unused[0]!r} is made but no later kernel uses it (a write that nothing "
                             f"reads is a plain write: use writes)")
        return self


class PrologueChoices(Strict):
    """The kernels that quantize a matrix kernel's activation, by how it is scaled: ``use``
    names the one this stack runs."""

    use: Literal["static", "per_tensor", "per_token", "fused"]
    choices: dict[Literal["static", "per_tensor", "per_token", "fused"], tuple[Kernel, ...]]
    bias: tuple[Kernel, ...] = ()  # after each matrix kernel of a biased matmul (the GEMM has no bias epilogue)
    source: str = ""

    @model_validator(mode="after")
    def _chosen(self):
        if self.use not in self.choices:
            raise ValueError(f"use: {self.use!r} is not among choices: {', '.join(self.choices) or '(none)'}")
        return self

    @property
    def kernels(self) -> tuple[Kernel, ...]:
        return self.choices[self.use]


class KernelImpl(Strict):
    """A kernel implementation with a measured quality: ``efficiency`` scales the rate its
    accesses to the backing store reach (of its class's); ``startup_ns``, where given, replaces
    its class's start-up."""

    efficiency: Frac
    startup_ns: Num | None = None  # its own measured start-up (else its class's)
    source: str = ""


class AttentionImpl(Strict):
    """A decode-attention kernel implementation and its measured quality on quantized
    caches. ``efficiency`` scales the rate its KV reads reach (of the attention class's
    bandwidth). Dequantization costs picoseconds per value: ``value_ps`` for every value,
    ``unpack_ps`` x (8 / bits - 1) for sub-byte unpacking, ``group_ps`` / group size for the
    scale and zero of each group, ``outlier_ps`` x the outlier fraction for gathering and
    merging outliers, ``channel_ps`` where K is quantized per channel (KIVI), ``codebook_ps``
    for a codebook lookup. The dequantization runs beside the loads: the kernel takes the
    longer of the two."""

    efficiency: Frac  # of the attention class's rate: 0 would never finish, above 1 beat the class's own measure
    value_ps: Num
    unpack_ps: Num
    group_ps: Num
    outlier_ps: Num
    channel_ps: Num
    codebook_ps: Num | None = None
    source: str = ""

    def ps_per_value(self, quant: KVQuant) -> float:
        """Picoseconds per dequantized value for a KV format (sim.formats.spec.kv_quant)."""
        ps = self.value_ps.value + self.unpack_ps.value * max(0.0, 8.0 / quant.bits - 1.0)
        ps += self.group_ps.value / quant.group_size if quant.group_size else 0.0
        ps += self.outlier_ps.value * quant.outlier_fraction + (self.channel_ps.value if quant.k_per_channel else 0.0)
        if quant.codebook and self.codebook_ps is not None:
            ps += self.codebook_ps.value
        return ps


class MoEHost(Strict):
    """The host's part of a host-synced MoE layer: grouping the routing on the host, and the
    extra syncs a plain PyTorch block makes per touched expert (``bool()``/``.item()`` of
    device values)."""

    grouping_ns: Num
    syncs_per_expert: int = Field(default=0, ge=0, le=16)


class SoftwareStack(Strict):
    """A software stack: launch mode, host dispatch costs, and the kernels of each op."""

    name: str
    description: str
    source: str
    launch: Literal["eager", "graph"]
    dispatch_ns: dict[str, Num] = Field(default_factory=dict)  # host time per eager kernel launch, by class
    host_calls_ns: dict[str, Num] = Field(default_factory=dict)  # host time per kernel-less framework call
    overlap: Share | None = None  # fraction of each kernel's start-up hidden under its predecessor
    groups: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    ops: dict[str, OpKernels]
    attention: dict[str, AttentionImpl] = Field(default_factory=dict)
    moe: Literal["loop", "grouped", "grouped_mm", "dense_all"] = "grouped"  # how routed experts execute
    moe_host: MoEHost | None = None
    # micro-batches a Mixture-of-Experts step runs as, one's all-to-alls under the other's compute
    # (2: DeepEP / SGLang's two-batch overlap); a run's own --microbatches wins
    moe_microbatches: int = Field(default=1, ge=1, le=8)
    # by matmul dtype (fp8: quantize x): a list of kernels, or the choices and the one used
    matrix_prologue: dict[str, tuple[Kernel, ...] | PrologueChoices] = Field(default_factory=dict)
    kv_formats: dict[str, dict[str, OpKernels]] = Field(default_factory=dict)  # by KV format, op -> kernels
    impls: dict[str, KernelImpl] = Field(default_factory=dict)  # measured implementations (not attention)
    # the quantization recipe's ignore list: matmuls whose weights stay bf16 under a quantized
    # weight format (FP8, GPTQ and AWQ checkpoints keep lm_head in 16 bits by default)
    unquantized: tuple[Literal["lm_head", "router", "qkv", "o_proj", "gate_up", "down", "shared_expert"], ...] = ()
    # a compiler that quantizes activations at their producer runs weights whose stored codes the
    # chip's matrix unit executes (int8, fp8, fp4) in that dtype instead of dequantizing them
    native_weight_codes: bool = False

    @field_validator("dispatch_ns")
    @classmethod
    def _classes(cls, table: dict) -> dict:
        check_classes(table, allowed_extra=("default",))
        return table

    @model_validator(mode="after")
    def _names(self):
        for where, kernel in self._kernels():
            problem = self._unknown_name(kernel)
            if problem is not None:
                raise ValueError(f"{where}.{kernel.name}: {problem}")
        return self

    def _kernels(self) -> list[tuple[str, Kernel]]:
        """(key path, kernel) of every kernel the stack declares."""
        kernels = [(f"ops.{key}", k) for key, entry in self.ops.items() for k in entry.kernels]
        for dtype, entry in self.matrix_prologue.items():
            if isinstance(entry, PrologueChoices):
                kernels += [(f"matrix_prologue.{dtype}.choices.{c}", k) for c, ks in entry.choices.items() for k in ks]
                kernels += [(f"matrix_prologue.{dtype}.bias", k) for k in entry.bias]
            else:
                kernels += [(f"matrix_prologue.{dtype}", k) for k in entry]
        kernels += [(f"kv_formats.{fmt}.{op}", k) for fmt, table in self.kv_formats.items()
                    for op, entry in table.items() for k in entry.kernels]
        return kernels

    def _unknown_name(self, kernel: Kernel) -> str | None:
        """What ``kernel`` names that the stack does not declare (an implementation, a framework
        call), or None. A cache-reading kernel's implementation may be an attention one."""
        if kernel.impl is not None and kernel.impl not in self.impls:
            if not CLASSES[kernel.kclass].cache_dequant:
                return f"impl {kernel.impl!r} is not in impls: {', '.join(self.impls) or '(none)'}"
            if kernel.impl not in self.attention:
                return (f"attention impl {kernel.impl!r} is in neither attention: "
                        f"{', '.join(self.attention) or '(none)'} nor impls")
        unknown = [c for c in kernel.calls if c not in self.host_calls_ns]
        if unknown:
            return f"framework call {unknown[0]!r} is not in host_calls_ns: {', '.join(self.host_calls_ns) or '(none)'}"
        return None

    def unknown_key(self) -> tuple[str, str] | None:
        """(key path, what is wrong) for the first op key, group member or KV-format op that
        names no op of the lowering; None if every name is known."""
        for group, members in self.groups.items():
            if group in OPS:
                return f"groups.{group}", f"a group may not take the name of an op ({group!r})"
            for i, member in enumerate(members):
                if member not in OPS:
                    return f"groups.{group}.{i}", f"unknown op {member!r}; ops: {', '.join(OPS)}"
        for key in self.ops:
            op, _, variant = key.partition("@")
            if op not in OPS and op not in self.groups:
                return f"ops.{key}", (f"unknown op {op!r} (neither an op of the lowering nor a group); "
                                      f"ops: {', '.join(OPS)}; groups: {', '.join(self.groups) or '(none)'}")
            if variant and variant not in OP_VARIANTS and not re.fullmatch(r"d\d+", variant):
                return f"ops.{key}", (f"unknown variant {variant!r}; variants: {', '.join(OP_VARIANTS)}, "
                                      f"d<head_dim> (attention)")
        for fmt, table in self.kv_formats.items():
            for op in table:
                if op not in OPS and op not in self.groups:
                    return f"kv_formats.{fmt}.{op}", f"unknown op {op!r}; ops: {', '.join(OPS)}"
        return None

    def stream_problem(self) -> tuple[str, str] | None:
        """(key path, what is wrong) for the first side stream that could never finish: one that
        joins an op the lowering does not have (nothing would wait for it) or joins its own op
        (the op would wait for itself: a deadlock); None if every side stream joins a later op.
        (An op named here that this model's step lacks is refused when the step is lowered.)"""
        for key, entry in self.ops.items():
            if entry.join is None:
                continue
            op = key.partition("@")[0]
            own = set(self.groups.get(op, (op,)))
            if entry.join not in OPS:
                return f"ops.{key}.join", (f"unknown op {entry.join!r}: a side stream must join an op of the "
                                           f"lowering that runs after it; ops: {', '.join(OPS)}")
            if entry.join in own:
                return f"ops.{key}.join", (f"a side stream cannot join its own op {entry.join!r} (the op would wait "
                                           "for itself: a deadlock); expected a later op")
        return None

    def prologue(self, dtype: str) -> tuple[Kernel, ...]:
        """The kernels before each matrix kernel of a matmul in ``dtype`` (none: ())."""
        entry = self.matrix_prologue.get(dtype, ())
        return entry.kernels if isinstance(entry, PrologueChoices) else entry

    def bias_epilogue(self, dtype: str) -> tuple[Kernel, ...]:
        """The kernels after each matrix kernel of a biased matmul in ``dtype`` (none: ())."""
        entry = self.matrix_prologue.get(dtype)
        return entry.bias if isinstance(entry, PrologueChoices) else ()

    def kernels_for(self, op_name: str, kv: str | None = None, variants: tuple[str, ...] = ()
                    ) -> tuple[Kernel, ...] | None:
        """The kernels of op ``op_name`` (or of its group): its entry for the run's KV format
        (``kv_formats``), else for one of ``variants`` (the model's: ``rmsnorm@unit_offset``),
        else for this stack's MoE execution (``experts@loop``), else its own, else None."""
        keys = (op_name, *(g for g, members in self.groups.items() if op_name in members))
        if kv is not None and kv in self.kv_formats:
            table = self.kv_formats[kv]
            entry = next((table[key] for key in keys if key in table), None)
            if entry is not None:
                return entry.kernels
        for variant in (*variants, self.moe):
            entry = next((self.ops[f"{key}@{variant}"] for key in keys if f"{key}@{variant}" in self.ops), None)
            if entry is not None:
                return entry.kernels
        entry = next((self.ops[key] for key in keys if key in self.ops), None)
        return entry.kernels if entry is not None else None

    def side_stream(self, op_name: str) -> tuple[str, str] | None:
        """(stream, join op) when the stack runs ``op_name`` on a side stream."""
        entry = self.ops.get(op_name)
        if entry is not None and entry.stream is not None:
            return entry.stream, entry.join
        return None

    def calls_ns(self, kernel: Kernel) -> float:
        """Host time of the kernel-less framework calls made before ``kernel`` (ns)."""
        return sum(self.host_calls_ns[c].value for c in kernel.calls)

    def dispatch(self, kclass: str) -> float:
        """Host time to launch one kernel of ``kclass`` eagerly (ns)."""
        q = self.dispatch_ns.get(kclass) or self.dispatch_ns.get("default")
        return q.value if q is not None else 0.0


def software_dir():
    return bundled("workloads", "software")


@lru_cache(maxsize=32)
def load_stack(name_or_path: str) -> SoftwareStack:
    """A bundled software stack by name, or a stack YAML file, validated."""
    path = resolve_path(name_or_path, software_dir(), "software stack")
    stack = validate(SoftwareStack, load_yaml(path), path)
    bad = stack.unknown_key() or stack.stream_problem()
    if bad is not None:
        raise ConfigError(str(path), *bad)
    return stack


def list_stacks() -> list[str]:
    return sorted(p.stem for p in software_dir().glob("*.yaml"))
