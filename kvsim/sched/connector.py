"""KV that comes from, or goes to, outside this engine's GPU cache: the KV connector.

vLLM V1 moves KV between an engine and the world through a *KV connector*
(``vllm/distributed/kv_transfer/kv_connector/v1/base.py``): the disaggregated
prefill/decode connectors (NixlConnector), CPU/disk offloading
(OffloadingConnector) and LMCache all implement the same scheduler-side API,
and the scheduler drives them the same way (``vllm/v1/core/sched/scheduler.py``,
0.33). kvsim keeps that split: :class:`KVConnector` is the API a connector
offers (a fleet's P/D link, an offload tier stack), :class:`KVTransfers` is
what the ``chunked`` scheduler keeps about the requests whose KV is in
flight. The rules reproduced:

* Admission asks ``get_num_new_matched_tokens(req, local_hit_tokens)``: how
  many tokens past the local prefix hit the connector can supply, and
  whether it loads them asynchronously. ``None`` means "cannot tell yet":
  the request is skipped this step.
* A synchronous load: the request is scheduled at once with
  ``num_computed = local + external``; the step waits for the load
  (``step_wait_s``).
* An asynchronous load: the request gets blocks for its computed tokens
  (local + external) and none for new work, ``update_state_after_alloc`` starts
  the transfer, and it waits in WAITING_FOR_REMOTE_KVS (vLLM's
  ``kv_holding_waiting`` queue, served before the waiting queue) until the
  connector reports it in ``finished_recving``. Then its blocks are cached
  (they were not at allocation: ``delay_cache_blocks``), a full-prompt hit
  recomputes the last token, and it is scheduled like a preempted request.
* At finish, ``request_finished(req, block_ids)`` may keep the blocks (a
  P/D prefill replica being read from) until ``finished_sending``.

Transfers are observed at the end of each step (``update_from_output``), as
vLLM's worker reports them in the model runner's output. Where vLLM's engine
core would poll with empty steps while only transfers are pending, kvsim's
engine sleeps until ``next_transfer_done_time()`` instead (no empty steps are
recorded).

A connector's ``get_num_new_matched_tokens`` must be a pure query (kvsim asks
it again while planning decode runs); state changes belong in
``update_state_after_alloc``.
"""

from __future__ import annotations

from typing import Protocol

from kvsim.sched.request import Request, RequestStatus


class KVConnector(Protocol):
    """The scheduler side of a vLLM KV connector (names as in vLLM)."""

    def bind(self, env, kv_manager) -> None:
        """Called once when the engine is built: its SimPy environment (the
        clock, ``env.now``) and its KV manager (vLLM: ``bind_kv_cache_manager``)."""
        ...

    def get_num_new_matched_tokens(self, req: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """(tokens past ``num_computed_tokens`` the connector supplies, load asynchronously?)."""
        ...

    def update_state_after_alloc(self, req: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        """The request got ``block_ids``; load ``num_external_tokens`` into them."""
        ...

    def step_wait_s(self, scheduled: list[tuple[Request, int, int]]) -> float:
        """Seconds this step's forward pass waits on synchronous transfers (0 if none)."""
        ...

    def request_finished(self, req: Request, block_ids: list[int]) -> bool:
        """A request finished; True keeps its blocks until ``finished_sending`` names it."""
        ...

    def finished_transfers(self, now: float) -> tuple[list[str], list[str]]:
        """(finished_recving, finished_sending) request ids of transfers done by ``now``."""
        ...

    def next_transfer_done_time(self) -> float:
        """When the next pending transfer completes (``inf`` if none)."""
        ...


class KVTransfers:
    """The chunked scheduler's side of a connector: waiting requests that hold KV
    blocks (vLLM's ``kv_holding_waiting``: loading, or loaded and not yet
    scheduled), and finished requests whose blocks are still being read."""

    def __init__(self, connector: KVConnector) -> None:
        self.connector = connector
        self.holding: list[Request] = []           # in the order they got their blocks
        self._received: set[str] = set()
        self._sending: dict[str, Request] = {}     # finished, blocks kept for a reader
        # vLLM's ``_inflight_prefills``: requests loading asynchronously and
        # running requests still prefilling after their chunk; what they still
        # need is kept free when another asynchronous load is admitted.
        self.inflight_prefills: dict[Request, None] = {}

    def __len__(self) -> int:
        return len(self.holding)

    @property
    def num_sending(self) -> int:
        return len(self._sending)

    def sends_keep_engine_busy(self) -> bool:
        """Whether kept blocks keep the engine loop going: only while a send's end is known.

        vLLM's ``Scheduler.has_requests`` does not count pull-mode sends at all
        (``has_pending_push_work`` is push mode only): an idle NIXL prefill
        instance waits for new work. kvsim sleeps until a known send ends
        (its blocks are freed on time); a send whose reader has not started
        yet (``next_transfer_done_time`` inf: kvsim/fleet/pd.py books it when
        the decode replica pulls) leaves the engine idle, and the connector
        wakes it (``Engine.wake``) once booked.
        """
        return bool(self._sending) and self.connector.next_transfer_done_time() < float("inf")

    def start_load(self, req: Request, num_computed_tokens: int) -> None:
        """The request waits for its KV (vLLM: WAITING_FOR_REMOTE_KVS, num_computed set now)."""
        req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        req.num_computed_tokens = num_computed_tokens
        self.holding.append(req)
        self.inflight_prefills[req] = None

    def admitted(self, req: Request, num_computed: int, num_new: int) -> None:
        """A request was scheduled from a waiting queue: in flight while its
        chunk leaves prompt to prefill (vLLM ``schedule``: ``if
        num_computed_tokens + num_new_tokens < request.num_tokens``)."""
        if num_computed + num_new < req.num_tokens:
            self.inflight_prefills[req] = None

    def after_schedule(self, scheduled) -> None:
        """vLLM ``_update_after_schedule``: a scheduled request whose computed
        tokens (advanced at schedule time, S6) reach its tokens is no longer a
        prefill in flight."""
        inflight = self.inflight_prefills
        if inflight:
            for req, _, _ in scheduled:
                if req in inflight and req.num_computed_tokens >= req.num_tokens:
                    del inflight[req]

    def drop_holding_head(self) -> Request:
        """The first holding request, taken out (it is failed: ``pop_unschedulable``)."""
        req = self.holding.pop(0)
        self._received.discard(req.request_id)
        self.forget(req)
        return req

    def forget(self, req: Request) -> None:
        """Preempted or finished (vLLM ``_preempt_request`` / ``_free_request``)."""
        self.inflight_prefills.pop(req, None)

    def reserved_blocks(self, remaining_blocks) -> int:
        """Free blocks an asynchronous load must leave (vLLM
        ``_inflight_prefill_reserved_blocks``): what every prefill in flight
        still needs for its whole sequence, ``remaining_blocks(req)`` each."""
        return sum(map(remaining_blocks, self.inflight_prefills))

    def ready(self, req: Request) -> int | None:
        """None while a holding request's KV is still loading (it is skipped
        this step); else the tokens whose blocks have just arrived, for the
        caller to cache (0 when they arrived at an earlier step). The load
        ends here (``_update_waiting_for_remote_kv``)."""
        if req.status is not RequestStatus.WAITING_FOR_REMOTE_KVS:
            return 0
        if req.request_id not in self._received:
            return None
        self._received.discard(req.request_id)
        req.status = RequestStatus.PREEMPTED if req.num_preemptions else RequestStatus.WAITING
        arrived = req.num_computed_tokens
        if arrived == req.num_tokens:
            req.num_computed_tokens -= 1           # the last token is computed to sample (H3)
        return arrived

    def may_change(self) -> bool:
        """Whether a holding request could be scheduled at the next step."""
        return any(r.status is not RequestStatus.WAITING_FOR_REMOTE_KVS
                   or r.request_id in self._received for r in self.holding)

    def keep_for_sending(self, req: Request) -> None:
        self._sending[req.request_id] = req

    def poll(self, now: float) -> list[Request]:
        """Take the connector's finished transfers; return the requests whose kept
        blocks may now be freed."""
        recving, sending = self.connector.finished_transfers(now)
        self._received.update(recving)
        return [self._sending.pop(rid) for rid in sending if rid in self._sending]
