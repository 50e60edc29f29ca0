"""Small builders shared by the KV and scheduler tests."""

from __future__ import annotations

import numpy as np

from kvsim.sched.config import SchedulerConfig
from kvsim.sched.request import Request
from kvsim.sim.run import make_scheduler
from kvsim.workload.request import RequestSpec


def spec(rid: str, tokens, max_tokens: int = 16, arrival: float = 0.0, priority: int = 0,
         **kw) -> RequestSpec:
    return RequestSpec(rid, arrival, np.asarray(list(tokens), dtype=np.int64), max_tokens,
                       priority=priority, **kw)


class Driver:
    """Drives a scheduler step by step without SimPy (1 s per step)."""

    def __init__(self, scheduler: str = "chunked", **cfg) -> None:
        cfg.setdefault("block_size", 4)
        cfg.setdefault("max_model_len", 256)
        self.config = SchedulerConfig(**cfg)
        self.sched = make_scheduler(scheduler, self.config)
        self.reqs: dict[str, Request] = {}
        self.now = 0.0
        self.index = 0

    @property
    def kv(self):
        return self.sched.kv

    def add(self, *specs: RequestSpec) -> None:
        for s in specs:
            r = Request(s, self.index, block_size=self.config.block_size,
                        max_model_len=self.config.max_model_len, arrival_time=s.arrival_time_s)
            self.index += 1
            self.reqs[s.request_id] = r
            self.sched.add_request(r)

    def step(self):
        """Run one step; returns (scheduled {id: n}, plan, finished ids)."""
        plan = self.sched.schedule()
        self.now += 1.0
        finished = self.sched.update_from_output(plan, self.now)
        return ({r.request_id: n for r, n, _ in plan.scheduled}, plan,
                [r.request_id for r in finished])

    def blocks(self, rid: str) -> list[int]:
        return list(self.kv.get_blocks(rid))

    def free_queue(self) -> list[int]:
        return self.kv.pool.free_queue()
