"""The ``kvsim`` command line.

Each sub-command lives next to the code it drives and registers itself through
an ``add_parser(subparsers)`` function that sets ``func`` on its parser; this
file only collects them, so that a folder owns its own command.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (module, attribute) of each sub-command's ``add_parser``; imported lazily so a
# missing optional dependency of one command never breaks the others.
COMMAND_MODULES = [
    "kvsim.specs.cli",        # capacity
    "kvsim.scenario.cli",     # run, sweep
    "kvsim.cost.cli",         # calibrate
    "kvsim.plots_cli",        # plot
    "kvsim.report",           # report
    "kvsim.plan",             # plan
    "kvsim.bench",            # bench
]


class UserError(Exception):
    """A mistake in the user's input: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvsim",
        description="Simulate KV-cache management and scheduling of LLM serving engines.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that command is not written yet
                continue
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"kvsim {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, KeyError, FileNotFoundError) as exc:
        # Validation errors from the library carry a message made for users.
        print(f"kvsim {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
