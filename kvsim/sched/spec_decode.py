"""Speculative decoding in the V1 scheduler: drafts, verification, acceptance (``engine.speculative_config``).

vLLM 0.33 (``vllm/v1/core/sched/scheduler.py``; ``vllm/config/speculative.py``):

* After a step in which a request sampled, the drafter proposes
  ``num_speculative_tokens`` (K) draft tokens for it (``update_draft_token_ids``;
  none for a request still in its prompt). The next step schedules the
  request's ``num_tokens_with_spec - num_computed_tokens`` tokens: the last
  sampled token plus its drafts, cut like any chunk (budget, max_model_len).
* ``allocate_slots`` reserves ``num_lookahead_tokens`` more slots past them,
  for the drafter's own KV (``VllmConfig.num_lookahead_tokens``: K for EAGLE,
  EAGLE-3, MTP and draft models; 0 for n-gram). Blocks are never given back
  when drafts are rejected: the request keeps them and its next tokens fill
  them; only the rejected tokens' computed count is rolled back.
* The step verifies the drafts: the target model accepts a prefix of them and
  samples one more token, so a request gains 1 + accepted tokens at once
  (``update_from_output``: ``num_computed_tokens -= num_rejected``; tokens past
  ``max_tokens`` are dropped by the stop check). Blocks filled by accepted
  tokens are cached then (``cache_blocks``), not at schedule time, where
  caching stops at the known tokens.
* Budgets: a step may issue ``max_num_scheduled_tokens`` tokens (default
  ``max_num_batched_tokens``) while the inputs, plus ``max_num_new_slots_for_drafting``
  per scheduled request (1 for a draft model, 0 otherwise), must fit
  ``max_num_batched_tokens`` (``kvsim.sched.budget``).

How many drafts are accepted is not something a simulator can know: it is an
input (``AcceptanceModel``), drawn per verification from a generator seeded
by the run's seed and the request's index, so a run is deterministic and a
request's draws do not depend on what else was batched with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvsim.sched.base import StepPlan
from kvsim.sched.request import Request

# vllm/config/speculative.py methods kvsim models, and what each reserves.
METHODS = ("ngram", "eagle", "eagle3", "mtp", "draft_model")


@dataclass(frozen=True)
class AcceptanceModel:
    """How many of a verification's drafts the target model accepts.

    ``per_position[i]``: the probability that draft i (0-based) is accepted,
    i.e. that at least i + 1 are (vLLM's per-position acceptance rate,
    ``vllm:spec_decode_num_accepted_tokens_per_pos`` / drafts); non-increasing.
    A constant per-token rate a (Leviathan et al., ICML'23: each draft
    accepted with probability a once the ones before it were) is
    ``per_position = [a, a^2, ..., a^K]``. ``trace``: accepted counts to use
    in the order the engine verifies drafts, over again when used up (each
    cut to the drafts scheduled).
    """

    per_position: tuple[float, ...] = ()
    trace: tuple[int, ...] = ()
    seed: int = 0

    @classmethod
    def constant(cls, rate: float, k: int, seed: int = 0) -> "AcceptanceModel":
        return cls(tuple(rate ** (i + 1) for i in range(k)), seed=seed)


def acceptance_from_config(value, k: int, seed: int, base_dir: Path = Path(".")) -> AcceptanceModel:
    """``speculative_config.acceptance``: {rate: a} | {per_position: [...]} | {trace: file}.

    ValueErrors name the key and what is allowed.
    """
    where = "engine.speculative_config.acceptance"
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in (
            "rate", "per_position", "trace"):
        raise ValueError(f"{where}: {value!r}; give one of {{rate: 0.7}}, "
                         f"{{per_position: [p1, ..., p{k}]}} or {{trace: FILE}}")
    key, v = next(iter(value.items()))
    if key == "rate":
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            raise ValueError(f"{where}.rate: {v!r} is not a probability in [0, 1]")
        return AcceptanceModel.constant(float(v), k, seed)
    if key == "per_position":
        ok = isinstance(v, list) and len(v) == k and all(
            not isinstance(p, bool) and isinstance(p, (int, float)) and 0.0 <= p <= 1.0 for p in v)
        if not ok:
            raise ValueError(f"{where}.per_position: {v!r}; expected {k} probabilities in [0, 1] "
                             f"(one per draft position, num_speculative_tokens = {k})")
        if any(b > a for a, b in zip(v, v[1:])):
            raise ValueError(f"{where}.per_position: {v!r} increases; position i is accepted only "
                             f"if every position before it is, so the rates cannot grow")
        return AcceptanceModel(tuple(float(p) for p in v), seed=seed)
    path = Path(v) if Path(str(v)).is_absolute() else base_dir / str(v)
    try:
        counts = json.loads(path.read_text())
    except IsADirectoryError:
        raise ValueError(f"{where}.trace: {str(path)!r} is a folder; expected a JSON file "
                         f"listing the accepted drafts per verification") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}.trace: {str(path)!r}: not a UTF-8 text file (byte {exc.start} "
                         f"cannot be decoded); expected a JSON list of accepted counts") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where}.trace: {v!r} is not a readable JSON list of accepted counts "
                         f"({exc.__class__.__name__})") from None
    if (not isinstance(counts, list) or not counts
            or not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= k
                       for c in counts)):
        raise ValueError(f"{where}.trace: {path} must hold a non-empty JSON list of integers in "
                         f"[0, {k}] (accepted drafts per verification)")
    return AcceptanceModel(trace=tuple(counts), seed=seed)


@dataclass(frozen=True)
class SpeculativeConfig:
    """``engine.speculative_config``, resolved (vLLM's ``SpeculativeConfig`` names)."""

    method: str
    num_speculative_tokens: int
    acceptance: AcceptanceModel = field(default_factory=AcceptanceModel)
    model: str | None = None                 # draft_model: the draft model (catalog name)

    @property
    def num_lookahead_tokens(self) -> int:
        """``VllmConfig.num_lookahead_tokens``: slots for the drafter's KV past the scheduled tokens."""
        return self.num_speculative_tokens if self.method != "ngram" else 0

    @property
    def max_num_new_slots_for_drafting(self) -> int:
        """``SpeculativeConfig.max_num_new_slots_for_drafting``: 1 for a draft model, else 0."""
        return 1 if self.method == "draft_model" else 0


class Drafts:
    """The drafts each running request holds, and the acceptance draws (one per scheduler)."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self.k = config.num_speculative_tokens
        self._num: dict[str, int] = {}                 # request id -> drafts proposed
        self._rngs: dict[str, np.random.Generator] = {}
        self._trace_at = 0

    def num_drafts(self, req: Request) -> int:
        return self._num.get(req.request_id, 0)

    def drop(self, req: Request) -> None:
        """Preempted or finished: its drafts are gone (``_preempt_request``)."""
        self._num.pop(req.request_id, None)

    def forget(self, req: Request) -> None:
        self._num.pop(req.request_id, None)
        self._rngs.pop(req.request_id, None)

    def after_schedule(self, plan: StepPlan) -> None:
        """Record each request's scheduled drafts; every position verified is sampled.

        Called after ``commit_scheduled``: a request whose chunk reached its
        known tokens scheduled ``num_computed_tokens - num_tokens`` drafts
        (``scheduled_spec_decode_tokens``); the LM head and the sampler run
        on the bonus position and on each draft.
        """
        drafting = context = 0
        for req, n, ctx in plan.scheduled:
            extra = req.num_computed_tokens - req.num_tokens
            if extra < 0:
                continue                          # a prompt chunk that does not sample
            if extra:
                plan.scheduled_drafts[req.request_id] = extra
                plan.num_sampled += extra
            drafting += 1
            context += ctx + n
        plan.num_drafting, plan.drafting_context_tokens = drafting, context

    def verify(self, plan: StepPlan, now: float, kv) -> list[Request]:
        """S7 with drafts: each sampling request gains 1 + accepted tokens at ``now``.

        Rejected drafts roll ``num_computed_tokens`` back; a request cut at
        its final length finishes. Requests that sampled and go on get K new
        drafts; the blocks accepted tokens filled are cached (``kv.cache_blocks``).
        Returns the finished requests (not yet freed).
        """
        finished = []
        generated = 0
        for req, _, _ in plan.scheduled:
            num_drafts = plan.scheduled_drafts.get(req.request_id, 0)
            if req.num_computed_tokens - num_drafts < req.num_tokens:
                continue                          # prompt not done: no token, no drafts
            accepted = self._accepted(req, num_drafts) if num_drafts else 0
            req.num_computed_tokens -= num_drafts - accepted
            room = req.final_num_tokens - req.num_tokens
            new = min(1 + accepted, room)
            # The stop check drops the tokens past the end, and the computed
            # count with them (``_update_request_with_output``).
            req.num_computed_tokens -= 1 + accepted - new
            out = req.num_output_tokens
            req.num_output_tokens = out + new
            req.token_times.extend([now] * new)
            if out == 0:
                req.first_token_time = now
            generated += new
            kv.cache_blocks(req, req.num_computed_tokens)
            if req.num_tokens >= req.final_num_tokens:
                finished.append(req)
                self.forget(req)
            else:
                self._num[req.request_id] = self.k
        plan.num_generated_tokens = generated
        return finished

    def _accepted(self, req: Request, num_drafts: int) -> int:
        model = self.config.acceptance
        if model.trace:
            count = model.trace[self._trace_at % len(model.trace)]
            self._trace_at += 1
            return min(count, num_drafts)
        rng = self._rngs.get(req.request_id)
        if rng is None:
            rng = self._rngs[req.request_id] = np.random.default_rng([model.seed, req.index])
        u = rng.random()
        return sum(1 for p in model.per_position[:num_drafts] if u < p)
