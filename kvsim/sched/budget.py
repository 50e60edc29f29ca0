"""A step's token budgets in vLLM V1's scheduler (``Scheduler.schedule``, vLLM 0.33).

Two budgets shrink as requests are scheduled: ``token_budget``, the tokens
the step may issue (``max_num_scheduled_tokens``, by default
``max_num_batched_tokens``), and ``input_budget``, the model runner's input
rows (``max_num_batched_tokens``), which each scheduled request also takes
``draft_slots`` of (``SpeculativeConfig.max_num_new_slots_for_drafting``: a
draft model's extra input row; 0 without speculative decoding). A request
gets at most ``min(token_budget, input_budget - draft_slots)`` tokens; the
loops stop once ``token_budget`` is spent or ``input_budget <= draft_slots``.
Without speculative decoding or ``max_num_scheduled_tokens`` both budgets
are the same number.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StepBudget:
    tokens: int                 # token_budget
    inputs: int                 # input_budget
    draft_slots: int = 0

    @property
    def room(self) -> int:
        """The most tokens the next request may get."""
        inputs = self.inputs - self.draft_slots          # (min(), spelled as its comparison)
        return self.tokens if self.tokens <= inputs else inputs

    @property
    def open(self) -> bool:
        return self.tokens > 0 and self.inputs > self.draft_slots

    def take(self, n: int) -> None:
        self.tokens -= n
        self.inputs -= n + self.draft_slots

    def give_back(self, n: int) -> None:
        """A preempted request's tokens of this step return (P1)."""
        self.tokens += n
        self.inputs += n + self.draft_slots
