"""A request's state inside the engine (vLLM ``Request``).

Every token a request will ever hold is known when it arrives: its prompt,
and the tokens it will generate (given by the workload, or fresh ids that
collide with nothing). So kvsim hashes the whole final sequence once, on
arrival, and exposes the hashes of the blocks that are full *so far* through
``num_tokens`` (vLLM extends ``block_hashes`` as tokens are appended, H2; the
KV manager only ever reads hashes of blocks below ``num_tokens``).
"""

from __future__ import annotations

import enum

import numpy as np

from kvsim.kv.hashing import block_hashes
from kvsim.workload.request import RequestSpec

# Generated tokens without a given id are negative, unique per request, and so
# never equal to a prompt token (prompts hold non-negative ids).
FRESH_IDS_PER_REQUEST = 1 << 32


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SWAPPED = "swapped"
    FINISHED = "finished"
    FAILED = "failed"


class Request:
    """Mutable per-request state the schedulers and the KV manager share."""

    __slots__ = (
        "request_id", "arrival_time", "priority", "prompt_len", "max_tokens",
        "all_token_ids", "block_hashes", "final_num_tokens", "num_output_tokens",
        "num_computed_tokens", "num_cached_tokens", "num_preemptions", "status",
        "scheduled_time", "first_token_time", "finish_time", "token_times",
        "fail_reason", "index", "resume_hit_tokens",
    )

    def __init__(self, spec: RequestSpec, index: int, *, block_size: int,
                 max_model_len: int, arrival_time: float | None = None,
                 hash_blocks: bool = True, keep_tokens: bool = True) -> None:
        self.index = index
        self.request_id = spec.request_id
        self.arrival_time = spec.arrival_time_s if arrival_time is None else arrival_time
        self.priority = spec.priority
        prompt = np.asarray(spec.prompt_token_ids, dtype=np.int64)
        self.prompt_len = len(prompt)
        self.max_tokens = spec.max_tokens
        # vLLM stops at max_tokens outputs or when the sequence reaches max_model_len.
        self.final_num_tokens = max(self.prompt_len,
                                    min(self.prompt_len + spec.max_tokens, max_model_len))
        num_out = self.final_num_tokens - self.prompt_len
        if spec.output_token_ids is not None and len(spec.output_token_ids) >= num_out:
            outputs = np.asarray(spec.output_token_ids[:num_out], dtype=np.int64)
        else:
            given = np.asarray(spec.output_token_ids if spec.output_token_ids is not None else [],
                               dtype=np.int64)
            k = np.arange(len(given), num_out, dtype=np.int64)
            if spec.output_id_base is not None:
                fresh = spec.output_id_base + k
            else:
                fresh = -(index * FRESH_IDS_PER_REQUEST + k + 1)
            outputs = np.concatenate([given, fresh])
        self.all_token_ids = np.concatenate([prompt, outputs])
        # Without prefix caching nothing ever reads a hash (H3: no lookup, A4: no caching).
        self.block_hashes = (block_hashes(self.all_token_ids, block_size, spec.cache_salt)
                             if hash_blocks else [])
        if not keep_tokens:
            # Only the debug mode reads token ids after hashing (to check hits);
            # dropping them keeps a long waiting queue small.
            self.all_token_ids = None
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1          # set at first admission (S5)
        self.resume_hit_tokens = -1
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.scheduled_time = float("nan")
        self.first_token_time = float("nan")
        self.finish_time = float("nan")
        self.token_times: list[float] = []
        self.fail_reason = ""

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
