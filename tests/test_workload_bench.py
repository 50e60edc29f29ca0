"""``workload: {bench: ...}``: the requests and send times of ``vllm bench serve``.

Tests marked ``vllm`` run vLLM's own dataset classes and ``get_request`` (the
Python at ``VLLM_PYTHON``) with a tokenizer that counts words, and compare
draw for draw; they skip where vLLM is not installed.
"""

import json
import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kvsim.workload import build_workload, parse_workload_config
from kvsim.workload.bench import bench_arrival_times, bench_table
from kvsim.workload.bench_config import BenchConfig

VLLM_PYTHON = Path(os.environ.get("VLLM_PYTHON", "/work/venv-vllm/bin/python"))
needs_vllm = pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason=f"vLLM not installed at {VLLM_PYTHON}")
SHARED = Path(__file__).resolve().parents[2] / "shared"
MOONCAKE = SHARED / "data/traces/mooncake_conversation_trace.jsonl"


def specs(bench, **kw):
    workload = build_workload({"bench": bench}, rng=np.random.default_rng(0), **kw)
    return workload, list(workload.requests())


def error_of(bench):
    with pytest.raises(ValueError) as exc:
        parse_workload_config({"bench": bench})
    return str(exc.value)


# --- against vLLM ----------------------------------------------------------------

VLLM_BENCH = r"""
import asyncio, json, os, sys
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
import numpy as np
import vllm.benchmarks.serve as serve
from vllm.benchmarks.datasets.datasets import ShareGPTDataset
from vllm.benchmarks.datasets.utils import get_sampling_params

class WordTokenizer:
    vocab_size = 1000
    all_special_ids = []
    def num_special_tokens_to_add(self): return 0
    def __call__(self, text):
        return type("Enc", (), {"input_ids": text.split()})()
    def decode(self, ids): return " ".join(map(str, ids))

async def send_times(n, rate, burstiness, ramp, start, end):
    clock = [0.0]
    async def sleep(dt): clock[0] += dt
    serve.asyncio.sleep, serve.time.time = sleep, lambda: clock[0]
    return [clock[0] async for _ in serve.get_request(list(range(n)), rate, burstiness, ramp, start, end)]

cases = json.loads(sys.stdin.read())
out = {"times": [], "random": [], "sharegpt": None}
for c in cases["times"]:
    np.random.seed(c["seed"])
    out["times"].append(asyncio.run(send_times(c["n"], c["rate"], c["burstiness"], c.get("ramp"),
                                               c.get("start"), c.get("end"))))
for c in cases["random"]:
    ins, outs, _ = get_sampling_params(np.random.default_rng(c["seed"]), c["n"], c["ratio"],
                                       c["input_len"], c["output_len"], WordTokenizer())
    out["random"].append([ins.tolist(), outs.tolist()])
c = cases["sharegpt"]
got = ShareGPTDataset(random_seed=c["seed"], dataset_path=c["path"]).sample(
    tokenizer=WordTokenizer(), num_requests=c["n"], output_len=c["output_len"])
out["sharegpt"] = [[r.prompt_len, r.expected_output_len] for r in got]
print(json.dumps(out))
"""

TIMES = [dict(n=40, rate=2.0, burstiness=1.0, seed=0), dict(n=40, rate=5.0, burstiness=0.3, seed=7),
         dict(n=25, rate=3.0, burstiness=math.inf, seed=1), dict(n=10, rate=math.inf, burstiness=1.0, seed=0),
         dict(n=30, rate=math.inf, burstiness=0.5, seed=2, ramp="linear", start=1, end=20),
         dict(n=30, rate=math.inf, burstiness=1.0, seed=3, ramp="exponential", start=2, end=50)]
RANDOM = [dict(n=50, seed=0, ratio=0.0, input_len=1024, output_len=128),
          dict(n=50, seed=4, ratio=0.5, input_len=300, output_len=40),
          dict(n=50, seed=5, ratio={"input": 0.9, "output": 0.2}, input_len=100, output_len=20)]


def sharegpt_file(tmp_path):
    rng = np.random.default_rng(11)
    data = []
    for i in range(60):
        turns = [{"from": "human" if k % 2 == 0 else "gpt",
                  "value": " ".join(["w"] * int(rng.integers(1, 700)))} for k in range(int(rng.integers(1, 4)))]
        data.append({"id": str(i), "conversations": turns})
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    return path


def burstgpt_file(tmp_path):
    rng = np.random.default_rng(12)
    rows = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    for i in range(40):
        model = "GPT-4" if rng.random() < 0.6 else "ChatGPT"
        req, resp = int(rng.integers(1, 2000)), int(rng.integers(0, 500))
        rows.append(f"{i},{model},{req},{resp},{req + resp},Conversation log")
    path = tmp_path / "burstgpt.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="module")
def vllm_bench(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    cases = {"times": TIMES, "random": RANDOM,
             "sharegpt": dict(seed=3, n=50, output_len=None, path=str(sharegpt_file(tmp)))}
    done = subprocess.run([str(VLLM_PYTHON), "-c", VLLM_BENCH], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp, json.loads(done.stdout.splitlines()[-1])


@needs_vllm
@pytest.mark.parametrize("case", range(len(TIMES)))
def test_send_times_are_vllms_get_request(vllm_bench, case):
    c = TIMES[case]
    ramp = {"ramp_up_strategy": c["ramp"], "ramp_up_start_rps": c["start"],
            "ramp_up_end_rps": c["end"]} if "ramp" in c else {"request_rate": c["rate"]}
    cfg = BenchConfig(num_prompts=c["n"], burstiness=c["burstiness"], **ramp)
    ours = bench_arrival_times(cfg, c["n"], c["seed"])
    # vLLM's clock here is a sum of its sleeps, so allow rounding of the last bit.
    assert ours.tolist() == pytest.approx(vllm_bench[1]["times"][case], rel=1e-12, abs=1e-12)


@needs_vllm
@pytest.mark.parametrize("case", range(len(RANDOM)))
def test_random_lengths_are_vllms_draws(vllm_bench, case):
    c = RANDOM[case]
    cfg = BenchConfig(num_prompts=c["n"], random_range_ratio=c["ratio"],
                      random_input_len=c["input_len"], random_output_len=c["output_len"])
    table = bench_table(cfg, seed=c["seed"], base_dir=None)
    assert [table.own_lens.tolist(), table.output_lens.tolist()] == vllm_bench[1]["random"][case]


@needs_vllm
def test_sharegpt_sample_is_vllms_shuffle_filter_and_oversample(vllm_bench):
    tmp, facts = vllm_bench
    cfg = BenchConfig(dataset_name="sharegpt", dataset_path=str(tmp / "sharegpt.json"), num_prompts=50)
    table = bench_table(cfg, seed=3, base_dir=None)
    assert np.column_stack([table.own_lens, table.output_lens]).tolist() == facts["sharegpt"]


def test_burstgpt_samples_gpt4_rows_with_an_answer_as_vllm_does(tmp_path):
    # vLLM's BurstGPTDataset (its venv here lacks pandas, so not run): keep GPT-4 rows with
    # Response tokens > 0, DataFrame.sample(n, random_state=seed), with replacement past the end.
    import pandas as pd
    path = burstgpt_file(tmp_path)
    df = pd.read_csv(path)
    rows = df[(df["Model"] == "GPT-4") & (df["Response tokens"] > 0)]
    cfg = BenchConfig(dataset_name="burstgpt", dataset_path=str(path), num_prompts=60)
    table = bench_table(cfg, seed=4, base_dir=None)
    want = rows.sample(n=60, random_state=4, replace=True)
    assert table.own_lens.tolist() == want["Request tokens"].tolist()
    assert table.output_lens.tolist() == want["Response tokens"].tolist()
    assert len(rows) < 60


# --- exact properties, without vLLM ------------------------------------------------

def test_the_default_is_vllm_bench_serves_default_run():
    workload, reqs = specs({})
    assert workload.num_requests == 1000 and workload.concurrency is None
    assert {(len(r.prompt_token_ids), r.max_tokens, r.arrival_time_s) for r in reqs} == {(1024, 128, 0.0)}


def test_a_fixed_rate_spans_exactly_num_prompts_over_rate():
    times = bench_arrival_times(BenchConfig(num_prompts=200, request_rate=4.0, burstiness=0.5), 200, 9)
    assert times[-1] == 50.0 and times[0] > 0 and (np.diff(times) >= 0).all()


def test_infinite_burstiness_gives_evenly_spaced_requests():
    times = bench_arrival_times(BenchConfig(num_prompts=4, request_rate=2.0, burstiness=math.inf), 4, 0)
    assert times.tolist() == [0.5, 1.0, 1.5, 2.0]


def test_random_prefix_and_special_tokens_are_shared_by_every_prompt():
    _, reqs = specs({"num_prompts": 3, "random_input_len": 100, "random_prefix_len": 20,
                     "num_special_tokens": 1})
    assert [len(r.prompt_token_ids) for r in reqs] == [120, 120, 120]   # 1 + 20 + (100 - 1)
    first = reqs[0].prompt_token_ids[:21]
    assert all((r.prompt_token_ids[:21] == first).all() for r in reqs)
    assert len({int(r.prompt_token_ids[21]) for r in reqs}) == 3


def test_prefix_repetition_gives_each_prefix_an_equal_share():
    _, reqs = specs({"dataset_name": "prefix_repetition", "num_prompts": 23,
                     "prefix_repetition_num_prefixes": 5, "prefix_repetition_prefix_len": 32,
                     "prefix_repetition_suffix_len": 16, "prefix_repetition_output_len": 7, "seed": 2})
    assert len(reqs) == 20                              # 5 prefixes x (23 // 5), as vLLM
    prefixes = [tuple(r.prompt_token_ids[:32].tolist()) for r in reqs]
    assert sorted(prefixes.count(p) for p in set(prefixes)) == [4] * 5
    assert prefixes != sorted(prefixes, key=prefixes.index)   # shuffled, not in groups
    assert {(len(r.prompt_token_ids), r.max_tokens) for r in reqs} == {(48, 7)}


def test_sonnet_is_a_shared_prefix_then_fresh_tokens():
    _, reqs = specs({"dataset_name": "sonnet", "num_prompts": 2})
    assert [(len(r.prompt_token_ids), r.max_tokens) for r in reqs] == [(550, 150)] * 2
    assert (reqs[0].prompt_token_ids[:200] == reqs[1].prompt_token_ids[:200]).all()
    assert reqs[0].prompt_token_ids[200] != reqs[1].prompt_token_ids[200]


@pytest.mark.skipif(not MOONCAKE.is_file(), reason="shared Mooncake trace not present")
def test_timed_trace_replays_the_file_in_order_at_its_timestamps():
    _, reqs = specs({"dataset_name": "timed_trace", "dataset_path": str(MOONCAKE), "num_prompts": 30,
                     "timed_trace_chunk_hash_size": 512, "timed_trace_sec_multiplier": 0.001})
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines()[:30]]
    assert [r.arrival_time_s for r in reqs] == [row["timestamp"] * 0.001 for row in rows]   # vLLM: ts * multiplier
    assert [(len(r.prompt_token_ids), r.max_tokens, r.prompt_block_ids) for r in reqs] == \
        [(row["input_length"], row["output_length"], row["hash_ids"]) for row in rows]


def test_max_concurrency_with_every_request_at_t0_is_a_closed_loop():
    workload, _ = specs({"num_prompts": 10, "max_concurrency": 4})
    assert workload.concurrency == 4


@pytest.mark.parametrize("bench,message", [
    ({"max_concurrency": 0}, "workload.bench.max_concurrency: must be greater than 0 (vLLM --max-concurrency)"),
    ({"ramp_up_strategy": "linear", "ramp_up_start_rps": 1, "ramp_up_end_rps": 5, "request_rate": 2.0},
     "workload.bench.request_rate: do not give it with ramp_up_strategy; the request rate is "
     "controlled by the ramp-up parameters (vLLM)"),
    ({"ramp_up_strategy": "exponential", "ramp_up_start_rps": 0, "ramp_up_end_rps": 5},
     "workload.bench.ramp_up_start_rps: for exponential ramp-up, the start RPS cannot be 0 (vLLM)"),
    ({"ramp_up_strategy": "linear", "ramp_up_start_rps": 9, "ramp_up_end_rps": 5},
     "workload.bench.ramp_up_start_rps: ramp-up start RPS must be less than end RPS (vLLM)"),
    ({"dataset_name": "random", "dataset_path": "x.json"},
     "workload.bench.dataset_path: cannot be used with the 'random' dataset (vLLM); give the "
     "dataset_name of the file (sharegpt, burstgpt, timed_trace)"),
    ({"dataset_name": "sharegpt"}, "workload.bench.dataset_path: missing; the 'sharegpt' dataset "
                                   "reads a file (vLLM: dataset_path must be provided)"),
    ({"random_range_ratio": 1.0}, "workload.bench.random_range_ratio: input range ratio 1.0 must be "
                                  "in [0, 1) (vLLM)"),
    ({"self_timed": True}, "workload.bench.self_timed: only supported with dataset_name timed_trace (vLLM)"),
    ({"dataset_name": "prefix_repetition", "num_prompts": 3},
     "workload.bench.num_prompts (3) must be greater than or equal to prefix_repetition_num_prefixes (10) (vLLM)"),
    ({"dataset_name": "timed_trace", "dataset_path": "t.jsonl"},
     "workload.bench.timed_trace_chunk_hash_size = 16: kvsim replays hash ids as Mooncake blocks of "
     "512 tokens; give 512"),
    ({"request_rate": 0}, "workload.bench.request_rate = 0: Input should be greater than 0"),
])
def test_what_vllm_refuses_is_refused_with_its_reason(bench, message):
    assert error_of(bench) == message


@pytest.mark.parametrize("text,message", [
    ("{}", "not a JSON list of conversations"),
    ("[{\"conversations\": [{\"value\": 3}, {\"value\": \"a\"}]}]", "entry 0: each message must be an "
                                                                   "object with a 'value' string"),
    ("[{\"conversations\": [{\"value\": \"a\"}, {\"value\": \"b\"}]}]", "no conversation passes vLLM's "
                                                                       "length filter"),
    ("not json", "not valid JSON"),
])
def test_a_sharegpt_file_of_the_wrong_shape_is_named(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError) as exc:
        specs({"dataset_name": "sharegpt", "dataset_path": str(path)})
    assert str(exc.value).startswith(f"workload.bench.dataset_path: {path}: ")
    assert message.replace("not a JSON", "expected a JSON") in str(exc.value) or message in str(exc.value)


def test_a_burstgpt_file_without_its_columns_is_named(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError) as exc:
        specs({"dataset_name": "burstgpt", "dataset_path": str(path)})
    assert str(exc.value) == (f"workload.bench.dataset_path: {path}: not a BurstGPT CSV; need the "
                              f"columns Timestamp, Model, Request tokens, Response tokens, ... in "
                              f"that order (found: a, b)")


def test_same_seed_same_requests():
    bench = {"num_prompts": 50, "request_rate": 3.0, "random_range_ratio": 0.4}
    a = [(r.arrival_time_s, len(r.prompt_token_ids), r.max_tokens) for r in specs(bench)[1]]
    b = [(r.arrival_time_s, len(r.prompt_token_ids), r.max_tokens) for r in specs(bench)[1]]
    assert a == b
