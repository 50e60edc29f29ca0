"""Column names of the tables a run produces (a contract: CLI, plots and sweeps read them).

``requests`` has one row per request that arrived (completed or failed);
``steps`` one row per engine step. Times are simulated seconds from t=0.
"""

REQUEST_COLUMNS = [
    "request_id",            # str
    "arrival_time_s",        # when the request reached the engine
    "queued_time_s",         # when the engine core took it in (vLLM's QUEUED event; NaN if refused)
    "scheduled_time_s",      # start of the first step that scheduled it (NaN if never)
    "first_token_time_s",    # end of the step that produced its first output token (NaN if none)
    "finish_time_s",         # end of the step that produced its last token, or when it failed
    "num_prompt_tokens",
    "num_output_tokens",     # tokens actually generated
    "num_cached_tokens",     # prompt tokens served from the prefix cache at first admission
    "num_preemptions",
    "priority",
    "status",                # "completed" | "failed"
    "fail_reason",           # "" when completed
]

# With a KV connector (engine.kv_offloading: kvsim/scenario/kv_offload.py), after
# REQUEST_COLUMNS; absent otherwise. The split of vLLM's PrefillStats
# (vllm/v1/metrics/stats.py) that its prefix-cache counters need.
CONNECTOR_REQUEST_COLUMNS = [
    "num_local_cached_tokens",     # GPU prefix hit at first admission (vLLM num_local_cached_tokens)
    "num_external_cached_tokens",  # tokens the connector supplied then (num_external_cached_tokens)
    "kv_load_start_time_s",        # start of the step that started its KV load (NaN if none)
]

STEP_COLUMNS = [
    "step",                  # 0-based
    "start_time_s",
    "duration_s",
    "num_prefill_tokens",    # tokens of prompt (or recompute) chunks in this step
    "num_decode_tokens",     # one per decoding request
    "num_scheduled_reqs",
    "num_running",           # after the step
    "num_waiting",           # after the step
    "num_preempted",         # preemptions in this step
    "num_finished",
    "num_free_blocks",       # after finished requests were freed
    "kv_cache_usage",        # 1 - free / usable blocks, in [0, 1]
    "num_generated_tokens",  # tokens sampled in this step (vLLM's generation tokens)
]
