"""A vLLM-like continuous-batching scheduler over paged KV memory.

Memory (``KVPool``): the KV cache of one chip (the fullest pipeline stage under tensor or
pipeline parallelism) is a pool of ``capacity_bytes`` = the backing store's capacity minus
the weights and the activations of the largest step (sim.run.capacity's figures). A
sequence holds whole blocks of ``block_tokens`` tokens (vLLM's default block size is 16);
holding ``k`` blocks costs ``footprint(k x block_tokens)`` bytes, the KV format's exact
per-sequence footprint (``Format.kv_footprint`` per layer x layers per stage), so a
full-precision window, groups along tokens and outliers are charged as the format stores
them. Admission and growth never take the pool past its capacity.

Each step (``policy="chunked"``, vLLM V1's scheduler with chunked prefill, which V1 always
enables; "Optimization and Tuning", docs.vllm.ai):

1. a token budget of ``max_tokens_per_step`` (vLLM's ``max_num_batched_tokens``);
2. running sequences, in admission order, each get their next tokens: 1 for a decoding
   sequence, up to the rest of the budget for one still prefilling (a chunk). A sequence
   that needs a new block and finds none preempts the most recently admitted running
   sequence (its blocks are freed; it goes to the front of the waiting queue and later
   recomputes its prompt and the tokens it had generated, as vLLM's default RECOMPUTE
   preemption does), repeating until the block is found or the sequence preempted itself;
3. if nothing was preempted this step, waiting requests are admitted first come first
   served while fewer than ``max_batch`` sequences run, budget is left and the blocks for
   their first chunk can be reserved; the first request that does not fit stops admission
   (no request overtakes another: head-of-line blocking, as in vLLM).

``policy="separate"`` runs prefill and decode in separate steps (vLLM V0 without chunked
prefill): when requests wait and can be admitted, a step prefills whole prompts (first come
first served, while the token budget, ``max_batch`` and the blocks for the whole prompt
allow; the first prompt always goes even if it exceeds the budget); otherwise a step decodes
one token for every running sequence, with the same preemption rule.

Each policy is a small strategy object that fills a step from the scheduler's queues; the
scheduler holds the mechanisms they share (reserving blocks, preemption, admission,
completing a step). ``POLICIES`` is the one registry of their names: each entry holds the
strategy and the engine's documented defaults (``max_batch``, ``max_tokens_per_step``,
``block_tokens``) with their source, so naming a policy names the engine release whose
scheduler it models (``PolicyEntry``):

* ``chunked`` / ``separate``: the vLLM policies above at the defaults this tool always used
  (vLLM's API server below 70 GiB of GPU memory: 256 sequences, 2,048 tokens, 16-token blocks);
* ``vllm-v1``: ``chunked`` at vLLM V1's API-server defaults on GPUs of 70 GiB or more
  (H100, H200, MI300X): ``max_num_seqs`` 1,024, ``max_num_batched_tokens`` 8,192
  (vllm/engine/arg_utils.py ``EngineArgs.get_batch_defaults``);
* ``trtllm-no-evict``: TensorRT-LLM's default capacity scheduler, GUARANTEED_NO_EVICT ("Useful
  Runtime Options", TensorRT-LLM docs): a request is admitted only if the blocks of its whole
  life (prompt + output - 1 cached tokens) can be reserved now, so a started request is never
  paused; in-flight batching mixes context and generation requests in one step within
  ``max_num_tokens``; context chunking is off by default (``enable_chunked_prefill`` False in
  the LLM API), so a prompt is computed whole in one step (one longer than the budget goes in
  a step without other prompts: TensorRT-LLM would refuse it, a replay must make progress);
* ``trtllm-max-util``: MAX_UTILIZATION: admits while the prompt's blocks fit now and pauses
  the most recently started request when a block is short (the paused request later
  recomputes, as vLLM's preemption does); whole prompts as above. Both TensorRT-LLM entries use
  ``max_batch_size`` 2,048 and ``max_num_tokens`` 8,192 (the build defaults, "Tuning Max Batch
  Size and Max Num Tokens", TensorRT-LLM docs) and 32-token blocks (``tokens_per_block``);
* ``sglang``: SGLang's scheduler: prefill and decode in separate steps (mixed chunks are
  opt-in, ``--enable-mixed-chunk``), a prefill step whenever a prompt is in progress or one can
  be admitted (prefill first), prompts chunked at ``chunked_prefill_size`` 8,192, a page of 1
  token, and conservative admission: a request is admitted only if the pool holds its prompt
  and ``new_token_ratio`` x its output beside the same estimate for every running request;
  the ratio starts at 0.7 and falls linearly to 0.7 x 0.14 over 600 decode steps, and a decode
  step that finds no block retracts the most recent request (recompute) and resets it to 0.7
  (SGLang's ``init_new_token_ratio``, ``min_new_token_ratio_factor``,
  ``new_token_ratio_decay_steps``; server arguments, docs.sglang.ai). SGLang sizes
  ``max_running_requests`` from the pool when it is not given; here the limit is 4,096.

The output length a request will have stands for its ``max_tokens`` (what the benchmark
clients send with ``ignore_eos``), so whole-life reservation is exact, not an estimate.

Token accounting (both policies): a request with prompt P and output O computes P tokens of
prompt; the step that completes them samples output token 1 (time to first token); each
decode step then processes the last sampled token and samples the next, until O tokens have
been sampled (O - 1 decode steps; the last token's KV is never written). A recomputed
sequence re-processes its prompt and all but its last generated token, and the step that
completes them samples its next token. Every output token is sampled exactly once.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from sim.errors import COMMAND_LINE, ConfigError

Policy = str  # a name in POLICIES
VLLM_BLOCK_TOKENS = 16  # vLLM's default KV block size on CUDA
DEFAULT_MAX_TOKENS_PER_STEP = 2048  # vLLM's max_num_batched_tokens below 70 GiB GPUs; see docs/serving.md
DEFAULT_MAX_BATCH = 256  # vLLM's max_num_seqs at the same tier


class SchedulingPolicy(Protocol):
    """How a step is filled: a policy decides the step's work from the scheduler's queues,
    using its shared mechanisms (``continue_running`` with preemption, ``admit``)."""

    def fill(self, sched: Scheduler, step: StepWork, now_ns: int) -> None: ...


@dataclass(slots=True, eq=False)
class Sequence:
    """The live state of one request (dropped when it finishes)."""

    rid: int
    arrival_ns: int
    prompt: int
    output: int
    computed: int = 0  # tokens whose K/V is in the cache
    generated: int = 0  # output tokens sampled so far
    max_computed: int = 0  # the most tokens ever cached (recompute = tokens below this again)
    blocks: int = 0
    charge_bytes: int = 0
    first_token_ns: int = -1
    last_token_ns: int = -1  # when its latest output token was sampled
    finish_ns: int = -1
    admitted_ns: int = -1
    preemptions: int = 0
    recomputed_tokens: int = 0

    @property
    def known(self) -> int:
        """Tokens that exist: the prompt and the sampled output."""
        return self.prompt + self.generated


class KVPool:
    """Paged KV memory: whole blocks per sequence, charged at the format's exact bytes."""

    def __init__(self, capacity_bytes: int, block_tokens: int, footprint_bytes: Callable[[int], int]):
        if block_tokens < 1:
            raise ConfigError(COMMAND_LINE, "block_tokens", "must be >= 1", block_tokens)
        if capacity_bytes <= 0:
            raise ConfigError("capacity", "kv_pool_bytes", "no memory is left for the KV cache after the "
                              "weights and activations", capacity_bytes)
        self.capacity_bytes = int(capacity_bytes)
        self.block_tokens = block_tokens
        self._footprint = footprint_bytes
        self._charges = [0]  # bytes of k blocks, k = 0, 1, ...
        self.used_bytes = 0
        self.used_blocks = 0

    def charge(self, blocks: int) -> int:
        """Bytes a sequence holding ``blocks`` blocks occupies."""
        charges = self._charges
        while len(charges) <= blocks:
            charges.append(int(self._footprint(len(charges) * self.block_tokens)))
        return charges[blocks]

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def fits_alone(self, tokens: int) -> bool:
        """Whether one sequence of ``tokens`` tokens fits in the empty pool."""
        return self.charge(self.blocks_for(tokens)) <= self.capacity_bytes

    def reserve(self, seq: Sequence, tokens: int) -> bool:
        """Grow ``seq`` to hold ``tokens`` tokens; False (and no change) if memory is short."""
        need = -(-tokens // self.block_tokens)
        if need <= seq.blocks:
            return True
        charge = self.charge(need)
        extra = charge - seq.charge_bytes
        if self.used_bytes + extra > self.capacity_bytes:
            return False
        self.used_bytes += extra
        self.used_blocks += need - seq.blocks
        seq.blocks, seq.charge_bytes = need, charge
        return True

    def release(self, seq: Sequence) -> None:
        self.used_bytes -= seq.charge_bytes
        self.used_blocks -= seq.blocks
        seq.blocks = seq.charge_bytes = 0

    @property
    def occupancy(self) -> float:
        return self.used_bytes / self.capacity_bytes


@dataclass(slots=True)
class StepWork:
    """What one step does: (sequence, new tokens) pairs and the step model's view of them."""

    work: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: int = 0
    itl_ns: list[int] = field(default_factory=list)  # inter-token gaps of the tokens it sampled after a first

    def split(self) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
        """(decode contexts after the step's token, prefill (chunk, context before))."""
        decode, prefill = [], []
        for seq, n in self.work:
            if n == 1 and seq.generated and seq.computed == seq.prompt + seq.generated - 1:
                decode.append(seq.computed + 1)
            else:
                prefill.append((n, seq.computed))
        return tuple(decode), tuple(prefill)


class Scheduler:
    """Waiting queue, running list and the per-step decisions of the module docstring."""

    def __init__(self, pool: KVPool, *, max_batch: int = DEFAULT_MAX_BATCH,
                 max_tokens_per_step: int = DEFAULT_MAX_TOKENS_PER_STEP, policy: Policy = "chunked"):
        if max_batch < 1:
            raise ConfigError(COMMAND_LINE, "max_batch", "must be >= 1", max_batch)
        if max_tokens_per_step < 1:
            raise ConfigError(COMMAND_LINE, "max_tokens_per_step", "must be >= 1", max_tokens_per_step)
        if policy not in POLICIES:
            raise ConfigError(COMMAND_LINE, "policy", f"expected one of {', '.join(POLICIES)}", policy)
        self.pool = pool
        self.max_batch = max_batch
        self.max_tokens_per_step = max_tokens_per_step
        self.policy = policy
        self._policy = POLICIES[policy].strategy()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    def arrive(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self, now_ns: int) -> StepWork:
        """Decide this step's work (and reserve its KV blocks)."""
        step = StepWork()
        self._policy.fill(self, step, now_ns)
        self.preemptions += step.preempted
        return step

    def continue_running(self, step: StepWork, budget: int) -> int:
        """Give running sequences, in admission order, their next tokens within ``budget``,
        preempting the most recently admitted when a block is short; returns the budget left."""
        running, pool = self.running, self.pool
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = min(seq.prompt + seq.generated - seq.computed, budget)
            while not pool.reserve(seq, seq.computed + n):
                victim = running.pop()  # the most recently admitted
                self._preempt(victim)
                step.preempted += 1
                if victim is seq:
                    break
            else:
                step.work.append((seq, n))
                budget -= n
                i += 1
                continue
            break
        return budget

    def _preempt(self, seq: Sequence) -> None:
        self.pool.release(seq)
        seq.computed = 0
        seq.preemptions += 1
        self.waiting.appendleft(seq)

    def admit(self, seq: Sequence, now_ns: int) -> None:
        """Move the head of the waiting queue to the running list."""
        self.waiting.popleft()
        self.running.append(seq)
        if seq.admitted_ns < 0:
            seq.admitted_ns = now_ns

    def complete(self, step: StepWork, end_ns: int) -> tuple[int, list[Sequence]]:
        """Apply a finished step: cache its tokens, sample tokens, release finished
        sequences. Returns (tokens sampled, finished sequences)."""
        sampled, finished = 0, []
        for seq, n in step.work:
            start = seq.computed
            seq.computed = start + n
            if start < seq.max_computed:
                seq.recomputed_tokens += min(seq.computed, seq.max_computed) - start
            if seq.computed > seq.max_computed:
                seq.max_computed = seq.computed
            if seq.computed == seq.prompt + seq.generated:
                seq.generated += 1
                sampled += 1
                if seq.generated == 1:
                    seq.first_token_ns = end_ns
                else:
                    step.itl_ns.append(end_ns - seq.last_token_ns)
                seq.last_token_ns = end_ns
                if seq.generated == seq.output:
                    seq.finish_ns = end_ns
                    finished.append(seq)
        if finished:
            for seq in finished:
                self.pool.release(seq)
            self.running = [s for s in self.running if s.generated < s.output]
        return sampled, finished


class ChunkedPolicy:
    """vLLM V1: running sequences first (decode tokens and prefill chunks within the token
    budget), then, if nothing was preempted, waiting requests admitted with a first chunk."""

    def fill(self, sched: Scheduler, step: StepWork, now_ns: int) -> None:
        budget = sched.continue_running(step, sched.max_tokens_per_step)
        if not step.preempted:
            self._admit_chunks(sched, step, budget, now_ns)

    @staticmethod
    def _admit_chunks(sched: Scheduler, step: StepWork, budget: int, now_ns: int) -> None:
        waiting, running = sched.waiting, sched.running
        while waiting and budget > 0 and len(running) < sched.max_batch:
            seq = waiting[0]
            n = min(seq.known - seq.computed, budget)  # computed > 0 only for a prefilled request's KV moved in
            if not sched.pool.reserve(seq, seq.computed + n):
                break
            sched.admit(seq, now_ns)
            step.work.append((seq, n))
            budget -= n


class SeparatePolicy:
    """vLLM V0 without chunked prefill: a step of whole prompts when one can be admitted,
    otherwise a decode step of one token for every running sequence."""

    def fill(self, sched: Scheduler, step: StepWork, now_ns: int) -> None:
        if not self._admit_whole_prompts(sched, step, now_ns):
            sched.continue_running(step, max(sched.max_batch, len(sched.running)))

    @staticmethod
    def _admit_whole_prompts(sched: Scheduler, step: StepWork, now_ns: int) -> bool:
        waiting, running = sched.waiting, sched.running
        budget = sched.max_tokens_per_step
        while waiting and len(running) < sched.max_batch:
            seq = waiting[0]
            n = seq.known - seq.computed
            if (step.work and n > budget) or not sched.pool.reserve(seq, seq.computed + n):
                break
            sched.admit(seq, now_ns)
            step.work.append((seq, n))
            budget -= n
        return bool(step.work)


def _decoding(seq: Sequence) -> bool:
    """Whether ``seq``'s next step is a decode (one token after its last sampled one)."""
    return seq.generated > 0 and seq.computed == seq.known - 1


def _admit_whole(sched: Scheduler, step: StepWork, budget: int, now_ns: int, whole_life: bool) -> None:
    """Admit waiting requests first come first served with whole prompts (no chunking) while
    ``budget`` tokens, ``max_batch`` and the pool allow; ``whole_life`` reserves the blocks of
    the request's whole life at admission (else only its prompt's). A prompt longer than the
    whole budget goes in a step without other prompts."""
    waiting, running = sched.waiting, sched.running
    first = True
    while waiting and len(running) < sched.max_batch:
        seq = waiting[0]
        n = seq.known - seq.computed
        if n > budget and not (first and n > sched.max_tokens_per_step):
            break
        life = seq.prompt + seq.output - 1 if whole_life else 0
        if not sched.pool.reserve(seq, max(seq.computed + n, life)):
            break
        sched.admit(seq, now_ns)
        step.work.append((seq, n))
        budget -= n
        first = False


class NoEvictPolicy:
    """TensorRT-LLM GUARANTEED_NO_EVICT: running requests first (their blocks were reserved
    for their whole life, so none is ever preempted), then whole prompts of waiting requests
    whose whole life fits the pool now."""

    def fill(self, sched: Scheduler, step: StepWork, now_ns: int) -> None:
        budget = sched.continue_running(step, sched.max_tokens_per_step)
        _admit_whole(sched, step, budget, now_ns, whole_life=True)


class MaxUtilizationPolicy:
    """TensorRT-LLM MAX_UTILIZATION: running requests first (pausing the most recently started
    when a block is short), then, if none was paused, whole prompts that fit now."""

    def fill(self, sched: Scheduler, step: StepWork, now_ns: int) -> None:
        budget = sched.continue_running(step, sched.max_tokens_per_step)
        if not step.preempted:
            _admit_whole(sched, step, budget, now_ns, whole_life=False)


class SglangPolicy:
    """SGLang-like: separate prefill and decode steps, prefill first, admission that keeps
    room for ``new_token_ratio`` of every request's output (module docstring)."""

    INIT_RATIO = 0.7  # init_new_token_ratio
    MIN_RATIO = 0.7 * 0.14  # init x min_new_token_ratio_factor
    DECAY_STEPS = 600  # new_token_ratio_decay_steps

    def __init__(self):
        self.ratio = self.INIT_RATIO

    def fill(self, sched: Scheduler, step: StepWork, now_ns: int) -> None:
        if self._prefill(sched, step, now_ns):
            return
        decoding = sum(1 for s in sched.running if _decoding(s))
        sched.continue_running(step, max(1, decoding))
        if step.preempted:
            self.ratio = self.INIT_RATIO
        else:
            self.ratio = max(self.MIN_RATIO, self.ratio - (self.INIT_RATIO - self.MIN_RATIO) / self.DECAY_STEPS)

    def _future_bytes(self, sched: Scheduler, seq: Sequence, now_tokens: int) -> int:
        """Bytes ``seq`` would hold with ``now_tokens`` cached plus ``ratio`` of its output to come."""
        pool = sched.pool
        ahead = math.ceil(self.ratio * (seq.output - seq.generated))
        return pool.charge(pool.blocks_for(now_tokens + ahead))

    def _prefill(self, sched: Scheduler, step: StepWork, now_ns: int) -> bool:
        """A prefill step: prompts in progress continue, then waiting requests are admitted
        while the pool keeps the ratio's room for everyone. False if there is nothing to do."""
        budget = sched.max_tokens_per_step
        pool = sched.pool
        for seq in sched.running:
            if budget > 0 and not _decoding(seq):
                n = min(seq.known - seq.computed, budget)
                if not pool.reserve(seq, seq.computed + n):
                    break
                step.work.append((seq, n))
                budget -= n
        held = sum(self._future_bytes(sched, s, s.known) for s in sched.running)
        waiting = sched.waiting
        while waiting and budget > 0 and len(sched.running) < sched.max_batch:
            seq = waiting[0]
            n = min(seq.known - seq.computed, budget)
            need = self._future_bytes(sched, seq, seq.known)
            if held + need > pool.capacity_bytes or not pool.reserve(seq, seq.computed + n):
                break
            held += need
            sched.admit(seq, now_ns)
            step.work.append((seq, n))
            budget -= n
        return bool(step.work)


@dataclass(frozen=True)
class PolicyEntry:
    """A named scheduler: its strategy, the engine's documented defaults and their source."""

    strategy: Callable[[], SchedulingPolicy]
    max_batch: int
    max_tokens_per_step: int
    block_tokens: int
    engine: str
    source: str


VLLM_SMALL = "vLLM API server below 70 GiB GPUs (vllm/engine/arg_utils.py get_batch_defaults)"
TRTLLM_LIMITS = ("TensorRT-LLM build defaults max_batch_size 2048, max_num_tokens 8192 (docs: Tuning Max Batch "
                 "Size and Max Num Tokens); KvCacheConfig tokens_per_block 32")
POLICIES: dict[str, PolicyEntry] = {
    "chunked": PolicyEntry(ChunkedPolicy, DEFAULT_MAX_BATCH, DEFAULT_MAX_TOKENS_PER_STEP, VLLM_BLOCK_TOKENS,
                           "vLLM V1 (chunked prefill)", VLLM_SMALL),
    "separate": PolicyEntry(SeparatePolicy, DEFAULT_MAX_BATCH, DEFAULT_MAX_TOKENS_PER_STEP, VLLM_BLOCK_TOKENS,
                            "vLLM V0 without chunked prefill", VLLM_SMALL),
    "vllm-v1": PolicyEntry(ChunkedPolicy, 1024, 8192, VLLM_BLOCK_TOKENS, "vLLM V1 (chunked prefill)",
                           "vLLM V1 API server on >= 70 GiB GPUs: max_num_seqs 1024, max_num_batched_tokens 8192 "
                           "(vllm/engine/arg_utils.py get_batch_defaults)"),
    "trtllm-no-evict": PolicyEntry(NoEvictPolicy, 2048, 8192, 32, "TensorRT-LLM GUARANTEED_NO_EVICT (default)",
                                   TRTLLM_LIMITS),
    "trtllm-max-util": PolicyEntry(MaxUtilizationPolicy, 2048, 8192, 32, "TensorRT-LLM MAX_UTILIZATION",
                                   TRTLLM_LIMITS),
    "sglang": PolicyEntry(SglangPolicy, 4096, 8192, 1, "SGLang (separate prefill/decode, conservative admission)",
                          "SGLang server arguments: chunked_prefill_size 8192, page_size 1, init_new_token_ratio 0.7"),
}


__all__ = ["KVPool", "Scheduler", "Sequence", "StepWork", "POLICIES", "PolicyEntry", "SchedulingPolicy",
           "ChunkedPolicy", "SeparatePolicy", "NoEvictPolicy", "MaxUtilizationPolicy", "SglangPolicy",
           "VLLM_BLOCK_TOKENS",
           "DEFAULT_MAX_TOKENS_PER_STEP", "DEFAULT_MAX_BATCH"]
