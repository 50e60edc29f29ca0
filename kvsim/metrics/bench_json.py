"""A run as the JSON file ``vllm bench serve --save-result`` writes, under the same keys.

``bench_serve_result`` builds the mapping ``serve.py`` ``main_async`` saves:
the set-up keys (``backend``, ``model_id``, ``num_prompts``, ``request_rate``,
``burstiness``, ``max_concurrency``, ramp-up), then ``benchmark``'s result
(``duration``, ``completed``, throughputs, ``latencies``, ``queue_times``,
``max_output_tokens_per_s``, ``max_concurrent_requests``, and
``mean_/median_/std_/pNN_`` of ``ttft_ms``, ``tpot_ms``, ``itl_ms``,
``e2el_ms``). ``detailed=True`` adds the per-request lists of
``--save-detailed`` (``input_lens``, ``output_lens``, ``ttfts``, ``itls``,
``start_times``, ``generated_texts``, ``errors``), in the order of ``requests``.

Where vLLM's definition differs from kvsim's ``summary.json``, this file
follows vLLM: ``duration`` runs from the start of the benchmark (t = 0) to the
last response; an empty statistic is 0, not NaN; ``max_concurrent_requests``
counts requests active in each whole second (``calculate_metrics``), not
requests running in one engine step. kvsim writes no ``date`` (results carry
no wall clock).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kvsim.metrics.summary import LATENCY_METRICS, check_slo, count_good, request_latencies_s


# The step table's columns ``bench_serve_result`` reads.
BENCH_STEP_COLUMNS = ("start_time_s", "duration_s", "num_decode_tokens")


def bench_serve_result(summary: dict, requests: pd.DataFrame, steps: pd.DataFrame, itl_s: np.ndarray, *,
                       setup: dict, slo: dict | None = None,
                       detailed: bool = False) -> tuple[dict, list[str]]:
    """The ``--save-result`` mapping, and notes on what could not be written exactly.

    ``setup`` holds the keys vLLM takes from its command line: ``backend``,
    ``label``, ``model_id``, ``num_prompts``, ``request_rate`` (a number or
    "inf"), ``burstiness``, ``max_concurrency`` and, with a ramp-up,
    ``ramp_up_strategy`` / ``ramp_up_start_rps`` / ``ramp_up_end_rps``.
    ``slo`` (``ttft_ms`` ...) gives ``request_goodput``; without it that key is None, as in vLLM.
    """
    notes: list[str] = []
    ok = (requests["status"] == "completed").to_numpy()
    arrival = requests["arrival_time_s"].to_numpy(dtype=float)
    first = requests["first_token_time_s"].to_numpy(dtype=float)
    finish = requests["finish_time_s"].to_numpy(dtype=float)
    outputs = np.where(ok, requests["num_output_tokens"].to_numpy(dtype=np.int64), 0)
    done = finish[np.isfinite(finish)]
    duration = float(done.max()) if len(done) else 0.0      # from the benchmark's start, t = 0
    completed, total_in = int(ok.sum()), int(requests["num_prompt_tokens"].to_numpy()[ok].sum())
    total_out = int(outputs.sum())
    rate = (lambda x: x / duration if duration > 0 else 0.0)
    num_good = count_good(request_latencies_s(requests, ok), check_slo(slo)) if slo else None
    result = {
        **setup,
        "duration": duration,
        "completed": completed,
        "failed": int((~ok).sum()),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": rate(completed),
        "request_goodput": None if num_good is None else rate(num_good),
        "output_throughput": rate(total_out),
        "total_token_throughput": rate(total_in + total_out),
    }
    if detailed:
        itls = per_request_itls(requests, steps, itl_s)
        result.update({
            "input_lens": requests["num_prompt_tokens"].astype(int).tolist(),
            "output_lens": outputs.tolist(),
            "ttfts": np.where(ok, first - arrival, 0.0).tolist(),
        })
        if itls is not None:
            result["itls"] = itls
        else:
            notes.append("itls left out: the run's tables do not give each request's token times "
                         "(a request was preempted or skipped a step)")
        result.update({
            "start_times": arrival.tolist(),
            "generated_texts": [""] * len(requests),
            "errors": [str(e) if not k else "" for e, k in zip(requests["fail_reason"].fillna(""), ok)],
        })
    closed_loop = setup.get("max_concurrency") is not None
    result.update({
        "latencies": np.where(ok, finish - arrival, 0.0).tolist(),
        # Time a request waited for a free slot before it was sent (closed loop: since t = 0).
        "queue_times": (arrival if closed_loop else np.zeros(len(arrival))).tolist(),
        **_peaks(arrival[ok], finish[ok], steps, first),
        "rtfx": 0.0,
    })
    for metric in LATENCY_METRICS:
        for stat in ("mean", "median", "std", "p90", "p99"):
            value = summary.get(f"{stat}_{metric}_ms")
            result[f"{stat}_{metric}_ms"] = 0.0 if value is None or _nan(value) else value
    return result, notes


def per_request_itls(requests: pd.DataFrame, steps: pd.DataFrame, itl_s: np.ndarray) -> list | None:
    """Each request's inter-token gaps (s), or None when the tables cannot say them exactly.

    A decoding request gets one token at the end of every engine step from
    its first token to its last (vLLM V1 schedules every running request each
    step), so its gaps are the gaps between those step ends. That holds when
    each completed request saw exactly ``num_output_tokens - 1`` step ends
    after its first token, and the gaps found are the run's own (``itl_s``,
    compared as sorted values): otherwise (a preemption, a prefill-only step
    of the continuous scheduler) None.
    """
    end = steps["start_time_s"].to_numpy(dtype=float) + steps["duration_s"].to_numpy(dtype=float)
    ok = (requests["status"] == "completed").to_numpy()
    first = requests["first_token_time_s"].to_numpy(dtype=float)
    finish = requests["finish_time_s"].to_numpy(dtype=float)
    outputs = requests["num_output_tokens"].to_numpy(dtype=np.int64)
    lo = np.searchsorted(end, first, side="right")
    hi = np.searchsorted(end, finish, side="right")
    gaps: list[list[float]] = []
    pieces = []
    for i in range(len(requests)):
        if not ok[i] or outputs[i] <= 1:
            gaps.append([])
            continue
        if hi[i] - lo[i] != outputs[i] - 1:
            return None
        piece = np.diff(np.concatenate(([first[i]], end[lo[i]:hi[i]])))
        pieces.append(piece)
        gaps.append(piece.tolist())
    found = np.sort(np.concatenate(pieces)) if pieces else np.zeros(0)
    if len(found) != len(itl_s) or not np.array_equal(found, np.sort(np.asarray(itl_s, dtype=float))):
        return None
    return gaps


def _peaks(start: np.ndarray, end: np.ndarray, steps: pd.DataFrame, first: np.ndarray) -> dict:
    """vLLM ``calculate_metrics``: most tokens in one second, most requests active in one second.

    Seconds are counted from the first completed request's start. Tokens per
    second come from the steps (each step's decode tokens and first tokens, at
    its end), the same derivation as ``vllm:generation_tokens_total``.
    """
    if not len(start):
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    t0 = float(start.min())
    seconds = int(math.ceil(float(end.max()) - t0)) + 1
    active = np.zeros(seconds + 1)
    np.add.at(active, (start - t0).astype(np.int64), 1)
    np.add.at(active, (end - t0).astype(np.int64) + 1, -1)
    step_end = steps["start_time_s"].to_numpy(dtype=float) + steps["duration_s"].to_numpy(dtype=float)
    tokens = steps["num_decode_tokens"].to_numpy(dtype=float).copy()
    has_first = np.isfinite(first)
    at = np.searchsorted(step_end, first[has_first], side="left")
    np.add.at(tokens, at[at < len(tokens)], 1)
    bucket = (step_end - t0).astype(np.int64)
    inside = (bucket >= 0) & (bucket < seconds)
    per_second = np.bincount(bucket[inside], weights=tokens[inside], minlength=seconds)
    return {"max_output_tokens_per_s": float(per_second.max()) if len(per_second) else 0.0,
            "max_concurrent_requests": int(np.cumsum(active)[:seconds].max())}


def _nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)
