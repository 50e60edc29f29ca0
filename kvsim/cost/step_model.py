"""One step-time formula shared by the roofline and the fitted cost model.

Every operator costs ``calls * (max(sec_per_flop * FLOPs, sec_per_byte * bytes,
floor_s) + const_s)``; attention adds ``sec_per_token`` per new token and prefill
``sec_per_causal_flop`` on the FLOPs of the causal diagonal;
each tensor-parallel all-reduce costs ``sec_per_byte * 2 (tp-1)/tp * bytes +
const_s`` (ring). That is the GPU's time. The engine's time around it is a
separate part (``overhead.py``): ``step time = max(kernels, launch) + cpu``,
the kernels run on the CUDA-graph padded token count, and swap traffic over
PCIe is added. Without an ``EngineTiming`` the engine part is the GPU model's
own per-step term ``const_s + sec_per_request * requests`` (a profile's
``overhead``, the roofline's ``step_overhead_s``), with no graphs. The
roofline model derives the coefficients from datasheet numbers and
efficiencies (``roofline.py``); the fitted model reads them from a profile
(``fitted.py``). Quantities come from ``features.py``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from kvsim.cost.base import BatchShape
from kvsim.cost.features import SAMPLED_OPS, RankShapes
from kvsim.cost.coefficients import (CommCoefficients, OpCoefficients,  # noqa: F401 (re-exported)
                                     OverheadCoefficients, _decode_terms, _op_time_scalar,
                                     decode_attention_layer_time, prefill_attention_layer_time)
from kvsim.cost.decode_run_costs import DecodeRunCosts, _combine
from kvsim.cost.overhead import EngineTiming, step_terms


@dataclass
class StepCostModel(DecodeRunCosts):
    """``CostModel`` (see ``base.py``) from per-op coefficients and rank shapes.

    The engine calls it once per step, so the per-step path works in plain
    Python floats on constants gathered at construction (numpy scalars and
    attribute chains cost more than the arithmetic). Build a new model rather
    than changing the fields of one in use.
    """

    shapes: RankShapes
    ops: dict[str, OpCoefficients]
    prefill_attention: OpCoefficients
    decode_attention: OpCoefficients
    allreduce: CommCoefficients
    overhead: OverheadCoefficients
    swap_sec_per_byte: float = 0.0
    # Decodes that share a step with a prefill chunk: vLLM V1 runs one varlen
    # attention kernel for the whole step, so they lose the split-KV decode
    # kernel and cost more per key (fitted from mixed-step tables; None: same
    # as pure decode, which is all a roofline can say).
    mixed_decode_attention: OpCoefficients | None = None
    # The engine's time outside the kernels (overhead.py); None: ``overhead``
    # above is the whole engine part and no CUDA graphs are modelled.
    engine: EngineTiming | None = None
    # Speculative decoding's drafter (kvsim.cost.spec_decode.DraftCost), or None.
    draft: object = None

    def __post_init__(self) -> None:
        sh = self.shapes
        # (op, its coefficients, whether it scales with sampled sequences)
        self._linear_ops = tuple((op, self.ops[op.name], op.name in SAMPLED_OPS) for op in sh.ops)
        self._linear_cache: dict[tuple[int, int], float] = {}
        # When the sampled ops come last (lm_head, sampler), a step's sum is also
        # memoised in two parts, exactly as the loop adds it up: the other ops'
        # running sum by token count, then each sampled op's time by sampled count.
        sampled = [s for _, _, s in self._linear_ops]
        first = sampled.index(True) if True in sampled else len(sampled)
        self._split_linear = all(sampled[first:])
        self._token_ops, self._sampled_ops = self._linear_ops[:first], self._linear_ops[first:]
        self._token_sums: dict[int, float] = {}
        self._sampled_times: dict[int, tuple[float, ...]] = {}
        self._run_terms: dict[tuple, tuple] = {}     # decode_run_times' per-batch terms
        self._attn_flops_per_pair = sh.attn_flops_per_pair
        # MLA decodes in the latent space and up-projects the cached context in
        # prefill (features.RankShapes; catalog issue #16); plain attention: same / 0.
        self._decode_flops_per_pair = sh.decode_flops_per_pair
        self._ctx_flops = sh.prefill_context_flops_per_token
        self._ctx_bytes = sh.prefill_context_bytes_per_token
        self._kv_bytes_per_token_layer = sh.kv_bytes_per_token_layer
        self._q_bytes_per_token = sh.q_bytes_per_token
        self._window = bool(sh.windowed_fraction)   # RankShapes.decode_keys (sliding layers)
        self._prefill_heads = sh.kv_heads if self.prefill_attention.wave_kv_heads else sh.q_heads
        mixed = self.mixed_decode_attention
        self._decode_coef = _decode_terms(self.decode_attention)
        self._mixed_decode_coef = _decode_terms(self.decode_attention if mixed is None else mixed)
        self._allreduce_calls = sh.allreduce_calls
        self._ring_factor = 2.0 * (sh.tp - 1) / sh.tp
        # The engine part as plain floats and padding tables (the per-step path reads these).
        (self._fixed_cpu_s, self._per_request_s, self._per_prefill_s, self._per_sampled_s,
         self._decode_pad, self._mixed_pad, self._decode_launch_s, self._mixed_launch_s,
         self._eager_launch_s, self._gpu_scale) = step_terms(self.engine, self.overhead, sh.num_layers)

    def with_engine(self, engine: EngineTiming | None) -> "StepCostModel":
        """The same GPU model with another engine part."""
        return dataclasses.replace(self, engine=engine)

    def with_draft(self, draft) -> "StepCostModel":
        """The same model with a speculative-decoding drafter (kvsim.cost.spec_decode)."""
        return dataclasses.replace(self, draft=draft)

    def draft_step_time(self, num_seqs: int, context_token_sum: int) -> float:
        """Seconds the drafter adds to a step in which ``num_seqs`` requests get drafts."""
        return 0.0 if self.draft is None else self.draft.step_time(num_seqs, context_token_sum)

    # ------------------------------------------------------------ public API

    def step_time(self, batch: BatchShape) -> float:
        return self.step_time_from_lists(batch.num_new_tokens.tolist(),
                                         batch.num_context_tokens.tolist(),
                                         int(batch.num_sampled), batch.swap_bytes)

    # The engine part is separate from the kernels, so the engine may overlap them
    # (``engine.async_scheduling``; kvsim.cost.base.step_time_function).
    separates_cpu_time = True

    def step_time_from_lists(self, num_new_tokens: list[int], num_context_tokens: list[int],
                             num_sampled: int, swap_bytes: int = 0,
                             overlap_cpu: bool = False, continuation: bool = False) -> float:
        """``step_time`` of the step ``BatchShape.from_lists`` would describe, without numpy.

        The engine's per-step entry point: a batch of a few dozen requests
        costs a few microseconds as Python ints, several times that as arrays.
        ``overlap_cpu``: the step's CPU work (its launches and the engine's
        serial part) runs while the GPU runs another step's kernels, as under
        vLLM V1's async scheduling, so a step takes ``max(kernels, launch +
        cpu)`` instead of ``max(kernels, launch) + cpu`` (``_combine``).
        ``continuation``: a step of a multi-step window after its first
        (vLLM 0.6 ``--num-scheduler-steps``), which neither schedules nor
        prepares inputs: only the per-sampled-token CPU time is paid.
        """
        num_requests = len(num_new_tokens)
        num_tokens = sum(num_new_tokens)
        num_decode = num_new_tokens.count(1)
        # CUDA graphs (overhead.CudaGraphs): a uniform decode batch and a mixed
        # one may replay different graphs; the kernels run the padded count.
        if num_decode == num_requests:
            pad, launch = self._decode_pad, self._decode_launch_s
        else:
            pad, launch = self._mixed_pad, self._mixed_launch_s
        if num_tokens < len(pad):
            run_tokens = pad[num_tokens]
        else:
            run_tokens, launch = num_tokens, self._eager_launch_s
        t = self._linear_time(run_tokens, num_sampled)
        if num_decode == num_requests:
            t += self._decode_attention_time_scalar(num_decode, float(sum(num_context_tokens)))
        else:
            # A 1-token chunk is a decode (it is what the GPU runs); the rest are prefill chunks.
            chunks, contexts, decode_context = [], [], 0
            for n, c in zip(num_new_tokens, num_context_tokens):
                if n == 1:
                    decode_context += c
                else:
                    chunks.append(n)
                    contexts.append(c)
            t += self._prefill_attention_time_scalar(chunks, contexts)
            t += self._decode_attention_time_scalar(num_decode, float(decode_context), True)
        t += self._allreduce_time(run_tokens)
        t *= self._gpu_scale
        t = _combine(t, launch, self._cpu_time(num_requests, num_requests - num_decode, num_sampled,
                                               continuation), overlap_cpu)
        t += self.swap_sec_per_byte * swap_bytes
        return t

    def breakdown(self, batch: BatchShape) -> dict[str, float]:
        """Seconds per component of a step (for reports and teaching); they add up to ``step_time``.

        GPU parts are scaled by the engine's ``gpu_scale``; ``launch_wait``
        is the time the GPU waits for kernel launches (``overhead.py``),
        ``overhead`` the engine's CPU time.
        """
        new, ctx = batch.num_new_tokens, batch.num_context_tokens
        decode = new == 1
        uniform = bool(decode.all())
        pad = self._decode_pad if uniform else self._mixed_pad
        launch = self._decode_launch_s if uniform else self._mixed_launch_s
        run_tokens = batch.total_new_tokens
        if run_tokens < len(pad):
            run_tokens = pad[run_tokens]
        else:
            launch = self._eager_launch_s
        s = self._gpu_scale
        out = {op.name: s * float(self._op_time(op, run_tokens, batch.num_sampled))
               for op in self.shapes.ops}
        out["prefill_attention"] = s * (self._prefill_attention_time(new[~decode], ctx[~decode])
                                        if (~decode).any() else 0.0)
        out["decode_attention"] = s * self._decode_attention_time_scalar(
            int(decode.sum()), float(ctx[decode].sum()), bool((~decode).any()))
        out["allreduce"] = s * self._allreduce_time(run_tokens)
        out["launch_wait"] = max(0.0, launch - sum(out.values()))
        out["overhead"] = self._cpu_time(batch.num_requests, int((~decode).sum()), batch.num_sampled)
        out["swap"] = self.swap_sec_per_byte * batch.swap_bytes
        return out

    # ------------------------------------------------------------ components

    def _op_time(self, op, num_tokens: int, num_sampled: int) -> float:
        n = num_sampled if op.name in SAMPLED_OPS else num_tokens
        if n <= 0:
            return 0.0
        coef = self.ops[op.name]
        flops = op.wave_flops(n, coef.tile_m, coef.tile_n, coef.num_sms)
        return op.calls * float(coef.time(flops, op.bytes(n)))

    def _linear_time(self, num_tokens: int, num_sampled: int) -> float:
        # Steps repeat the same (tokens, sampled) pairs constantly; memoise.
        key = (num_tokens, num_sampled)
        t = self._linear_cache.get(key)
        if t is None:
            t = self._linear_sum(num_tokens, num_sampled)
            if len(self._linear_cache) < 200_000:
                self._linear_cache[key] = t
        return t

    def _linear_sum(self, num_tokens: int, num_sampled: int) -> float:
        """Every linear op's time added up in the ops' order (``_linear_time`` unmemoised)."""
        if not self._split_linear:
            t = 0.0
            for op, coef, sampled in self._linear_ops:
                t += _op_time_scalar(op, coef, num_sampled if sampled else num_tokens)
            return t
        # The same additions in the same order, the parts memoised (_split_linear).
        t = self._token_sums.get(num_tokens)
        if t is None:
            t = 0.0
            for op, coef, _ in self._token_ops:
                t += _op_time_scalar(op, coef, num_tokens)
            if len(self._token_sums) < 200_000:
                self._token_sums[num_tokens] = t
        times = self._sampled_times.get(num_sampled)
        if times is None:
            times = tuple(_op_time_scalar(op, coef, num_sampled) for op, coef, _ in self._sampled_ops)
            if len(self._sampled_times) < 200_000:
                self._sampled_times[num_sampled] = times
        for x in times:
            t += x
        return t

    def _op_time_scalar(self, op, num_tokens: int, num_sampled: int) -> float:
        """``_op_time`` in plain floats (the per-step hot path; numpy scalars are ~20x slower)."""
        n = num_sampled if op.name in SAMPLED_OPS else num_tokens
        return _op_time_scalar(op, self.ops[op.name], n)

    def _prefill_attention_time_scalar(self, chunks: list, contexts: list) -> float:
        """``_prefill_attention_time`` in plain floats (few chunks per step; numpy is slower)."""
        c_ = self.prefill_attention
        fpp, kvb, qb = self._attn_flops_per_pair, self._kv_bytes_per_token_layer, self._q_bytes_per_token
        heads = self._prefill_heads
        total = 0.0
        for c, p in zip(chunks, contexts):
            c, p = float(c), float(p)
            flops = (c * p + c * (c + 1.0) / 2.0) * fpp + p * self._ctx_flops
            nbytes = (p + 2.0 * c) * kvb + c * qb + p * self._ctx_bytes
            t = (max(c_.sec_per_flop * flops, c_.sec_per_byte * nbytes, c_.floor_s) + c_.const_s
                 + c_.sec_per_token * c + c_.sec_per_causal_flop * (c * (c + 1.0) / 2.0 * fpp))
            if c_.wave_tile_m:
                waves = math.ceil(math.ceil(c / c_.wave_tile_m) * heads / c_.num_sms)
                t += c_.sec_per_wave_key * (waves * (p + c / 2.0))
            total += t
        return self.shapes.num_layers * total

    def _decode_attention_time_scalar(self, num_seqs: int, context_sum: float,
                                      mixed: bool = False) -> float:
        """``_decode_attention_time`` for one step, in plain floats."""
        if num_seqs <= 0:
            return 0.0
        spf, spb, floor_s, const_s, spt = self._mixed_decode_coef if mixed else self._decode_coef
        n = float(num_seqs)
        keys = context_sum + n
        if self._window:                    # sliding layers read only their window (catalog #16)
            keys = self.shapes.decode_keys(n, keys)
        flops = keys * self._decode_flops_per_pair
        nbytes = (keys + n) * self._kv_bytes_per_token_layer + n * self._q_bytes_per_token
        per_layer = max(spf * flops, spb * nbytes, floor_s) + const_s + spt * n
        return self.shapes.num_layers * per_layer

    def _decode_attention_times(self, num_seqs: int, context_sums: np.ndarray) -> np.ndarray:
        """``_decode_attention_time_scalar`` over an array of sums (pure decode); overwrites it."""
        spf, spb, floor_s, const_s, spt = self._decode_coef
        n = float(num_seqs)
        keys = context_sums
        keys += n
        if self._window:
            keys = self.shapes.decode_keys(n, keys)
        flops = keys * self._decode_flops_per_pair
        flops *= spf
        nbytes = keys                      # (keys + n) * kv bytes + n * q bytes, in place
        nbytes += n
        nbytes *= self._kv_bytes_per_token_layer
        nbytes += n * self._q_bytes_per_token
        nbytes *= spb
        t = np.maximum(flops, nbytes, out=flops)
        np.maximum(t, floor_s, out=t)
        t += const_s
        t += spt * n
        t *= self.shapes.num_layers
        return t

    def _prefill_attention_time(self, chunks, contexts) -> float:
        per_layer = prefill_attention_layer_time(self.prefill_attention, self.shapes, chunks, contexts)
        return float(self.shapes.num_layers * per_layer.sum())

    def _decode_attention_time(self, num_seqs: int, context_sum):
        if num_seqs <= 0:
            return np.zeros_like(np.asarray(context_sum, dtype=float))
        per_layer = decode_attention_layer_time(self.decode_attention, self.shapes, num_seqs,
                                                context_sum)
        return self.shapes.num_layers * per_layer

    def _allreduce_time(self, num_tokens: int) -> float:
        calls = self._allreduce_calls
        if not calls or num_tokens <= 0:
            return 0.0
        ring_bytes = self._ring_factor * num_tokens * self.shapes.allreduce_bytes_per_token
        return calls * (self.allreduce.sec_per_byte * ring_bytes + self.allreduce.const_s)

    def _cpu_time(self, num_requests: int, num_prefill: int, num_sampled: int,
                  continuation: bool = False) -> float:
        """The engine's serial CPU time of a step (``overhead.EngineOverhead``)."""
        if continuation:
            return self._per_sampled_s * num_sampled
        return (self._fixed_cpu_s + self._per_request_s * num_requests
                + self._per_prefill_s * num_prefill + self._per_sampled_s * num_sampled)
