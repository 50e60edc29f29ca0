"""What a router sees: the replicas' state at the arrival instant, and the request.

``ReplicaState`` is the read-only protocol every router uses; ``Engine``
(kvsim/sim/engine.py) satisfies it, and so do the fakes in the tests.
Nothing a router calls changes what a replica will do (``Engine`` brings
the blocks of a decode run in flight up to now before it answers).

    num_running            requests the replica's scheduler runs now
    num_waiting            requests queued there, including those that arrived
                           but were not handed to the scheduler yet (vLLM's
                           input queue; what `vllm:num_requests_waiting` counts)
    kv_cache_usage()       fraction of the usable KV blocks not free (vLLM's
                           `vllm:kv_cache_usage_perc`; evictable cached blocks count as free)
    prefix_hit_blocks(h)   how many leading blocks of the hash list ``h`` the
                           replica has cached now (the block pool's hash map,
                           which vLLM's KV events mirror to llm-d and Dynamo)

``ReplicaInfo`` holds what does not change during a run (name, pool, KV size).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kvsim.sched.request import Request
from kvsim.workload.request import RequestSpec


class ReplicaState(Protocol):
    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    def kv_cache_usage(self) -> float: ...

    def prefix_hit_blocks(self, block_hashes: Sequence[int]) -> int: ...


@dataclass(frozen=True)
class ReplicaInfo:
    """A replica's fixed facts: ``name`` is ``<pool>-<k>``."""

    name: str
    pool: str
    role: str
    block_size: int
    num_usable_blocks: int


@dataclass(frozen=True)
class RouteRequest:
    """A request as a router sees it.

    ``block_hashes`` are the hashes of the prompt's full blocks, computed as
    the engine computes them (same block size, cache salt and naming rule),
    so ``prefix_hit_blocks`` and the router-side indexes agree with the
    replicas' caches. ``previous_request_id`` is the session's previous turn
    (``RequestSpec.after_request_id``), or None for a first turn.
    """

    request_id: str
    num_prompt_tokens: int
    block_size: int
    block_hashes: list[int]
    previous_request_id: str | None = None

    @property
    def num_prompt_blocks(self) -> int:
        """Blocks the prompt occupies, the partial last one included."""
        return -(-self.num_prompt_tokens // self.block_size)


def route_request(spec: RequestSpec, block_size: int, *, hash_blocks: bool = True) -> RouteRequest:
    """The router's view of ``spec`` for replicas with ``block_size``-token blocks.

    The hashes come from the engine's own ``Request`` (kvsim/sched/request.py)
    so that there is one hashing rule; capping the sequence at one token past
    the prompt keeps it from hashing outputs the router never looks at.
    """
    num_prompt = spec.num_prompt_tokens
    hashes: list[int] = []
    if hash_blocks and num_prompt >= block_size:
        req = Request(spec, 0, block_size=block_size, max_model_len=num_prompt + 1,
                      hash_blocks=True, keep_tokens=False)
        hashes = req.block_hashes[:num_prompt // block_size]
    return RouteRequest(spec.request_id, num_prompt, block_size, hashes, spec.after_request_id)
