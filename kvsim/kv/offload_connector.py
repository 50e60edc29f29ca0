"""Offload tiers behind vLLM's KV connector API: the scheduler side of the OffloadingConnector.

Prepared for the engine's KV connector interface (``sched/connector.py``, the
lead's; not wired yet). The methods are those vLLM's scheduler calls on a
connector (``vllm/distributed/kv_transfer/kv_connector/v1/base.py``), with
the decisions of vLLM 0.33's ``OffloadingConnectorScheduler``
(``.../v1/offloading/scheduler.py``, ``sc:`` below) on kvsim's tiers
(``kv/offload.py``, ``kv/offload_stack.py``):

* ``get_num_new_matched_tokens(req, num_computed_tokens)`` -> ``(tokens, load_async)``
  (sc:1210): consecutive offloaded chunks from the GPU hit on, up to the
  whole request; ``(None, False)`` defers the request (a chunk still being
  stored or promoted, or a transfer of this request in flight); a hit is
  loaded asynchronously (vLLM's default, no sync-load budget), so the
  scheduler parks the request in ``WAITING_FOR_REMOTE_KVS``;
* ``update_state_after_alloc(req, num_external_tokens)`` (sc:1351): pins the
  hit chunks and returns the load job; stores then skip every chunk up to the
  end of the hit (chunk-level policy);
* ``build_store_jobs(batch)`` (sc:1815 ``_build_store_jobs``): write-through:
  for each scheduled or finished request, the chunks that are full after
  this step (prompt chunks only by default) and not offered yet go to the
  tiers; a store that finds no room fails whole and is offered again later;
* ``complete(job_id)`` (sc:2229 ``_update_connector_output``): a worker
  finished a transfer (``finished_sending`` / ``finished_recving``);
* ``request_finished(req)`` (sc:2336): the request's recency is committed in
  every tier; blocks are freed at once (vLLM returns ``False``).

A lookup that finds a chunk only below the first tier (``vllm`` semantics:
``TieringOffloadingManager`` answers RETRY) starts a promotion job into the
first tier and defers the request until it completes.

Simplified against vLLM (docs/kv_tiers.md): one full-attention KV group; no
EAGLE, sliding-window or Mamba groups, partial-tail chunks, retention
interval, sync loads, or the flush of a step whose newly allocated blocks
still have a store in flight.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kvsim.kv.offload import HIT, MISS, chunk_keys
from kvsim.kv.offload_stack import OffloadTiers


@dataclass(frozen=True)
class TransferJob:
    """One transfer a worker performs: ``kind`` is load, store or promote.

    ``reads`` / ``writes``: chunk keys per tier name; ``bytes_per_tier`` the
    bytes each tier's link moves (a load from the first tier crosses PCIe;
    a promotion reads a lower tier and writes the first).
    """

    job_id: int
    request_id: str
    kind: str
    keys: tuple[int, ...]
    reads: dict[str, tuple[int, ...]] = field(default_factory=dict)
    writes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    bytes_per_tier: dict[str, int] = field(default_factory=dict)


class _ReqState:
    """sc:378 ``RequestOffloadState`` for one KV group."""

    __slots__ = ("keys", "next_stored_chunk_idx", "num_local", "jobs", "finished")

    def __init__(self) -> None:
        self.keys: list[int] = []
        self.next_stored_chunk_idx = 0
        self.num_local = 0
        self.jobs: set[int] = set()
        self.finished = False


class OffloadingConnectorScheduler:
    """vLLM's OffloadingConnector, scheduler side, on ``OffloadTiers`` (module docstring)."""

    def __init__(self, tiers: OffloadTiers, *, block_size: int, blocks_per_chunk: int = 1,
                 offload_prompt_only: bool = True) -> None:
        if block_size < 1 or blocks_per_chunk < 1:
            raise ValueError(f"block_size and blocks_per_chunk must be >= 1, got "
                             f"{block_size}, {blocks_per_chunk}")
        if tiers.semantics != "vllm":
            raise ValueError("the OffloadingConnector reads vLLM's tiers (semantics: vllm); "
                             "LMCache has its own connector")
        self.tiers = tiers
        self.block_size = block_size
        self.blocks_per_chunk = blocks_per_chunk
        self.tokens_per_chunk = block_size * blocks_per_chunk
        self.offload_prompt_only = offload_prompt_only
        self.chunk_bytes = tiers.first.chunk_bytes
        self._req: dict[str, _ReqState] = {}
        self._jobs: dict[int, TransferJob] = {}
        self._next_job = 0
        self.num_store_failures = 0              # vLLM: kv_offload_allocation_failure

    # ------------------------------------------------------------ lookups

    def get_num_new_matched_tokens(self, req, num_computed_tokens: int) -> tuple[int | None, bool]:
        """Tokens the tiers hold past the GPU hit, and whether they load asynchronously."""
        st = self._state(req)
        st.next_stored_chunk_idx = 0            # restarting at token 0: offer every chunk again
        if st.jobs:
            return None, False                  # sc:1246: in-flight transfers
        st.keys = chunk_keys(req.block_hashes, self.blocks_per_chunk)   # update_offload_keys
        st.num_local = num_computed_tokens
        hit = self._lookup(req, st)
        return hit, bool(hit)

    def _lookup(self, req, st: _ReqState) -> int | None:
        """sc:849 ``_lookup_complete_chunks`` for one full-attention group."""
        tpc, c = self.tokens_per_chunk, st.num_local
        max_hit = min(req.num_tokens, len(st.keys) * tpc)
        if max_hit - c < tpc:
            return 0
        start = c // tpc
        keys = st.keys[:-(-max_hit // tpc)]
        hit = self.tiers.lookup(keys, start)
        if hit.num_chunks == 0:
            return 0
        if hit.pending:
            self._promote(req, keys, start, hit)
            return None                          # sc:1046: the backend asked to retry
        num_hit = min(max_hit, tpc * (start + hit.num_chunks)) - c
        return num_hit if num_hit >= tpc else 0

    def _promote(self, req, keys, start: int, hit) -> None:
        """Chunks only below the first tier are copied into it first (``TieringOffloadingManager``)."""
        plan = self.tiers.plan_load(keys, start, hit)
        first = self.tiers.first
        # Only chunks readable below: one whose store into that tier is still in
        # flight waits (the request retries) until it is done.
        ready = {k for name, ks in plan.reads.items() if name != first.name
                 for k in ks if self.tiers.by_name[name].lookup(k) == HIT}
        todo = [k for k in plan.promotions if first.lookup(k) == MISS and k in ready]
        if not todo:
            return                               # already being promoted or stored
        if first.prepare_store(todo, req.request_id) is None:
            self.num_store_failures += 1
            return
        reads = {name: tuple(k for k in ks if k in set(todo))
                 for name, ks in plan.reads.items() if name != first.name}
        reads = {n: ks for n, ks in reads.items() if ks}
        for name, ks in reads.items():
            self.tiers.by_name[name].prepare_load(ks, req.request_id)
        nbytes = {name: len(ks) * self.chunk_bytes for name, ks in reads.items()}
        nbytes[first.name] = len(todo) * self.chunk_bytes
        self._add_job(req.request_id, "promote", todo, reads, {first.name: tuple(todo)}, nbytes)

    # -------------------------------------------------------- allocation

    def update_state_after_alloc(self, req, num_external_tokens: int) -> TransferJob | None:
        """The scheduler allocated blocks for the hit: pin its chunks, return the load job."""
        if num_external_tokens == 0:
            return None
        st = self._req[req.request_id]
        tpc = self.tokens_per_chunk
        num_cached = st.num_local + num_external_tokens
        num_chunks = -(-num_cached // tpc)
        start = -(-st.num_local // self.block_size) // self.blocks_per_chunk
        keys = st.keys[start:num_chunks]
        hit = self.tiers.lookup(keys)
        if hit.pending or hit.num_chunks < len(keys):
            raise ValueError(f"request {req.request_id}: chunks {keys} are not all ready to load")
        plan = self.tiers.plan_load(keys, 0, hit)
        for name, ks in plan.reads.items():
            self.tiers.by_name[name].prepare_load(ks, req.request_id)
        st.next_stored_chunk_idx = num_chunks    # chunk-level policy: skip the hit's chunks
        reads = {name: tuple(ks) for name, ks in plan.reads.items()}
        nbytes = {name: len(ks) * self.chunk_bytes for name, ks in reads.items()}
        return self._add_job(req.request_id, "load", keys, reads, {}, nbytes)

    # ------------------------------------------------------------ stores

    def build_store_jobs(self, batch: Iterable[tuple[object, int]]) -> list[TransferJob]:
        """Store jobs of one step: ``batch`` holds (request, its tokens with KV after
        the step); for a finished request vLLM uses ``max(prompt, num_tokens - 1)``."""
        jobs = []
        tpc = self.tokens_per_chunk
        for req, tokens_after in batch:
            st = self._req.get(req.request_id)
            if st is None:
                continue
            num = min(tokens_after, req.num_tokens)
            if self.offload_prompt_only:
                num = min(num, req.prompt_len)   # sc:762 _calc_num_offloadable_tokens
            num_chunks = min(num // tpc, len(st.keys))
            keys = st.keys[st.next_stored_chunk_idx:num_chunks]
            if not keys:
                st.next_stored_chunk_idx = max(st.next_stored_chunk_idx, num_chunks)
                continue
            positions = [(i + 1) * tpc for i in range(st.next_stored_chunk_idx, num_chunks)]
            results = self.tiers.store(keys, req.request_id, positions)
            first = results[self.tiers.first.name]
            if first is None:
                self.num_store_failures += 1     # offered again at the next step
                continue
            st.next_stored_chunk_idx = num_chunks
            writes = {name: r.stored for name, r in results.items() if r is not None and r.stored}
            if not writes:
                continue
            nbytes = {name: len(ks) * self.chunk_bytes for name, ks in writes.items()}
            stored = tuple(dict.fromkeys(k for ks in writes.values() for k in ks))
            jobs.append(self._add_job(req.request_id, "store", stored, {}, writes, nbytes))
        return jobs

    # ---------------------------------------------------- completions

    def complete(self, job_id: int, success: bool = True) -> TransferJob:
        """A worker finished ``job_id`` (vLLM ``finished_sending`` / ``finished_recving``)."""
        job = self._jobs.pop(job_id)
        for name, ks in job.reads.items():
            self.tiers.by_name[name].complete_load(ks)
        for name, ks in job.writes.items():
            self.tiers.by_name[name].complete_store(ks, success)
        st = self._req.get(job.request_id)
        if st is not None:
            st.jobs.discard(job_id)
            if st.finished and not st.jobs:
                del self._req[job.request_id]
        return job

    def request_finished(self, req) -> tuple[bool, None]:
        """Commit the request's recency in every tier; its blocks may be freed now."""
        self.tiers.request_finished(req.request_id)
        st = self._req.get(req.request_id)
        if st is not None:
            st.finished = True
            if not st.jobs:
                del self._req[req.request_id]
        return False, None

    @property
    def jobs_in_flight(self) -> list[TransferJob]:
        return list(self._jobs.values())

    @property
    def num_jobs_created(self) -> int:
        """Jobs made so far (job ids count from 1): a caller sees a lookup start a promotion."""
        return self._next_job

    def job(self, job_id: int) -> TransferJob:
        return self._jobs[job_id]

    def local_hit_tokens(self, request_id) -> int:
        """The GPU prefix hit of the request's last lookup."""
        return self._req[request_id].num_local

    # ------------------------------------------------------------ private

    def _state(self, req) -> _ReqState:
        return self._state_of(req.request_id)

    def _add_job(self, request_id, kind, keys, reads, writes, nbytes) -> TransferJob:
        self._next_job += 1
        job = TransferJob(self._next_job, request_id, kind, tuple(keys), reads, writes, nbytes)
        self._jobs[job.job_id] = job
        self._state_of(request_id).jobs.add(job.job_id)
        return job

    def _state_of(self, request_id) -> _ReqState:
        st = self._req.get(request_id)
        if st is None:
            st = self._req[request_id] = _ReqState()       # sc:1197 on_new_request
        return st
