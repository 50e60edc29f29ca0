"""Disaggregated prefill/decode: the two sides of vLLM's NixlConnector (pull mode).

What vLLM 0.33 does, with vLLM's toy proxy
(``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``,
``_handle_completions``) in front of the two instances:

1. The proxy sends the request to a prefill (P) instance with
   ``max_tokens: 1``, ``stream: false`` and ``kv_transfer_params =
   {do_remote_decode: true}``, and waits for the whole response. P
   prefills the prompt and samples one token the client never sees. At
   finish, ``request_finished`` returns ``delay_free_blocks=True``
   (``nixl/pull_scheduler.py``): P keeps the blocks until D has read them
   (``finished_sending``).
2. The proxy sends the original request, with the prefill's
   ``kv_transfer_params`` (``do_remote_prefill``, ``remote_block_ids``), to a
   decode (D) instance and **streams D's response to the client**: every
   token the client sees, the first included, is D's.
3. D's ``get_num_new_matched_tokens`` returns ``len(prompt) - num_computed``
   (the prompt less D's own prefix hit), ``load_async=True``; the scheduler
   allocates the blocks, ``update_state_after_alloc`` starts the pull, the
   request waits in WAITING_FOR_REMOTE_KVS (kvsim/sched/connector.py).
4. When the pull is done (``finished_recving``) D schedules the request with
   every prompt token computed but the last (recomputed to sample), so the
   client's first token comes out of that D step. P frees its blocks
   (``finished_sending``; they stay in P's prefix cache).

So the client's TTFT is P's queueing and prefill, D's wait for room, the
transfer and one D step: not "P's first token plus the transfer" (P's token
is dropped by the proxy). requests.csv carries the pieces
(``prefill_replica``, ``prefill_done_s``, ``kv_transfer_start_s``,
``kv_transfer_end_s``).

A transfer (kvsim/fleet/links.py) moves the blocks D does not already hold,
``latency_s + bytes_per_stream / bandwidth``, starting when both replicas'
ports are free (``LinkPorts``). Not modelled: the proxy's own latency, NIXL
handshakes, P's ``kv_lease_duration`` timeout (a send always happens or is
released), D-side bidirectional transfers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvsim.fleet.links import LinkPorts, LinkSpec, kv_bytes_per_stream
from kvsim.fleet.replica import PoolPlan
from kvsim.sched.request import Request, RequestStatus


@dataclass
class Transfer:
    """One request's KV move, P -> D (what requests.csv reports)."""

    prefill_replica: str
    prefill_done_s: float
    start_s: float = math.nan
    end_s: float = math.nan
    num_blocks: int = 0
    bytes_per_stream: int = 0


class PrefillSide:
    """A prefill replica's connector: keeps each finished request's blocks until D has read them.

    ``request_finished`` keeps the blocks of every request that finished
    normally (vLLM returns ``delay_free_blocks`` for FINISHED_LENGTH_CAPPED /
    STOPPED, frees at once otherwise). The send's end is known only when a
    decode replica starts pulling (``book_send``); until then the prefill
    engine idles as vLLM's does (its ``has_requests`` ignores pull-mode
    sends), and ``book_send`` wakes it so it frees the blocks on time.
    """

    def __init__(self, name: str, pool: PoolPlan) -> None:
        self.name, self.pool = name, pool
        self.engine = None                      # set by the fleet (to wake it)
        self._sends: dict[str, float] = {}      # request id -> send end (inf: not booked yet)

    def bind(self, env, kv_manager) -> None:
        self.env = env

    def get_num_new_matched_tokens(self, req: Request, num_computed_tokens: int):
        return 0, False                         # P computes its prompts itself

    def update_state_after_alloc(self, req, block_ids, num_external_tokens) -> None:
        pass

    def step_wait_s(self, scheduled) -> float:
        return 0.0

    def request_finished(self, req: Request, block_ids: list[int]) -> bool:
        if req.status is RequestStatus.FAILED or not block_ids:
            return False
        self._sends[req.request_id] = math.inf
        return True

    def book_send(self, request_id: str, end_s: float) -> None:
        """D reads the blocks until ``end_s`` (or gives them up: ``end_s`` = now).

        ``Engine.wake`` ends a sleep only; an engine inside a decode run frees
        at the run's end. Prefill replicas run max_tokens=1 requests, so they
        have no decode runs."""
        if request_id in self._sends:
            self._sends[request_id] = end_s
            if self.engine is not None:
                self.engine.wake()

    def finished_transfers(self, now: float) -> tuple[list[str], list[str]]:
        sent = [rid for rid, end in self._sends.items() if end <= now]
        for rid in sent:
            del self._sends[rid]
        return [], sent

    def next_transfer_done_time(self) -> float:
        return min(self._sends.values(), default=math.inf)

    @property
    def num_held(self) -> int:
        return len(self._sends)


class DecodeSide:
    """A decode replica's connector: pulls the prompt's KV from the prefill replica.

    ``expect(req_id, source, transfer)`` is the proxy handing D the prefill's
    ``kv_transfer_params``; the rest is vLLM's scheduler-side API.
    """

    def __init__(self, name: str, pool: PoolPlan, link: LinkSpec, ports: LinkPorts) -> None:
        self.name, self.pool, self.link, self.ports = name, pool, link, ports
        self._remote: dict[str, tuple[PrefillSide, Transfer]] = {}
        self._loads: dict[str, float] = {}

    def bind(self, env, kv_manager) -> None:
        self.env = env

    def expect(self, request_id: str, source: PrefillSide, transfer: Transfer) -> None:
        self._remote[request_id] = (source, transfer)

    def get_num_new_matched_tokens(self, req: Request, num_computed_tokens: int):
        # nixl/pull_scheduler.py: do_remote_prefill -> all prompt tokens past
        # the local hit, asynchronously; else nothing.
        if req.request_id not in self._remote:
            return 0, False
        count = req.prompt_len - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(self, req: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        """Book the pull: the blocks past D's own hit, over the pair's link."""
        entry = self._remote.pop(req.request_id, None)
        if entry is None:
            return
        source, transfer = entry
        bs = self.pool.sched_config.block_size
        local = req.prompt_len - num_external_tokens
        num_blocks = -(-req.prompt_len // bs) - local // bs
        p = source.pool
        nbytes = kv_bytes_per_stream(num_blocks, p.block_bytes_per_rank, p.tp, self.pool.tp,
                                     replicated=p.kv_replicated)
        now = self.env.now
        start, end = self.ports.reserve(source.name, self.name, now, self.link.transfer_time_s(nbytes))
        transfer.start_s, transfer.end_s = start, end
        transfer.num_blocks, transfer.bytes_per_stream = num_blocks, nbytes
        self._loads[req.request_id] = end
        source.book_send(req.request_id, end)

    def release(self, request_id: str) -> None:
        """The request ended on D before pulling (refused, failed): P frees its blocks now.

        vLLM: D's ``request_finished`` with ``do_remote_prefill`` still set
        notifies P to free them (nixl/pull_scheduler.py)."""
        entry = self._remote.pop(request_id, None)
        if entry is not None:
            entry[0].book_send(request_id, self.env.now)

    def step_wait_s(self, scheduled) -> float:
        return 0.0

    def request_finished(self, req: Request, block_ids: list[int]) -> bool:
        return False                            # D frees at once (no bidirectional transfer)

    def finished_transfers(self, now: float) -> tuple[list[str], list[str]]:
        done = [rid for rid, end in self._loads.items() if end <= now]
        for rid in done:
            del self._loads[rid]
        return done, []

    def next_transfer_done_time(self) -> float:
        return min(self._loads.values(), default=math.inf)

    @property
    def num_pending(self) -> int:
        return len(self._remote) + len(self._loads)
