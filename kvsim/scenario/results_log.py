"""Results that survive a crash: an append-only JSON-lines log, a lock on its folder, the code version.

* :class:`ResultsLog` appends one JSON object per finished simulation and
  flushes and syncs it at once; :func:`read_log` returns the latest record of
  each key, ignoring a line torn by a crash (that simulation simply runs again).
* :class:`OutLock` keeps two sweeps (or plans) from writing one folder. It is
  a POSIX record lock (``fcntl.lockf``): it belongs to this process alone, so
  forked workers never inherit it, and the kernel drops it when this process
  ends, however it ends. The lock file holds the holder's pid while held and
  is emptied on release, so a pid found there when the lock is free names a
  process that was killed: it is taken over, with a message.
* :func:`code_version` names the simulator code (version and a hash of the
  package's files, data included), so a record made by other code is never
  taken for one of this code.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvsim.scenario.executor import plain

LOCK_FILE = ".lock"
_HELD: set[str] = set()        # folders this process holds (a record lock does not exclude itself)


class LockedError(ValueError):
    """Another live process writes the folder; the message names the folder and the process."""


def json_default(value: Any) -> Any:
    converted = plain(value)
    return converted if converted is not value else str(value)


class ResultsLog:
    """Append-only JSON lines: one record per finished simulation, flushed and synced at once."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        needs_newline = self.path.exists() and self.path.stat().st_size > 0 and \
            not self.path.read_bytes().endswith(b"\n")
        self.file = open(self.path, "a", encoding="utf-8")
        if needs_newline:  # finish a line torn by a crash so the next record starts clean
            self.file.write("\n")

    def append(self, record: dict) -> None:
        self.file.write(json.dumps(record, default=json_default) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> ResultsLog:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def read_log(path: str | os.PathLike, key: str) -> dict[str, dict]:
    """The latest record of each ``record[key]`` in the log ({} when there is none).

    A line that does not parse (a process killed mid-write) is ignored.
    """
    path = Path(path)
    latest: dict[str, dict] = {}
    if not path.exists():
        return latest
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and isinstance(record.get(key), str):
                latest[record[key]] = record
    return latest


class OutLock:
    """An exclusive lock on ``folder`` for this process (see the module docstring).

    ``what`` names the writer in messages (``sweep``, ``plan``); ``log`` gets
    the one-line message when a dead holder's lock is taken over.
    """

    def __init__(self, folder: str | os.PathLike, *, what: str = "sweep",
                 log: Callable[[str], None] | None = None):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self.what = what
        self.log = log
        self.fd: int | None = None

    def __enter__(self) -> OutLock:
        key = str(self.path.resolve())
        if key in _HELD:
            raise LockedError(f"--out {self.folder}: another {self.what} in this process is writing there now")
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock, as before
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f" (process {holder})" if holder else ""
            raise LockedError(f"--out {self.folder}: another {self.what}{who} is writing there now") from None
        previous = _read_pid(fd)
        if previous and previous != os.getpid() and self.log is not None:
            self.log(f"--out {self.folder}: taking over from process {previous}, which ended "
                     f"without releasing it (killed?); what it finished is kept")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        _HELD.add(key)
        return self

    def __exit__(self, *exc_info) -> None:
        if self.fd is None:
            return
        _HELD.discard(str(self.path.resolve()))
        os.ftruncate(self.fd, 0)          # released cleanly: no pid left to take over
        os.close(self.fd)                 # closing drops the record lock
        self.fd = None


def _read_pid(fd: int) -> int | None:
    text = os.pread(fd, 64, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else None


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """``kvsim <version>+<hash>``: the hash of every file of the kvsim package (code and data).

    Two runs of the same code and data give the same string; any edit to the
    simulator, its catalogs or its profiles gives another.
    """
    import kvsim
    root = Path(kvsim.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return f"kvsim {kvsim.__version__}+{digest.hexdigest()[:12]}"
