"""The API server's queue limits: requests past them are refused with HTTP 503.

vLLM 0.33 checks them in the API server before a request reaches the engine
core (``vllm/v1/engine/async_llm.py`` ``AsyncLLM.check_admission``, called
once per request before its ``n`` samples fan out):

* ``max_num_queued_reqs``: refuse when ``unfinished + n > max_num_queued_reqs``;
  ``unfinished`` counts the requests added and not yet finished (waiting or
  running; ``OutputProcessor.get_num_unfinished_requests``), a request with
  ``n`` samples counting ``n``;
* ``max_num_queued_tokens``: refuse when the prompts of the requests still in
  prefill already hold that many tokens (``current >= max``; the new prompt is
  not added). A request counts its whole prompt until its first output
  reaches the API server (``OutputProcessor.get_num_queued_tokens``,
  ``is_prefilling``): chunk progress and prefix hits are not subtracted, and a
  preempted request that already answered does not count again.

A refused request is reported as failed at its arrival time, with the reason
below (the text of ``vllm/exceptions.py`` ``QueueOverflowError`` /
``MaxQueuedTokensError``), and never reaches the scheduler.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvsim.sched.request import Request

QUEUE_FULL = ("HTTP 503 (max_num_queued_reqs): The engine is currently busy and cannot accept "
              "new requests. Please try again later or on a different instance.")
BACKLOG_FULL = ("HTTP 503 (max_num_queued_tokens): The engine has reached its prefill token "
                "backlog limit. Please try again later or on a different instance.")


class QueueLimits:
    """``check_admission`` and the prefill backlog it reads, for one engine."""

    def __init__(self, max_num_queued_reqs: int | None, max_num_queued_tokens: int | None) -> None:
        self.max_num_queued_reqs = max_num_queued_reqs
        self.max_num_queued_tokens = max_num_queued_tokens
        self._prefilling: set[Request] = set()     # accepted, no output yet
        self.num_prefill_tokens = 0                # their prompt tokens

    @classmethod
    def of(cls, max_num_queued_reqs: int | None, max_num_queued_tokens: int | None) -> QueueLimits | None:
        """The limits, or None when neither is set (no check at all)."""
        if max_num_queued_reqs is None and max_num_queued_tokens is None:
            return None
        return cls(max_num_queued_reqs, max_num_queued_tokens)

    def refusal(self, num_unfinished: int, n: int) -> str:
        """The 503 reason for a request of ``n`` samples arriving now, or ""."""
        if self.max_num_queued_reqs is not None and num_unfinished + n > self.max_num_queued_reqs:
            return QUEUE_FULL
        if (self.max_num_queued_tokens is not None
                and self.num_prefill_tokens >= self.max_num_queued_tokens):
            return BACKLOG_FULL
        return ""

    def accepted(self, req: Request) -> None:
        if self.max_num_queued_tokens is not None:
            self._prefilling.add(req)
            self.num_prefill_tokens += req.prompt_len

    def outputs(self, scheduled: Iterable[tuple[Request, int, int]]) -> None:
        """After a step: a request that has its first token leaves the backlog."""
        prefilling = self._prefilling
        if not prefilling:
            return
        for req, _, _ in scheduled:
            if req.num_output_tokens and req in prefilling:
                prefilling.discard(req)
                self.num_prefill_tokens -= req.prompt_len

    def done(self, req: Request) -> None:
        """Finished or failed: no longer in the backlog."""
        if req in self._prefilling:
            self._prefilling.discard(req)
            self.num_prefill_tokens -= req.prompt_len
