"""The ``kvsim`` command line.

Each sub-command lives next to the code it drives and registers itself through
an ``add_parser(subparsers)`` function that sets ``func`` on its parser; this
file only maps names to modules. Only the module of the command being run is
imported, so ``kvsim capacity`` does not pay for matplotlib or the simulator,
and a broken optional command never breaks the others.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from typing import NoReturn

# numpy's OpenBLAS starts a thread per other core when numpy is imported, and
# each spins ~0.08 s of CPU waiting for work that kvsim never gives it: kvsim runs
# no large matrix products, and its parallel commands use worker processes. So
# the command runs BLAS on one thread, unless the user's environment says
# otherwise. The products that are left (the calibration fits) stay small, and
# on one thread they give the same bits on any machine.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from kvsim.sim.gc_pause import collector_paused  # noqa: E402

# name -> (module with add_parser, one-line help)
COMMANDS = {
    "run": ("kvsim.scenario.cli", "simulate one scenario; write summary.json, requests.csv, steps.csv"),
    "sweep": ("kvsim.scenario.sweep_cli", "run every point of a scenario's sweep section; write DIR/results.csv"),
    "plot": ("kvsim.plots_cli", "draw a figure from a run folder or a sweep's results.csv"),
    "capacity": ("kvsim.specs.cli", "KV-cache size of a model on a GPU (vLLM's sizing)"),
    "calibrate": ("kvsim.cost.cli", "fit cost-model profiles; write the calibration report"),
    "report": ("kvsim.reports.cli", "known-result reports: out/reports/ (reports/ with --update-reports)"),
    "plan": ("kvsim.plan", "capacity planning: highest rate meeting SLOs per GPU candidate, "
                           "or the fewest replicas per router (--router)"),
    "bench": ("kvsim.bench", "speed benchmarks: out/performance.md (reports/ with --update-reports)"),
    "view": ("kvsim.view", "one self-contained HTML page of a run, sweep or plan folder"),
    "schema": ("kvsim.schema_cli", "print the scenario JSON Schema (for editors)"),
    "native": ("kvsim.native.build", "compile the engine's hot modules with Cython (optional), "
                                     "or show / remove builds"),
}


# Commands that run with the cyclic garbage collector off from their first
# import on (kvsim/sim/gc_pause.py): a `kvsim run` leaves no cycles for it to
# find, and the collections while its modules are imported cost ~30 ms (1% of W1's process).
COLLECTOR_OFF = {"run"}

INTERRUPTED = 130                        # 128 + SIGINT: what a shell reports after Ctrl-C


class UserError(Exception):
    """A mistake in the user's input: printed as one line, exit status 2."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``only``'s command, the others named with their one line of help
    (``only=""``: every command so, none of their modules imported); None: every command's."""
    parser = argparse.ArgumentParser(
        prog="kvsim",
        description="Simulate KV-cache management and scheduling of LLM serving engines.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=help_text, add_help=False)
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:       # that command is not part of this build
                continue
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; ``argv`` None means the process's own arguments (the program)."""
    as_program = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    only = argv[0] if argv and argv[0] in COMMANDS else None
    with collector_paused() if only in COLLECTOR_OFF else contextlib.nullcontext():
        return _main(argv, only, as_program)


def _main(argv: list[str], only: str | None, as_program: bool) -> int:
    # No command named (`kvsim --help`, a typo): its list needs no command's module
    # (importing them all, pandas and matplotlib among them, took ~1 s).
    parser = build_parser("" if only is None else only)
    if only is None:
        parser.print_help() if not argv or argv[0] in ("-h", "--help") else parser.parse_args(argv)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = int(args.func(args) or 0)
    except UserError as exc:
        print(f"kvsim {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Commands that write files clean up on the way out (kvsim.scenario.outputs).
        print(f"kvsim {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except UnicodeDecodeError as exc:
        # A reader that did not name its file (the ones in kvsim do).
        print(f"kvsim {args.command}: error: an input is not UTF-8 text (byte {exc.start}: "
              f"{exc.reason})", file=sys.stderr)
        return 2
    except (ValueError, KeyError, FileNotFoundError) as exc:
        # Validation errors from the library carry a message made for users.
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"kvsim {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except OSError as exc:
        # A file that cannot be read or written (permissions, a full disk): name it.
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"kvsim {args.command}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if interrupt_behind(exc) is None:
            raise
        print(f"kvsim {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    if (as_program and getattr(args, "exit_without_cleanup", False)
            and sys.getprofile() is None and sys.gettrace() is None):
        # (Under a profiler or coverage tool, exit normally: they write at exit.)
        exit_without_cleanup(code)
    return code


def interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C (or SIGTERM raised as one) that ``exc`` comes from, or None.

    A signal that lands while a class body is being built reaches the caller
    wrapped: a lazy import of a pydantic model interrupted there raises
    ``RuntimeError: Error calling __set_name__ ...`` with the
    KeyboardInterrupt as its cause. An error raised while the interrupt
    unwinds the stack has it as its context. One that lands while
    pydantic-core builds a model's validator comes back as its
    ``SchemaError``, the interrupt kept only as the message's last line
    ("KeyboardInterrupt: "), no cause attached.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        if (type(exc).__name__ == "SchemaError" and type(exc).__module__.startswith("pydantic_core")
                and str(exc).rstrip().endswith("KeyboardInterrupt:")):
            return KeyboardInterrupt()
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def exit_without_cleanup(code: int) -> NoReturn:
    """End the process now, skipping the interpreter's teardown (as mypy's ``hard_exit`` does).

    Freeing the module state of pandas, numpy and pydantic costs 0.2-0.4 s of
    CPU at exit, a large share of a short ``kvsim run``. Only commands whose
    work is complete when they return (files closed, no worker processes or
    threads, nothing left for atexit) ask for it, with
    ``set_defaults(exit_without_cleanup=True)``; calls of ``main(argv)`` from
    Python never exit.
    """
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        code = code or 120                    # what Python exits with when stdout cannot be flushed
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
