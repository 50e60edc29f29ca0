"""What the tests of forked children share (tests/test_rows_ahead.py, tests/test_files_apart.py):
the skip where the process does not fork, a small scenario, and the thread-count fixture."""

import multiprocessing
import os

import pytest

from kvsim.metrics import tables

needs_fork = pytest.mark.skipif(not hasattr(os, "fork") or multiprocessing.get_start_method() != "fork",
                                reason="the children run only where the process forks")

BASE = {
    "name": "ahead", "seed": 3, "model": "llama-3.2-1b", "hardware": {"gpu": "h100-sxm"},
    "engine": {"scheduler": "chunked", "block_size": 16, "num_gpu_blocks_override": 400,
               "max_num_batched_tokens": 256},
    "cost_model": {"type": "roofline"},
    "workload": {"num_requests": 60, "arrival": {"type": "poisson", "rate": 20.0},
                 "prompt_len": {"type": "uniform", "low": 10, "high": 600},
                 "output_len": {"type": "uniform", "low": 5, "high": 120}},
}


@pytest.fixture(autouse=True)
def one_thread(monkeypatch, request):
    """The test runner may keep a thread of its own (pytest-xdist's): the children
    format rows or write files and leave, which is safe with it; ``fork_is_safe``
    counts threads for the caller's, which this patch stands in for (but where a
    test sets another: a name with "unsafe")."""
    if "unsafe" not in request.node.name:
        monkeypatch.setattr(tables.threading, "active_count", lambda: 1)
