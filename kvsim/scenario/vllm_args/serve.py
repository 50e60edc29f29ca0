"""``vllm serve`` flags -> scenario keys.

Every flag of vLLM 0.33's ``vllm serve`` (``serve_flags.OPTIONS``, generated
from vLLM's parser) falls in exactly one of three tables:

* :data:`SUPPORTED`: kvsim models it; the flag's value (read with vLLM's own
  type and bounds, ``values.Rule``) becomes a scenario key;
* :data:`NO_EFFECT`: it cannot change what kvsim simulates (the HTTP server,
  logging, weight loading, sampling); accepted and listed as such;
* everything else is *not modelled*: refused by name, or with
  ``ignore_unsupported`` listed as ignored. :data:`PLANNED` names the ones
  other work is adding, so the message can say where they will come from.

To support a flag, move it into :data:`SUPPORTED` with the key it sets (and,
if kvsim's value differs from vLLM's, a ``convert``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvsim.scenario.vllm_args import engine_flags
from kvsim.scenario.vllm_args.engine_flags import Unmodelled
from kvsim.scenario.vllm_args.parse import VllmArgsError
from kvsim.scenario.vllm_args.values import Rule
from kvsim.specs.parallel import ALL2ALL_BACKENDS


@dataclass(frozen=True)
class To:
    """A supported flag: the scenario key it sets and how its value is read.

    ``convert`` turns vLLM's value into kvsim's (``None``: the same value); it
    returns :data:`DEFAULT` when vLLM's value means "kvsim's default", and
    raises :class:`Unmodelled` for a value vLLM accepts but kvsim does not
    model (``--pipeline-parallel-size 2``).
    """

    key: str | None                       # None: the flag only checks its value
    rule: Rule
    convert: Callable | None = None


DEFAULT = object()


def _only(value, what: str) -> Callable:
    def convert(v):
        if v != value:
            raise Unmodelled(f"kvsim models {what}")
        return DEFAULT
    return convert


# vllm/config/cache.py CacheDType -> kvsim's engine.kv_cache_dtype.
_KV_DTYPES = {"auto": "auto", "float16": "fp16", "bfloat16": "bf16", "fp8": "fp8",
              "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
VLLM_KV_DTYPES = (
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
    "nvfp4_ds_mla", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
    "turboquant_3bit_nc", "octave_k3v4", "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit",
    "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6")


def _kv_dtype(value: str):
    if value not in _KV_DTYPES:
        raise Unmodelled(f"kvsim models the KV cache dtypes {', '.join(_KV_DTYPES)}")
    return _KV_DTYPES[value]


def _max_model_len(value: int):
    if value == -1:
        # vLLM's -1/auto fits the length to the KV cache: kvsim's default does that.
        return DEFAULT
    if value < 1:
        raise VllmArgsError(f"--max-model-len {value}: vLLM refuses it: max_model_len must be a "
                            f"positive integer or -1/auto (ModelConfig.max_model_len)")
    return value


def _dtype(value: str):
    if value in ("float", "float32"):
        raise Unmodelled("kvsim models 16-bit weights (auto, bfloat16, float16, half)")
    return DEFAULT


def model_value(value: str) -> str:
    """``vllm serve MODEL``: a Hugging Face id or a folder with config.json -> ``model:``.

    A Hugging Face id is looked up in kvsim's catalog by its full name, then by
    its last part (``meta-llama/Llama-3.1-8B-Instruct`` -> ``llama-3.1-8b-instruct``,
    a catalog alias); a folder holding ``config.json`` is read as that file.
    """
    from kvsim.specs.catalog import load_model

    folder = Path(value).expanduser()
    if folder.is_dir() and (folder / "config.json").is_file():
        return str((folder / "config.json").resolve())
    for candidate in dict.fromkeys((value, value.rstrip("/").rsplit("/", 1)[-1])):
        try:
            load_model(candidate)
        except (ValueError, KeyError, TypeError, FileNotFoundError):
            continue
        return candidate
    raise VllmArgsError(f"model {value!r}: not in kvsim's model catalog (kvsim capacity --list) "
                        f"and not a folder holding config.json")


SUPPORTED: dict[str, To] = {
    "model_tag": To("model", Rule("str"), model_value),
    "model": To("model", Rule("str"), model_value),
    "tensor_parallel_size": To("hardware.tp", Rule("int", ge=1, source="ParallelConfig.tensor_parallel_size")),
    "pipeline_parallel_size": To(None, Rule("int", ge=1, source="ParallelConfig.pipeline_parallel_size"),
                                 _only(1, "one pipeline stage (--pipeline-parallel-size 1)")),
    "data_parallel_size": To("hardware.dp", Rule("int", ge=1, source="ParallelConfig.data_parallel_size")),
    "enable_expert_parallel": To("engine.enable_expert_parallel", Rule("switch")),
    "all2all_backend": To("engine.all2all_backend", Rule("str", choices=ALL2ALL_BACKENDS)),
    "disable_hybrid_kv_cache_manager": To("engine.disable_hybrid_kv_cache_manager", Rule("switch")),
    "dtype": To(None, Rule("str", choices=("auto", "bfloat16", "float", "float16", "float32", "half")), _dtype),
    "block_size": To("engine.block_size", Rule("int", gt=0, source="CacheConfig.block_size")),
    "gpu_memory_utilization": To("engine.gpu_memory_utilization",
                                 Rule("float", gt=0, le=1, source="CacheConfig.gpu_memory_utilization")),
    "num_gpu_blocks_override": To("engine.num_gpu_blocks_override", Rule("int")),
    "kv_cache_dtype": To("engine.kv_cache_dtype", Rule("str", choices=VLLM_KV_DTYPES), _kv_dtype),
    "max_model_len": To("engine.max_model_len",
                        Rule("human_readable_int_or_auto", ge=-1, source="ModelConfig.max_model_len"),
                        _max_model_len),
    "max_num_batched_tokens": To("engine.max_num_batched_tokens",
                                 Rule("human_readable_int", ge=1, source="SchedulerConfig.max_num_batched_tokens")),
    "max_num_seqs": To("engine.max_num_seqs", Rule("int", ge=1, source="SchedulerConfig.max_num_seqs")),
    "enable_prefix_caching": To("engine.enable_prefix_caching", Rule("switch")),
    "enable_chunked_prefill": To("engine.enable_chunked_prefill", Rule("switch")),
    "long_prefill_token_threshold": To("engine.long_prefill_token_threshold",
                                       Rule("int", ge=0, source="SchedulerConfig.long_prefill_token_threshold")),
    "scheduling_policy": To("engine.policy", Rule("str", choices=("fcfs", "priority"))),
    "scheduler_reserve_full_isl": To("engine.scheduler_reserve_full_isl", Rule("switch")),
    "watermark": To("engine.watermark", Rule("float", ge=0.0, lt=1.0, source="SchedulerConfig.watermark")),
    # vLLM 0.33 scheduler knobs and API-server queue limits (issue 17)
    "max_num_scheduled_tokens": To("engine.max_num_scheduled_tokens",
                                   Rule("human_readable_int", ge=1,
                                        source="SchedulerConfig.max_num_scheduled_tokens")),
    "max_num_active_seqs": To("engine.max_num_active_seqs",
                              Rule("int", ge=1, source="SchedulerConfig.max_num_active_seqs")),
    "long_prefill_token_threshold_adaptive": To("engine.long_prefill_token_threshold_adaptive",
                                                Rule("switch")),
    "prefill_schedule_interval": To("engine.prefill_schedule_interval",
                                    Rule("int", ge=1, source="SchedulerConfig.prefill_schedule_interval")),
    "max_num_queued_reqs": To("engine.max_num_queued_reqs",
                              Rule("int", ge=0, source="SchedulerConfig.max_num_queued_reqs")),
    "max_num_queued_tokens": To("engine.max_num_queued_tokens",
                                Rule("human_readable_int", ge=0,
                                     source="SchedulerConfig.max_num_queued_tokens")),
    # Engine time (issue 13; engine_flags.py says how each is read)
    "async_scheduling": To("engine.async_scheduling", Rule("switch")),
    "stream_interval": To("engine.stream_interval",
                          Rule("int", ge=1, source="SchedulerConfig.stream_interval")),
    "enforce_eager": To("engine.enforce_eager", Rule("switch")),
    "cudagraph_capture_sizes": To("engine.cudagraph_capture_sizes", Rule("int_list")),
    "max_cudagraph_capture_size": To("engine.max_cudagraph_capture_size",
                                     Rule("int", ge=1, source="CompilationConfig.max_cudagraph_capture_size")),
    "speculative_config": To("engine.speculative_config", Rule("json"),
                             engine_flags.speculative_config),
    "spec_method": To("engine.speculative_config.method", Rule("str"), engine_flags.spec_method),
    "spec_model": To("engine.speculative_config.model", Rule("str")),
    "spec_tokens": To("engine.speculative_config.num_speculative_tokens",
                      Rule("int", gt=0, source="SpeculativeConfig.num_speculative_tokens")),
    # CPU KV offloading (kvsim/scenario/kv_offload.py, issue 15): native is vLLM's
    # OffloadingConnector sized by --kv-offloading-size; lmcache is LMCacheMPConnector,
    # whose store the LMCache server's own flags size (scenario key engine.lmcache).
    "kv_offloading_size": To("engine.kv_offloading_size", Rule("float", source="CacheConfig.kv_offloading_size")),
    "kv_offloading_backend": To("engine.kv_offloading_backend",
                                Rule("str", choices=("native", "lmcache"))),
}

# Flags other work is adding (see the issues named); refused until then.
PLANNED: dict[str, str] = {
    # The capture sizes, their ceiling and eager mode are modelled (SUPPORTED); the
    # compilation settings are not yet.
    **dict.fromkeys(("compilation_config", "optimization_level", "performance_mode"),
                    "CUDA graphs and compilation beyond the capture sizes (engine time, issue 13)"),
    **dict.fromkeys(("enable_eplb", "eplb_config",
                     "expert_placement_strategy", "enable_dbo", "ubatch_size"),
                    "expert parallelism (MoE, issue 16)"),
    **dict.fromkeys(("quantization", "kv_cache_memory_bytes"), "model and memory specs (issue 16)"),
    **dict.fromkeys(("kv_transfer_config", "kv_events_config"),
                    "KV transfer configs (issues 14, 15; CPU offloading: --kv-offloading-size)"),
}

NO_EFFECT: dict[str, tuple[str, ...]] = {
    "the HTTP server, its API and its logs (kvsim simulates the engine behind them)": (
        "host", "port", "uds", "api_key", "ssl_keyfile", "ssl_certfile", "ssl_ca_certs",
        "ssl_cert_reqs", "ssl_ciphers", "enable_ssl_refresh", "root_path", "middleware",
        "allowed_origins", "allowed_methods", "allowed_headers", "allow_credentials",
        "uvicorn_log_level", "disable_uvicorn_access_log", "disable_access_log_for_endpoints",
        "enable_request_id_headers", "disable_fastapi_docs", "enable_offline_docs",
        "h11_max_incomplete_event_size", "h11_max_header_count", "sse_keep_alive_interval",
        "served_model_name", "chat_template", "chat_template_content_format", "response_role",
        "trust_request_chat_template", "default_chat_template_kwargs", "enable_auto_tool_choice",
        "tool_call_parser", "tool_parser_plugin", "tool_strict_level", "tool_server",
        "exclude_tools_when_tool_choice_none", "reasoning_parser", "reasoning_parser_plugin",
        "enable_prompt_tokens_details", "enable_server_load_tracking", "enable_force_include_usage",
        "return_tokens_as_token_ids", "enable_tokenizer_info_endpoint", "max_log_len",
        "enable_log_requests", "enable_log_outputs", "enable_log_deltas", "disable_log_stats",
        "log_error_stack", "log_level", "logging_config", "log_config_file",
        "aggregate_engine_logging", "show_hidden_metrics_for_version", "otlp_traces_endpoint",
        "collect_detailed_traces", "kv_cache_metrics", "kv_cache_metrics_sample",
        "cudagraph_metrics", "enable_mfu_metrics", "enable_logging_iteration_details",
        "enable_per_request_metrics", "grpc", "grpc_port", "fingerprint_mode",
        "fingerprint_value", "headless", "api_server_count"),
    "loading the weights and the tokenizer (kvsim needs only the model's shape)": (
        "tokenizer", "tokenizer_mode", "tokenizer_revision", "revision", "code_revision",
        "trust_remote_code", "download_dir", "load_format", "hf_token", "config_format",
        "safetensors_load_strategy", "safetensors_prefetch_num_threads",
        "safetensors_prefetch_block_size", "model_loader_extra_config", "ignore_patterns",
        "use_tqdm_on_load", "pt_load_map_location", "max_parallel_loading_workers",
        "skip_tokenizer_init"),
    "sampling (kvsim generates exactly max_tokens tokens per request)": (
        "seed", "max_logprobs", "logprobs_mode"),
    "process start-up and networking": (
        "master_addr", "master_port", "distributed_timeout_seconds",
        "cpu_distributed_timeout_seconds", "data_parallel_supervisor_port",
        "dp_supervisor_probe_interval_s", "dp_supervisor_probe_timeout_s",
        "dp_supervisor_probe_failure_threshold", "shutdown_timeout", "fail_on_environ_validation"),
    "the block hash function (kvsim's block hashes never collide, so every algorithm gives "
    "the same hits)": ("prefix_caching_hash_algo",),
}
