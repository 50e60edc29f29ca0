"""What the drafter of speculative decoding costs per step (``engine.speculative_config``).

After the target model verifies a step's drafts, vLLM's drafter proposes the
next ones in the same step (``vllm/v1/worker/gpu_model_runner.py``,
``propose_draft_token_ids``), on the GPU before the step returns:

* ``eagle`` / ``eagle3`` / ``mtp`` (``vllm/v1/spec_decode/eagle.py``): a
  draft head of one decoder layer on the target's hidden states, with the
  target's LM head, run once per draft token (K passes, the first over the
  verified tokens, the rest one token per request). Costed as K decode
  passes of a one-layer copy of the target model.
* ``draft_model`` (``draft_model.py``): a smaller model run the same way:
  K decode passes of that model (``speculative_config.model``, a catalog
  name), on the target's GPU and tensor-parallel degree.
* ``ngram`` (``ngram_proposer.py``): prompt lookup on the CPU, no GPU work;
  its CPU time is not modelled (0).

Each pass is the roofline's decode step of the drafting requests over their
context, GPU time only (no engine overhead of its own): the roofline,
whatever the target's cost model, since no draft-head timings are published
with the data here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class DraftCost:
    """Seconds the drafter adds to a step: ``passes`` decode passes of ``model``."""

    model: object                 # a StepCostModel of the drafter (GPU time only)
    passes: int

    def step_time(self, num_seqs: int, context_token_sum: int) -> float:
        if num_seqs <= 0 or self.passes <= 0:
            return 0.0
        one = float(self.model.decode_step_times(num_seqs, np.array([float(context_token_sum)]))[0])
        return self.passes * one


def draft_cost(spec, target_model, gpu, tp: int, kv_cache_dtype: str, load_model) -> DraftCost | None:
    """The drafter's cost for ``spec`` (a ``SpeculativeConfig``), or None (n-gram: no GPU work)."""
    from kvsim.cost.roofline import RooflineParams, roofline_cost_model
    if spec.method == "ngram":
        return None
    if spec.method == "draft_model":
        drafter = load_model(spec.model)
    else:
        drafter = one_layer(target_model)
    params = RooflineParams(step_overhead_s=0.0, request_overhead_s=0.0)
    return DraftCost(roofline_cost_model(drafter, gpu, tp, kv_cache_dtype, params),
                     spec.num_speculative_tokens)


def one_layer(model):
    """A one-decoder-layer copy of ``model``, with its embeddings and LM head (an EAGLE / MTP head)."""
    return replace(model, name=f"{model.name} (draft head)", num_layers=1, first_k_dense_layers=0,
                   moe_layer_step=1, layer_pattern=None)
