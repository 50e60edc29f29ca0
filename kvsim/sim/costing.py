"""How the engine turns a step plan, or a decode run, into seconds (the cost model's calls).

One place for what the engine adds around ``CostModel``: the kind of step
(a multi-step window's continuation pays no scheduling CPU), the CPU/GPU
overlap of async scheduling, the drafter of speculative decoding, and the
wait on synchronous KV loads (sched/connector.py). The formulas are the
cost model's (``kvsim.cost.base``, ``kvsim.cost.step_model``).
"""

from __future__ import annotations

import math
from array import array

from kvsim.cost.base import CostModel, decode_run_function, step_time_function
from kvsim.sched.base import DecodeRun, StepPlan


class StepCosts:
    """The seconds of the engine's steps and decode runs on ``cost_model``."""

    def __init__(self, cost_model: CostModel, *, async_scheduling: bool = False) -> None:
        # Async scheduling: the CPU part of a step overlaps the GPU part of another.
        self._step = step_time_function(cost_model, overlap_cpu=async_scheduling)
        self._run = decode_run_function(cost_model, overlap_cpu=async_scheduling)
        # vLLM 0.6 multi-step: a window's later steps skip scheduling and input preparation.
        self._continuation_step = step_time_function(cost_model, continuation=True)
        self._continuation_run = decode_run_function(cost_model, continuation=True)
        self._draft = getattr(cost_model, "draft_step_time", None)   # speculative decoding

    def step(self, plan: StepPlan) -> float:
        scheduled = plan.scheduled
        step_time = self._continuation_step if plan.continuation else self._step
        seconds = step_time([e[1] for e in scheduled], [e[2] for e in scheduled],
                            plan.num_sampled, plan.swap_bytes) + plan.kv_wait_s
        if plan.num_drafting and self._draft is not None:
            # The drafter proposes the next drafts on the GPU within the step.
            seconds += self._draft(plan.num_drafting, plan.drafting_context_tokens)
        return seconds

    def run(self, run: DecodeRun, start: float, until: float,
            one_more: bool = False) -> tuple[array, array]:
        """Boundaries and durations of the run's steps that start before ``until``;
        ``one_more``: and the first that does not (it was scheduled already)."""
        n, context = run.num_seqs, run.context_token_sum
        if run.chunk:
            return self._chunk_run(run, start, until)
        if run.continuation:
            return self._continuation_run(n, context, start, run.max_steps, until)
        times, durations = self._run(n, context, start, run.max_steps, until)
        if one_more and len(durations) < run.max_steps:
            more_times, more = self._run(n, context + n * len(durations), times[-1], 1, math.inf)
            times += more_times[1:]
            durations += more
        return times, durations

    def _chunk_run(self, run: DecodeRun, start: float, until: float) -> tuple[array, array]:
        """A chunk run's steps (sched/chunked_runs.py), each costed as ``step`` costs
        the step path's plan of it: the decodes' one token each, then the chunk,
        in running order, from the contexts the step starts with; the decodes
        sample, and the chunked request in its last chunk. The clock adds up
        left to right, as the step path's does."""
        step_time = self._step
        computed, chunk = run.num_computed, run.chunk
        decodes = computed[:-1]
        d = len(decodes)
        num_new = [1] * d + [chunk]
        end = run.chunk_end_step
        times, durations = array("d", (start,)), array("d")
        t = start
        for k in range(run.max_steps):
            if t >= until:
                break
            context = [c + k for c in decodes]
            context.append(computed[-1] + k * chunk)
            sampled = d
            if k + 1 == end:                    # its last chunk: the rest of its prompt
                num_new[-1] = run.chunk_tokens(end)
                sampled += 1
            d_s = step_time(num_new, context, sampled, 0) + 0.0    # StepPlan's swap_bytes, kv_wait_s
            t += d_s
            times.append(t)
            durations.append(d_s)
        return times, durations
