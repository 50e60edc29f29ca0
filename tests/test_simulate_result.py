"""``Result``: its inter-token gaps and the files ``kvsim run --out`` writes."""

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

import kvsim
from kvsim.sched.request import RequestStatus
from kvsim.scenario.simulate import itl_seconds

SCENARIO = {
    "name": "result-files", "seed": 1, "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
    "engine": {"max_num_batched_tokens": 256, "max_model_len": 2048},
    "cost_model": {"type": "roofline"},
    "workload": {"num_requests": 40, "arrival": {"type": "poisson", "rate": 30.0},
                 "prompt_len": {"type": "uniform", "low": 20, "high": 600},
                 "output_len": {"type": "uniform", "low": 1, "high": 60}},
}


def test_itl_is_every_gap_of_every_completed_request_in_order():
    def req(index, times, status=RequestStatus.FINISHED, arrival=0.0):
        return SimpleNamespace(token_times=times, status=status, arrival_time=arrival, index=index)

    # Finished in this order; pooled by arrival, then by the workload's order.
    done = [req(3, [3.0, 3.25, 3.5, 4.0]), req(1, [1.0]), req(2, [2.0, 2.1], RequestStatus.FAILED),
            req(0, [0.0, 0.5, 0.75]), req(4, []), req(5, [0.1, 0.3], arrival=-1.0)]
    expected = np.concatenate([np.diff([0.1, 0.3]), np.diff([0.0, 0.5, 0.75]),
                               np.diff([3.0, 3.25, 3.5, 4.0])])
    np.testing.assert_array_equal(itl_seconds(done), expected)
    assert itl_seconds([req(0, [1.0])]).shape == (0,)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 3), st.booleans()), max_size=30),
       st.randoms(use_true_random=False))
def test_itl_is_each_requests_diff_without_its_one_message_gaps(shapes, rnd):
    """Any requests: each completed one's np.diff, its zero gaps (tokens of one
    message) left out, pooled in order; few or many zero gaps, requests with no gap,
    failed ones, times as lists and as arrays; compressed in blocks of 7 values or
    in one."""
    from array import array
    from unittest import mock

    import kvsim.scenario.result as result_module

    done, expected = [], []
    for index, (num_tokens, zero_every, failed) in enumerate(shapes):
        times = np.cumsum([rnd.choice([0.25, 0.5, 1.0]) for _ in range(num_tokens)])
        if zero_every:                                   # several tokens in one message
            times[::zero_every + 1] = np.maximum.accumulate(times)[::zero_every + 1]
            times[1:][::zero_every + 1] = times[:-1][::zero_every + 1]
        times = times + index * 100.0
        status = RequestStatus.FAILED if failed else RequestStatus.FINISHED
        kept = times.tolist() if index % 2 else array("d", times.tolist())
        done.append(SimpleNamespace(token_times=kept, status=status, arrival_time=float(index),
                                    index=index))
        if not failed:
            gaps = np.diff(times)
            expected.append(gaps[gaps != 0.0])
    for block in (7, 1 << 16):
        with mock.patch.object(result_module, "_COMPRESS_BLOCK", block):
            got = itl_seconds(done[::-1])                # (finished in another order)
        np.testing.assert_array_equal(got, np.concatenate(expected) if expected else np.zeros(0))


def test_itl_of_mostly_one_message_gaps_holds_only_the_kept_ones():
    """Tokens streamed ten to a message (stream_interval): nine gaps in ten go, and
    the gaps are their own array, not a view holding every token time."""
    times = np.repeat(np.arange(1.0, 101.0), 10)                  # 1,000 tokens, 100 messages
    done = [SimpleNamespace(token_times=times.tolist(), status=RequestStatus.FINISHED,
                            arrival_time=0.0, index=0)]
    gaps = itl_seconds(done)
    np.testing.assert_array_equal(gaps, np.ones(99))
    assert gaps.base is None


def test_simultaneous_arrivals_keep_the_workloads_order_as_vllm_bench_serve():
    """Every request arrives at t = 0: requests.csv lists them in the workload's order (not
    the order they finished in), and every statistic is vLLM's ``calculate_metrics``
    over the lists in that order, bit for bit (``np.mean(ttfts) * 1000``, ...)."""
    from kvsim.metrics.bench_json import per_request_itls

    sc = {**SCENARIO, "workload": {**SCENARIO["workload"], "num_requests": 120,
                                   "arrival": {"type": "all_at_once"}}}
    result = kvsim.simulate(sc)
    req = result.requests
    assert list(req["request_id"]) == [f"r{i}" for i in range(120)]
    finish_order = np.argsort(req["finish_time_s"].to_numpy(), kind="stable")
    assert (finish_order != np.arange(120)).any()        # (they did not finish in that order)
    ttfts = (req["first_token_time_s"] - req["arrival_time_s"]).tolist()
    e2els = (req["finish_time_s"] - req["arrival_time_s"]).tolist()
    n_out = req["num_output_tokens"].tolist()
    tpots = [(e - t) / (k - 1) for e, t, k in zip(e2els, ttfts, n_out) if k > 1]
    gaps = per_request_itls(req, result.steps, result.itl_s)
    itls = [g for request_gaps in gaps for g in request_gaps]
    np.testing.assert_array_equal(result.itl_s, itls)
    s = result.summary
    for metric, xs in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        assert s[f"mean_{metric}_ms"] == np.mean(xs) * 1000, metric
        assert s[f"median_{metric}_ms"] == np.median(xs) * 1000, metric
        assert s[f"std_{metric}_ms"] == np.std(xs) * 1000, metric
        assert s[f"p90_{metric}_ms"] == np.percentile(xs, 90) * 1000, metric
        assert s[f"p99_{metric}_ms"] == np.percentile(xs, 99) * 1000, metric
    # The order matters in the last bits: pooled as the requests finished, the gaps'
    # mean is another float.
    assert np.mean([g for i in finish_order for g in gaps[i]]) != np.mean(itls)


def test_written_files_are_the_tables_as_pandas_writes_them(tmp_path):
    result = kvsim.simulate(SCENARIO)
    out = result.write(tmp_path / "run")
    for name, table in (("requests", result.requests), ("steps", result.steps)):
        table.to_csv(tmp_path / f"{name}-pandas.csv", index=False)
        assert (out / f"{name}.csv").read_bytes() == (tmp_path / f"{name}-pandas.csv").read_bytes()
    pd.testing.assert_frame_equal(pd.read_csv(out / "steps.csv"), result.steps)
    assert json.loads((out / "summary.json").read_text())["completed"] == result.summary["completed"]


def test_stats_count_every_step_and_split_them_between_runs_and_single_steps():
    fast = kvsim.simulate(SCENARIO)
    slow = kvsim.simulate(SCENARIO, fast_path=False)
    assert fast.stats.num_steps == slow.stats.num_steps == len(fast.steps)
    assert slow.stats.num_run_steps == slow.stats.num_runs == 0
    assert 0 < fast.stats.num_runs < fast.stats.num_run_steps < fast.stats.num_steps
    assert fast.stats.skip_ahead_share == fast.stats.num_run_steps / fast.stats.num_steps
    assert fast.stats.num_arrived == 40


def test_stats_carry_the_scheduler_counters():
    static = kvsim.simulate({**SCENARIO, "engine": {**SCENARIO["engine"], "scheduler": "static"}})
    util = static.stats.scheduler["slot_utilization"]
    assert 0 < util < 1


def test_requests_table_has_the_types_pandas_infers_from_the_fields():
    # requests_frame converts plain float / int columns itself; the table must be
    # the one pandas builds from the same fields as lists, dtypes included, also
    # when a column is not all floats (an int arrival time) or holds a None.
    from kvsim.metrics.schema import REQUEST_COLUMNS
    from kvsim.scenario.result import _REQUEST_FIELDS, requests_frame

    def req(i, arrival, status=RequestStatus.FINISHED, reason=""):
        return SimpleNamespace(request_id=f"r{i}", index=i, arrival_time=arrival, queued_time=arrival,
                               scheduled_time=float("nan"), first_token_time=arrival + 1.0,
                               finish_time=arrival + 2.0, prompt_len=10 + i, num_output_tokens=3,
                               num_cached_tokens=-1 if i % 2 else 16, num_preemptions=0,
                               priority=i % 3, status=status, fail_reason=reason)

    for done in ([req(0, 0.5), req(1, 0.25), req(2, 0.25)],
                 [req(0, 0), req(1, 1.5, RequestStatus.FAILED, "too long"), req(2, 1)],
                 [req(0, 2.0, reason=None), req(1, 1.0)], [req(0, 3), req(1, 1)], []):
        rows = {c: [getattr(r, _REQUEST_FIELDS[c]) for r in done] for c in REQUEST_COLUMNS}
        rows["num_cached_tokens"] = [max(c, 0) for c in rows["num_cached_tokens"]]
        rows["status"] = ["failed" if s is RequestStatus.FAILED else "completed" for s in rows["status"]]
        want = (pd.DataFrame(rows, columns=REQUEST_COLUMNS)
                .sort_values(["arrival_time_s"], kind="stable").reset_index(drop=True))
        got = requests_frame(done)
        pd.testing.assert_frame_equal(got, want)
        assert list(got.dtypes) == list(want.dtypes)
