"""``--kv-offloading-backend lmcache``: vLLM 0.33's ``LMCacheMPConnector`` behind kvsim's KV connector API.

vLLM (``config/vllm.py`` ``_post_init_kv_transfer_config``) turns the flag
into ``kv_connector = "LMCacheMPConnector"`` and does not pass
``kv_offloading_size`` on ("the actual KV storage capacity is managed by the
standalone LMCache server process"). The connector
(``distributed/kv_transfer/kv_connector/v1/lmcache_mp_connector.py``, ``mp:``
below; its adapter ``lmcache_integration/multi_process_adapter.py``, ``ad:``)
talks to that server (kv/lmcache_server.py). What this class reproduces:

* **Lookups are RPCs answered asynchronously.** ``get_num_new_matched_tokens``
  submits the lookup once per request (ad ``maybe_submit_lookup_request``:
  the request's tokens cut to whole chunks; none when that is 0 tokens) and
  returns ``(None, True)`` while ``check_lookup_result`` has no reply: the
  scheduler skips the request that pass. kvsim's server answers by the next
  scheduler pass (the lookup runs on the server's CPU pool; kvsim charges it
  no time beyond the pass), from its store as it is at submission, or, when
  chunks come from its L2 (disk), once they are read into L1
  (kv/lmcache_server.py); the chunks found stay locked until loaded or freed.
* **Hits are whole chunks**: the reply is chunks x ``chunk_size`` (mp
  ``assert ret % (num_blocks_per_chunk * block_size) == 0``), the tokens past
  the GPU hit are loaded (``need_to_load = max(0, ret - num_computed_tokens)``)
  **asynchronously** (``return need_to_load, need_to_load > 0``): the request
  waits in WAITING_FOR_REMOTE_KVS. The retrieve (``GetRetrieveMetadata``: from
  the chunk holding the GPU hit's end to the LMCache hit's end; the tokens the
  GPU already holds are not written, ``skip_first_n_tokens``) is built at this
  pass and submitted at the step's start (``start_load_kv``); it crosses the
  host->GPU link; the request is ``finished_recving`` at the first step end
  after. ``update_state_after_alloc`` frees the locks of chunks the GPU hit
  covers whole (``free_lookup_locks``; all of them when nothing loads).
* **A preempted request gets no hit** (mp: "TODO: support loading KV for
  preempted requests": ``return 0, False``) and a fresh tracker
  (``_get_or_create_request_tracker``): it stores its chunks again from 0.
* **Stores** (``GetStoreMetadata``, each pass in ``build_connector_meta``):
  every whole chunk of the request's block hashes up to
  ``scheduled tokens // block_size + max(GPU hit blocks, LMCache hit blocks)``
  not stored yet, **decode tokens included** (no prompt-only rule). The LMCache
  hit counts as stored at each lookup reply read (``increase_num_stored_blocks``
  is called on every pass that reads it: a request looked up in several passes
  skips as many hits' worth of its first stores; kvsim reproduces that).
  The worker submits them at ``wait_for_save`` (the end of the same forward:
  kvsim, the step's end) over the GPU->host link.
* **Blocks are held until saved**: ``request_finished`` returns True; the
  worker reports the request in ``finished_sending`` at the end of the step
  after its finish once no store of it is in flight (ad ``get_finished``: a
  finished request's id reaches the worker with the next step's scheduler
  output), then its blocks are freed (sched/connector.py, as the P/D
  connector's, kvsim/fleet/pd.py).

Decode runs (the engine's skip-ahead) do not call the connector; the stores a
run's decode steps would have built are built when the run ends
(``_catch_up``), each timed at the end of the step that filled its chunk
(``Request.token_times``), in the step path's order, so the fast path and the
step path submit the same stores at the same times.

Links: FIFO queues (``offload_engine.book_link``), ``h2d`` for loads and
``d2h`` for stores, each TP rank moving its share over its own PCIe link.
Counters: ``stats()``, under the native connector's names
(kv/offload_engine.py) where they mean the same.
"""

from __future__ import annotations

import enum
import heapq
import math
from dataclasses import dataclass, field

from kvsim.kv.lmcache_server import LMCacheServer
from kvsim.kv.offload import chunk_keys
from kvsim.kv.offload_engine import book_link

# sched/request.py RequestStatus.PREEMPTED's value (kv/ does not import sched/).
PREEMPTED = "preempted"


class TrackerState(enum.Enum):
    """mp ``LMCacheMPRequestState``."""

    PREFETCHING = enum.auto()
    WAITING_FOR_LOAD = enum.auto()
    READY = enum.auto()


@dataclass
class Tracker:
    """mp ``LMCacheMPRequestTracker`` (the fields kvsim needs)."""

    req: object
    num_scheduled_tokens: int = 0
    num_stored_blocks: int = 0
    num_vllm_hit_blocks: int = 0
    num_lmcache_hit_blocks: int = 0
    state: TrackerState = TrackerState.PREFETCHING
    seen_computed: int = 0            # num_computed_tokens at the last pass that scheduled it
    locked: list[int] = field(default_factory=list)   # chunk keys its lookup locked

    def needs_retrieve(self) -> bool:
        return (self.num_lmcache_hit_blocks > self.num_vllm_hit_blocks
                and self.state is not TrackerState.READY)


class LMCacheMPConnector:
    """vLLM 0.33's LMCacheMPConnector (scheduler + worker timing) on an LMCache server (module doc)."""

    def __init__(self, server: LMCacheServer, *, block_size: int, chunk_size: int = 256,
                 link_parallelism: int = 1) -> None:
        if chunk_size % block_size:
            # ad LMCacheMPSchedulerAdapter.__init__: assert chunk_size % vllm_block_size == 0
            raise ValueError(f"chunk_size {chunk_size} is not a multiple of block_size {block_size}")
        if link_parallelism < 1:
            raise ValueError(f"link_parallelism must be >= 1, got {link_parallelism}")
        self.server = server
        self.tiers = server.tiers
        self.block_size = block_size
        self.chunk_size = chunk_size
        self.blocks_per_chunk = chunk_size // block_size
        self.ranks = link_parallelism
        self.env = self.kv = None
        self._trackers: dict[str, Tracker] = {}
        # request -> (pass submitted, hit keys, when the reply is ready)
        self._lookups: dict[str, tuple[int, list[int], float]] = {}
        self._pass = 0                                   # scheduler passes so far
        self._polls = 0                                  # finished_transfers calls so far
        self._free_at: dict[str, float] = {}             # link -> when its queue drains
        self._done: list[tuple[float, int, str, str, tuple[int, ...]]] = []  # (t, seq, kind, rid, keys)
        self._seq = 0
        self._recving: list[str] = []                     # loads done, not yet reported
        self._unsubmitted: list[tuple[str, list[int]]] = []    # this pass's stores (rid, keys)
        self._last_scheduled: list[Tracker] = []
        self._stores_in_flight: dict[str, int] = {}
        self._held: dict[str, tuple[int, float]] = {}    # finished request -> (poll at finish, time)
        # Counters (stats()).
        self.external_hits: dict[str, tuple[int, int]] = {}     # request -> (local hit, external)
        self.load_start_s: dict[str, float] = {}
        self.bytes_moved = {"load": 0, "store": 0}
        self.busy_s = {"load": 0.0, "store": 0.0}
        self.num_jobs = {"load": 0, "store": 0}
        self.load_wait_s = 0.0
        self.num_lookups = self.num_lookup_skips = self.lookup_hit_tokens = 0
        self.held_s = 0.0                                # finish -> blocks freed, summed

    # ------------------------------------------------------- KVConnector

    def bind(self, env, kv_manager) -> None:
        self.env, self.kv = env, kv_manager

    def get_num_new_matched_tokens(self, req, num_computed_tokens: int) -> tuple[int | None, bool]:
        rid = req.request_id
        tracker = self._trackers.get(rid)
        if req.status.value == PREEMPTED:
            # mp _get_or_create_request_tracker: a fresh tracker after a preemption;
            # mp get_num_new_matched_tokens: no hit for a preempted request.
            if tracker is None or tracker.state is not TrackerState.PREFETCHING:
                self._trackers[rid] = Tracker(req)
            return 0, False
        if tracker is None:
            tracker = self._trackers[rid] = Tracker(req)
        if rid not in self._lookups:
            num_chunks = req.num_tokens // self.chunk_size
            if num_chunks == 0:
                # ad maybe_submit_lookup_request: nothing to look up below one chunk.
                # (vLLM 0.33's bundled adapter would then assert in check_lookup_result;
                # LMCache's own adapter answers 0.)
                return 0, False
            self._advance_to(self._now())
            keys = chunk_keys(req.block_hashes, self.blocks_per_chunk)[:num_chunks]
            tracker.locked, ready = self.server.lookup(keys)
            self._lookups[rid] = (self._pass, tracker.locked, ready)
            self.num_lookups += 1
            self.lookup_hit_tokens += len(tracker.locked) * self.chunk_size
        submitted, hit, ready = self._lookups[rid]
        if submitted == self._pass or self._now() < ready:
            self.num_lookup_skips += 1
            return None, True                         # ad check_lookup_result: no reply yet
        ret = len(hit) * self.chunk_size
        if ret == 0:
            return 0, False
        # mp: the LMCache hit counts as stored, at every reply read.
        tracker.num_stored_blocks += ret // self.block_size
        tracker.num_vllm_hit_blocks = num_computed_tokens // self.block_size
        tracker.num_lmcache_hit_blocks = ret // self.block_size
        need_to_load = max(0, ret - num_computed_tokens)
        return need_to_load, need_to_load > 0

    def update_state_after_alloc(self, req, block_ids: list[int], num_external_tokens: int) -> None:
        tracker = self._trackers[req.request_id]
        load = tracker.needs_retrieve() and num_external_tokens > 0
        self._after_alloc(tracker, load)
        if not load:
            return
        # mp GetRetrieveMetadata: chunks from the one holding the GPU hit's end to
        # the LMCache hit's end; the GPU-held tokens are skipped (not written).
        keys, tracker.locked = tracker.locked, []     # these locks end with the retrieve
        nbytes = (tracker.num_lmcache_hit_blocks - tracker.num_vllm_hit_blocks) * self._block_bytes()
        now = self._now()
        done = self._transfer("load", "h2d", now, nbytes)
        self._push(done, "load", req.request_id, keys)
        tracker.state = TrackerState.READY            # mp _process_retrieve_requests
        if req.num_preemptions == 0:
            self.external_hits[req.request_id] = (tracker.num_vllm_hit_blocks * self.block_size,
                                                  num_external_tokens)
            self.load_start_s[req.request_id] = now
        self.load_wait_s += done - now

    def step_wait_s(self, scheduled) -> float:
        """mp ``build_connector_meta``: this pass's stores (submitted when the step ends)."""
        self._pass += 1
        order = []
        for req, n, _ in scheduled:
            tracker = self._trackers.get(req.request_id)
            if tracker is None:                       # admitted with no lookup (never here)
                tracker = self._trackers[req.request_id] = Tracker(req)
            if tracker.state is TrackerState.PREFETCHING:
                # Admitted without a load: kvsim's scheduler calls update_state_after_alloc
                # only with external tokens; vLLM calls it for every admission.
                self._after_alloc(tracker, False)
            tracker.num_scheduled_tokens += n
            keys = self._store_keys(tracker, req.num_tokens // self.block_size,
                                    len(self.kv.get_blocks(req.request_id)))
            if keys:
                self._unsubmitted.append((req.request_id, keys))
            tracker.seen_computed = req.num_computed_tokens
            order.append(tracker)
        self._last_scheduled = order
        return 0.0                                    # loads and stores never lengthen a step

    def request_finished(self, req, block_ids: list[int]) -> bool:
        self._catch_up()
        rid = req.request_id
        tracker = self._trackers.pop(rid, None)       # mp _cleanup_request_tracker
        if tracker is not None and tracker.locked:
            self.server.unlock(tracker.locked)
        self._lookups.pop(rid, None)
        self._last_scheduled = [t for t in self._last_scheduled if t is not tracker]
        self._held[rid] = (self._polls, self._now())
        return True                                   # held until finished_sending

    def finished_transfers(self, now: float) -> tuple[list[str], list[str]]:
        self._catch_up()
        self._polls += 1
        self._advance_to(now)
        for rid, keys in self._unsubmitted:           # wait_for_save: this step's end
            self._submit_store(rid, keys, now)
        self._unsubmitted.clear()
        recving, self._recving = self._recving, []
        sending = []
        for rid, (poll, finished_at) in list(self._held.items()):
            # ad get_finished: the id reaches the worker with the next step's output.
            if poll + 1 < self._polls and not self._stores_in_flight.get(rid):
                del self._held[rid]
                self._stores_in_flight.pop(rid, None)
                self.held_s += now - finished_at
                sending.append(rid)
        return recving, sending

    def next_transfer_done_time(self) -> float:
        """The next time the scheduler's view changes: at once while a lookup waits for
        its reply (the next pass), a store is unsubmitted or a held request's
        blocks can be released; else the next transfer's end."""
        now = self._now()
        if self._unsubmitted or self._recving:
            return now
        if any(not self._stores_in_flight.get(rid) for rid in self._held):
            return now
        wake = self._done[0][0] if self._done else math.inf
        for p, _, ready in self._lookups.values():
            if ready > now:
                wake = min(wake, ready)               # a reply waiting for an L2 read
            elif p >= self._pass - 1:
                return now                            # submitted in the last pass: the next answers
        return wake

    # ------------------------------------------------------------ private

    def _now(self) -> float:
        return self.env.now if self.env is not None else 0.0

    def _advance_to(self, t: float) -> None:
        """Transfers done by ``t``, in time order, with the server's clock: a load
        ends its chunks' locks (and its request is received), a store is no
        longer in flight."""
        while self._done and self._done[0][0] <= t:
            done, _, kind, rid, keys = heapq.heappop(self._done)
            self.server.advance(done)
            if kind == "load":
                self.server.unlock(keys)
                self._recving.append(rid)
            else:
                self._stores_in_flight[rid] -= 1
        self.server.advance(t)

    def _block_bytes(self) -> int:
        return self.server.l1.chunk_bytes // self.blocks_per_chunk

    def _after_alloc(self, tracker: Tracker, load: bool) -> None:
        """mp ``update_state_after_alloc`` from PREFETCHING: free the locks of the chunks
        that will not be retrieved (all, or those the GPU hit covers whole)."""
        if tracker.state is not TrackerState.PREFETCHING:
            return
        tracker.state = TrackerState.WAITING_FOR_LOAD if load else TrackerState.READY
        self._lookups.pop(tracker.req.request_id, None)   # ad cleanup_lookup_result
        # Chunks the GPU hit covers whole (all of them without a load) are not read.
        keep = tracker.num_vllm_hit_blocks // self.blocks_per_chunk if load else len(tracker.locked)
        self.server.unlock(tracker.locked[:keep])
        tracker.locked = tracker.locked[keep:]

    def _store_keys(self, tracker: Tracker, num_hashes: int, num_allocated: int) -> list[int]:
        """mp ``GetStoreMetadata``: the chunk keys of this pass's store (may be none)."""
        bs, bpc = self.block_size, self.blocks_per_chunk
        computed = tracker.num_scheduled_tokens // bs + max(tracker.num_vllm_hit_blocks,
                                                            tracker.num_lmcache_hit_blocks)
        available = min(num_hashes, num_allocated, computed)
        num_chunks = (available - tracker.num_stored_blocks) // bpc
        if num_chunks < 1:
            return []
        start = tracker.num_stored_blocks
        end = start + num_chunks * bpc
        tracker.num_stored_blocks = end
        hashes = tracker.req.block_hashes
        return [hashes[b - 1] for b in range(start + bpc, end + 1, bpc)]

    def _catch_up(self) -> None:
        """The stores of a decode run's steps (module doc), in time and batch order."""
        jobs = []
        for i, tracker in enumerate(self._last_scheduled):
            req = tracker.req
            if req.num_computed_tokens <= tracker.seen_computed:
                continue
            for c in range(tracker.seen_computed + 1, req.num_computed_tokens + 1):
                tracker.num_scheduled_tokens += 1
                keys = self._store_keys(tracker, c // self.block_size, c // self.block_size + 1)
                if keys:
                    # The step computing token c - 1 samples output number c - prompt_len + 1.
                    jobs.append((req.token_times[c - req.prompt_len], i, req.request_id, keys))
            tracker.seen_computed = req.num_computed_tokens
        for t, _, rid, keys in sorted(jobs, key=lambda j: (j[0], j[1])):
            self._advance_to(t)
            self._submit_store(rid, keys, t)

    def _submit_store(self, rid: str, keys: list[int], now: float) -> None:
        self.server.advance(now)
        written = self.server.reserve_write(keys)
        done = self._transfer("store", "d2h", now, len(written) * self.server.l1.chunk_bytes)
        self.server.finish_write(written, done)
        self._stores_in_flight[rid] = self._stores_in_flight.get(rid, 0) + 1
        self._push(done, "store", rid, tuple(written))

    def _transfer(self, kind: str, link: str, now: float, nbytes: int) -> float:
        spec = self.server.l1.spec
        start, end = book_link(self._free_at, link, now, spec.transfer_time_s(-(-nbytes // self.ranks)))
        self.busy_s[kind] += end - start
        self.bytes_moved[kind] += nbytes
        self.num_jobs[kind] += 1
        return end

    def _push(self, done: float, kind: str, rid: str, keys) -> None:
        self._seq += 1
        heapq.heappush(self._done, (done, self._seq, kind, rid, tuple(keys)))

    # ------------------------------------------------------------ metrics

    def stats(self, tiers: bool = True) -> dict[str, float]:
        """Totals of the run, under the native connector's names where they mean the
        same (kv/offload_engine.py), and the LMCache ones: lookups, passes a request
        was skipped waiting for a reply, chunks dropped for want of L1 memory
        (``kv_offload_allocation_failure``), eviction-loop rounds, held seconds."""
        out = {
            "num_external_hit_requests": len(self.external_hits),
            "external_prefix_cache_hits": sum(e for _, e in self.external_hits.values()),
            "kv_offload_load_bytes": self.bytes_moved["load"],
            "kv_offload_store_bytes": self.bytes_moved["store"],
            "kv_offload_promote_bytes": 0,
            "kv_offload_load_time_s": self.busy_s["load"],
            "kv_offload_store_time_s": self.busy_s["store"],
            "kv_offload_promote_time_s": 0.0,
            "num_load_jobs": self.num_jobs["load"],
            "num_store_jobs": self.num_jobs["store"],
            "num_promote_jobs": 0,
            "load_wait_s": self.load_wait_s,
            "kv_offload_allocation_failure": self.server.num_out_of_memory,
            "num_promoted_chunks": 0,
            "num_lookups": self.num_lookups,
            "num_lookup_skips": self.num_lookup_skips,
            "lookup_hit_tokens": self.lookup_hit_tokens,
            "num_eviction_rounds": self.server.num_eviction_rounds,
            "held_after_finish_s": self.held_s,
        }
        if self.server.l2 is not None:
            srv = self.server
            out.update({"lmcache_l2_store_bytes": srv.l2_bytes["store"],
                        "lmcache_l2_prefetch_bytes": srv.l2_bytes["prefetch"],
                        "lmcache_l2_store_time_s": srv.l2_busy_s["store"],
                        "lmcache_l2_prefetch_time_s": srv.l2_busy_s["prefetch"],
                        "lmcache_l2_store_failures": srv.num_l2_store_failures})
        for t in (self.tiers.tiers if tiers else ()):
            out[f"{t.name}_chunks_held"] = len(t)
            out[f"{t.name}_capacity_chunks"] = t.capacity_chunks
            out[f"{t.name}_chunks_evicted"] = t.num_evicted
        return out
