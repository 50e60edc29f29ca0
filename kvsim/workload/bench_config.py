"""``workload: {bench: {...}}``: the load of ``vllm bench serve``, under vLLM's argument names.

    workload:
      bench: {dataset_name: random, random_input_len: 2048, random_output_len: 256,
              num_prompts: 500, request_rate: 8, burstiness: 0.5, seed: 0}

Keys are the ``dest`` names of ``vllm bench serve``'s flags
(``vllm/benchmarks/serve.py`` ``add_cli_args``, ``datasets.py``
``add_dataset_parser``; ``--random-input-len`` -> ``random_input_len``), with
vLLM 0.33's defaults, and each check ``main_async`` / the dataset classes make
is made here with their message. ``kvsim run --bench-args '...'`` fills this
section from a command line (``kvsim/scenario/vllm_args``).

kvsim additions, marked as such: the ``sonnet`` dataset (vLLM 0.10's, which
0.33 dropped) as lengths, and ``num_special_tokens`` (what vLLM's tokenizer
adds to a prompt, which the random dataset subtracts from its input length).
"""

from __future__ import annotations

import json
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

INF = math.inf
BENCH_DATASETS = ("random", "sharegpt", "burstgpt", "prefix_repetition", "timed_trace", "sonnet")
# vLLM: these datasets are generated, so a file is an error; the others read one.
_GENERATED = ("random", "prefix_repetition", "sonnet")
# kvsim replays a trace's hash ids as Mooncake blocks of this many tokens.
_MOONCAKE_CHUNK = 512


class _Section(BaseModel):
    # As every workload model (config.py): no unknown keys, no "4" for 4.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class BenchConfig(_Section):
    dataset_name: Literal["random", "sharegpt", "burstgpt", "prefix_repetition", "timed_trace",
                          "sonnet"] = "random"
    dataset_path: str | None = Field(None, min_length=1)
    num_prompts: int = Field(1000, ge=1, description="vLLM asserts at least one request")
    seed: int | None = Field(None, ge=0, description="vLLM's --seed; omitted: drawn from the run's seed")
    # traffic (serve.py get_request)
    request_rate: float = Field(INF, gt=0, description="req/s; inf sends every request at t=0")
    burstiness: float = Field(1.0, gt=0, description="gamma shape of the gaps; 1 = Poisson")
    max_concurrency: int | None = None
    ramp_up_strategy: Literal["linear", "exponential"] | None = None
    ramp_up_start_rps: int | None = None
    ramp_up_end_rps: int | None = None
    self_timed: bool | None = None
    # lengths: the general options map to the dataset-specific ones (serve.py main_async)
    input_len: int | None = Field(None, ge=0)
    output_len: int | None = Field(None, ge=0)
    random_input_len: int = Field(1024, ge=0)
    random_output_len: int = Field(128, ge=0)
    random_range_ratio: float | dict[str, float] = 0.0
    random_prefix_len: int = Field(0, ge=0)
    num_special_tokens: int = Field(0, ge=0, description="kvsim: tokens the tokenizer adds (Llama: 1, BOS)")
    sharegpt_output_len: int | None = Field(None, ge=0)
    prefix_repetition_prefix_len: int = Field(256, ge=0)
    prefix_repetition_suffix_len: int = Field(256, ge=0)
    prefix_repetition_num_prefixes: int = Field(10, ge=1)
    prefix_repetition_output_len: int = Field(128, ge=1)
    sonnet_input_len: int = Field(550, ge=1, description="kvsim: vLLM 0.10's sonnet dataset")
    sonnet_output_len: int = Field(150, ge=1)
    sonnet_prefix_len: int = Field(200, ge=0)
    timed_trace_chunk_hash_size: int = Field(16, ge=1)
    timed_trace_sec_multiplier: float = Field(1.0, gt=0)
    disable_shuffle: bool = False
    no_oversample: bool = False

    @field_validator("random_range_ratio", mode="before")
    @classmethod
    def _range_ratio_text(cls, value):
        # vLLM _parse_range_ratio: a float, or a JSON {"input": .., "output": ..}.
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                try:
                    return json.loads(value)
                except json.JSONDecodeError:
                    raise PydanticCustomError(
                        "range_ratio", "{value!r}: expected a number or a JSON object "
                        "{{\"input\": r, \"output\": r}}", {"value": value}) from None
        return value

    @model_validator(mode="after")
    def _vllm_checks(self):
        _check_traffic(self)
        _check_dataset(self)
        return self

    # --- what the dataset options resolve to ------------------------------------
    @property
    def input_and_output(self) -> tuple[int, int]:
        """random_input_len / random_output_len after ``--input-len`` / ``--output-len``."""
        return (self.random_input_len if self.input_len is None else self.input_len,
                self.random_output_len if self.output_len is None else self.output_len)

    @property
    def range_ratios(self) -> tuple[float, float]:
        """(input, output) range ratios (vLLM ``_resolve_range_ratios``)."""
        r = self.random_range_ratio
        if isinstance(r, dict):
            return float(r["input"]), float(r["output"])
        return float(r), float(r)

    @property
    def is_self_timed(self) -> bool:
        """vLLM: timed_trace uses the trace's timestamps unless --no-self-timed."""
        return self.dataset_name == "timed_trace" and self.self_timed is not False


def _error(field: str, message: str, **ctx) -> PydanticCustomError:
    return PydanticCustomError("workload_conflict", f"{field}{message}", {"field": field, **ctx})


def _check_traffic(c: BenchConfig) -> None:
    """vllm/benchmarks/serve.py main_async and get_request, in their order."""
    if c.max_concurrency is not None and c.max_concurrency <= 0:
        raise _error("max_concurrency", ": must be greater than 0 (vLLM --max-concurrency)")
    if c.ramp_up_strategy is not None:
        if c.request_rate != INF:
            raise _error("request_rate", ": do not give it with ramp_up_strategy; the request rate "
                                         "is controlled by the ramp-up parameters (vLLM)")
        if c.ramp_up_start_rps is None or c.ramp_up_end_rps is None:
            raise _error("ramp_up_strategy", ": needs both ramp_up_start_rps and ramp_up_end_rps (vLLM)")
        if c.ramp_up_start_rps < 0 or c.ramp_up_end_rps < 0:
            raise _error("ramp_up_start_rps", ": ramp-up start and end RPS must be non-negative (vLLM)")
        if c.ramp_up_start_rps > c.ramp_up_end_rps:
            raise _error("ramp_up_start_rps", ": ramp-up start RPS must be less than end RPS (vLLM)")
        if c.ramp_up_strategy == "exponential" and c.ramp_up_start_rps == 0:
            raise _error("ramp_up_start_rps", ": for exponential ramp-up, the start RPS cannot be 0 (vLLM)")
        if c.ramp_up_strategy == "linear" and c.ramp_up_start_rps == 0:
            # vLLM's get_request asserts every request's rate is > 0; the first one's is 0.
            raise _error("ramp_up_start_rps", ": vLLM's first request would get rate 0 and fail "
                                              "(get_request asserts a positive rate); start above 0")
    if c.self_timed is not None and c.dataset_name != "timed_trace":
        raise _error("self_timed", ": only supported with dataset_name timed_trace (vLLM)")


def _check_dataset(c: BenchConfig) -> None:
    name = c.dataset_name
    if name in _GENERATED and c.dataset_path is not None:
        raise _error("dataset_path", f": cannot be used with the {name!r} dataset (vLLM); give the "
                                     f"dataset_name of the file (sharegpt, burstgpt, timed_trace)")
    if name not in _GENERATED and c.dataset_path is None:
        raise _error("dataset_path", f": missing; the {name!r} dataset reads a file (vLLM: "
                                     f"dataset_path must be provided)")
    if name == "random":
        ratio_in, ratio_out = c.range_ratios
        for which, ratio in (("input", ratio_in), ("output", ratio_out)):
            if not 0.0 <= ratio < 1.0:
                raise _error("random_range_ratio", f": {which} range ratio {ratio} must be in [0, 1) (vLLM)")
        real = max(0, c.input_and_output[0] - c.num_special_tokens)
        if c.random_prefix_len + math.floor(real * (1.0 - ratio_in)) < 1:
            raise _error("random_input_len", ": too small: the shortest prompt (prefix + sampled "
                                             "input) would have no token (vLLM)")
    if name == "prefix_repetition" and c.num_prompts // c.prefix_repetition_num_prefixes == 0:
        raise _error("num_prompts", f" ({c.num_prompts}) must be greater than or equal to "
                                    f"prefix_repetition_num_prefixes ({c.prefix_repetition_num_prefixes}) (vLLM)")
    if name == "timed_trace" and c.timed_trace_chunk_hash_size != _MOONCAKE_CHUNK:
        raise _error("timed_trace_chunk_hash_size", f" = {c.timed_trace_chunk_hash_size}: kvsim replays "
                                                    f"hash ids as Mooncake blocks of {_MOONCAKE_CHUNK} "
                                                    f"tokens; give {_MOONCAKE_CHUNK}")
    if name == "sonnet" and c.sonnet_prefix_len > c.sonnet_input_len:
        raise _error("sonnet_prefix_len", f" ({c.sonnet_prefix_len}) must be <= sonnet_input_len "
                                          f"({c.sonnet_input_len})")
