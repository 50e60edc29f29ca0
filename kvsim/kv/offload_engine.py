"""Offload tiers in a running engine: vLLM's OffloadingConnector behind kvsim's KV connector API.

``OffloadConnector`` implements ``sched/connector.py``'s ``KVConnector`` on the
prepared scheduler side (``kv/offload_connector.py``, vLLM 0.33's
``OffloadingConnectorScheduler``) and adds what vLLM's worker side does with
time (``.../v1/offloading/worker.py``, ``wk:`` below):

* **Loads are asynchronous** (``sync_load_budget_bytes`` is 0 by default, so
  ``get_num_new_matched_tokens`` returns ``load_async`` True): the request
  waits in WAITING_FOR_REMOTE_KVS; the load is submitted when its step starts
  (wk ``start_kv_transfers``) and crosses the host->GPU link; the request is
  ``finished_recving`` at the first step end at or after the load is done.
* **Stores are write-through and deferred one step**: the step's
  ``build_connector_meta`` builds store jobs for the prompt chunks that are
  full after the step (kvsim: ``step_wait_s``, called once the step's
  tokens are committed); the worker submits them at the start of the next
  step (wk ``prepare_store_kv``: "so that offloading starts AFTER transfers
  related to token sampling"), here at the end of the step that built them.
  Stores never lengthen a step; a chunk is readable once its store is done.
* **A chunk found only on disk (or in a remote store)** is promoted into the
  CPU tier first (``TieringOffloadingManager`` RETRY): the read is submitted
  at the lookup; the request is skipped until it is done.

Each link is a FIFO queue: a transfer of ``b`` bytes starts when the link is
free and takes ``latency + b / bandwidth`` (``TierSpec.transfer_time_s``).
The links: ``h2d`` (CPU tier -> GPU, loads) and ``d2h`` (GPU -> CPU tier,
stores), one per direction as PCIe is full duplex and vLLM runs loads and
stores on separate CUDA streams; ``disk`` (NVMe, reads and writes);
``remote`` (the network to a store; a store shared by a fleet's replicas has
one queue for all, ``shared_links``). With tensor parallelism every rank
moves its own share over its own PCIe link in parallel, so such a link
carries ``bytes / tp`` of each job.

Simplified (docs/kv_tiers.md section 2): a store to CPU and disk completes as
one job (when both writes are done); a GPU block reused while its store is
in flight does not wait for it (vLLM's ``jobs_to_flush``); stores of decode
tokens (``offload_prompt_only: false``) are not modelled.

The counters (``stats()``) are those of vLLM's metrics, under its names:
external prefix-cache hits per request (``vllm:external_prefix_cache_*``),
bytes and seconds per transfer kind (``vllm:kv_offload_{load,store}_{bytes,time}``),
store failures (``kv_offload_allocation_failure``).
"""

from __future__ import annotations

import heapq
import math

from kvsim.kv.offload_connector import OffloadingConnectorScheduler, TransferJob
from kvsim.kv.offload_stack import OffloadTiers


def book_link(queue: dict[str, float], link: str, now: float, seconds: float) -> tuple[float, float]:
    """A FIFO link: a transfer starts when ``link`` is free (``queue[link]``, when
    its last transfer ends) or ``now``, whichever is later, and holds it for
    ``seconds``; returns (start, end) and books the link until ``end``."""
    start = max(now, queue.get(link, 0.0))
    end = queue[link] = start + seconds
    return start, end


class OffloadConnector:
    """vLLM's OffloadingConnector (scheduler and worker timing) on kvsim's tiers (module doc)."""

    def __init__(self, tiers: OffloadTiers, *, block_size: int, blocks_per_chunk: int = 1,
                 link_parallelism: int = 1, shared_links: dict[str, float] | None = None) -> None:
        if link_parallelism < 1:
            raise ValueError(f"link_parallelism must be >= 1, got {link_parallelism}")
        self.core = OffloadingConnectorScheduler(tiers, block_size=block_size,
                                                 blocks_per_chunk=blocks_per_chunk)
        self.tiers = tiers
        self.ranks = link_parallelism
        self.env = None
        self._free_at: dict[str, float] = {}      # link -> when its queue drains
        # A shared tier's link (a fleet's store): one queue for every replica.
        self._shared_free_at = shared_links if shared_links is not None else {}
        self._done: list[tuple[float, int]] = []  # (done time, job id) heap
        self._unsubmitted: list[TransferJob] = []
        self._store_failed = False                # the last step offered a store that found no room
        # Counters (stats()).
        self.external_hits: dict[str, tuple[int, int]] = {}    # request -> (local hit, external)
        # request -> when its load started: vLLM records the request's prefix-cache
        # stats in that step (Scheduler.schedule, before WAITING_FOR_REMOTE_KVS).
        self.load_start_s: dict[str, float] = {}
        self.bytes_moved = {"load": 0, "store": 0, "promote": 0}
        self.busy_s = {"load": 0.0, "store": 0.0, "promote": 0.0}
        self.num_jobs = {"load": 0, "store": 0, "promote": 0}
        self.load_wait_s = 0.0                    # submit -> done, summed over loads
        self.promoted_chunks = 0

    # ------------------------------------------------------- KVConnector

    def bind(self, env, kv_manager) -> None:
        self.env = env

    def get_num_new_matched_tokens(self, req, num_computed_tokens: int) -> tuple[int | None, bool]:
        jobs_before = self.core.num_jobs_created
        hit = self.core.get_num_new_matched_tokens(req, num_computed_tokens)
        if self.core.num_jobs_created != jobs_before:     # a promotion started (disk -> CPU)
            self._submit(self.core.job(self.core.num_jobs_created), self._now())
        return hit

    def update_state_after_alloc(self, req, block_ids: list[int], num_external_tokens: int) -> None:
        job = self.core.update_state_after_alloc(req, num_external_tokens)
        if job is None:
            return
        now = self._now()
        if req.num_preemptions == 0:
            # vLLM records connector prefix-cache stats at first admission only.
            self.external_hits[req.request_id] = (self.core.local_hit_tokens(req.request_id),
                                                  num_external_tokens)
            self.load_start_s[req.request_id] = now
        done = self._submit(job, now)
        self.load_wait_s += done - now

    def step_wait_s(self, scheduled) -> float:
        """vLLM's ``build_connector_meta``: this step's store jobs (submitted when it ends)."""
        failures = self.core.num_store_failures
        self._unsubmitted.extend(self.core.build_store_jobs(
            (req, req.num_computed_tokens) for req, _, _ in scheduled))
        # A failed store is offered again at the next step (sc _build_store_jobs):
        # next_transfer_done_time() says "now" so no decode run skips that step.
        self._store_failed = self.core.num_store_failures > failures
        return 0.0                                # loads are asynchronous: no step waits

    def request_finished(self, req, block_ids: list[int]) -> bool:
        # sc request_finished: the final keys are stored at the next step
        # (max(prompt, num_tokens - 1) tokens; prompt chunks only by default).
        self._unsubmitted.extend(self.core.build_store_jobs(
            [(req, max(req.prompt_len, req.num_tokens - 1))]))
        self.core.request_finished(req)
        return False                              # vLLM frees the blocks at once

    def finished_transfers(self, now: float) -> tuple[list[str], list[str]]:
        for job in self._unsubmitted:             # wk prepare_store_kv: next step's start
            self._submit(job, now)
        self._unsubmitted.clear()
        recving = []
        while self._done and self._done[0][0] <= now:
            _, job_id = heapq.heappop(self._done)
            job = self.core.complete(job_id)
            if job.kind == "load":
                recving.append(job.request_id)
        return recving, []                        # stores never emit finished_sending (wk get_finished)

    def next_transfer_done_time(self) -> float:
        """When the next transfer is done: vLLM's engine keeps stepping while the
        connector has jobs (``has_pending_push_work``: loads, promotions and
        stores), so every completion is seen at once; kvsim sleeps to it."""
        if self._store_failed or self._unsubmitted:
            return self._now()
        return self._done[0][0] if self._done else math.inf

    # ------------------------------------------------------------ private

    def _now(self) -> float:
        return self.env.now if self.env is not None else 0.0

    def _submit(self, job: TransferJob, now: float) -> float:
        """Queue ``job`` on its links; returns when it is done."""
        first = self.tiers.first.name
        done = now
        for tier, nbytes in job.bytes_per_tier.items():
            if job.kind == "promote" and tier == first:
                continue                          # the copy lands in host memory: no PCIe hop
            medium = self.tiers.by_name[tier].spec.medium
            link = ("h2d" if job.kind == "load" else "d2h") if medium == "cpu" else tier
            spec = self.tiers.by_name[tier].spec
            queue = self._shared_free_at if spec.shared else self._free_at
            # Each TP rank moves its share over its own PCIe link; a network store's
            # link is the replica's (or the store's), not per rank: the whole job.
            share = nbytes if medium == "remote" else -(-nbytes // self.ranks)
            start, end = book_link(queue, link, now, spec.transfer_time_s(share))
            self.busy_s[job.kind] += end - start
            self.bytes_moved[job.kind] += nbytes
            done = max(done, end)
        self.num_jobs[job.kind] += 1
        if job.kind == "promote":
            self.promoted_chunks += len(job.keys)
        heapq.heappush(self._done, (done, job.job_id))
        return done

    # ------------------------------------------------------------ metrics

    def stats(self, tiers: bool = True) -> dict[str, float]:
        """Totals of the run, under vLLM's metric names where vLLM has one; with
        ``tiers``, each tier's chunks held, capacity and evictions too."""
        ext = sum(e for _, e in self.external_hits.values())
        out = {
            "num_external_hit_requests": len(self.external_hits),
            "external_prefix_cache_hits": ext,
            "kv_offload_load_bytes": self.bytes_moved["load"],
            "kv_offload_store_bytes": self.bytes_moved["store"],
            "kv_offload_promote_bytes": self.bytes_moved["promote"],
            "kv_offload_load_time_s": self.busy_s["load"],
            "kv_offload_store_time_s": self.busy_s["store"],
            "kv_offload_promote_time_s": self.busy_s["promote"],
            "num_load_jobs": self.num_jobs["load"],
            "num_store_jobs": self.num_jobs["store"],
            "num_promote_jobs": self.num_jobs["promote"],
            "load_wait_s": self.load_wait_s,
            "kv_offload_allocation_failure": self.core.num_store_failures,
            "num_promoted_chunks": self.promoted_chunks,
        }
        for t in (self.tiers.tiers if tiers else ()):
            out[f"{t.name}_chunks_held"] = len(t)
            out[f"{t.name}_capacity_chunks"] = t.capacity_chunks
            out[f"{t.name}_chunks_evicted"] = t.num_evicted
        return out
