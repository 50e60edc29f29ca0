"""``--serve-args`` / ``--bench-args``: vLLM's command lines read as vLLM 0.33 reads them.

Tests marked ``vllm`` run vLLM's own parser (the Python at ``VLLM_PYTHON``,
default /work/venv-vllm/bin/python) and skip where it is not installed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvsim.scenario.loader import load_scenario
from kvsim.scenario.schema import ScenarioError
from kvsim.scenario.vllm_args import (VllmArgsError, cli_overrides, expand_scenario_args, map_bench_args,
                             map_serve_args, supported_flags)
from kvsim.scenario.vllm_args import bench as bench_table
from kvsim.scenario.vllm_args import bench_flags, serve_flags
from kvsim.scenario.vllm_args import serve as serve_table
from kvsim.scenario.vllm_args.parse import parse_options

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = Path(os.environ.get("VLLM_PYTHON", "/work/venv-vllm/bin/python"))
needs_vllm = pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason=f"vLLM not installed at {VLLM_PYTHON}")


def serve(text, **kw):
    return dict(map_serve_args(text, **kw).overrides)


def error(fn, text, **kw):
    with pytest.raises(VllmArgsError) as exc:
        fn(text, **kw)
    return str(exc.value)


# --- the tables -----------------------------------------------------------------

@pytest.mark.parametrize("table,options", [(serve_table, serve_flags.OPTIONS),
                                           (bench_table, bench_flags.OPTIONS)])
def test_every_flag_named_in_a_table_is_a_vllm_flag_and_in_one_table_only(table, options):
    supported = set(table.SUPPORTED) - {"model_tag"}           # the positional MODEL
    no_effect = {d for dests in table.NO_EFFECT.values() for d in dests}
    planned = set(table.PLANNED)
    assert supported | no_effect | planned <= set(options)
    assert not supported & no_effect and not supported & planned and not no_effect & planned


# One run of vLLM's Python for every check against it (importing vLLM takes ~30 s).
VLLM_FACTS = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import dump_vllm_flags as dump
version, serve, bench = dump._parsers()
out = {"serve": dump.render(version, "serve", serve), "bench": dump.render(version, "bench", bench),
       "parsed": []}
for args, dests in json.loads(sys.stdin.read()):
    try:
        ns = serve.parse_args(args)
        out["parsed"].append({d: getattr(ns, d) for d in dests})
    except SystemExit:
        out["parsed"].append("error")
print(json.dumps(out))
"""

LINES = [
    ["--max_num_seqs", "128"], ["--max-num-seqs=64"], ["--max-num-seq", "8"], ["-tp", "2"],
    ["-tp=4"], ["--tensor_parallel_size=2"], ["--no-enable-prefix-caching"],
    ["--disable-prefix-caching"], ["--enable-prefix-caching"], ["--disable-chunked-prefill"],
    ["--max-model-len", "8k"], ["--max-model-len", "8K"], ["--max-model-len", "-1"],
    ["--max-model-len", "auto"], ["--max-num-batched-tokens", "25.6k"], ["--block-size", "32"],
    ["--gpu-memory-utilization", "0.85"], ["--device-memory-utilization", "0.5"],
    ["--kv-cache-dtype", "fp8"], ["--scheduling-policy", "priority"], ["--watermark", "0.01"],
    ["--no-scheduler-reserve-full-isl"], ["--long-prefill-token-threshold", "512"],
    ["--max-num-seqs", "abc"], ["--scheduling-policy", "lifo"], ["--max-num", "4"],
    ["--max-num-batched-tokens", "1.5K"],
    # engine time (issue 13)
    ["--async-scheduling"], ["--no-async-scheduling"], ["--stream-interval", "4"],
    ["--enforce-eager"], ["--cudagraph-capture-sizes", "1", "2", "8"], ["--max-cudagraph-capture-size", "64"],
    ["--cudagraph-capture-sizes", "1", "x"], ["--spec-tokens", "3"], ["--spec-method", "eagle"],
    ["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 3}'],
    ["-sc", '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}'],
]


@pytest.fixture(scope="module")
def vllm_facts():
    dests = [[_dest(line[0])] for line in LINES]
    done = subprocess.run([str(VLLM_PYTHON), "-c", VLLM_FACTS, str(ROOT / "tests/tools")],
                          input=json.dumps(list(zip(LINES, dests))), capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@needs_vllm
@pytest.mark.parametrize("which", ["serve", "bench"])
def test_the_committed_option_tables_are_what_vllms_parsers_say(vllm_facts, which):
    assert vllm_facts[which] == (ROOT / f"kvsim/scenario/vllm_args/{which}_flags.py").read_text()


@needs_vllm
def test_flag_values_are_what_vllms_parser_makes_of_them(vllm_facts):
    for line, want in zip(LINES, vllm_facts["parsed"]):
        assert _kvsim_values(line) == want, line


def _dest(option):
    from kvsim.scenario.vllm_args.parse import _resolve, _split_explicit
    lookup = {o: d for d, (_, opts, _) in serve_flags.OPTIONS.items() for o in opts}
    try:
        return lookup[_resolve(_split_explicit(option)[0], lookup, "vllm serve")]
    except VllmArgsError:
        return "ambiguous"


def _kvsim_values(line):
    try:
        given = parse_options(line, serve_flags.OPTIONS, program="vllm serve", positional="model_tag")
        return {g.dest: serve_table.SUPPORTED[g.dest].rule.read(g) for g in given}
    except VllmArgsError:
        return "error"


# --- mapping, aliases and messages ---------------------------------------------------

def test_serve_flags_map_to_scenario_keys_under_vllms_aliases():
    assert serve("vllm serve meta-llama/Llama-3.1-8B-Instruct -tp 2 --max_num_seqs 128 "
                 "--no-enable-prefix-caching --max-model-len 8k --gpu-memory-utilization=0.85 "
                 "--kv-cache-dtype bfloat16 --scheduling-policy priority") == {
        "model": "Llama-3.1-8B-Instruct", "hardware.tp": 2, "engine.max_num_seqs": 128,
        "engine.enable_prefix_caching": False, "engine.max_model_len": 8000,
        "engine.gpu_memory_utilization": 0.85, "engine.kv_cache_dtype": "bf16",
        "engine.policy": "priority"}


def test_a_later_flag_wins_and_auto_max_model_len_keeps_kvsims_fit_to_memory():
    assert serve("--max-num-seqs 8 --max-num-seqs 16 --max-model-len auto") == {"engine.max_num_seqs": 16}


def test_the_three_spellings_of_a_switch():
    for text, value in (("--enable-prefix-caching", True), ("--disable-prefix-caching", False),
                        ("--no-enable-prefix-caching", False)):
        assert serve(text) == {"engine.enable_prefix_caching": value}


def test_an_unknown_flag_is_refused_by_name():
    assert error(map_serve_args, "--max-num-seqs 8 --foo 3") == \
        "--serve-args: --foo: not a vllm serve flag (vLLM 0.33.0)"


def test_an_unmodelled_flag_is_refused_with_the_supported_list():
    msg = error(map_serve_args, "--enable-eplb")
    assert msg.startswith("--serve-args: --enable-eplb: kvsim does not model this vllm "
                          "serve flag yet (expert parallelism (MoE, issue 16)); supported: --all2all-backend, "
                          "--async-scheduling, "
                          "--block-size, ")
    assert "--max-num-seqs" in msg and msg.endswith("pass --ignore-unsupported to simulate without it")
    assert "\n" not in msg


def test_ignore_unsupported_lists_what_it_skipped():
    mapped = map_serve_args("--enable-eplb -pp 2 --kv-cache-memory-bytes 64 --block-size 32 "
                            "--port 1", ignore_unsupported=True)
    assert mapped.overrides == [("engine.block_size", 32)]
    assert mapped.ignored == ["--enable-eplb", "-pp 2", "--kv-cache-memory-bytes 64"]
    assert mapped.no_effect == ["--port"]


@pytest.mark.parametrize("text,message", [
    ("--gpu-memory-utilization 1.5", "--serve-args: --gpu-memory-utilization 1.5: vLLM refuses it: "
                                     "must be <= 1 (CacheConfig.gpu_memory_utilization)"),
    ("--block-size 0", "--serve-args: --block-size 0: vLLM refuses it: must be > 0 (CacheConfig.block_size)"),
    ("--watermark 1", "--serve-args: --watermark 1.0: vLLM refuses it: must be < 1.0 (SchedulerConfig.watermark)"),
    ("--max-num-seqs abc", "--serve-args: argument --max-num-seqs: invalid int value: 'abc'"),
    ("--scheduling-policy lifo", "--serve-args: argument --scheduling-policy: invalid choice: 'lifo' "
                                 "(choose from fcfs, priority)"),
    ("--max-model-len 0", "--serve-args: --max-model-len 0: vLLM refuses it: max_model_len must be a "
                          "positive integer or -1/auto (ModelConfig.max_model_len)"),
    ("--max-num-seqs", "--serve-args: argument --max-num-seqs: expected one argument"),
    ("--enable-prefix-caching=1", "--serve-args: argument --enable-prefix-caching: ignored explicit argument '1'"),
])
def test_a_value_vllm_would_refuse_is_an_error_naming_the_flag(text, message):
    assert error(map_serve_args, text) == message


def test_an_ambiguous_prefix_lists_what_it_could_mean():
    assert error(map_serve_args, "--max-num 4").startswith(
        "--serve-args: ambiguous option: --max-num could match --max-num-active-seqs, ")


def test_a_value_vllm_accepts_but_kvsim_does_not_model():
    assert error(map_serve_args, "--kv-cache-dtype nvfp4") == (
        "--serve-args: --kv-cache-dtype nvfp4: a value vLLM accepts but kvsim does not model: kvsim "
        "models the KV cache dtypes auto, float16, bfloat16, fp8, fp8_e4m3, fp8_e5m2; pass "
        "--ignore-unsupported to simulate without it")
    assert serve("-pp 1 -dp 1 --dtype bfloat16") == {"hardware.dp": 1}


def test_an_unknown_model_is_refused_by_name():
    assert error(map_serve_args, "vllm serve acme/NoSuchModel-9B") == (
        "--serve-args: model 'acme/NoSuchModel-9B': not in kvsim's model catalog (kvsim capacity "
        "--list) and not a folder holding config.json")


def test_a_model_folder_with_config_json_is_read_as_that_file(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert serve(str(tmp_path)) == {"model": str(tmp_path / "config.json")}


def test_supported_flags_use_vllms_documented_names():
    names = supported_flags("serve")
    assert "--enable-prefix-caching" in names and "--tensor-parallel-size" in names
    assert "--no-enable-prefix-caching" not in names


def test_bench_args_give_the_whole_workload_and_the_slo():
    mapped = map_bench_args("vllm bench serve --dataset-name random --random-input-len 2048 "
                            "--request-rate 8 --goodput ttft:300 tpot:50 --seed 3 --port 1 "
                            "--model meta-llama/Llama-3.1-8B")
    assert mapped.overrides == [
        ("workload", {"bench": {"dataset_name": "random", "random_input_len": 2048,
                                "request_rate": 8.0, "seed": 3}}),
        ("slo", {"ttft_ms": 300.0, "tpot_ms": 50.0}),
        ("model", "Llama-3.1-8B")]
    assert mapped.no_effect == ["--port"]


@pytest.mark.parametrize("text,message", [
    ("--dataset-name hf", "--bench-args: --dataset-name hf: a value vLLM accepts but kvsim does not "
                          "model: kvsim simulates the datasets random, sharegpt, burstgpt, "
                          "prefix_repetition, timed_trace (lengths and prefix structure; no "
                          "multimodal or Hugging Face datasets); pass --ignore-unsupported to "
                          "simulate without it"),
    ("--dataset-name sonnet", "--bench-args: argument --dataset-name: invalid choice: 'sonnet' "
                              "(choose from sharegpt, burstgpt, random, random-mm, random-rerank, "
                              "hf, custom, custom_audio, custom_image, prefix_repetition, spec_bench, "
                              "speed_bench, timed_trace)"),
    ("--goodput ttft=3", "--bench-args: --goodput 'ttft=3': invalid format; specify service level "
                         "objectives as KEY:VALUE pairs, the value a number in milliseconds"),
    ("--goodput itl:3", "--bench-args: --goodput 'itl:3': invalid metric name 'itl'; the service level "
                        "objective name should be one of ttft, tpot, e2el"),
    ("--num-warmups 3", "--bench-args: --num-warmups 3: a value vLLM accepts but kvsim does not model: "
                        "kvsim models no warm-up requests (--num-warmups 0); pass --ignore-unsupported "
                        "to simulate without it"),
])
def test_bench_values_vllm_refuses_or_kvsim_does_not_model(text, message):
    assert error(map_bench_args, text) == message


def test_two_command_lines_naming_different_models_are_refused():
    with pytest.raises(VllmArgsError, match="name different models"):
        cli_overrides("llama-3.1-8b", "--model qwen3-1.7b", ignore_unsupported=False)


# --- in a scenario file ---------------------------------------------------------------

def test_engine_serve_args_in_a_file_become_its_keys():
    data = expand_scenario_args({"engine": {"serve_args": "--max-num-seqs 32 -tp 2", "block_size": 16}})
    assert data == {"engine": {"max_num_seqs": 32, "block_size": 16}, "hardware": {"tp": 2}}


def test_a_key_set_twice_is_an_error_naming_both():
    with pytest.raises(VllmArgsError) as exc:
        expand_scenario_args({"engine": {"serve_args": "--block-size 32", "block_size": 16}})
    assert str(exc.value) == ("engine.serve_args sets engine.block_size = 32 but the scenario sets it "
                              "to 16; keep one")


def test_workload_bench_args_replace_the_workload():
    assert expand_scenario_args({"workload": {"bench_args": "--num-prompts 5"}}) == \
        {"workload": {"bench": {"num_prompts": 5}}}
    with pytest.raises(VllmArgsError, match="remove workload.num_requests"):
        expand_scenario_args({"workload": {"bench_args": "--num-prompts 5", "num_requests": 3}})


def test_load_scenario_reads_serve_args_and_set_still_wins(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"engine": {"serve_args": "--max-num-seqs 32 --max-model-len 4096"}}))
    sc = load_scenario(path, overrides=["engine.max_num_seqs=8"])
    assert (sc.sched_config.max_num_seqs, sc.sched_config.max_model_len) == (8, 4096)


def test_serve_args_given_with_set_is_refused(tmp_path):
    with pytest.raises(ScenarioError, match="not with --set"):
        load_scenario({}, overrides=[("engine.serve_args", "--max-num-seqs 8")])


# --- kvsim run ---------------------------------------------------------------------------

SCENARIO = {"name": "vllm-args", "model": "llama-3.1-8b", "engine": {"max_model_len": 4096},
            "cost_model": {"type": "constant", "step_time_s": 0.01}}


def kvsim(*argv):
    return subprocess.run([sys.executable, "-m", "kvsim", *argv], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_kvsim_run_takes_both_command_lines(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    done = kvsim("run", str(path), "--json", "--ignore-unsupported",
                 "--serve-args", "vllm serve meta-llama/Llama-3.1-8B --max-num-seqs 4 "
                                "--kv-cache-memory-bytes 8",
                 "--bench-args", "--dataset-name random --random-input-len 64 --random-output-len 8 "
                                 "--num-prompts 12 --max-concurrency 3")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["completed"], summary["total_input_tokens"]) == (12, 12 * 64)
    assert summary["max_concurrent_requests"] == 3
    assert ("--serve-args: ignored (not modelled by kvsim): --kv-cache-memory-bytes 8"
            in done.stderr)


def test_kvsim_run_refuses_an_unsupported_flag_in_one_line(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    done = kvsim("run", str(path), "--serve-args=--kv-cache-memory-bytes 8")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("kvsim run: error: --serve-args: --kv-cache-memory-bytes: "
                                  "kvsim does not model")
