"""What the engine tells a cost model about a step, and what it gets back.

The scheduler builds a :class:`BatchShape` for every step; a cost model turns it
into seconds. The cost model never sees blocks or request ids (DESIGN.md).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from functools import partial
from typing import Callable, Protocol

import numpy as np


@dataclass(frozen=True)
class BatchShape:
    """One engine step, as the GPU sees it.

    ``num_new_tokens[i]`` tokens are computed for the i-th scheduled request,
    whose KV cache already holds ``num_context_tokens[i]`` tokens before this
    step (prefix-cache hits and earlier chunks included). A decode is
    ``num_new_tokens == 1``; a prefill chunk is any larger count (a 1-token
    prefill chunk is costed like a decode, which is what the GPU does).
    ``num_sampled`` requests emit a token this step (LM head + sampling).
    ``swap_bytes`` are moved between CPU and GPU memory in this step
    (swap preemption of the ``continuous`` scheduler).
    """

    num_new_tokens: np.ndarray
    num_context_tokens: np.ndarray
    num_sampled: int
    swap_bytes: int = 0

    @property
    def num_requests(self) -> int:
        return len(self.num_new_tokens)

    @property
    def total_new_tokens(self) -> int:
        return int(self.num_new_tokens.sum())

    @classmethod
    def from_lists(cls, new_tokens, context_tokens, num_sampled: int | None = None,
                   swap_bytes: int = 0) -> "BatchShape":
        new = np.asarray(new_tokens, dtype=np.int64)
        ctx = np.asarray(context_tokens, dtype=np.int64)
        if num_sampled is None:
            num_sampled = len(new)
        return cls(new, ctx, int(num_sampled), int(swap_bytes))


class CostModel(Protocol):
    """Turns a step into seconds on the simulated GPU(s).

    A model may also offer ``step_time_from_lists(num_new_tokens,
    num_context_tokens, num_sampled, swap_bytes)``: the same seconds from plain
    lists, which the engine prefers when present (see ``step_time_function``),
    and ``decode_run_times(num_seqs, context_token_sum, start, max_steps,
    until)``: a whole run of decode steps, costed and added up, which the fast
    path prefers when present (see ``decode_run_function``); it returns the
    step boundaries and durations as two ``array('d')``.
    """

    def step_time(self, batch: BatchShape) -> float:
        """Seconds the engine spends on this step (GPU + per-step CPU overhead)."""
        ...

    def decode_step_times(self, num_seqs: int, context_token_sums: np.ndarray) -> np.ndarray:
        """Seconds of each of several decode-only steps, vectorised (fast path).

        Every step decodes one token for each of ``num_seqs`` requests, all of
        which sample; ``context_token_sums[k]`` is the sum over the batch of
        the tokens in the KV cache before step k. Must equal ``step_time`` on
        the equivalent ``BatchShape`` (to 1e-12 relative): a decode step's cost
        depends on the contexts only through their sum.
        """
        ...


@dataclass(frozen=True)
class ConstantCostModel:
    """Every step takes ``step_time_s``: for step-exact tests and teaching."""

    step_time_s: float = 1.0

    def step_time(self, batch: BatchShape) -> float:
        return self.step_time_s

    def step_time_from_lists(self, num_new_tokens, num_context_tokens, num_sampled: int,
                             swap_bytes: int = 0) -> float:
        return self.step_time_s

    def decode_step_times(self, num_seqs: int, context_token_sums: np.ndarray) -> np.ndarray:
        return np.full(len(context_token_sums), self.step_time_s, dtype=float)


# (num_new_tokens, num_context_tokens, num_sampled, swap_bytes) -> seconds
StepTimeFunction = Callable[[list, list, int, int], float]


def step_time_function(cost_model: CostModel, *, overlap_cpu: bool = False,
                       continuation: bool = False) -> StepTimeFunction:
    """How the engine should cost a step it holds as lists of ints.

    The model's ``step_time_from_lists`` if it has one (no numpy arrays per
    step), else ``step_time`` on the equivalent ``BatchShape``. Both give the
    same seconds. ``overlap_cpu`` (``engine.async_scheduling``): the engine's
    CPU time overlaps the GPU's, for models that keep the two apart
    (``separates_cpu_time``); any other model has no CPU part to overlap.
    ``continuation``: a multi-step window's later steps, which pay only the
    per-sampled-token CPU time (``StepCostModel.step_time_from_lists``).
    """
    fast = getattr(cost_model, "step_time_from_lists", None)
    if (overlap_cpu or continuation) and getattr(cost_model, "separates_cpu_time", False):
        return partial(fast, overlap_cpu=overlap_cpu, continuation=continuation)
    if fast is not None:
        return fast

    def via_batch_shape(num_new_tokens, num_context_tokens, num_sampled, swap_bytes=0):
        return cost_model.step_time(BatchShape.from_lists(num_new_tokens, num_context_tokens,
                                                          num_sampled, swap_bytes))
    return via_batch_shape


# (num_seqs, context_token_sum, start, max_steps, until) -> (boundaries, durations)
DecodeRunFunction = Callable[[int, int, float, int, float], tuple[array, array]]


def decode_run_function(cost_model: CostModel, *, overlap_cpu: bool = False,
                        continuation: bool = False) -> DecodeRunFunction:
    """How the fast path should cost a run of decode steps (see ``StepCostModel.decode_run_times``).

    The model's ``decode_run_times`` if it has one, else ``decode_step_times``
    in growing windows: the same seconds, added up the same way.
    ``overlap_cpu`` and ``continuation`` as for ``step_time_function``.
    """
    fast = getattr(cost_model, "decode_run_times", None)
    if (overlap_cpu or continuation) and getattr(cost_model, "separates_cpu_time", False):
        return partial(fast, overlap_cpu=overlap_cpu, continuation=continuation)
    if fast is not None:
        return fast

    def via_decode_step_times(num_seqs, context_token_sum, start, max_steps, until):
        times, durations = array("d", (start,)), array("d")
        t, window = start, 16
        while len(durations) < max_steps and t < until:
            first = len(durations)
            n = min(window, max_steps - first)
            sums = [context_token_sum + num_seqs * k for k in range(first, first + n)]
            for d in cost_model.decode_step_times(num_seqs, sums).tolist():
                if t >= until:
                    break
                t += d
                times.append(t)
                durations.append(d)
            window *= 4
        return times, durations
    return via_decode_step_times
