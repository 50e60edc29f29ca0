"""The executor that sweeps and plans share: simulations on worker processes or Ray tasks.

A caller hands :func:`execute` some :class:`Task` objects (a scenario each)
and a function ``on_done(task, record)`` that it calls in this process as each
one finishes; ``on_done`` may return new tasks (a plan's next probe), which
run as workers free up. ``run_point(scenario, point_dir) -> summary dict`` is
what a worker does with a task (it must pickle: a module-level function or a
``functools.partial`` of one). A record never raises::

    {"summary": {...} or None, "error": "" or "Type: message", "traceback": "...",
     "wall_time_s": 0.42}

Executors (``executor=``):

* ``local``: a pool of ``workers`` processes, each running one task at a time
  with one more queued. A worker that dies (segfault, OOM kill) fails only the
  task it was running; the queued one and the rest go to a fresh worker.
  Workers die with the process that started them (Linux: the kernel's
  parent-death signal; elsewhere a watch on the parent's pid), ignore Ctrl-C
  (the driver decides) and are killed when the driver stops early: an error,
  Ctrl-C, or SIGTERM under :func:`signals_as_interrupts`. ``workers=1`` runs
  the tasks in this process. Records come back pickled with their arrays out
  of band; one of 1 MB or more is read on a thread of its own (``_Transfer``),
  so that workers finishing together send at once.
* ``ray``: Ray tasks on a local Ray (started and stopped here) or the cluster
  at ``address``, at most ``2 x workers`` in flight.
"""

from __future__ import annotations

import collections
import collections.abc
import contextlib
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing import BufferTooShort, connection, get_context
from typing import Any

EXECUTORS = ("local", "ray")
RunPoint = Callable[[dict, "str | None"], dict]
QUEUED_PER_WORKER = 2          # the running task and the next one, so a worker never waits
STOP_TIMEOUT_S = 5.0           # how long finished workers get to exit before they are killed
PARENT_POLL_S = 0.5            # the parent-death watch where the kernel offers none


class ExecutorError(ValueError):
    """A bad executor option; the message names the option, the value and what is allowed."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or SIGINT) as an exception: ``finally`` blocks stop workers and keep what is done."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass(frozen=True)
class Task:
    """One simulation: ``run_point(scenario, point_dir)`` in a worker; ``key`` is the caller's handle."""

    key: Any
    scenario: dict
    point_dir: str | None = None


OnDone = Callable[[Task, dict], "Iterable[Task] | None"]


def default_workers() -> int:
    """All cores this process may use."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def check_options(executor: str, workers: int | None, address: str | None) -> None:
    """Refuse bad options before anything runs (and before Ray is imported needlessly)."""
    if executor not in EXECUTORS:
        raise ExecutorError(f"--executor: {executor!r} is not an executor; allowed: {', '.join(EXECUTORS)}")
    if address and executor != "ray":
        raise ExecutorError(f"--address: {address!r} is only used with --executor ray")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ExecutorError(f"--workers: expected an integer >= 1, got {workers!r}")
    if executor == "ray":
        import_ray()


def import_ray():
    try:
        import ray
    except ImportError as exc:
        raise ExecutorError(f"--executor ray: ray is not installed ({exc}); "
                            f"install the extra: pip install 'kvsim[ray]'") from None
    return ray


def execute(tasks: Iterable[Task], run_point: RunPoint, on_done: OnDone, *, executor: str = "local",
            workers: int | None = None, address: str | None = None) -> None:
    """Run every task, and every task ``on_done`` returns, until none is left.

    ``workers``: processes (local, default all cores) or concurrent Ray tasks
    (default all cores of a local Ray, the cluster's CPUs at ``address``).
    """
    check_options(executor, workers, address)
    if executor == "ray":
        _execute_ray(tasks, run_point, on_done, workers, address)
    elif (workers or default_workers()) == 1:
        _execute_inline(tasks, run_point, on_done)
    else:
        _LocalPool(run_point, workers or default_workers()).run(tasks, on_done)


@contextlib.contextmanager
def signals_as_interrupts():
    """Within: SIGTERM raises :class:`Interrupted` like Ctrl-C raises KeyboardInterrupt.

    A command wraps its work in this, so ``kill PID`` stops the workers and
    keeps every finished result instead of ending the process mid-write.
    Only the main thread may set handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ----------------------------------------------------------------------------
# One task, in a worker (or in this process)
# ----------------------------------------------------------------------------

def plain(value: Any) -> Any:
    """numpy scalars -> Python, so records pickle small and serialise as JSON."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        try:
            return value.item()
        except (TypeError, ValueError):
            return value
    return value


def run_task(run_point: RunPoint, scenario: dict, point_dir: str | None) -> dict:
    """Run one task and never raise: the record says ok or carries the error."""
    start = time.perf_counter()
    try:
        summary = run_point(scenario, point_dir)
        if not isinstance(summary, collections.abc.Mapping):
            raise TypeError(f"run_point returned {type(summary).__name__}, expected a dict of summary metrics")
        record = {"summary": {str(k): plain(v) for k, v in summary.items()}, "error": "", "traceback": ""}
    except Exception as exc:  # a failing point is a row, not the end of the sweep
        record = {"summary": None, "error": one_line(exc), "traceback": traceback.format_exc()}
    record["wall_time_s"] = time.perf_counter() - start
    return record


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def crash_record(why: str) -> dict:
    return {"summary": None, "error": why, "traceback": "", "wall_time_s": float("nan")}


def _execute_inline(tasks: Iterable[Task], run_point: RunPoint, on_done: OnDone) -> None:
    queue = collections.deque(tasks)
    while queue:
        task = queue.popleft()
        queue.extend(on_done(task, run_task(run_point, task.scenario, task.point_dir)) or ())


# ----------------------------------------------------------------------------
# The local pool
# ----------------------------------------------------------------------------

def _worker_main(conn, run_point: RunPoint, parent_pid: int) -> None:
    """A worker: run the tasks that come down the pipe, send each record back, until told to stop."""
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C reaches the whole group: the driver decides
    signal.signal(signal.SIGTERM, signal.SIG_DFL)   # not the driver's handler, inherited by fork
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        number, scenario, point_dir = message
        record = run_task(run_point, scenario, point_dir)
        try:
            reply = _pickled((number, record))
        except Exception as exc:  # a summary that does not pickle
            reply = _pickled((number, crash_record(f"the result could not be sent back: {one_line(exc)}")))
        _send_pickled(conn, reply)


def _pickled(obj) -> tuple[bytes, list[memoryview]]:
    """``obj`` pickled with its large contiguous buffers (numpy arrays) left out of
    band, as views of their own memory (pickle protocol 5)."""
    buffers: list = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return head, [b.raw() for b in buffers]


def _send_pickled(conn, message: tuple[bytes, list[memoryview]]) -> None:
    """The head and its buffers' sizes, then each buffer written from its own memory.

    A fleet worker's tables are hundreds of MB (kvsim/scenario/cluster_parallel.py):
    pickled in band they were copied into the message here and out of it on the
    other side, each copy into memory first touched then. Where the connection
    is a file descriptor (a socket pair: Linux, macOS), the buffers go through it
    raw, their sizes known from the head; elsewhere as one message each.
    """
    head, buffers = message
    conn.send((head, [b.nbytes for b in buffers]))
    if not _RAW_BUFFERS:
        for b in buffers:
            conn.send_bytes(b)
        return
    fd = conn.fileno()
    for b in buffers:
        while b:
            b = b[os.write(fd, b):]


def _recv_pickled(conn):
    """What ``_send_pickled`` sent: each buffer read straight into memory of its own
    (writable, so the arrays unpickled on it are too), the object unpickled on them.

    The memory is numpy's, which is not zeroed first and is advised to the kernel
    for huge pages: W7's driver took 2.9-3.0 s of CPU with ``bytearray`` buffers
    (1.1-1.2 s of it making them), 2.25-2.3 s with these.
    """
    head, sizes = conn.recv()
    return _read_record(conn, head, sizes)


def _read_record(conn, head: bytes, sizes: list[int]):
    """The rest of ``_recv_pickled`` after the head: the buffers, then the object."""
    buffers = _empty_buffers(sizes)
    for buffer in buffers:
        if _RAW_BUFFERS:
            _read_raw(conn.fileno(), buffer)
        elif conn.recv_bytes_into(buffer) != len(buffer):
            raise EOFError(f"a result buffer came short of its {len(buffer)} bytes")
    return pickle.loads(head, buffers=buffers)


def _empty_buffers(sizes: list[int]) -> list:
    import numpy as np                   # (only here: the executor itself needs no numpy)
    return [np.empty(n, dtype=np.uint8) for n in sizes]


def _read_raw(fd: int, buffer) -> None:
    view = memoryview(buffer)
    while view:
        got = os.readv(fd, [view])
        if not got:
            raise EOFError(f"the pipe closed inside a result buffer of {len(buffer)} bytes")
        view = view[got:]


class _Transfer:
    """A record whose buffers are read on a thread of their own, while the driver
    waits on the other workers (and reads their records so too).

    A fleet's workers finish together and each sends hundreds of MB
    (kvsim/scenario/cluster_parallel.py): read one after the other, the second
    waited ~0.5 s for the first on W7; the reads are the kernel's copies into
    memory first touched then, which two threads do on two cores. Ready to
    collect when ``fileno()`` (a pipe the thread writes to when it ends) is.
    """

    def __init__(self, conn, head: bytes, sizes: list[int]) -> None:
        self.head = head
        self.buffers = _empty_buffers(sizes)
        self.error: BaseException | None = None
        self.finished = False
        self._ready_r, self._ready_w = os.pipe()
        self.thread = threading.Thread(target=self._read, args=(conn.fileno(),),
                                       name="kvsim-receive", daemon=True)
        self.thread.start()

    def fileno(self) -> int:
        return self._ready_r

    def _read(self, fd: int) -> None:
        try:
            for buffer in self.buffers:
                _read_raw(fd, buffer)
        except BaseException as exc:     # handed to the driver by result()
            self.error = exc
        finally:
            self.finished = True
            os.write(self._ready_w, b"\0")

    def result(self):
        """The record (the thread has ended); raises what the read raised."""
        self.close()
        if self.error is not None:
            raise self.error
        return pickle.loads(self.head, buffers=self.buffers)

    def close(self) -> None:
        self.thread.join()
        if self._ready_r >= 0:
            os.close(self._ready_r)
            os.close(self._ready_w)
            self._ready_r = self._ready_w = -1


# Buffers raw through the connection's descriptor (multiprocessing's Pipe is a socket
# pair there); Windows' pipe connections have none.
_RAW_BUFFERS = hasattr(os, "readv") and sys.platform != "win32"
# Records whose buffers hold at least this many bytes are read on a thread (_Transfer).
BACKGROUND_BYTES = 1 << 20


def _die_with_parent(parent_pid: int) -> None:
    """End this worker when its driver ends, however the driver ends (even SIGKILL)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            PR_SET_PDEATHSIG = 1
            if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) == 0:
                if os.getppid() != parent_pid:      # the driver died before the call
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="kvsim-parent-watch", daemon=True).start()


class _Worker:
    def __init__(self, context, run_point: RunPoint):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child, run_point, os.getpid()),
                                       name="kvsim-worker", daemon=True)
        self.process.start()
        child.close()
        self.queued: collections.deque = collections.deque()   # (number, Task), oldest first: running
        self.transfer: _Transfer | None = None                 # its running task's record, coming in

    def waitables(self) -> list:
        """What says this worker has something for the driver: its pipe, or the
        transfer reading it, and its process's end."""
        return [self.transfer or self.conn, self.process.sentinel]

    def end_transfer(self) -> None:
        if self.transfer is not None:
            self.transfer.close()
            self.transfer = None


class _LocalPool:
    """``workers`` processes fed one task at a time (plus one queued), results read as they come."""

    def __init__(self, run_point: RunPoint, workers: int):
        self.run_point = run_point
        self.max_workers = workers
        self.context = get_context()
        self.workers: list[_Worker] = []

    def run(self, tasks: Iterable[Task], on_done: OnDone) -> None:
        queue = collections.deque(tasks)
        numbers = iter(range(1 << 62))
        try:
            while True:
                while queue and (worker := self._pick()) is not None:
                    number, task = next(numbers), queue.popleft()
                    try:
                        worker.conn.send((number, task.scenario, task.point_dir))
                    except OSError:
                        # It died (its pipe is broken) before we saw it: the task goes
                        # back, and what the worker had is collected like any crash.
                        queue.appendleft(task)
                        if worker.process.is_alive():
                            worker.process.kill()
                        worker.process.join()
                        for done_task, record in self._collect(worker, queue):
                            queue.extend(on_done(done_task, record) or ())
                        if worker in self.workers:     # it died idle
                            self._drop(worker)
                        continue
                    worker.queued.append((number, task))
                busy = [w for w in self.workers if w.queued]
                if not busy:
                    break
                ready = set(connection.wait([x for w in busy for x in w.waitables()]))
                for worker in busy:
                    if not ready.isdisjoint(worker.waitables()):
                        for task, record in self._collect(worker, queue):
                            queue.extend(on_done(task, record) or ())
            self._stop()
        finally:
            self._kill()   # on an error or an interrupt: nothing keeps running behind us

    def _pick(self) -> _Worker | None:
        """An idle worker, else a new one (up to ``workers``), else one with room in its queue."""
        idle = [w for w in self.workers if not w.queued]
        if idle:
            return idle[0]
        if len(self.workers) < self.max_workers:
            self.workers.append(_Worker(self.context, self.run_point))
            return self.workers[-1]
        worker = min(self.workers, key=lambda w: len(w.queued))
        return worker if len(worker.queued) < QUEUED_PER_WORKER else None

    def _collect(self, worker: _Worker, queue: collections.deque) -> list[tuple[Task, dict]]:
        """The results ``worker`` has sent; if it died, its running task as a crash and its
        queued, never-started tasks back to the front of ``queue``."""
        out = []
        if worker.transfer is not None and not worker.process.is_alive():
            worker.transfer.thread.join()        # it ends: the pipe is closed behind what was sent
        try:
            while worker.queued:
                if worker.transfer is not None:
                    if not worker.transfer.finished:
                        break                    # still coming in
                    transfer, worker.transfer = worker.transfer, None
                    number, record = transfer.result()
                elif worker.conn.poll():
                    head, sizes = worker.conn.recv()
                    if _RAW_BUFFERS and sum(sizes) >= BACKGROUND_BYTES:
                        worker.transfer = _Transfer(worker.conn, head, sizes)
                        continue
                    number, record = _read_record(worker.conn, head, sizes)
                else:
                    break
                expected, task = worker.queued.popleft()
                if number != expected:
                    raise RuntimeError(f"worker answered task {number}, expected {expected}")
                out.append((task, record))
        except (EOFError, OSError, ValueError, TypeError, AttributeError, ImportError,
                pickle.UnpicklingError, BufferTooShort):
            # The pipe closed, or a message was cut short or does not unpickle: either
            # way this worker cannot go on; what it was running fails, the rest re-run.
            if worker.process.is_alive():
                worker.process.kill()
            worker.process.join()
        if worker.queued and not worker.process.is_alive():
            if worker.transfer is not None:
                # It died while its record came in: what did come is read first.
                return out + self._collect(worker, queue)
            _, crashed = worker.queued.popleft()
            out.append((crashed, self._crash_record(worker)))
            queue.extendleft(task for _, task in reversed(worker.queued))
            self._drop(worker)                   # a fresh worker takes its place when needed
        return out

    def _drop(self, worker: _Worker) -> None:
        worker.queued.clear()
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join()
        worker.end_transfer()
        worker.conn.close()
        self.workers.remove(worker)

    @staticmethod
    def _crash_record(worker: _Worker) -> dict:
        worker.process.join()
        code = worker.process.exitcode
        how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exit status {code}")
        return crash_record(f"worker process died ({how}) while this point was running")

    def _stop(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(OSError):
                worker.conn.send(None)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for worker in self.workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))

    def _kill(self) -> None:
        for worker in self.workers:
            if worker.process.is_alive():
                worker.process.kill()
        for worker in self.workers:
            worker.process.join()
            worker.end_transfer()                # the pipe is closed behind it: the read ends
            worker.conn.close()
        self.workers = []


# ----------------------------------------------------------------------------
# Ray
# ----------------------------------------------------------------------------

def _execute_ray(tasks: Iterable[Task], run_point: RunPoint, on_done: OnDone, workers: int | None,
                 address: str | None) -> None:
    """The same tasks as Ray tasks, on a local Ray (default) or the cluster at ``address``."""
    queue = collections.deque(tasks)
    if not queue:
        return
    ray = import_ray()
    started_here = False
    if not ray.is_initialized():
        options = dict(address=address or None, include_dashboard=False, log_to_driver=False)
        if not address:
            options["num_cpus"] = workers  # a cluster sizes itself; Ray refuses num_cpus there
        ray.init(**options)
        started_here = True
    in_flight: dict = {}
    try:
        max_in_flight = 2 * (workers or max(1, int(ray.cluster_resources().get("CPU", 1))))
        remote_task = ray.remote(num_cpus=1, max_retries=0)(run_task)
        runner_ref = ray.put(run_point)
        while queue or in_flight:
            while queue and len(in_flight) < max_in_flight:
                task = queue.popleft()
                in_flight[remote_task.remote(runner_ref, task.scenario, task.point_dir)] = task
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in ready:
                task = in_flight.pop(ref)
                try:
                    record = ray.get(ref)
                except Exception as exc:  # the worker died or the result did not come back
                    record = crash_record(one_line(exc))
                queue.extend(on_done(task, record) or ())
    finally:
        for ref in in_flight:          # stopped early: cancel what still runs
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()
