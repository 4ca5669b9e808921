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

Each policy is a small strategy object (``ChunkedPolicy``, ``SeparatePolicy``, named in
``POLICIES``) that fills a step from the scheduler's queues; the scheduler holds the
mechanisms both share (reserving blocks, preemption, admission, completing a step).

Token accounting (both policies): a request with prompt P and output O computes P tokens of
prompt; the step that completes them samples output token 1 (time to first token); each
decode step then processes the last sampled token and samples the next, until O tokens have
been sampled (O - 1 decode steps; the last token's KV is never written). A recomputed
sequence re-processes its prompt and all but its last generated token, and the step that
completes them samples its next token. Every output token is sampled exactly once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from sim.errors import COMMAND_LINE, ConfigError

Policy = Literal["chunked", "separate"]
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
        self._policy = POLICIES[policy]()
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
            n = min(seq.known, budget)
            if not sched.pool.reserve(seq, n):
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
            n = seq.known
            if (step.work and n > budget) or not sched.pool.reserve(seq, n):
                break
            sched.admit(seq, now_ns)
            step.work.append((seq, n))
            budget -= n
        return bool(step.work)


POLICIES: dict[str, type[SchedulingPolicy]] = {"chunked": ChunkedPolicy, "separate": SeparatePolicy}


__all__ = ["KVPool", "Scheduler", "Sequence", "StepWork", "POLICIES", "SchedulingPolicy", "ChunkedPolicy",
           "SeparatePolicy", "VLLM_BLOCK_TOKENS",
           "DEFAULT_MAX_TOKENS_PER_STEP", "DEFAULT_MAX_BATCH"]
