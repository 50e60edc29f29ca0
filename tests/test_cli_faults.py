"""``kvsim run`` on a catalogue of bad inputs and faults, each in its own process.

Every case runs the real program (``python -m kvsim``'s ``main``) in a
subprocess with a timeout and asserts:

* no traceback, and no hang (the timeout);
* the exit status (2 bad input or output, 1 every request failed or the
  engine stopped, 0 done, 130 interrupted);
* the message names the file, the option or the YAML key at fault (and bad
  input is one line);
* nothing already written is lost: every case writes into an output folder
  and a trace file that hold an earlier run's files; unless the run completed,
  they are byte for byte as they were, and no temporary file is left anywhere.

Faults a test cannot cause for real everywhere (a full disk, a refused
permission when the tests run as root) are injected into the child process
by ``BOOT``: ``KVSIM_TEST_FAULT=kind:marker`` makes the matching file
operation raise the ``OSError`` the operating system would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import yaml

TIMEOUT_S = 120
DATA = Path(__file__).parent / "data"

BOOT = r"""
import errno, io, builtins, os, signal, sys
# A shell that starts a job in the background ignores SIGINT in it; the tests send one.
signal.signal(signal.SIGINT, signal.default_int_handler)
kind, _, marker = os.environ.get("KVSIM_TEST_FAULT", "").partition(":")

def fault(code, path):
    return OSError(code, os.strerror(code), str(path))

class FullDisk:
    # A file on a disk that fills up at the first write.
    def __init__(self, f, path):
        self._f, self._path = f, path
    def write(self, text):
        raise fault(errno.ENOSPC, self._path)
    def __getattr__(self, name):
        return getattr(self._f, name)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self._f.close()

if kind:
    real_open, real_mkdir, real_replace = builtins.open, os.mkdir, os.replace
    def faulty_open(file, mode="r", *args, **kwargs):
        writing = any(c in mode for c in "wax")
        if writing and marker in str(file):
            if kind == "enospc-open":
                raise fault(errno.ENOSPC, file)
            if kind == "eacces-open":
                raise fault(errno.EACCES, file)
            if kind == "enospc-write":
                return FullDisk(real_open(file, mode, *args, **kwargs), file)
        return real_open(file, mode, *args, **kwargs)
    def faulty_mkdir(path, *args, **kwargs):
        if kind == "eacces-mkdir" and marker in str(path):
            raise fault(errno.EACCES, path)
        return real_mkdir(path, *args, **kwargs)
    def faulty_replace(src, dst, *args, **kwargs):
        if kind == "eacces-replace" and marker in str(dst):
            raise fault(errno.EACCES, dst)
        return real_replace(src, dst, *args, **kwargs)
    builtins.open = io.open = faulty_open
    os.mkdir, os.replace = faulty_mkdir, faulty_replace

from kvsim.cli import main
sys.exit(main())
"""

BASE = {
    "name": "faults", "seed": 0, "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm", "tp": 1},
    "engine": {"num_gpu_blocks_override": 512, "block_size": 16, "max_model_len": 2048,
               "max_num_batched_tokens": 512},
    "cost_model": {"type": "constant", "step_time_s": 0.01},
    "workload": {"num_requests": 20, "arrival": {"type": "poisson", "rate": 50.0},
                 "prompt_len": {"type": "fixed", "value": 100},
                 "output_len": {"type": "fixed", "value": 10}},
}

OLD = {"summary.json": "OLD SUMMARY\n", "requests.csv": "OLD REQUESTS\n", "steps.csv": "OLD STEPS\n"}
OLD_TRACE = "OLD TRACE\n"


@dataclass
class Case:
    """One bad input or fault: how to build it, and what the program must do."""
    id: str
    rc: int
    needles: tuple[str, ...]                  # must all appear in stderr ({tmp} = the folder)
    scenario: dict | str | bytes | None = None   # None: BASE
    overrides: dict = field(default_factory=dict)   # dotted paths applied to the scenario
    args: tuple[str, ...] = ()                # more command-line arguments
    setup: Callable[[Path], None] | None = None
    fault: str | None = None                  # KVSIM_TEST_FAULT
    outputs: bool = True                      # pass --out and --trace (with old files in them)
    command: tuple[str, ...] | None = None    # another command line than `run s.yaml` ({tmp})
    signal_after_start: int | None = None     # send this signal once the run is under way
    # Files are renamed one by one: a rename refused midway leaves each output
    # file old or new (each whole), not all of them old.
    each_old_or_new: bool = False


def scenario_with(**dotted) -> dict:
    data = json.loads(json.dumps(BASE))
    for path, value in dotted.items():
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        if value is _DELETE:
            node.pop(last, None)
        else:
            node[last] = value
    return data


_DELETE = object()


def write(name: str, content: str | bytes) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return setup


GARBAGE = bytes(range(128, 256)) * 8
HUGE_RUN = {"workload.num_requests": 1_000_000}

CASES = [
    # --- the scenario file itself ---
    Case("scenario-missing", 2, ("does-not-exist.yaml", "does not exist"), args=("--x",)),
    Case("scenario-empty", 2, ("s.yaml", "the scenario file is empty"), scenario=""),
    Case("scenario-comments-only", 2, ("s.yaml", "empty"), scenario="# nothing here\n"),
    Case("scenario-binary", 2, ("s.yaml", "not a text file"), scenario=b"name: x\n\x00\xff" + GARBAGE),
    Case("scenario-not-utf8", 2, ("s.yaml", "not a UTF-8 text file"), scenario=b"name: \xff\xfe\n"),
    Case("scenario-is-a-folder", 2, ("is a folder",), setup=lambda tmp: (tmp / "s.yaml").mkdir()),
    Case("scenario-a-list", 2, ("s.yaml", "must be a YAML mapping"), scenario="- a\n- b\n"),
    Case("scenario-bad-yaml", 2, ("s.yaml", "not valid YAML", "line 2"), scenario="name: x\n  engine: [1,\n"),
    Case("duplicate-top-level-key", 2, ("s.yaml", "duplicate key 'name'", "line 2"),
         scenario="name: a\nname: b\n"),
    Case("duplicate-nested-key", 2, ("s.yaml", "duplicate key 'block_size'"),
         scenario="name: a\nengine: {block_size: 16, block_size: 32}\n"),
    Case("unknown-section", 2, ("enigne", "unknown key"), overrides={"enigne": {"x": 1}}),
    Case("unknown-engine-key", 2, ("engine.blok_size", "unknown key"), overrides={"engine.blok_size": 16}),
    Case("string-for-int", 2, ("engine.block_size", "'16'"), overrides={"engine.block_size": "16"}),
    Case("negative-block-size", 2, ("engine.block_size", "-4"), overrides={"engine.block_size": -4}),
    Case("unknown-scheduler", 2, ("engine.scheduler", "'fifo'"), overrides={"engine.scheduler": "fifo"}),
    Case("swap-with-chunked", 2, ("engine.preemption_mode", "swap"),
         overrides={"engine.preemption_mode": "swap"}),
    Case("fractional-count", 2, ("workload.num_requests", "1.5"),
         scenario="name: x\nworkload: {num_requests: 1.5e0}\n"),
    Case("number-for-a-name", 2, ("name", "1000"), scenario="name: 1e3\n"),
    Case("empty-name", 2, ("name", "must not be empty"), overrides={"name": " "}),
    # --- --set ---
    Case("set-malformed-yaml", 2, ("--set engine.block_size", "not valid YAML"),
         args=("--set", "engine.block_size=[1,")),
    Case("set-without-equals", 2, ("--set 'engine.block_size'", "KEY=VALUE"),
         args=("--set", "engine.block_size")),
    Case("set-unknown-section", 2, ("foo.bar", "unknown section"), args=("--set", "foo.bar=1")),
    Case("set-inside-a-string", 2, ("model.name", "not a mapping"), args=("--set", "model.name=x")),
    Case("set-duplicate-key", 2, ("--set engine", "duplicate key 'a'"), args=("--set", "engine={a: 1, a: 2}")),
    # --- model and hardware ---
    Case("tp-not-dividing-heads", 2, ("hardware.tp", "got 3", "32 attention heads"),
         overrides={"hardware.tp": 3}),
    Case("tp-not-splitting-kv-heads", 2, ("hardware.tp", "3 KV heads"),
         overrides={"hardware.tp": 2, "model": {
             "name": "odd", "num_layers": 2, "hidden_size": 768, "num_attention_heads": 12,
             "num_kv_heads": 3, "head_dim": 64, "intermediate_size": 1024, "vocab_size": 1000,
             "gated_mlp": True, "tie_word_embeddings": False, "max_position_embeddings": 4096}}),
    Case("inline-model-missing-fields", 2, ("model", "missing field(s) hidden_size"),
         overrides={"model": {"name": "m", "num_layers": 2}}),
    Case("inline-model-unknown-field", 2, ("model", "unknown field(s) layers"),
         overrides={"model": {"name": "m", "layers": 2}}),
    Case("model-file-binary", 2, ("model", "m.json", "not a UTF-8 text file"),
         overrides={"model": "m.json"}, setup=write("m.json", GARBAGE)),
    Case("model-unknown-name", 2, ("model", "no-such-model"), overrides={"model": "no-such-model"}),
    Case("gpu-without-memory", 2, ("hardware.gpu", "memory"), overrides={"hardware.gpu": {"name": "g"}}),
    Case("max-model-len-over-cache", 2, ("engine.max_model_len", "usable blocks"),
         overrides={"engine.max_model_len": 100_000}),
    Case("cost-profile-missing", 2, ("cost_model",),
         overrides={"cost_model": {"type": "fitted", "profile": "no-such-profile"}}),
    # --- workload files ---
    Case("trace-missing", 2, ("workload.trace.path", "nope.csv", "file not found"),
         overrides={"workload": {"trace": {"format": "azure", "path": "nope.csv"}}}),
    Case("trace-binary-azure", 2, ("workload.trace.path", "t.csv", "not a UTF-8 text file"),
         overrides={"workload": {"trace": {"format": "azure", "path": "t.csv"}}},
         setup=write("t.csv", GARBAGE)),
    Case("trace-binary-mooncake", 2, ("workload.trace.path", "t.jsonl", "not a UTF-8 text file"),
         overrides={"workload": {"trace": {"format": "mooncake", "path": "t.jsonl"}}},
         setup=write("t.jsonl", GARBAGE)),
    Case("trace-binary-sharegpt", 2, ("workload.trace.path", "t.json", "not a UTF-8 text file"),
         overrides={"workload": {"trace": {"format": "sharegpt", "path": "t.json"}}},
         setup=write("t.json", GARBAGE)),
    Case("trace-missing-column", 2, ("t.csv", "missing column", "num_decode_tokens"),
         overrides={"workload": {"trace": {"format": "vidur", "path": "t.csv"}}},
         setup=write("t.csv", "arrived_at,num_prefill_tokens\n0,10\n")),
    Case("trace-not-a-number", 2, ("t.csv", "arrived_at", "not a number"),
         overrides={"workload": {"trace": {"format": "vidur", "path": "t.csv"}}},
         setup=write("t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\nsoon,10,2\n")),
    Case("trace-time-scale-overflow", 2, ("workload.trace.time_scale", "infinite"),
         overrides={"workload": {"trace": {"format": "vidur", "path": "t.csv", "time_scale": 1e308}}},
         setup=write("t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,2\n3,10,2\n")),
    Case("mooncake-broken-line", 2, ("t.jsonl line 2", "not valid JSON"),
         overrides={"workload": {"trace": {"format": "mooncake", "path": "t.jsonl"}}},
         setup=write("t.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 2, '
                                '"hash_ids": [1]}\n{"timestamp": \n')),
    Case("requests-file-binary", 2, ("workload.requests_file", "r.jsonl", "not a UTF-8 text file"),
         overrides={"workload": {"requests_file": "r.jsonl"}}, setup=write("r.jsonl", GARBAGE)),
    Case("requests-file-broken-json", 2, ("r.jsonl line 1", "not valid JSON"),
         overrides={"workload": {"requests_file": "r.jsonl"}}, setup=write("r.jsonl", "{id: 1}\n")),
    Case("requests-file-negative-token", 2, ("r.jsonl line 1", "prompt_token_ids[1] = -3"),
         overrides={"workload": {"requests_file": "r.jsonl"}},
         setup=write("r.jsonl", '{"id": 1, "prompt_token_ids": [1, -3]}\n')),
    Case("requests-file-too-many-outputs", 2, ("r.jsonl line 1", "output_token_ids", "at most max_tokens"),
         overrides={"workload": {"requests_file": "r.jsonl"}},
         setup=write("r.jsonl", '{"id": 1, "prompt_token_ids": [1], "max_tokens": 1, '
                                '"output_token_ids": [5, 6]}\n')),
    Case("requests-file-duplicate-id", 2, ("r.jsonl line 2", "used twice"),
         overrides={"workload": {"requests_file": "r.jsonl"}},
         setup=write("r.jsonl", '{"id": 1, "prompt_token_ids": [1]}\n{"id": "1", "prompt_token_ids": [2]}\n')),
    Case("requests-file-with-synthetic-keys", 2, ("workload.num_requests", "requests_file"),
         overrides={"workload": {"requests_file": "r.jsonl", "num_requests": 3}},
         setup=write("r.jsonl", '{"id": 1, "prompt_token_ids": [1]}\n')),
    Case("empirical-lengths-binary", 2, ("workload.prompt_len.file", "l.csv", "not a UTF-8 text file"),
         overrides={"workload.prompt_len": {"type": "empirical", "file": "l.csv", "column": "n"}},
         setup=write("l.csv", GARBAGE)),
    Case("empirical-lengths-empty", 2, ("workload.prompt_len.file", "l.csv", "empty"),
         overrides={"workload.prompt_len": {"type": "empirical", "file": "l.csv", "column": "n"}},
         setup=write("l.csv", "")),
    Case("arrival-rate-overflow", 2, ("workload.arrival", "overflow"),
         overrides={"workload.arrival": {"type": "poisson", "rate": 1e-320}}),
    Case("sessions-with-closed-loop", 2, ("workload.sessions.turns", "closed_loop"),
         overrides={"workload.sessions": {"turns": 2},
                    "workload.arrival": {"type": "closed_loop", "concurrency": 2}}),
    # --- outputs ---
    Case("out-is-a-file", 2, ("--out", "afile", "is a file, not a folder"), outputs=False,
         args=("--out", "{tmp}/afile"), setup=write("afile", "KEEP ME\n")),
    Case("out-under-a-file", 2, ("--out", "afile/sub", "cannot create the folder"), outputs=False,
         args=("--out", "{tmp}/afile/sub"), setup=write("afile", "KEEP ME\n")),
    Case("out-summary-is-a-folder", 2, ("--out", "summary.json is a folder"), outputs=False,
         args=("--out", "{tmp}/o"), setup=lambda tmp: (tmp / "o" / "summary.json").mkdir(parents=True)),
    Case("trace-is-a-folder", 2, ("--trace", "is a folder"), outputs=False,
         args=("--trace", "{tmp}")),
    Case("trace-under-a-file", 2, ("--trace", "afile", "is a file, not a folder"), outputs=False,
         args=("--trace", "{tmp}/afile/t.jsonl"), setup=write("afile", "KEEP ME\n")),
    Case("out-not-writable", 2, ("--out", "cannot write in", "Permission denied"),
         fault="eacces-open:.kvsim-probe"),
    Case("out-folder-cannot-be-created", 2, ("--out", "newdir", "Permission denied"), outputs=False,
         args=("--out", "{tmp}/newdir"), fault="eacces-mkdir:newdir"),
    Case("disk-full-writing-requests-csv", 2, ("out/requests.csv", "No space left on device"),
         fault="enospc-open:requests.csv"),
    Case("disk-full-writing-summary", 2, ("out/summary.json", "No space left on device"),
         fault="enospc-open:summary.json"),
    Case("disk-full-writing-the-trace", 2, ("--trace", "trace.jsonl", "No space left on device"),
         fault="enospc-write:trace.jsonl"),
    Case("rename-refused", 2, ("out/steps.csv", "Permission denied"), fault="eacces-replace:steps.csv",
         each_old_or_new=True),
    # --- runs that are cut short or fail as a whole ---
    Case("every-prompt-too-long", 1, ("every request failed (20 of 20)",
                                      "20 x prompt of 2000000000 tokens >= max_model_len 2048"),
         overrides={"workload.prompt_len.value": 2_000_000_000}),
    Case("every-prompt-too-long-streaming", 1, ("every request failed", "metrics.streaming"),
         overrides={"workload.prompt_len.value": 5000, "metrics": {"streaming": True}}),
    Case("tiny-cache-caps-max-model-len", 1, ("engine.max_model_len", "num_gpu_blocks_override = 2",
                                              "prompt of 100 tokens >= max_model_len 16"),
         overrides={"engine.num_gpu_blocks_override": 2, "engine.max_model_len": _DELETE}),
    Case("swap-space-exhausted", 1, ("the simulation stopped", "swap space exhausted", "engine.swap_space"),
         overrides={"engine.scheduler": "continuous", "engine.preemption_mode": "swap",
                    "engine.swap_space": 0.0001, "engine.num_gpu_blocks_override": 40,
                    "engine.max_model_len": 512, "workload.num_requests": 50,
                    "workload.output_len.value": 300}),
    Case("closed-loop-concurrency-1e9", 0, ("simulated time", "(20 requests",),
         overrides={"workload.arrival": {"type": "closed_loop", "concurrency": 1_000_000_000}}),
    Case("sweep-section-ignored-by-run", 0, ("s.yaml", "sweep:", "kvsim sweep"),
         overrides={"sweep": {"grid": {"engine.block_size": [16, 32]}}}),
    Case("ctrl-c", 130, ("interrupted (Ctrl-C)",), overrides=HUGE_RUN, signal_after_start=signal.SIGINT),
    Case("sigterm", 130, ("interrupted (SIGTERM)",), overrides=HUGE_RUN, signal_after_start=signal.SIGTERM),
]


def run_folder(**files: str | bytes) -> Callable[[Path], None]:
    """A `kvsim run --out` folder ``r/`` with these files (a valid summary.json unless given)."""
    files = {"summary.json": '{"scenario": "x", "completed": 1}', **files}

    def setup(tmp: Path) -> None:
        for name, content in files.items():
            write(f"r/{name}", content)(tmp)
    return setup


BENCH_RESULT = json.dumps({"start_times": [0.0, 0.5], "input_lens": [100, 100], "output_lens": [20, 20],
                           "ttfts": [0.05, 0.05], "latencies": [0.5, 0.5], "errors": ["", ""]})
SERVER = yaml.safe_dump({"name": "srv", "model": "llama-3.1-8b",
                         "engine": {"num_gpu_blocks_override": 2000, "max_model_len": 4096},
                         "cost_model": {"type": "roofline", "engine_preset": "vllm-v1"}})
CALIBRATE = ("calibrate", "serve", "--scenario", "{tmp}/srv.yaml", "--max-evals", "2", "--fit", "step_s")


def calibrate_files(**files: str | bytes) -> Callable[[Path], None]:
    files = {"srv.yaml": SERVER, "a.json": BENCH_RESULT, **files}

    def setup(tmp: Path) -> None:
        for name, content in files.items():
            write(name, content)(tmp)
    return setup


CASES += [
    # --- the vLLM 0.33 scheduler knobs and queue limits ---
    Case("prefill-interval-zero", 2, ("engine.prefill_schedule_interval", "got 0"),
         overrides={"engine.prefill_schedule_interval": 0}),
    Case("active-seqs-over-max-num-seqs", 2, ("engine.max_num_active_seqs", "max_num_seqs (8)"),
         overrides={"engine.max_num_seqs": 8, "engine.max_num_active_seqs": 9}),
    Case("v1-knob-on-continuous", 2, ("engine.max_num_scheduled_tokens", "only the chunked"),
         overrides={"engine.scheduler": "continuous", "engine.max_num_scheduled_tokens": 256,
                    "engine.max_num_batched_tokens": 2048}),
    Case("threshold-over-max-model-len", 2, ("engine.long_prefill_token_threshold", "max_model_len (2048)"),
         overrides={"engine.long_prefill_token_threshold": 4096}),
    Case("queue-limit-refuses-everything", 1, ("every request failed (20 of 20)",
                                               "20 x HTTP 503 (max_num_queued_reqs)"),
         overrides={"engine.max_num_queued_reqs": 0}),
    # --- vLLM command lines ---
    Case("serve-args-unknown-flag", 2, ("--serve-args", "--bogus-flag", "not a vllm serve flag"),
         args=("--serve-args=--bogus-flag 3",)),
    Case("serve-args-bad-value", 2, ("--serve-args", "--max-num-seqs", "'abc'"),
         args=("--serve-args=--max-num-seqs abc",)),
    Case("serve-args-unbalanced-quote", 2, ("--serve-args", "No closing quotation"),
         args=("--serve-args=--model 'x",)),
    Case("serve-args-value-vllm-refuses", 2, ("--max-num-active-seqs 0", "vLLM refuses it"),
         args=("--serve-args=--max-num-active-seqs 0",)),
    Case("serve-args-in-the-file", 2, ("engine.serve_args", "--max-num-seqs 0"),
         overrides={"engine.serve_args": "--max-num-seqs 0"}),
    Case("bench-args-bad-choice", 2, ("--bench-args", "--dataset-name", "'nosuch'"),
         args=("--bench-args=--dataset-name nosuch",)),
    Case("bench-args-dataset-binary", 2, ("workload.bench.dataset_path", "d.json", "not valid JSON"),
         args=("--bench-args=--dataset-name sharegpt --dataset-path {tmp}/d.json",),
         setup=write("d.json", GARBAGE)),
    Case("bench-in-the-file-unknown-key", 2, ("workload.bench.nosuchkey", "unknown key"),
         overrides={"workload": {"bench": {"num_prompts": 3, "nosuchkey": 1}}}),
    # --- kvsim view ---
    Case("view-not-a-run-folder", 2, ("kvsim view", "neither a run folder"), outputs=False,
         command=("view", "{tmp}/nothing")),
    Case("view-summary-not-json", 2, ("r/summary.json", "not valid JSON"), outputs=False,
         command=("view", "{tmp}/r"), setup=run_folder(**{"summary.json": "garbage{"})),
    Case("view-summary-a-list", 2, ("r/summary.json", "expected a JSON object"), outputs=False,
         command=("view", "{tmp}/r"), setup=run_folder(**{"summary.json": "[1, 2]"})),
    Case("view-requests-binary", 2, ("r/requests.csv", "not a UTF-8 text file"), outputs=False,
         command=("view", "{tmp}/r"), setup=run_folder(**{"requests.csv": GARBAGE})),
    Case("view-metrics-foreign-columns", 2, ("r/metrics.csv", "missing column(s) time_s"), outputs=False,
         command=("view", "{tmp}/r"), setup=run_folder(**{"metrics.csv": "a,b\n1,2\n3,4\n"})),
    Case("view-sweep-results-binary", 2, ("r/results.csv", "not a UTF-8 text file"), outputs=False,
         command=("view", "{tmp}/r"), setup=run_folder(**{"results.csv": GARBAGE})),
    Case("view-out-is-a-folder", 2, ("--out", "is a folder"), outputs=False,
         command=("view", "{tmp}/r", "--out", "{tmp}/r"), setup=run_folder()),
    Case("view-out-under-a-file", 2, ("--out", "afile", "is a file, not a folder"), outputs=False,
         command=("view", "{tmp}/r", "--out", "{tmp}/afile/v.html"),
         setup=lambda tmp: (run_folder()(tmp), write("afile", "KEEP ME\n")(tmp))),
    # --- kvsim schema ---
    Case("schema-out-is-a-folder", 2, ("kvsim schema", "Is a directory"), outputs=False,
         command=("schema", "--out", "{tmp}")),
    # --- kvsim calibrate serve ---
    Case("calibrate-manifest-bad-yaml", 2, ("m.yaml", "not valid YAML"), outputs=False,
         command=("calibrate", "serve", "{tmp}/m.yaml"), setup=write("m.yaml", "runs: [1,\n")),
    Case("calibrate-manifest-duplicate-key", 2, ("m.yaml", "duplicate key 'runs'"), outputs=False,
         command=("calibrate", "serve", "{tmp}/m.yaml"), setup=write("m.yaml", "runs: []\nruns: []\n")),
    Case("calibrate-results-binary", 2, ("r.json", "not a UTF-8 text file"), outputs=False,
         command=(*CALIBRATE, "--train", "{tmp}/r.json"), setup=calibrate_files(**{"r.json": GARBAGE})),
    Case("calibrate-results-without-detail", 2, ("r.json", "no 'input_lens' list", "--save-detailed"),
         outputs=False, command=(*CALIBRATE, "--train", "{tmp}/r.json"),
         setup=calibrate_files(**{"r.json": json.dumps({"start_times": [0.0]})})),
    Case("calibrate-jsonl-broken-line", 2, ("r.jsonl line 2", "not valid JSON"), outputs=False,
         command=(*CALIBRATE, "--train", "{tmp}/r.jsonl"),
         setup=calibrate_files(**{"r.jsonl": '{"arrival_time": 0, "input_toks": 1, "output_toks": 1, '
                                             '"queued_ts": 0, "first_token_ts": 1, "last_token_ts": 2}\n'
                                             '{"arrival_time": \n'})),
    Case("calibrate-scenario-binary", 2, ("srv.yaml", "not a UTF-8 text file"), outputs=False,
         command=(*CALIBRATE, "--train", "{tmp}/a.json"), setup=calibrate_files(**{"srv.yaml": GARBAGE})),
    Case("calibrate-unknown-term", 2, ("fit", "'nosuch' is not a term"), outputs=False,
         command=(*CALIBRATE[:-1], "nosuch", "--train", "{tmp}/a.json"), setup=calibrate_files()),
    Case("calibrate-out-is-a-folder", 2, ("--out", "is a folder"), outputs=False,
         command=(*CALIBRATE, "--train", "{tmp}/a.json", "--out", "{tmp}"), setup=calibrate_files()),
    Case("calibrate-report-under-a-file", 2, ("--report", "afile", "is a file, not a folder"),
         outputs=False, command=(*CALIBRATE, "--train", "{tmp}/a.json", "--report", "{tmp}/afile/r.md"),
         setup=lambda tmp: (calibrate_files()(tmp), write("afile", "KEEP ME\n")(tmp))),
]


REPO = Path(__file__).parent.parent
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "acceptance": {"rate": 0.7}}
PLAN = {"gpus": ["h100-sxm"], "slo": {"p99_ttft_ms": 2000}, "target_rate": 10}
PLAN_COMMAND = ("plan", "{tmp}/s.yaml", "--out", "{tmp}/p")
COMPARE = ("bench", "--scenarios", str(REPO / "scenarios" / "bench"), "--no-instructions", "--reps", "1",
           "--requests", "50", "--compare")
PD_POOLS = [{"name": "p", "role": "prefill"}, {"name": "d", "role": "decode"}]
INLINE_MODEL = {"name": "m", "num_layers": 2, "hidden_size": 768, "num_attention_heads": 12, "num_kv_heads": 4,
                "head_dim": 64, "intermediate_size": 1024, "vocab_size": 1000, "gated_mlp": True,
                "tie_word_embeddings": False, "max_position_embeddings": 4096}

CASES += [
    # --- cluster: (replicas, pools, routers, the P/D link) ---
    Case("cluster-not-a-mapping", 2, ("cluster", "[1, 2]", "dictionary"), overrides={"cluster": [1, 2]}),
    Case("cluster-replicas-zero", 2, ("cluster.replicas", "got 0", "greater than or equal to 1"), overrides={"cluster": {"replicas": 0}}),
    Case("cluster-unknown-key", 2, ("cluster.replica", "unknown key", "allowed: decode_router"),
         overrides={"cluster": {"replica": 2}}),
    Case("cluster-unknown-router", 2, ("cluster.router.policy", "'fastest'", "allowed: round_robin"),
         overrides={"cluster": {"replicas": 2, "router": "fastest"}}),
    Case("cluster-router-option-out-of-range", 2, ("cluster.router.cache_threshold", "got 2", "less than or equal to 1"),
         overrides={"cluster": {"replicas": 2, "router": {"policy": "prefix_aware", "cache_threshold": 2}}}),
    Case("cluster-unknown-scorer", 2, ("cluster.router.scorers.speed", "'speed'", "allowed: queue"),
         overrides={"cluster": {"replicas": 2, "router": {"policy": "weighted", "scorers": {"speed": 1}}}}),
    Case("cluster-replicas-and-pools", 2, ("cluster.replicas", "not both"),
         overrides={"cluster": {"replicas": 2, "pools": [{"name": "a"}]}}),
    Case("cluster-pool-name-twice", 2, ("cluster.pools[1].name", "'a' names two pools"),
         overrides={"cluster": {"pools": [{"name": "a"}, {"name": "a"}]}}),
    Case("cluster-pd-without-link", 2, ("cluster.link", "missing", "roce-400g"),
         overrides={"cluster": {"pools": PD_POOLS}}),
    Case("cluster-unknown-link", 2, ("cluster.link", "'nolink'", "catalog: nvlink-h100"),
         overrides={"cluster": {"pools": PD_POOLS, "link": "nolink"}}),
    Case("cluster-pool-engine-key", 2, ("cluster.pools[0].engine.blok", "unknown key"),
         overrides={"cluster": {"pools": [{"name": "a", "engine": {"blok": 1}}]}}),
    Case("cluster-pool-tp", 2, ("cluster.pools[0].hardware.tp", "got 3", "allowed: 1, 2, 4"),
         overrides={"cluster": {"pools": [{"name": "a", "hardware": {"tp": 3}}]}}),
    Case("cluster-pd-two-models", 2, ("cluster.pools[1].model", "'qwen3-8b'", "one cluster serves one model"),
         overrides={"cluster": {"pools": [PD_POOLS[0], {**PD_POOLS[1], "model": "qwen3-8b"}],
                                "link": "roce-400g"}}),
    Case("cluster-with-streaming", 2, ("metrics.streaming", "cluster:"),
         overrides={"cluster": {"replicas": 2}, "metrics": {"streaming": True}}),
    Case("cluster-set-bad", 2, ("cluster.replicas", "got -1"), args=("--set", "cluster.replicas=-1")),
    Case("cluster-every-request-failed", 1, ("every request failed (20 of 20)",
                                            "20 x prompt of 5000 tokens >= max_model_len 2048"),
         overrides={"cluster": {"replicas": 2}, "workload.prompt_len.value": 5000}),
    Case("cluster-ctrl-c", 130, ("interrupted (Ctrl-C)",), overrides={"cluster": {"replicas": 2}, **HUGE_RUN},
         signal_after_start=signal.SIGINT),
    # --- the prefix cache: hash or radix ---
    Case("prefix-cache-unknown", 2, ("engine.prefix_cache", "'trie'", "'hash' or 'radix'"),
         overrides={"engine.prefix_cache": "trie"}),
    Case("radix-section-with-hash", 2, ("engine.radix", "engine.prefix_cache is 'hash'"),
         overrides={"engine.radix": {"page_size": 1}}),
    Case("radix-page-size", 2, ("engine.radix.page_size", "got 8", "allowed: 1"),
         overrides={"engine.prefix_cache": "radix", "engine.radix": {"page_size": 8}}),
    Case("radix-eviction-policy", 2, ("engine.radix.eviction_policy", "'random'", "'lru'"),
         overrides={"engine.prefix_cache": "radix", "engine.radix": {"eviction_policy": "random"}}),
    Case("radix-with-a-hybrid-model", 2, ("engine.prefix_cache", "several KV-cache groups", "hash"),
         overrides={"engine.prefix_cache": "radix", "model": "gemma-3-1b", "engine.num_gpu_blocks_override": 4096}),
    Case("radix-on-continuous", 2, ("engine.scheduler", "'continuous'", "chunked"),
         overrides={"engine.prefix_cache": "radix", "engine.scheduler": "continuous",
                    "engine.max_num_batched_tokens": 2048}),
    # --- speculative decoding ---
    Case("spec-unknown-method", 2, ("engine.speculative_config.method", "'medusa2'", "allowed: ngram"),
         overrides={"engine.speculative_config": {**SPEC, "method": "medusa2"}}),
    Case("spec-zero-tokens", 2, ("engine.speculative_config.num_speculative_tokens", "0", ">= 1"),
         overrides={"engine.speculative_config": {**SPEC, "num_speculative_tokens": 0}}),
    Case("spec-unknown-key", 2, ("engine.speculative_config.k", "unknown key", "allowed: method"),
         overrides={"engine.speculative_config": {**SPEC, "k": 1}}),
    Case("spec-no-acceptance", 2, ("engine.speculative_config.acceptance", "missing", "{rate: 0.7}"),
         overrides={"engine.speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}),
    Case("spec-rate-over-one", 2, ("engine.speculative_config.acceptance.rate", "1.5", "[0, 1]"),
         overrides={"engine.speculative_config": {**SPEC, "acceptance": {"rate": 1.5}}}),
    Case("spec-acceptance-trace-binary", 2, ("acceptance.trace", "a.json", "not a UTF-8 text file"),
         overrides={"engine.speculative_config": {**SPEC, "acceptance": {"trace": "a.json"}}},
         setup=write("a.json", GARBAGE)),
    Case("spec-acceptance-trace-folder", 2, ("acceptance.trace", "is a folder"),
         overrides={"engine.speculative_config": {**SPEC, "acceptance": {"trace": "."}}}),
    Case("spec-acceptance-trace-values", 2, ("acceptance.trace", "a.json", "integers in [0, 3]"),
         overrides={"engine.speculative_config": {**SPEC, "acceptance": {"trace": "a.json"}}},
         setup=write("a.json", "[1, 9]")),
    Case("spec-draft-model-unknown", 2, ("engine.speculative_config.model", "'nomodel'", "known: "),
         overrides={"engine.speculative_config": {**SPEC, "method": "draft_model", "model": "nomodel"}}),
    Case("spec-on-continuous", 2, ("engine.speculative_config", "'continuous'"),
         overrides={"engine.speculative_config": SPEC, "engine.scheduler": "continuous"}),
    Case("spec-with-async-scheduling", 2, ("engine.speculative_config", "async_scheduling: false"),
         overrides={"engine.speculative_config": SPEC, "engine.async_scheduling": True}),
    Case("spec-budget-too-small", 2, ("engine.max_num_batched_tokens", "3 lookahead slots"),
         overrides={"engine.speculative_config": {**SPEC, "method": "eagle"}, "engine.max_num_batched_tokens": 3}),
    # --- multi-step, async scheduling, streaming interval ---
    Case("multistep-on-chunked", 2, ("engine.num_scheduler_steps", "'chunked'", "continuous"),
         overrides={"engine.num_scheduler_steps": 4}),
    Case("multistep-with-spec", 2, ("engine.num_scheduler_steps", "speculative decoding"),
         overrides={"engine.num_scheduler_steps": 4, "engine.scheduler": "continuous",
                    "engine.speculative_config": SPEC}),
    Case("async-on-continuous", 2, ("engine.async_scheduling", "'continuous'", "allowed: false"),
         overrides={"engine.async_scheduling": True, "engine.scheduler": "continuous"}),
    # --- hybrid models, DP/EP ---
    Case("hybrid-mamba-without-hybrid-manager", 2, ("engine.disable_hybrid_kv_cache_manager", "Mamba"),
         overrides={"model": "qwen3-next-80b-a3b", "hardware.tp": 4,
                    "engine.disable_hybrid_kv_cache_manager": True}),
    Case("hybrid-layer-type-unknown", 2, ("model", "'sliding'", "allowed: full_attention"),
         overrides={"model": {**INLINE_MODEL, "layer_pattern": ["full_attention", "sliding"]}}),
    Case("hybrid-window-missing", 2, ("model", "sliding_window is not set"),
         overrides={"model": {**INLINE_MODEL, "layer_pattern": ["full_attention", "sliding_attention"]}}),
    Case("expert-parallel-dense-model", 2, ("engine.enable_expert_parallel", "no experts"),
         overrides={"engine.enable_expert_parallel": True}),
    # --- baseline schedulers ---
    Case("orca-reservation-elsewhere", 2, ("engine.orca_reservation", "'max'", "scheduler: orca"),
         overrides={"engine.orca_reservation": "max"}),
    Case("simple-chunking-unchunked", 2, ("engine.enable_chunked_prefill", "simple_chunking"),
         overrides={"engine.scheduler": "simple_chunking", "engine.enable_chunked_prefill": False}),
    # --- kvsim sweep over the new keys ---
    Case("sweep-cluster-point-bad", 2, ("sweep point", "cluster.replicas=0", "got 0"), outputs=False,
         command=("sweep", "{tmp}/s.yaml", "--out", "{tmp}/sw"),
         overrides={"sweep": {"grid": {"cluster.replicas": [1, 0]}}}),
    # --- kvsim plan with plan.fleet ---
    Case("plan-fleet-not-a-mapping", 2, ("plan.fleet", "[1]", "routers, max_replicas"), outputs=False,
         command=PLAN_COMMAND, overrides={"plan": {**PLAN, "fleet": [1]}}),
    Case("plan-fleet-unknown-key", 2, ("plan.fleet.router", "unknown key", "allowed: routers"), outputs=False,
         command=PLAN_COMMAND, overrides={"plan": {**PLAN, "fleet": {"router": "x"}}}),
    Case("plan-fleet-unknown-router", 2, ("plan.fleet.routers[0].policy", "'fastest'", "allowed: round_robin"),
         outputs=False, command=PLAN_COMMAND, overrides={"plan": {**PLAN, "fleet": {"routers": ["fastest"]}}}),
    Case("plan-fleet-no-target-rate", 2, ("plan.target_rate", "missing"), outputs=False, command=PLAN_COMMAND,
         overrides={"plan": {**{k: v for k, v in PLAN.items() if k != "target_rate"}, "fleet": {}}}),
    Case("plan-fleet-start-over-max", 2, ("plan.fleet", "start_replicas 8 > max_replicas 4"), outputs=False,
         command=PLAN_COMMAND, overrides={"plan": {**PLAN, "fleet": {"start_replicas": 8, "max_replicas": 4}}}),
    Case("plan-fleet-with-pools", 2, ("plan.fleet", "cluster.pools"), outputs=False, command=PLAN_COMMAND,
         overrides={"cluster": {"pools": [{"name": "a"}]}, "plan": {**PLAN, "fleet": {}}}),
    Case("plan-router-flag-unknown", 2, ("--router fastest", "allowed: round_robin"), outputs=False,
         command=(*PLAN_COMMAND, "--router", "fastest"), overrides={"plan": PLAN}),
    Case("plan-out-is-a-file", 2, ("--out", "afile", "is a file, not a folder"), outputs=False,
         command=("plan", "{tmp}/s.yaml", "--out", "{tmp}/afile"), overrides={"plan": PLAN},
         setup=write("afile", "KEEP ME\n")),
    Case("plan-csv-is-a-folder", 2, ("--out", "plan.csv is a folder"), outputs=False,
         command=PLAN_COMMAND, overrides={"plan": {**PLAN, "fleet": {"max_replicas": 2}}},
         setup=lambda tmp: (tmp / "p" / "plan.csv").mkdir(parents=True)),
    # --- refused combinations the knob fuzz test found (tests/test_knob_combinations.py) ---
    Case("spec-with-radix", 2, ("engine.speculative_config", "prefix_cache: radix", "use prefix_cache: hash"),
         overrides={"engine.speculative_config": SPEC, "engine.prefix_cache": "radix"}),
    Case("spec-with-mamba-state", 2, ("engine.speculative_config", "qwen3-next-80b-a3b", "Mamba"),
         overrides={"engine.speculative_config": SPEC, "model": "qwen3-next-80b-a3b",
                    "hardware.tp": 4, "engine.num_gpu_blocks_override": 4096}),
    # --- kvsim bench --compare REF ---
    Case("compare-ref-unknown", 2, ("--compare nosuchref", "neither a folder nor a git commit"), outputs=False,
         command=(*COMPARE, "nosuchref")),
    Case("compare-ref-folder-without-kvsim", 2, ("--compare", "no kvsim/ package"), outputs=False,
         command=(*COMPARE, "{tmp}")),
    Case("compare-ref-cannot-run", 2, ("--compare {tmp}/ref", "failed to run W1", "this kvsim is broken"),
         outputs=False, command=(*COMPARE, "{tmp}/ref", "--out", "{tmp}/c.md"),
         setup=write("ref/kvsim/__init__.py", "raise SystemExit('this kvsim is broken')\n")),
    Case("compare-out-is-a-folder", 2, ("--out", "is a folder"), outputs=False,
         command=(*COMPARE, "HEAD", "--out", "{tmp}")),
    Case("compare-two-workloads", 2, ("--compare", "give one workload", "W1 W2"), outputs=False,
         command=("bench", "--compare", "HEAD", "W1", "W2")),
    Case("bench-out-is-a-folder", 2, ("--out", "is a folder"), outputs=False,
         command=("bench", "--scenarios", str(REPO / "scenarios" / "bench"), "W1", "--out", "{tmp}")),
]

def prepare(case: Case, tmp: Path) -> tuple[list[str], dict]:
    scenario = tmp / "s.yaml"
    if case.setup is not None:
        case.setup(tmp)
    if not scenario.exists():
        content = case.scenario if case.scenario is not None else scenario_with(**case.overrides)
        if isinstance(content, dict):
            content = yaml.safe_dump(content, sort_keys=False)
        (scenario.write_bytes if isinstance(content, bytes) else scenario.write_text)(content)
    argv = ["run", str(scenario)]
    if case.command is not None:
        argv = [a.replace("{tmp}", str(tmp)) for a in case.command]
    if case.id == "scenario-missing":
        argv = ["run", str(tmp / "does-not-exist.yaml")]
    if case.outputs:
        (tmp / "out").mkdir()
        for name, text in OLD.items():
            (tmp / "out" / name).write_text(text)
        (tmp / "trace.jsonl").write_text(OLD_TRACE)
        argv += ["--out", str(tmp / "out"), "--trace", str(tmp / "trace.jsonl")]
    argv += [a.replace("{tmp}", str(tmp)) for a in case.args if a != "--x"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    if case.fault:
        env["KVSIM_TEST_FAULT"] = case.fault
    return argv, env


def run_case(case: Case, tmp: Path, argv: list[str], env: dict) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", BOOT, *argv]
    if case.signal_after_start is None:
        return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=tmp)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tmp)
    # Under way = the trace's temporary file exists (the simulation has started).
    deadline = time.monotonic() + TIMEOUT_S
    while not any(tmp.glob(".trace.jsonl.*.tmp")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never started"
        time.sleep(0.05)
    proc.send_signal(case.signal_after_start)
    out, err = proc.communicate(timeout=TIMEOUT_S)
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def snapshot(tmp: Path) -> dict[str, bytes]:
    return {str(p.relative_to(tmp)): p.read_bytes() for p in sorted(tmp.rglob("*")) if p.is_file()}


def test_the_catalogue_has_at_least_50_cases():
    assert len(CASES) >= 50 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_bad_input_or_fault_ends_cleanly(case: Case, tmp_path: Path):
    argv, env = prepare(case, tmp_path)
    before = snapshot(tmp_path)
    done = run_case(case, tmp_path, argv, env)
    err = done.stderr

    assert "Traceback" not in err + done.stdout, err
    assert done.returncode == case.rc, err
    for needle in case.needles:
        assert needle.replace("{tmp}", str(tmp_path)) in err, (needle, err)
    if case.rc == 2:
        assert len(err.strip().splitlines()) == 1, err          # one line
    leftovers = [str(p) for p in tmp_path.rglob("*.tmp")]
    assert leftovers == [], leftovers

    completed = case.rc in (0, 1) and "the simulation stopped" not in err
    after = snapshot(tmp_path)
    for name, content in before.items():
        if completed and (name.startswith("out/") or name == "trace.jsonl"):
            continue
        if case.each_old_or_new and name.startswith("out/") and after.get(name) != content:
            assert name == "out/summary.json" or after[name].startswith(b"request_id,"), name
            continue
        assert after.get(name) == content, f"{name} changed or was lost"
    if completed and case.outputs:
        summary = (tmp_path / "out" / "summary.json").read_text()
        json.loads(summary, parse_constant=lambda c: pytest.fail(f"summary.json holds {c}"))
        trace = (tmp_path / "trace.jsonl").read_text()
        assert trace == "" or trace.endswith("\n")          # whole lines (none if no step ran)


def test_a_real_full_disk_leaves_the_old_files(tmp_path: Path):
    """The injected ENOSPC above, for real: a 64 KiB tmpfs (needs root and mount; else skipped)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (disk / "out").mkdir()
        (disk / "out" / "summary.json").write_text("OLD\n")
        scenario = tmp_path / "s.yaml"
        scenario.write_text(yaml.safe_dump(scenario_with(**{"workload.num_requests": 2000})))
        done = subprocess.run([sys.executable, "-m", "kvsim", "run", str(scenario), "--out", str(disk / "out")],
                              capture_output=True, text=True, timeout=TIMEOUT_S,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert done.stderr.strip().endswith("requests.csv: No space left on device"), done.stderr
        assert sorted(p.name for p in (disk / "out").iterdir()) == ["summary.json"]
        assert (disk / "out" / "summary.json").read_text() == "OLD\n"
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def test_only_the_engine_stopping_is_reported_as_such(tmp_path: Path, monkeypatch, capsys):
    """``EngineError`` (swap space exhausted, ...) is a one-line error; any other
    exception is a bug in kvsim and is not dressed up as the engine stopping."""
    import importlib

    from kvsim.cli import main
    from kvsim.sched.errors import EngineError

    simulate_module = importlib.import_module("kvsim.scenario.simulate")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(scenario_with()))

    def stops(*args, **kwargs):
        raise EngineError("swap space exhausted: request r1 needs 3 CPU blocks, 0 free")

    monkeypatch.setattr(simulate_module, "simulate", stops)
    assert main(["run", str(scenario)]) == 1
    assert "the simulation stopped: swap space exhausted" in capsys.readouterr().err

    def bug(*args, **kwargs):
        raise RuntimeError("an invariant broke")

    monkeypatch.setattr(simulate_module, "simulate", bug)
    with pytest.raises(RuntimeError, match="an invariant broke"):
        main(["run", str(scenario)])
