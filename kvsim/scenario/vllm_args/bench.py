"""``vllm bench serve`` flags -> the scenario's ``workload: {bench: {...}}``.

The ``bench`` workload (``kvsim/workload/bench_config.py``) takes vLLM's own
argument names (``dataset_name``, ``random_input_len``, ``request_rate`` ...),
so a supported flag maps to ``workload.bench.<its dest>`` with its value read
by vLLM's type rules. ``--goodput`` fills ``slo:``, ``--model`` fills
``model:``. The tables work as in ``serve.py``: :data:`SUPPORTED`,
:data:`NO_EFFECT`, and every other flag is not modelled.
"""

from __future__ import annotations

from kvsim.scenario.vllm_args.parse import VllmArgsError
from kvsim.scenario.vllm_args.serve import To, Unmodelled, _only, model_value
from kvsim.scenario.vllm_args.values import Rule

# vllm/benchmarks/datasets/datasets.py add_dataset_parser: --dataset-name choices.
VLLM_DATASETS = ("sharegpt", "burstgpt", "random", "random-mm", "random-rerank", "hf", "custom",
                 "custom_audio", "custom_image", "prefix_repetition", "spec_bench", "speed_bench",
                 "timed_trace")
KVSIM_DATASETS = ("random", "sharegpt", "burstgpt", "prefix_repetition", "timed_trace")


def _dataset(name: str):
    if name not in KVSIM_DATASETS:
        raise Unmodelled(f"kvsim simulates the datasets {', '.join(KVSIM_DATASETS)} (lengths and "
                         f"prefix structure; no multimodal or Hugging Face datasets)")
    return name


def _goodput(pairs: list[str]) -> dict:
    """vLLM ``parse_goodput`` + ``check_goodput_args``: ``ttft:300 tpot:50`` -> slo (ms)."""
    slo = {}
    for pair in pairs:
        try:
            name, value = pair.split(":")
            number = float(value)
        except ValueError:
            raise VllmArgsError(f"--goodput {pair!r}: invalid format; specify service level "
                                f"objectives as KEY:VALUE pairs, the value a number in milliseconds") from None
        if name not in ("ttft", "tpot", "e2el"):
            raise VllmArgsError(f"--goodput {pair!r}: invalid metric name {name!r}; the service level "
                                f"objective name should be one of ttft, tpot, e2el")
        if number < 0:
            raise VllmArgsError(f"--goodput {pair!r}: invalid value; the service level objective "
                                f"value should be non-negative")
        slo[f"{name}_ms"] = number
    return slo


def _bench(dest: str, rule: Rule, convert=None) -> To:
    return To(f"workload.bench.{dest}", rule, convert)


_INT = Rule("int")
SUPPORTED: dict[str, To] = {
    "model": To("model", Rule("str"), model_value),
    "goodput": To("slo", Rule("raw"), _goodput),
    "dataset_name": _bench("dataset_name", Rule("str", choices=VLLM_DATASETS), _dataset),
    **{dest: _bench(dest, rule) for dest, rule in {
        "dataset_path": Rule("str"),
        "num_prompts": _INT,
        "seed": _INT,
        "request_rate": Rule("float"),
        "burstiness": Rule("float"),
        "max_concurrency": _INT,
        "ramp_up_strategy": Rule("str", choices=("linear", "exponential")),
        "ramp_up_start_rps": _INT,
        "ramp_up_end_rps": _INT,
        "input_len": _INT,
        "output_len": _INT,
        "random_input_len": _INT,
        "random_output_len": _INT,
        "random_range_ratio": Rule("str"),
        "random_prefix_len": _INT,
        "sharegpt_output_len": _INT,
        "prefix_repetition_prefix_len": _INT,
        "prefix_repetition_suffix_len": _INT,
        "prefix_repetition_num_prefixes": _INT,
        "prefix_repetition_output_len": _INT,
        "timed_trace_chunk_hash_size": _INT,
        "timed_trace_sec_multiplier": Rule("float"),
        "disable_shuffle": Rule("switch"),
        "no_oversample": Rule("switch"),
        "self_timed": Rule("switch"),
    }.items()},
    "random_batch_size": To(None, _INT, _only(1, "one prompt per request (--random-batch-size 1)")),
    "num_warmups": To(None, _INT, _only(0, "no warm-up requests (--num-warmups 0)")),
    "probe_request_rate": To(None, Rule("float"), _only(0.0, "no probe requests (--probe-request-rate 0)")),
    **{dest: To(None, Rule("str"), _only(default, f"the trace field {default!r} (the Mooncake name)"))
       for dest, default in (("timed_trace_label_timestamp", "timestamp"),
                             ("timed_trace_label_input_length", "input_length"),
                             ("timed_trace_label_output_length", "output_length"),
                             ("timed_trace_label_hash_ids", "hash_ids"))},
}

PLANNED: dict[str, str] = {}

NO_EFFECT: dict[str, tuple[str, ...]] = {
    "the client: where it sends requests, what it prints and saves": (
        "label", "backend", "base_url", "host", "port", "endpoint", "header", "disable_tqdm",
        "profile", "save_result", "save_detailed", "append_result", "metadata", "result_dir",
        "result_filename", "percentile_metrics", "metric_percentiles", "request_id_prefix",
        "served_model_name", "ready_check_timeout_sec", "insecure", "plot_timeline",
        "timeline_itl_thresholds", "plot_dataset_stats"),
    "the tokenizer and chat template (kvsim's datasets are lengths, not text)": (
        "tokenizer", "tokenizer_mode", "trust_remote_code", "skip_tokenizer_init",
        "chat_template_kwargs", "skip_chat_template", "enable_multimodal_chat"),
    "sampling (kvsim generates exactly max_tokens tokens, as with --ignore-eos)": (
        "ignore_eos", "top_p", "top_k", "min_p", "temperature", "frequency_penalty",
        "presence_penalty", "repetition_penalty"),
}
