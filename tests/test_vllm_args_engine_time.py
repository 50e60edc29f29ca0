"""The engine-time ``vllm serve`` flags (issue 13): async scheduling, streaming, CUDA graphs, speculation.

vLLM 0.33's parser itself is checked on these flags in test_vllm_args.py
(``LINES``); here: the scenario keys they become and what kvsim does with them.
"""

from __future__ import annotations

import pytest
import yaml

from kvsim.scenario.loader import load_scenario
from kvsim.scenario.schema import ScenarioError
from kvsim.scenario.vllm_args import VllmArgsError, expand_scenario_args, map_serve_args
from kvsim.scenario.vllm_args import serve as serve_table
from kvsim.scenario.vllm_args.engine_flags import acceptance_length_rates


def serve(text, **kw):
    return dict(map_serve_args(text, **kw).overrides)


def error(text):
    with pytest.raises(VllmArgsError) as exc:
        map_serve_args(text)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


ENGINE_TIME = ("async_scheduling", "stream_interval", "enforce_eager", "cudagraph_capture_sizes",
               "max_cudagraph_capture_size", "speculative_config", "spec_method", "spec_model",
               "spec_tokens")


def test_the_engine_time_flags_are_supported_not_planned():
    for dest in ENGINE_TIME:
        assert dest in serve_table.SUPPORTED and dest not in serve_table.PLANNED, dest
    assert "compilation_config" in serve_table.PLANNED


def test_each_flag_sets_its_key():
    assert serve("--async-scheduling --stream-interval 4 --enforce-eager "
                 "--cudagraph-capture-sizes 1 2 8") == {
        "engine.async_scheduling": True, "engine.stream_interval": 4, "engine.enforce_eager": True,
        "engine.cudagraph_capture_sizes": [1, 2, 8]}
    assert serve("--max-cudagraph-capture-size 64") == {"engine.max_cudagraph_capture_size": 64}
    assert serve("--no-async-scheduling --no-enforce-eager") == {
        "engine.async_scheduling": False, "engine.enforce_eager": False}
    assert serve("--speculative-config '{\"method\": \"eagle3\", \"num_speculative_tokens\": 2}'") == {
        "engine.speculative_config": {"method": "eagle3", "num_speculative_tokens": 2}}
    assert serve("--spec-method draft_model --spec-model llama-3.2-1b --spec-tokens 4") == {
        "engine.speculative_config": {"method": "draft_model", "model": "llama-3.2-1b",
                                      "num_speculative_tokens": 4}}


def test_synthetic_acceptance_is_kvsims_per_position_acceptance():
    rates = serve("-sc '{\"method\": \"eagle\", \"num_speculative_tokens\": 3, "
                  "\"rejection_sample_method\": \"synthetic\", "
                  "\"synthetic_acceptance_rates\": [0.8, 0.6, 0.3]}'")
    assert rates["engine.speculative_config"]["acceptance"] == {"per_position": [0.8, 0.6, 0.3]}
    # vLLM's minimum-variance schedule for a mean acceptance length, worked by hand:
    # 2.5 tokens per verification = 1 bonus + 1.5 drafts: draft 1 always, draft 2 half the time.
    assert acceptance_length_rates(2.5, 3) == [1.0, 0.5, 0.0]
    assert acceptance_length_rates(1.0, 3) == [0.0, 0.0, 0.0]
    assert acceptance_length_rates(4.0, 3) == [1.0, 1.0, 1.0]
    length = serve("-sc '{\"method\": \"deepseek_mtp\", \"num_speculative_tokens\": 3, "
                   "\"rejection_sample_method\": \"synthetic\", \"synthetic_acceptance_length\": 2.5}'")
    assert length["engine.speculative_config"] == {
        "method": "mtp", "num_speculative_tokens": 3, "acceptance": {"per_position": [1.0, 0.5, 0.0]}}


@pytest.mark.parametrize("text, message", [
    ("--spec-method ngram -sc '{\"method\": \"eagle\"}'",
     "--serve-args: --spec-method and --speculative-config['method'] are mutually exclusive (as vLLM)"),
    ("--spec-tokens 0", "--serve-args: --spec-tokens 0: vLLM refuses it: must be > 0 "
                        "(SpeculativeConfig.num_speculative_tokens)"),
    ("--speculative-config.method eagle", "--serve-args: argument --speculative-config.method: kvsim "
     "reads --speculative-config as one JSON object ('{\"key\": value, ...}'), not key by key"),
    ("-sc '[1, 2]'", "--serve-args: argument -sc: '[1, 2]' is not a JSON object"),
    ("-sc '{method'", "--serve-args: argument -sc: invalid loads value: '{method' (Expecting "
                      "property name enclosed in double quotes: line 1 column 2 (char 1))"),
    ("--cudagraph-capture-sizes 1 x", "--serve-args: argument --cudagraph-capture-sizes: invalid "
                                      "int value: 'x'"),
    ("--stream-interval 0", "--serve-args: --stream-interval 0: vLLM refuses it: must be >= 1 "
                            "(SchedulerConfig.stream_interval)"),
    ("-sc '{\"method\": \"eagle\", \"synthetic_acceptance_rates\": [0.5]}'",
     "--serve-args: --speculative-config: synthetic_acceptance_rates/_length need "
     "rejection_sample_method 'synthetic' (vLLM refuses them otherwise)"),
    ("-sc '{\"method\": \"eagle\", \"num_speculative_tokens\": 2, \"rejection_sample_method\": "
     "\"synthetic\", \"synthetic_acceptance_length\": 3.5}'",
     "--serve-args: --speculative-config: synthetic_acceptance_length 3.5: vLLM refuses it: must be "
     "in [1, num_speculative_tokens + 1 = 3]"),
])
def test_bad_values_are_one_line_naming_the_flag(text, message):
    assert error(text) == message


def test_what_vllm_accepts_and_kvsim_does_not_model_can_be_ignored():
    assert error("-sc '{\"method\": \"suffix\"}'").startswith(
        "--serve-args: -sc {\"method\": \"suffix\"}: a value vLLM accepts but kvsim does not model: "
        "kvsim models the speculative methods ngram, eagle, eagle3, mtp, draft_model")
    assert "(not prompt_lookup_max)" in error(
        "-sc '{\"method\": \"ngram\", \"num_speculative_tokens\": 2, \"prompt_lookup_max\": 4}'")
    mapped = map_serve_args("-sc '{\"method\": \"suffix\"}' --stream-interval 2",
                            ignore_unsupported=True)
    assert mapped.overrides == [("engine.stream_interval", 2)]
    assert mapped.ignored == ['-sc {"method": "suffix"}']


# --- in a scenario ----------------------------------------------------------------------

BASE = {"name": "et", "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
        "engine": {"max_model_len": 4096, "max_num_batched_tokens": 512, "max_num_seqs": 64},
        "cost_model": {"type": "roofline", "engine_preset": "vllm-v1"},
        "workload": {"num_requests": 4}}


def test_the_file_gives_the_acceptance_the_command_line_cannot():
    data = {**BASE, "engine": {**BASE["engine"], "speculative_config": {"acceptance": {"rate": 0.7}},
                               "serve_args": "--speculative-config "
                                             "'{\"method\": \"eagle\", \"num_speculative_tokens\": 3}'"}}
    sc = load_scenario(data)
    spec = sc.sched_config.speculative
    assert (spec.method, spec.num_speculative_tokens) == ("eagle", 3)
    assert spec.acceptance.per_position == pytest.approx((0.7, 0.49, 0.343))
    with pytest.raises(VllmArgsError) as exc:
        expand_scenario_args({"engine": {"speculative_config": {"method": "ngram"},
                                         "serve_args": "--spec-method eagle"}})
    assert str(exc.value) == ("engine.serve_args sets engine.speculative_config.method = 'eagle' "
                              "but the scenario sets it to 'ngram'; keep one")


def test_without_an_acceptance_the_loader_says_where_to_give_it():
    with pytest.raises(ScenarioError, match="acceptance: missing"):
        load_scenario({**BASE, "engine": {**BASE["engine"], "serve_args": "--spec-method eagle "
                                          "--spec-tokens 2"}})
    sc = load_scenario({**BASE, "engine": {**BASE["engine"], "serve_args": "--spec-method eagle "
                                           "--spec-tokens 2"}},
                       overrides=[("engine.speculative_config.acceptance.rate", 0.5)])
    assert sc.sched_config.speculative.acceptance.per_position == (0.5, 0.25)


def test_async_streaming_and_cuda_graph_flags_reach_the_scheduler_and_the_cost(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, "engine": {
        **BASE["engine"], "serve_args": "--async-scheduling --stream-interval 8 "
                                        "--cudagraph-capture-sizes 1 2 4 8 16 1024"}}))
    sc = load_scenario(path)
    assert (sc.sched_config.async_scheduling, sc.sched_config.stream_interval) == (True, 8)
    graphs = sc.cost_model.engine.cudagraphs
    # vLLM keeps the sizes up to max_num_batched_tokens (512): 1024 is dropped.
    assert (graphs.mode, graphs.capture_sizes) == ("full_and_piecewise", (1, 2, 4, 8, 16))
    assert graphs.padded_size(3) == 4 and graphs.padded_size(17) == 17     # eager above 16
    eager = load_scenario({**BASE, "engine": {**BASE["engine"], "serve_args": "--enforce-eager"}})
    assert eager.cost_model.engine.cudagraphs.mode == "none"
    with pytest.raises(ScenarioError) as exc:
        load_scenario({**BASE, "engine": {**BASE["engine"], "serve_args":
                                          "--enforce-eager --cudagraph-capture-sizes 1 2"}})
    assert str(exc.value) == ("engine.cudagraph_capture_sizes: given with engine.enforce_eager: "
                              "true, which captures no graphs; drop one of them")
    with pytest.raises(ScenarioError, match="engine.enforce_eager: CUDA graphs are modelled by an "
                                            "engine preset"):
        load_scenario({**BASE, "cost_model": {"type": "roofline"},
                       "engine": {**BASE["engine"], "serve_args": "--enforce-eager"}})


def test_max_cudagraph_capture_size_replaces_vllms_ceiling():
    # BASE: max_num_seqs 64, max_num_batched_tokens 512 -> vLLM's ceiling min(2 x 64, 512) = 128
    # plus max_num_seqs (64, already a multiple of 8).
    default = load_scenario(BASE).cost_model.engine.cudagraphs.capture_sizes
    assert default == (1, 2, 4, *range(8, 129, 8))
    # A given maximum of 100: 1, 2, 4, 8..96 by 8 (vLLM truncates the maximum to 96); no
    # uniform-decode size is added, and 512 tokens do not fit under it.
    sc = load_scenario(BASE, overrides=[("engine.max_cudagraph_capture_size", 100)])
    assert sc.cost_model.engine.cudagraphs.capture_sizes == (1, 2, 4, *range(8, 97, 8))
    # 300: the multiples of 16 from 256 join (256, 272, 288).
    sc = load_scenario(BASE, overrides=[("engine.max_cudagraph_capture_size", 300)])
    assert sc.cost_model.engine.cudagraphs.capture_sizes[-4:] == (248, 256, 272, 288)
    # Above max_num_batched_tokens: capped there, and 512 itself is captured.
    sc = load_scenario(BASE, overrides=[("engine.max_cudagraph_capture_size", 4096)])
    assert sc.cost_model.engine.cudagraphs.capture_sizes[-2:] == (496, 512)


@pytest.mark.parametrize("engine, cost, message", [
    ({"max_cudagraph_capture_size": 8, "cudagraph_capture_sizes": [1, 2, 4]}, None,
     "engine.max_cudagraph_capture_size: 8, but the largest engine.cudagraph_capture_sizes kept is "
     "4; vLLM refuses both when they differ"),
    ({"max_cudagraph_capture_size": 8, "enforce_eager": True}, None,
     "engine.max_cudagraph_capture_size: given with engine.enforce_eager: true, which captures no "
     "graphs; drop one of them"),
    ({"max_cudagraph_capture_size": 8}, "vllm-v0.6",
     "engine.max_cudagraph_capture_size: vLLM V1's knob; the vllm-v0.6 engine captures its own "
     "sizes (use engine.cudagraph_capture_sizes)"),
    ({"max_cudagraph_capture_size": 8}, "sarathi-serve-2024",
     "engine.max_cudagraph_capture_size: the sarathi-serve-2024 engine has no CUDA graphs (it "
     "always runs eagerly); drop engine.max_cudagraph_capture_size"),
])
def test_bad_capture_ceilings_are_one_line(engine, cost, message):
    data = {**BASE, "engine": {**BASE["engine"], **engine}}
    if cost:
        data["cost_model"] = {**BASE["cost_model"], "engine_preset": cost}
    with pytest.raises(ScenarioError) as exc:
        load_scenario(data)
    assert str(exc.value) == message
    sizes = {**BASE, "engine": {**BASE["engine"], "max_cudagraph_capture_size": 4,
                                "cudagraph_capture_sizes": [1, 2, 4, 1024]}}
    assert load_scenario(sizes).cost_model.engine.cudagraphs.capture_sizes == (1, 2, 4)
