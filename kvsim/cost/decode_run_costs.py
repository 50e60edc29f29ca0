"""``StepCostModel``'s decode runs: many all-decode steps costed in one call (the fast path).

A mixin of :class:`~kvsim.cost.step_model.StepCostModel`, split out by
concern, as kv/decode_runs.py is of the KV manager. ``decode_step_times``
costs several decode-only steps at once; ``decode_run_times`` costs the steps
of an engine's decode run one after the other and adds up the clock. Both
use the same operations, in the same order, as ``step_time_from_lists`` on
an all-decode batch, so the skip-ahead and the step path agree bit for bit
(tests/test_cost_models.py).
"""

from __future__ import annotations

from array import array

import numpy as np


class DecodeRunCosts:
    """``decode_step_times`` / ``decode_run_times`` for ``StepCostModel`` (which
    owns the per-step constants they read: ``_decode_pad``, ``_decode_coef``,
    ``_gpu_scale``, ... and ``_linear_time``, ``_allreduce_time``, ``_cpu_time``,
    ``_decode_attention_time*``)."""

    def decode_step_times(self, num_seqs: int, context_token_sums: np.ndarray,
                          overlap_cpu: bool = False) -> np.ndarray:
        # The same operations, in the same order, as step_time on an all-decode
        # batch, so that the two agree bit for bit (the fast path relies on it).
        run_tokens, launch = self._decode_run_shape(num_seqs)
        linear = self._linear_time(run_tokens, num_seqs)
        allreduce = self._allreduce_time(run_tokens)
        cpu = self._cpu_time(num_seqs, 0, num_seqs)
        scale = self._gpu_scale
        if num_seqs <= 0 or len(context_token_sums) <= _SCALAR_DECODE_RUN:
            # Short runs (the common case): a loop of floats beats a dozen ufunc calls.
            sums = context_token_sums
            if isinstance(sums, np.ndarray):
                sums = sums.tolist()
            attn = self._decode_attention_time_scalar
            out = []
            for s in sums:
                g = (linear + attn(num_seqs, float(s)) + allreduce) * scale
                out.append(_combine(g, launch, cpu, overlap_cpu))
            return np.array(out, dtype=float)
        t = self._decode_attention_times(num_seqs, np.array(context_token_sums, dtype=float))
        t += linear
        t += allreduce
        t *= scale
        if overlap_cpu:
            np.maximum(t, launch + cpu, out=t)
        else:
            np.maximum(t, launch, out=t)
            t += cpu
        return t

    def decode_run_times(self, num_seqs: int, context_token_sum: int, start: float,
                         max_steps: int, until: float, overlap_cpu: bool = False,
                         continuation: bool = False) -> tuple[array, array]:
        """Boundaries and durations of consecutive decode steps from ``start`` (fast path),
        as two ``array('d')``: the engine slices them into the requests' token
        times and the step table without a float object per step.

        Step k (0-based) decodes one token for each of ``num_seqs`` requests
        with ``context_token_sum + k * num_seqs`` tokens in their KV cache.
        Steps are costed one after the other while a step would start before
        ``until``, at most ``max_steps``; the clock adds up left to right as
        the step path's does. Each duration is computed with the same
        operations, in the same order, as ``step_time_from_lists`` on that
        all-decode batch, so the two agree bit for bit.
        """
        key = (num_seqs, overlap_cpu, continuation)
        terms = self._run_terms.get(key)
        if terms is None:
            terms = self._run_terms[key] = self._decode_run_terms(num_seqs, overlap_cpu, continuation)
        (linear, allreduce, scale, floor, extra, n, q_bytes, per_seq, spf, spb, floor_s, const_s,
         fpp, kvb, num_layers, window, decode_keys) = terms
        times, durations = array("d", (start,)), array("d")
        t = start
        if window:
            context = context_token_sum
            for _ in range(max_steps):
                if t >= until:
                    break
                # _decode_attention_time_scalar(num_seqs, float(context)), inlined.
                keys = decode_keys(n, float(context) + n)
                per_layer = max(spf * (keys * fpp), spb * ((keys + n) * kvb + q_bytes), floor_s) \
                    + const_s + per_seq
                # _combine(kernels, launch, cpu, overlap_cpu), inlined (the same operations).
                d = (linear + num_layers * per_layer + allreduce) * scale
                d = (d if d >= floor else floor) + extra
                t += d
                times.append(t)
                durations.append(d)
                context += num_seqs
            return times, durations
        # The same operations without a window, with two exact rewrites: the
        # keys are whole numbers below 2**53, so adding n to the last step's
        # keys gives float(context) + n bit for bit; and max(a, b, floor_s) is
        # spelled as the two comparisons it makes (it keeps the first largest).
        keys = float(context_token_sum) + n
        add_time, add_duration = times.append, durations.append
        for _ in range(max_steps):
            if t >= until:
                break
            per_layer = spf * (keys * fpp)
            other = spb * ((keys + n) * kvb + q_bytes)
            if other > per_layer:
                per_layer = other
            if floor_s > per_layer:
                per_layer = floor_s
            d = (linear + num_layers * (per_layer + const_s + per_seq) + allreduce) * scale
            d = (d if d >= floor else floor) + extra
            t += d
            add_time(t)
            add_duration(d)
            keys += n
        return times, durations

    def _decode_run_terms(self, num_seqs: int, overlap_cpu: bool, continuation: bool) -> tuple:
        """What ``decode_run_times`` reads for a batch of ``num_seqs``: the same for
        every run of that batch (the model's constants do not change), so memoised."""
        run_tokens, launch = self._decode_run_shape(num_seqs)
        linear = self._linear_time(run_tokens, num_seqs)
        allreduce = self._allreduce_time(run_tokens)
        cpu = self._cpu_time(num_seqs, 0, num_seqs, continuation)
        spf, spb, floor_s, const_s, spt = self._decode_coef
        n = float(num_seqs)
        # _combine(kernels, launch, cpu, overlap_cpu) as max(kernels, floor) + extra:
        # overlapped, max(kernels, launch + cpu) + 0.0 (the same float); else
        # max(kernels, launch) + cpu.
        floor, extra = (launch + cpu, 0.0) if overlap_cpu else (launch, cpu)
        return (linear, allreduce, self._gpu_scale, floor, extra, n, n * self._q_bytes_per_token,
                spt * n, spf, spb, floor_s, const_s, self._decode_flops_per_pair,
                self._kv_bytes_per_token_layer, self.shapes.num_layers, self._window,
                self.shapes.decode_keys)

    def _decode_run_shape(self, num_seqs: int) -> tuple[int, float]:
        """(tokens the kernels run, launch seconds) of a uniform decode step of ``num_seqs``."""
        pad = self._decode_pad
        if num_seqs < len(pad):
            return pad[num_seqs], self._decode_launch_s
        return num_seqs, self._eager_launch_s


# Decode runs up to this many steps are costed in a Python loop, longer ones
# with numpy (measured on W1: the loop costs ~1 µs a step, numpy ~25-40 µs a
# call; the fast path asks for one step, then windows of 16 and more).
_SCALAR_DECODE_RUN = 32


def _combine(kernels: float, launch: float, cpu: float, overlap_cpu: bool) -> float:
    """A step's seconds from its GPU time, its launch time and the engine's CPU time (overhead.py).

    Synchronous: the launches overlap the kernels, the CPU work comes after
    (``max(kernels, launch) + cpu``). Overlapped (vLLM V1 async scheduling,
    ``vllm/v1/engine/core.py`` ``EngineCore.step_with_batch_queue``: step N+1
    is scheduled, prepared and launched while step N runs): the period is
    whichever is longer, the GPU's kernels or the CPU's launches and work.
    """
    if overlap_cpu:
        host = launch + cpu
        return kernels if kernels >= host else host
    return (kernels if kernels >= launch else launch) + cpu
