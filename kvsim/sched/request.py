"""A request's state inside the engine (vLLM ``Request``).

Every token a request will ever hold is known when it arrives: its prompt,
and the tokens it will generate (given by the workload, or fresh ids that
collide with nothing). So kvsim hashes the whole final sequence once, on
arrival (or, when the workload says how the prompt is made, names its blocks
without reading any token, see ``kvsim.kv.hashing``; a prompt of Mooncake
blocks when its keys are first read, ``NamedBlockKeys``), and exposes the
hashes of the blocks that are full *so far* through
``num_tokens`` (vLLM extends ``block_hashes`` as tokens are appended, H2; the
KV manager only ever reads hashes of blocks below ``num_tokens``).
"""

from __future__ import annotations

import enum
import weakref
from array import array
from collections.abc import Sequence

import numpy as np

from kvsim.kv.hashing import (block_hashes, check_block_id_prompt, content_block_id_hashes,
                              fresh_block_hashes)
from kvsim.workload.request import RequestSpec
from kvsim.workload.tokens import MOONCAKE_BLOCK_TOKENS

# Generated tokens without a given id are negative, unique per request, and so
# never equal to a prompt token (prompts hold non-negative ids).
FRESH_IDS_PER_REQUEST = 1 << 32


def _first_fresh_id(index: int) -> int:
    """Id of generated token 0 of request ``index``; token k gets this minus k."""
    return -(index * FRESH_IDS_PER_REQUEST + 1)


def final_num_tokens(prompt_len: int, max_tokens: int, max_model_len: int) -> int:
    """vLLM stops at max_tokens outputs or when the sequence reaches max_model_len."""
    return max(prompt_len, min(prompt_len + max_tokens, max_model_len))


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"   # its KV is being loaded (sched/connector.py)
    RUNNING = "running"
    PREEMPTED = "preempted"
    SWAPPED = "swapped"
    FINISHED = "finished"
    FAILED = "failed"


class Request:
    """Mutable per-request state the schedulers and the KV manager share."""

    __slots__ = (
        "request_id", "arrival_time", "queued_time", "priority", "prompt_len", "max_tokens",
        "all_token_ids", "block_hashes", "final_num_tokens", "num_output_tokens",
        "num_computed_tokens", "num_cached_tokens", "num_preemptions", "status",
        "scheduled_time", "first_token_time", "finish_time", "token_times",
        "fail_reason", "index", "resume_hit_tokens", "private_keys",
        "__weakref__",                        # NamedBlockKeys refers back without a cycle
    )

    def __init__(self, spec: RequestSpec, index: int, *, block_size: int,
                 max_model_len: int, arrival_time: float | None = None,
                 hash_blocks: bool = True, keep_tokens: bool = True, alone: bool = False) -> None:
        self.index = index
        self.request_id = spec.request_id
        self.arrival_time = spec.arrival_time_s if arrival_time is None else arrival_time
        self.priority = spec.priority
        self.prompt_len = prompt_len = len(spec.prompt_token_ids)
        self.max_tokens = spec.max_tokens
        self.final_num_tokens = final_num_tokens(prompt_len, spec.max_tokens, max_model_len)
        # Prompts that say how they are made (a fresh counter run, Mooncake
        # blocks) and fresh outputs: the blocks are named without reading token
        # ids (the per-request cost of every trace replay), see kvsim.kv.hashing.
        fresh_outputs = spec.output_token_ids is None and spec.output_id_base is None
        if spec.prompt_block_ids is not None and not fresh_outputs:
            raise ValueError(f"request {spec.request_id}: prompt_block_ids needs the engine's "
                             f"fresh output ids (no output_token_ids, no output_id_base)")
        named = fresh_outputs and (spec.fresh_prompt_start is not None
                                   or spec.prompt_block_ids is not None)
        tokens = None
        if keep_tokens or (hash_blocks and not named):
            tokens = self._token_ids(spec, index)
        if not hash_blocks:
            # Without prefix caching nothing ever reads a hash (H3: no lookup, A4: no caching).
            self.block_hashes = []
        elif spec.prompt_block_ids is not None:
            # Named when first read, not on arrival (``NamedBlockKeys``).
            check_block_id_prompt(prompt_len)
            self.block_hashes = NamedBlockKeys(self, (
                spec.prompt_block_ids, MOONCAKE_BLOCK_TOKENS, prompt_len, _first_fresh_id(index),
                self.final_num_tokens, block_size, spec.cache_salt))
        elif named:
            self.block_hashes = fresh_block_hashes(spec.fresh_prompt_start, prompt_len,
                                                   _first_fresh_id(index),
                                                   self.final_num_tokens, block_size)
        else:
            self.block_hashes = block_hashes(tokens, block_size, spec.cache_salt)
        # Keys no other request holds: fresh ids, and no sibling sample sharing the
        # prompt (``alone``: the engine says so for n = 1). Its blocks stay out of
        # the prefix-cache map unless it is freed unfinished (kv/block_pool.py).
        self.private_keys = (alone and hash_blocks and fresh_outputs
                             and spec.fresh_prompt_start is not None and spec.prompt_block_ids is None)
        # Only the debug mode reads token ids after hashing (to check every hit
        # against them); dropping them keeps a long waiting queue small.
        self.all_token_ids = tokens if keep_tokens else None
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1          # set at first admission (S5)
        self.resume_hit_tokens = -1
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.queued_time = float("nan")     # the engine core took it in (kvsim.sim.inbox)
        self.scheduled_time = float("nan")
        self.first_token_time = float("nan")
        self.finish_time = float("nan")
        # When each token reached the client, in order. An array of doubles, not a
        # list: the same floats, but no object per token for the collector to
        # visit at the end of a run, and the ITL gaps read it without a copy.
        self.token_times: array = array("d")
        self.fail_reason = ""

    def _token_ids(self, spec: RequestSpec, index: int) -> np.ndarray:
        """Every token id the request will hold: the prompt, then the outputs."""
        num_out = self.final_num_tokens - self.prompt_len
        given = spec.output_token_ids
        if num_out == 0:
            outputs = np.zeros(0, dtype=np.int64)
        elif given is not None and len(given) >= num_out:
            outputs = np.asarray(given[:num_out], dtype=np.int64)
        else:
            given = np.asarray(given if given is not None else [], dtype=np.int64)
            k = np.arange(len(given), num_out, dtype=np.int64)
            if spec.output_id_base is not None:
                fresh = spec.output_id_base + k
            else:
                fresh = _first_fresh_id(index) - k
            outputs = np.concatenate([given, fresh])
        return np.concatenate([np.asarray(spec.prompt_token_ids, dtype=np.int64), outputs])

    @property
    def num_tokens(self) -> int:
        """Prompt plus the tokens generated so far."""
        return self.prompt_len + self.num_output_tokens

    @property
    def is_finished(self) -> bool:
        return self.num_tokens >= self.final_num_tokens

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, {self.status.value})")


class NamedBlockKeys(Sequence):
    """The block keys of a prompt made of Mooncake blocks, made when first read.

    ``content_block_id_hashes`` of the request's blocks, the same keys it would
    get on arrival (they depend only on what the request was built from),
    made later: a Mooncake prompt has hundreds of 128-bit keys, and an
    overloaded engine's waiting queue holds every request it has not served
    (W2: ~11,000 at its peak, 340 MB of keys), while nothing reads a waiting
    request's keys before it reaches the head of the queue.

    The first read puts the list itself in the request's ``block_hashes``, so
    every later read is a plain list read (a property or ``__getattr__`` on
    ``Request`` would slow every attribute of every request: CPython
    specialises attribute reads only on classes without them); a caller that
    kept this object reads through it.
    """

    __slots__ = ("_request", "_args", "_keys")

    def __init__(self, request: Request, args: tuple) -> None:
        # A weak reference: a request dropped unread (a run cut short) leaves no cycle.
        self._request, self._args, self._keys = weakref.ref(request), args, None

    def _list(self) -> list[int]:
        keys = self._keys
        if keys is None:
            keys = self._keys = content_block_id_hashes(*self._args)
            request, self._request, self._args = self._request(), None, None
            if request is not None and request.block_hashes is self:
                request.block_hashes = keys
        return keys

    def __getitem__(self, index):
        return self._list()[index]

    def __len__(self) -> int:
        return len(self._list())

    def __iter__(self):
        return iter(self._list())

    def __contains__(self, key) -> bool:
        return key in self._list()

    def index(self, key, *bounds) -> int:
        return self._list().index(key, *bounds)

    def __eq__(self, other) -> bool:
        return self._list() == (other._list() if isinstance(other, NamedBlockKeys) else other)

    __hash__ = None

    def __repr__(self) -> str:
        return f"NamedBlockKeys({self._list()!r})"
