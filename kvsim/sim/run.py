"""Build a scheduler, an engine and its front end for a list of requests, and run them."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import simpy

from kvsim.cost.base import ConstantCostModel, CostModel
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.request import Request, final_num_tokens
from kvsim.sim.admission import QueueLimits
from kvsim.sim.engine import Engine
from kvsim.sim.frontend import Frontend
from kvsim.sim.gc_pause import collector_paused
from kvsim.workload.request import RequestSpec

SCHEDULERS = ("chunked", "continuous", "static", "simple_chunking", "orca")


def make_scheduler(name: str, config: SchedulerConfig, connector=None):
    """The scheduler ``name``; ``connector`` (sched/connector.py) only with ``chunked``."""
    if connector is not None and name != "chunked":
        raise ValueError(f"engine.scheduler: {name!r} takes no KV connector (P/D transfer, KV "
                         f"offloading); allowed: chunked")
    if connector is not None and config.is_hybrid:
        # vLLM VllmConfig (config/vllm.py) turns the hybrid KV cache manager off for a
        # connector without SupportsHMA; kv/hybrid.py models no external KV (issue 16).
        raise ValueError("engine.disable_hybrid_kv_cache_manager: a KV connector with several "
                         "KV-cache groups (the hybrid KV cache manager) is not modelled; vLLM "
                         "turns the hybrid manager off for connectors without SupportsHMA: "
                         "set it to true (attention-only models)")
    if name == "chunked":
        from kvsim.sched.chunked import ChunkedScheduler
        if connector is not None and config.async_scheduling:
            # vLLM's AsyncScheduler with a connector drops stale outputs of requests whose
            # KV must be delivered and defers their block frees (v1/core/sched/scheduler.py
            # drop_stale_output, requires_kv_delivery); kvsim's async finishing
            # (sched/async_finish.py) does neither (issue #13): refused, not run wrong.
            raise ValueError("engine.async_scheduling: not modelled with a KV connector (P/D "
                             "transfer, KV offloading); allowed: false")
        return ChunkedScheduler(config, connector)
    if name == "continuous":
        if config.num_scheduler_steps > 1:
            from kvsim.sched.multistep import MultiStepScheduler
            return MultiStepScheduler(config)
        from kvsim.sched.continuous import ContinuousScheduler
        return ContinuousScheduler(config)
    if name == "static":
        from kvsim.sched.static import StaticScheduler
        return StaticScheduler(config)
    if name == "simple_chunking":
        from kvsim.sched.simple_chunking import SimpleChunkingScheduler
        return SimpleChunkingScheduler(config)
    if name == "orca":
        from kvsim.sched.orca import OrcaScheduler
        return OrcaScheduler(config)
    raise ValueError(f"engine.scheduler: {name!r} is not one of {', '.join(SCHEDULERS)}")


def request_problem(spec: RequestSpec, config: SchedulerConfig) -> str:
    """Why ``spec`` can never run on this engine, or "" (never retried forever).

    Read from the spec's lengths only, before the engine builds (and hashes)
    the request: a prompt of 2e9 tokens fails without a block hashed.
    """
    prompt_len = len(spec.prompt_token_ids)
    if prompt_len == 0:
        return "empty prompt"
    if prompt_len >= config.max_model_len:
        # vLLM's input processor rejects these before they reach the scheduler.
        return f"prompt of {prompt_len} tokens >= max_model_len {config.max_model_len}"
    final = final_num_tokens(prompt_len, spec.max_tokens, config.max_model_len)
    # All KV-cache groups together (hybrid models: sliding groups hold a window).
    need = config.blocks_per_request(final)     # final <= max_model_len
    usable = config.num_gpu_blocks - 1
    if need > usable:
        return (f"needs {need} KV blocks for {final} tokens; "
                f"the cache has only {usable} usable blocks")
    return ""


def make_engine(config: SchedulerConfig, *, scheduler: str = "chunked",
                cost_model: CostModel | None = None, env: simpy.Environment | None = None,
                connector=None, **engine_options) -> Engine:
    """One engine replica with its scheduler and request builder (not started)."""
    sched = make_scheduler(scheduler, config, connector)

    def make(spec: RequestSpec, index: int, arrival: float, *, read_tokens: bool = True,
             alone: bool = False) -> Request:
        return Request(spec, index, block_size=config.block_size,
                       max_model_len=config.max_model_len, arrival_time=arrival,
                       hash_blocks=read_tokens and config.hashes_blocks,
                       keep_tokens=read_tokens and config.keeps_token_ids, alone=alone)

    limits = QueueLimits.of(config.max_num_queued_reqs, config.max_num_queued_tokens)
    engine = Engine(sched, cost_model or ConstantCostModel(1.0), make_request=make,
                    check_request=lambda spec: request_problem(spec, config), env=env,
                    stream_interval=config.stream_interval,
                    async_scheduling=config.async_scheduling, queue_limits=limits,
                    **engine_options)
    if connector is not None:
        connector.bind(engine.env, sched.kv)
    return engine


def run_engine(specs: Iterable[RequestSpec], config: SchedulerConfig, *,
               scheduler: str = "chunked", cost_model: CostModel | None = None,
               trace: Callable[[dict], None] | None = None,
               concurrency: int | None = None, fast_path: bool = True, sink=None,
               flush_every: int = 20_000,
               progress: Callable[[float, int], None] | None = None, connector=None,
               watch_steps=None) -> Engine:
    """Simulate ``specs`` on one engine; returns the engine with its records.
    ``watch_steps``: ``Engine``'s, which reads the step log as it grows."""
    env = simpy.Environment(initial_time=0.0)
    engine: Engine | None = None
    frontend = Frontend(env, specs, lambda spec, at, index: engine.submit(spec, at, index),
                        concurrency=concurrency)
    engine = make_engine(config, scheduler=scheduler, cost_model=cost_model, env=env, trace=trace,
                         fast_path=fast_path, sink=sink, flush_every=flush_every,
                         on_done=lambda req: frontend.on_done(req.request_id, req.finish_time),
                         more_input=frontend.has_more_input, progress=progress, connector=connector,
                         watch_steps=watch_steps)
    frontend.start()
    engine.start()
    with collector_paused():
        env.run()
    engine.close()
    frontend.check_all_sent()
    # The two callbacks above hold ``engine`` and ``frontend``: Python gives each
    # lambda its own variable's cell, a compiled build (kvsim/native) one scope of
    # both, in which the front end's callback reaches the front end. Let go.
    frontend = None
    return engine
