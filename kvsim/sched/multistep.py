"""vLLM 0.6 multi-step scheduling (``engine.num_scheduler_steps`` k > 1) on the V0 scheduler.

vLLM 0.6.0-0.6.2 (``vllm/engine/llm_engine.py``, ``LLMEngine.step``;
``vllm/core/scheduler.py``; ``vllm/core/block_manager_v2.py``):

* A decode batch is scheduled once for k steps: ``_append_slots`` reserves
  k - 1 lookahead slots per request past its next token
  (``num_lookahead_slots = num_scheduler_steps - 1``), and while the batch has
  steps left the engine runs it without calling the scheduler
  (``_has_remaining_steps``). A request that arrives, or that could be
  admitted, waits until the window ends: the first prefill after it starts
  only then. A prefill batch is one step (no lookahead for prefills).
* The outputs of a window are processed once, after its last step
  (``multi_step_stream_outputs`` is False by default in 0.6.2 and absent
  before), so the client gets a window's tokens in one burst, and a request
  that reached its last token mid-window is only then found finished: until
  the window ends it stays in the batch, computed for nothing (padding).
* Feasibility is worst case per request (``can_append_slots``): the blocks
  "touched" by appending the tokens the block table has not seen plus the
  lookahead slots, ``1 + ceil((unseen + lookahead - first_chunk) / block_size)``
  with ``first_chunk`` the room left in the table's last block
  (``BlockTable.get_num_blocks_touched_by_append_slots``). The table sees a
  window's tokens only at the next window: after a prefill one token is
  unseen, after a window k are.
* A window's blocks are hashed for the prefix cache when the table appends
  them, at the next window's start (``allocate_slots`` here).

Refused with it, as vLLM 0.6 refuses or kvsim does not model: chunked prefill
(0.6.0-0.6.2: "Chunked prefill is not supported with multi-step"; kvsim's
chunked scheduler is vLLM V1's, which has no multi-step), speculative
decoding ("Speculative decoding is not supported with multi-step"), swap
preemption (the swap-in lookahead is not modelled).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from kvsim.sched.base import DecodeRun, StepPlan
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.continuous import ContinuousScheduler
from kvsim.sched.request import Request


class MultiStepScheduler(ContinuousScheduler):
    """``continuous`` with decode windows of ``num_scheduler_steps`` steps."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.k = config.num_scheduler_steps
        self.num_lookahead_slots = self.k - 1
        self._window: list[Request] = []           # the batch of the window in flight
        self._steps_left = 0                       # its steps after the one just scheduled
        self._burst_start: dict[str, int] = {}     # where each request's window tokens begin
        self._unseen: dict[str, int] = {}          # tokens the V0 block table has not seen

    # ------------------------------------------------------------ protocol

    def schedule(self) -> StepPlan:
        if self._steps_left > 0:
            return self._window_step()
        plan = super().schedule()
        if plan.scheduled and not plan.prefix_hit_tokens and not plan.resume_hit_tokens:
            self._start_window([req for req, _, _ in plan.scheduled])
        else:
            for req in plan.prefix_hit_tokens.keys() | plan.resume_hit_tokens.keys():
                self._unseen[req] = 1                 # the prefill's sampled token
        return plan

    def update_from_output(self, plan: StepPlan, now: float) -> list[Request]:
        if not self._window:
            return super().update_from_output(plan, now)
        self._sample_window(plan, now)
        if self._steps_left > 0:
            return []
        return self._end_window(now)

    def blocks_touched(self, req: Request) -> int:
        """V0 ``can_append_slots``: blocks touched by the unseen tokens plus the lookahead."""
        bs = self.kv.block_size
        unseen = self._unseen.get(req.request_id, 1)
        full = req.num_tokens - unseen            # tokens in the block table
        first_chunk = bs - full % bs
        return 1 + max(-(-(unseen + self.num_lookahead_slots - first_chunk) // bs), 0)

    # ---------------------------------------------------------- decode runs

    def plan_decode_run(self) -> DecodeRun | None:
        """The rest of the window in flight, up to the first request's last token.

        Every step of it decodes the same batch with no scheduling and no
        block taken (the slots were reserved); nothing that arrives changes
        it (the engine still ends the run there, to record the new request
        as waiting). A window's first step and prefills go through
        ``schedule()``.
        """
        if self._steps_left <= 0:
            return None
        reqs = self._window
        context, steps = 0, self._steps_left
        for r in reqs:
            if r.num_tokens >= r.final_num_tokens:
                return None                           # padding: step by step
            steps = min(steps, r.final_num_tokens - r.num_tokens)
            context += r.num_computed_tokens
        return DecodeRun(num_seqs=len(reqs), context_token_sum=context, max_steps=steps,
                         requests=list(reqs), num_computed=[], first_allocations=[],
                         num_free_blocks=self.kv.get_num_free_blocks(), continuation=True)

    def sync_decode_run(self, run: DecodeRun, num_started: int) -> None:
        run.steps_allocated = max(run.steps_allocated, num_started)   # nothing is allocated

    def apply_decode_run(self, run: DecodeRun, num_steps: int,
                         token_times: Sequence[float]) -> list[Request]:
        if not 1 <= num_steps <= run.max_steps or len(token_times) != num_steps:
            raise ValueError(f"apply_decode_run: {num_steps} steps of a run of {run.max_steps} "
                             f"with {len(token_times)} token times")
        times = array("d", token_times)         # converted once (Request.token_times)
        for r in run.requests:
            r.num_computed_tokens += num_steps
            r.num_output_tokens += num_steps
            r.token_times.extend(times)
        run.free_after = [run.num_free_blocks] * num_steps
        self._steps_left -= num_steps
        return self._end_window(token_times[-1]) if self._steps_left == 0 else []

    # ------------------------------------------------------------ windows

    def _start_window(self, batch: list[Request]) -> None:
        self._window = batch
        self._steps_left = self.k - 1
        for req in batch:
            self._burst_start[req.request_id] = len(req.token_times)
            self._unseen[req.request_id] = self.k

    def _window_step(self) -> StepPlan:
        """A step of the window after its first: the same batch, one token each."""
        plan = StepPlan(continuation=True)
        for req in self._window:
            plan.scheduled.append((req, 1, req.num_computed_tokens))
            if req.num_tokens < req.final_num_tokens:
                req.num_computed_tokens += 1          # padding is computed, but makes nothing
        plan.num_sampled = len(self._window)          # the sampler runs on the whole batch
        self._steps_left -= 1
        return plan

    def _sample_window(self, plan: StepPlan, now: float) -> None:
        generated = 0
        for req, _, _ in plan.scheduled:
            if req.num_tokens >= req.final_num_tokens or req.num_computed_tokens < req.num_tokens:
                continue
            req.num_output_tokens += 1
            req.token_times.append(now)
            generated += 1
        plan.num_generated_tokens = generated

    def _end_window(self, now: float) -> list[Request]:
        """The window's outputs are processed: its tokens reach the client now, finishes are found."""
        finished = []
        for req in self._window:
            start = self._burst_start.pop(req.request_id)
            times = req.token_times                  # the burst's tokens all arrive now
            burst = len(times) - start
            del times[start:]
            times.extend([now] * burst)
            if req.num_tokens >= req.final_num_tokens:
                finished.append(req)
                self._unseen.pop(req.request_id, None)
        self._window = []
        return self.finish_requests(finished, now)

    def _preempt(self, req: Request, plan: StepPlan) -> None:
        self._unseen.pop(req.request_id, None)      # recomputed: its prefill sets it again
        super()._preempt(req, plan)
