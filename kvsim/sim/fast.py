"""The fast path: a run of identical decode steps, simulated in one go.

While every running request only decodes, no waiting request can be
admitted, no request finishes and no arrival is due, consecutive steps of the
``chunked`` scheduler differ only in their context lengths: each schedules one
token per running request, in running order, and allocates a block when a
request crosses a block boundary. So instead of K trips through ``schedule()``, the cost model, SimPy
and ``update_from_output()``, kvsim computes the K step times at once
(``CostModel.decode_run_times``) and applies the K steps' effects in bulk, in
exactly the order the step path would (block pops in (step, running index)
order, block hashing likewise), so every later decision is unchanged.

The run ends with the step in which some request emits its last token (it
finishes and frees its blocks, exactly as ``update_from_output`` would), and
stops *before* any step that could differ:

* the first step that would need more blocks than are free (a preemption);
* the first step that starts at or after the next arrival or release (the
  new request must be visible to it);
* any step at all if the waiting head could be admitted, or could become
  admissible because a running request is writing its next prefix block.

Any other step that preempts nothing (an admission, a prefill chunk) goes
through ``schedule_step``: the same ``schedule()``, with the running
requests' one-token chunks given their slots in one pass instead of one
``allocate_slots`` call each; admission is the scheduler's own code.

Only the ``chunked`` scheduler has a fast path; ``continuous`` and ``static``
always step one by one.

``tests/test_fast_path.py`` runs scenarios both ways and compares them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.sched.base import StepPlan, commit_scheduled
from kvsim.sched.chunked import ChunkedScheduler

MIN_RUN_STEPS = 1


@dataclass
class DecodeRun:
    """K decode steps of the same B requests, starting at ``times[0]``."""

    times: list[float]       # K + 1 step boundaries: start of step 1 .. end of step K
    durations: list[float]   # K step times
    free_before: int         # free blocks before the run
    events: list             # (step, running index) of every block allocation, in pop order
    request_ids: list        # the batch, in running (= scheduling) order

    @property
    def num_steps(self) -> int:
        return len(self.durations)

    @property
    def free_after(self) -> list[int]:
        """Free blocks at the end of each step (before the finished are freed)."""
        taken = [0] * (self.num_steps + 1)
        for s, _ in self.events:
            taken[s] += 1
        free, out = self.free_before, []
        for n in taken[1:]:
            free -= n
            out.append(free)
        return out


def plan_decode_run(sched, decode_run_times, now: float,
                    next_event_time: float) -> DecodeRun | None:
    """The longest run of identical decode steps that starts now, or None.

    ``decode_run_times`` costs the steps (``kvsim.cost.base.decode_run_function``).
    """
    if type(sched) is not ChunkedScheduler or next_event_time <= now:
        return None
    running = sched.running
    num_seqs = len(running)
    if num_seqs == 0 or num_seqs > sched.config.max_num_batched_tokens:
        return None
    blocked_hash = _blocked_head(sched)
    if blocked_hash is False:
        return None                           # the waiting head could be admitted
    bs = sched.kv.block_size
    blocks_of = sched.kv.req_to_blocks
    min_remaining = 1 << 62
    ctx_sum = 0
    first_alloc = []             # per request: the step at which it first needs a block
    for r in running:
        c = r.num_computed_tokens
        out = r.num_output_tokens
        prompt_len = r.prompt_len
        if out == 0 or prompt_len + out - c != 1:
            return None                       # a prefill chunk is pending
        rem = r.final_num_tokens - prompt_len - out
        if rem < min_remaining:
            min_remaining = rem
            if rem < MIN_RUN_STEPS:
                return None                   # a request finishes too soon
        ctx_sum += c
        # Step s (1-based) computes token c + s - 1; it needs a new block when
        # that token lies past the blocks held: c + s - 1 >= held * bs.
        s0 = len(blocks_of[r.request_id]) * bs - c + 1
        first_alloc.append(s0 if s0 > 1 else 1)
    # End with the first step in which a request emits its last token: it
    # finishes, and the batch changes after it.
    # A step may start only strictly before the next arrival: the costing
    # stops there.
    times, durations = decode_run_times(num_seqs, ctx_sum, now, min_remaining, next_event_time)
    k = len(durations)
    if k < MIN_RUN_STEPS:
        return None

    if blocked_hash is not None and _cached_during_run(sched, k, blocked_hash):
        return None                           # the head's prefix hit could grow

    # Block allocations as (step, running index): one every bs steps from the
    # first; popped in this order, as the step path pops them.
    events = [(s, i) for i, s0 in enumerate(first_alloc) if s0 <= k
              for s in range(s0, k + 1, bs)]
    events.sort()
    free0 = sched.kv.get_num_free_blocks()
    if len(events) > free0:
        k = events[free0][0] - 1              # stop before the step that would preempt
        if k < MIN_RUN_STEPS:
            return None
        events = events[:free0]
        while events and events[-1][0] > k:
            events.pop()
    return DecodeRun(times[:k + 1], durations[:k], free0, events,
                     [r.request_id for r in running])


def _blocked_head(sched):
    """Whether the waiting queue stays shut for the whole run.

    Returns None when nothing can be admitted for a reason that lasts (no
    waiting request, ``max_num_seqs`` reached, no budget left); the hash of the
    head's next uncached block when the head does not fit now — it still will
    not during the run, since free blocks only shrink and losing a hit never
    lowers the blocks it needs, *unless* a running request caches that very
    block; False when the head could be admitted (no run).
    """
    waiting = sched.waiting
    if not len(waiting):
        return None
    cfg = sched.config
    budget = cfg.max_num_batched_tokens - len(sched.running)
    if len(sched.running) >= cfg.max_num_seqs or budget <= 0:
        return None
    sched.refresh_threshold()
    head = waiting.peek()
    if sched.try_admission(head, budget) is not None:
        return False
    hits, _ = sched.kv.get_computed_blocks(head)
    j = len(hits)
    if not sched.kv.enable_caching or j >= (head.num_tokens - 1) // sched.kv.block_size:
        return None
    return head.block_hashes[j]


def _cached_during_run(sched, k: int, block_hash: int) -> bool:
    """Would a running request hash a block equal to ``block_hash`` in the next k steps?"""
    bs = sched.kv.block_size
    cached = sched.kv.num_cached_block
    for r in sched.running:
        hi = (r.num_computed_tokens + k) // bs
        if hi > cached[r.request_id] and block_hash in r.block_hashes[cached[r.request_id]:hi]:
            return True
    return False


def apply_decode_run(sched, run: DecodeRun) -> list:
    """Apply the run's effects to the scheduler's state, as K steps would.

    Returns the requests that finished in the run's last step, freed as the
    step path frees them (scheduled order, each request's blocks tail first).
    """
    kv = sched.kv
    pool = kv.pool
    running = sched.running
    k = run.num_steps
    if run.events:
        popped = pool.get_new_blocks(len(run.events))
        blocks_of = kv.req_to_blocks
        for block, (_, i) in zip(popped, run.events):
            blocks_of[running[i].request_id].append(block)
    token_times = run.times[1:]
    cached = kv.num_cached_block
    bs = kv.block_size
    caching = kv.enable_caching
    # Blocks filled during the run are hashed in (step, running index) order,
    # as the step path hashes them at schedule time.
    fills = []
    finished = []
    for i, r in enumerate(running):
        c = r.num_computed_tokens
        if caching:
            rid = r.request_id
            last_full = (c + k) // bs
            if last_full > cached[rid]:
                for full in range(max((c + 1) // bs, cached[rid] + 1), last_full + 1):
                    fills.append((full * bs - c, i, full))
        r.num_computed_tokens = c + k
        r.num_output_tokens = out = r.num_output_tokens + k
        r.token_times.extend(token_times)
        if r.prompt_len + out >= r.final_num_tokens:      # is_finished
            finished.append(r)
    if fills:
        fills.sort()
        if kv.debug:
            for _, i, full in fills:
                r = running[i]
                rid = r.request_id
                pool.cache_full_blocks(kv.req_to_blocks[rid], r.block_hashes, cached[rid], full,
                                       r.all_token_ids, bs)
                cached[rid] = full
        else:
            # What cache_full_blocks would do fill by fill, in one call.
            blocks, hashes = [], []
            for _, i, full in fills:
                r = running[i]
                rid = r.request_id
                held, hs = kv.req_to_blocks[rid], r.block_hashes
                for j in range(cached[rid], full):
                    blocks.append(held[j])
                    hashes.append(hs[j])
                cached[rid] = full
            pool.cache_blocks(blocks, hashes)
    return sched.finish_requests(finished, float(run.times[-1]))


def schedule_step(sched) -> StepPlan | None:
    """``sched.schedule()`` for a step that preempts nothing, or None.

    The running requests get their chunks by the rules of
    ``ChunkedScheduler._schedule_running`` (S2: running order, the budget,
    the long-prefill threshold, one slot kept for the sampled token). When
    the free blocks cover every block those chunks need, no request is
    preempted, so the blocks are taken without one ``allocate_slots`` call per
    decode: a decode's block is popped, and a block it fills is cached (A4),
    in running order, grouped between prefill chunks (which go through
    ``allocate_slots``). Then the waiting queue is served by the scheduler's
    own ``_schedule_waiting`` (S3-S5), which can hit the blocks just cached
    (TV5). The plan is the one ``schedule()`` returns. None (use
    ``schedule()``) when some request would have to be preempted.
    """
    if type(sched) is not ChunkedScheduler or sched.kv._any_forks:
        return None
    cfg = sched.config
    kv = sched.kv
    bs = kv.block_size
    blocks_of = kv.req_to_blocks
    sched.refresh_threshold()
    chunk, max_model_len = sched.running_chunk, cfg.max_model_len
    budget = cfg.max_num_batched_tokens
    scheduled = []
    need = 0                                  # free blocks the chunks use up (A2)
    any_chunk = False
    for r in sched.running:
        if budget <= 0:
            break
        n = chunk(r, budget)
        if n <= 0:
            continue
        c = r.num_computed_tokens
        any_chunk = any_chunk or n > 1
        need += max(0, -(-min(c + n, max_model_len) // bs) - len(blocks_of[r.request_id]))
        scheduled.append((r, n, c))
        budget -= n
    if need > kv.get_num_free_blocks():
        return None                           # someone would be preempted: the step path decides
    if not any_chunk:
        _give_one_slot_each(kv, scheduled)
    else:
        ones = []
        for entry in scheduled:
            if entry[1] == 1:
                ones.append(entry)
            else:
                _give_one_slot_each(kv, ones)
                ones = []
                if kv.allocate_slots(entry[0], entry[1]) is None:
                    raise AssertionError("schedule_step: a chunk did not fit after the check")
        _give_one_slot_each(kv, ones)
    plan = StepPlan(scheduled=scheduled)
    sched._schedule_waiting(plan, budget)
    commit_scheduled(plan)
    return plan


def _give_one_slot_each(kv, entries: list) -> None:
    """``allocate_slots(r, 1)`` for each (r, 1, computed) entry, known to fit: pops, then caching.

    Pops before caching is the same as interleaving them request by request:
    a popped block is free and a cached one is held, so the evictions and
    insertions touch different blocks and leave the hash map in the same order.
    """
    if not entries:
        return
    bs = kv.block_size
    blocks_of = kv.req_to_blocks
    new_block_for = [r for r, _, c in entries if c >= len(blocks_of[r.request_id]) * bs]
    if new_block_for:
        for r, block in zip(new_block_for, kv.pool.get_new_blocks(len(new_block_for))):
            blocks_of[r.request_id].append(block)
    if kv.enable_caching:
        cached = kv.num_cached_block
        for r, _, c in entries:
            full = (c + 1) // bs
            rid = r.request_id
            if full > cached[rid]:
                kv.pool.cache_full_blocks(blocks_of[rid], r.block_hashes, cached[rid], full,
                                          r.all_token_ids if kv.debug else None, bs)
                cached[rid] = full
