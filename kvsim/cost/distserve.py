"""DistServe's step-time model: its own fitted coefficients for OPT on A100-80GB.

``cost_model: {type: distserve, profile: distserve | vllm}`` costs every step
with the formulas of DistServe's simulator (LLMServe/DistServe,
``simdistserve/estimators/time_estimator.py``, ``get_prefill_time`` and
``get_decode_time``) and the coefficients it ships
(``simdistserve/estimators/profile_data/profiler-a100-80g.{distserve,vllm}.json``,
copied unchanged into ``kvsim/cost/profiles/distserve/`` with their Apache-2.0
licence). Per model (``facebook/opt-13b``, ``facebook/opt-66b``) and TP degree::

    prefill_ms = a + b * sum(l) + c * sum(l**2) + 1      # l: each request's prompt chunk
    decode_ms  = a + b * sum(ctx + 1) + c * bs            # ctx: tokens in its KV cache

``prefill`` holds [a, b, c]; ``decoding_smallbs`` when the batch has fewer than
``decoding_large_small_bs_threshold`` requests, else ``decoding_largebs``. The
``+ 1`` is ``get_prefill_time``'s pipeline constant ``pp_const = 1 * pp`` at
pp = 1 (``get_decode_time`` sets it to 0); kvsim has no pipeline stages, so
the ``/ pp`` scaling is at pp = 1. ``ctx + 1`` is the worker's
``token_generated_list`` (``simdistserve/base/worker.py``, ``do_decode``:
``current_context_len + 1``, where ``current_context_len`` is the prompt plus
the tokens decoded so far, i.e. kvsim's ``num_context_tokens`` of the step).

The ``distserve`` profile was fitted to DistServe's own engine, ``vllm`` to
vLLM's (v0.2-era, the paper's baseline); DistServe's simulator picks one per
system (``engine_type``).

A step with both (kvsim's chunked scheduler mixes them, vLLM v1 does too):
DistServe's simulator never costs one (its vLLM baseline runs prefill-only
batches; its chunked mode charges ``get_prefill_time`` of the chunks and lets
the decodes ride free, worker.py ``do_prefill``). kvsim charges the prefill
formula plus the decodes' marginal terms (``b * sum(ctx + 1) + c * bs``,
without the decode intercept ``a``): a pure step matches DistServe exactly,
a mixed one pays for the decodes' KV reads. A 1-token prefill chunk is costed
as a decode, as ``BatchShape`` says. ``ray_overhead: true`` adds the
simulator's Ray cost of every step (worker.py ``add_ray_overhead``:
2 ms + 1e-4 ms per context token of the batch); off by default, since the
profiles were fitted to the GPU forward alone
(``evaluation/0-test-single-forward-performance``).
"""

from __future__ import annotations

import csv
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

# Package data (pyproject.toml [tool.setuptools.package-data]): DistServe's files, unchanged.
DATA_DIR = Path(__file__).with_name("profiles") / "distserve"
PROFILES = {"distserve": "profiler-a100-80g.distserve.json",
            "vllm": "profiler-a100-80g.vllm.json"}
# The profiles were measured on A100-80GB (DistServe's testbed, OSDI'24 §6.1); the
# catalog's a100-80gb-sxm.
GPUS = ("a100-80gb-sxm",)
KEYS = {"type", "profile", "ray_overhead"}
RAY_BASE_MS = 2.0          # worker.py add_ray_overhead: base_overhead
RAY_PER_TOKEN_MS = 0.0001  # worker.py add_ray_overhead: k


@lru_cache(maxsize=None)
def load_profile(profile: str) -> dict:
    """DistServe's coefficients: {HF model name: {TP as str: {...}}}."""
    return json.loads((DATA_DIR / PROFILES[profile]).read_text())


@lru_cache(maxsize=None)
def max_num_tokens(model: str, tp: int, pp: int = 1) -> int | None:
    """DistServe's KV capacity in tokens (``max_num_tokens.csv``, memory_estimator.py), or None."""
    hf = hf_name(model)
    with open(DATA_DIR / "max_num_tokens.csv") as f:
        for row in csv.DictReader(f):
            if row["model"] == hf and int(row["tp"]) == tp and int(row["pp"]) == pp:
                return int(row["max_num_tokens"])
    return None


def hf_name(model: str) -> str:
    """kvsim's catalog name -> the profile's key (``opt-13b`` -> ``facebook/opt-13b``)."""
    return model if "/" in model else f"facebook/{model}"


class DistServeCostModel:
    """Step seconds from one (model, TP) entry of a DistServe profile."""

    separates_cpu_time = False

    def __init__(self, entry: dict, *, ray_overhead: bool = False):
        self.prefill = tuple(float(v) for v in entry["prefill"])
        self.small = tuple(float(v) for v in entry["decoding_smallbs"])
        self.large = tuple(float(v) for v in entry["decoding_largebs"])
        self.threshold = int(entry["decoding_large_small_bs_threshold"])
        self.ray_overhead = bool(ray_overhead)

    # -- DistServe's two functions, in ms ------------------------------------------------
    def prefill_ms(self, lens) -> float:
        """``get_prefill_time`` at pp = 1: a + b * sum(l) + c * sum(l^2), + pp_const 1."""
        a, b, c = self.prefill
        total = sum(lens)
        squares = sum(x * x for x in lens)
        return a + b * total + c * squares + 1.0

    def _decode_coef(self, bs: int) -> tuple[float, float, float]:
        return self.small if bs < self.threshold else self.large

    def decode_ms(self, bs: int, generated_sum: int) -> float:
        """``get_decode_time``: a + b * sum(ctx + 1) + c * bs (``generated_sum`` = sum(ctx + 1))."""
        a, b, c = self._decode_coef(bs)
        return a + b * generated_sum + c * bs

    def _ray_ms(self, context_sum: int) -> float:
        return RAY_BASE_MS + context_sum * RAY_PER_TOKEN_MS if self.ray_overhead else 0.0

    # -- kvsim's CostModel protocol -----------------------------------------------------
    def step_time_from_lists(self, num_new_tokens, num_context_tokens, num_sampled: int = 0,
                             swap_bytes: int = 0) -> float:
        chunks, bs, generated = [], 0, 0
        for new, ctx in zip(num_new_tokens, num_context_tokens):
            if new > 1:
                chunks.append(int(new))
            else:
                bs += 1
                generated += int(ctx) + 1
        if not chunks and not bs:
            return 0.0
        if not chunks:
            ms = self.decode_ms(bs, generated)
        else:
            ms = self.prefill_ms(chunks)
            if bs:
                _, b, c = self._decode_coef(bs)
                ms += b * generated + c * bs
        if self.ray_overhead:
            # worker.py sums current_context_len: the prompt chunk of a prefill, the context of a decode.
            ms += self._ray_ms(sum(chunks) + generated - bs)
        return ms / 1000.0

    def step_time(self, batch) -> float:
        return self.step_time_from_lists(batch.num_new_tokens.tolist(),
                                         batch.num_context_tokens.tolist(), batch.num_sampled,
                                         batch.swap_bytes)

    def decode_step_times(self, num_seqs: int, context_token_sums) -> np.ndarray:
        """Decode-only steps: the same arithmetic as ``step_time_from_lists`` (bit for bit)."""
        out = []
        for s in context_token_sums:
            ms = self.decode_ms(num_seqs, int(s) + num_seqs)
            if self.ray_overhead:
                ms += self._ray_ms(int(s))
            out.append(ms / 1000.0)
        return np.asarray(out, dtype=float)


def distserve_cost_model(config: dict, model, gpu, tp: int) -> DistServeCostModel:
    """The cost model of ``cost_model: {type: distserve, ...}`` for the scenario's model, GPU, TP."""
    for key in config:
        if key not in KEYS:
            raise ValueError(f"cost_model.{key}: unknown key for type 'distserve' "
                             f"(value {config[key]!r}); allowed: {', '.join(sorted(KEYS))}")
    profile = config.get("profile", "distserve")
    if profile not in PROFILES:
        raise ValueError(f"cost_model.profile: {profile!r} is not a DistServe profile; "
                         f"allowed: {', '.join(PROFILES)}")
    ray = config.get("ray_overhead", False)
    if not isinstance(ray, bool):
        raise ValueError(f"cost_model.ray_overhead: {ray!r} is not true or false")
    name = getattr(gpu, "name", str(gpu))
    if name not in GPUS:
        raise ValueError(f"cost_model.type: 'distserve' profiles were measured on "
                         f"{', '.join(GPUS)}, but hardware.gpu is {name!r}; use type: roofline")
    data = load_profile(profile)
    hf = hf_name(model.name)
    if hf not in data:
        models = ", ".join(m.split("/")[-1] for m in data)
        raise ValueError(f"cost_model.profile: DistServe profile {profile!r} has no model "
                         f"{model.name!r}; allowed: {models}")
    if str(tp) not in data[hf]:
        raise ValueError(f"cost_model.profile: DistServe profile {profile!r} has no "
                         f"{model.name} at hardware.tp {tp}; allowed: "
                         f"{', '.join(sorted(data[hf], key=int))}")
    return DistServeCostModel(data[hf][str(tp)], ray_overhead=ray)
