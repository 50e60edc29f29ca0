"""Requests whose last token is in flight under vLLM V1's async scheduling (``chunked``).

vLLM V1 with ``async_scheduling`` (``vllm/v1/engine/core.py``,
``EngineCore.step_with_batch_queue``) schedules step N+1 while step N runs,
and applies N's outputs after that (``Scheduler.update_from_output``). kvsim
samples N's tokens when N ends (what N+1's output placeholders stand for) and
reports the requests that finished, but they keep their running slot and
their blocks through the next ``schedule()``, which skips them: vLLM does not
schedule a request whose last token is in flight (``Scheduler.schedule``:
``num_computed_tokens + 2 - num_output_placeholders >= num_prompt_tokens +
max_tokens``, or no room left under ``max_model_len``). That schedule frees
them when it is done. The arrival side (a request submitted during step N is
first scheduled in N+2) is the engine's, ``kvsim.sim.inbox``.
"""

from __future__ import annotations

from kvsim.sched.base import StepPlan
from kvsim.sched.request import Request, RequestStatus


class AsyncFinishing:
    """What ``ChunkedScheduler`` does with finished requests under async scheduling.

    The scheduler keeps them in ``self._finishing`` (and in ``running``).
    """

    _finishing: list[Request]

    def _finish_after_next_schedule(self, finished: list[Request], now: float) -> list[Request]:
        """Finished now for the client; slot and blocks held until the next schedule."""
        for req in finished:
            req.status = RequestStatus.FINISHED
            req.finish_time = now
        self._finishing += finished
        return finished

    def _release_finishing(self) -> None:
        """After the schedule that skipped them: free the finished requests, in output order."""
        for req in self._finishing:
            self.running.remove(req)
            self._free_finished(req)
        self._finishing = []

    def _preempt_finishing(self, req: Request, plan: StepPlan) -> None:
        """P1 picked a request whose last token is in flight.

        vLLM preempts it (its blocks are freed now, ``num_preemptions`` counts
        it) and, as its stale output is kept (``drop_stale_output`` is False
        without a KV connector that needs it), that output still finishes it:
        it never goes back to the queue. The caller took it out of ``running``.
        """
        self._finishing.remove(req)
        self._free_finished(req)
        req.num_preemptions += 1
        plan.preempted.append(req)
