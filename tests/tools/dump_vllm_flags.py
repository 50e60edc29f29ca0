"""Write kvsim/scenario/vllm_args/{serve,bench}_flags.py: every option of vLLM's own CLI parsers.

Run with the Python that has vLLM installed (vLLM is not a kvsim dependency)::

    /work/venv-vllm/bin/python tests/tools/dump_vllm_flags.py serve > kvsim/scenario/vllm_args/serve_flags.py
    /work/venv-vllm/bin/python tests/tools/dump_vllm_flags.py bench > kvsim/scenario/vllm_args/bench_flags.py

``tests/test_vllm_args.py`` reruns it when that Python exists and checks that
the committed module is what vLLM's parsers say.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def _parsers():
    import vllm
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    # Building the parsers reads device defaults; a CPU platform needs no GPU.
    platforms._current_platform = CpuPlatform()
    from vllm.benchmarks.serve import add_cli_args
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    serve = FlexibleArgumentParser()
    make_arg_parser(serve)
    bench = FlexibleArgumentParser()
    add_cli_args(bench)
    return vllm.__version__, serve, bench


def _nargs(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "0"
    if action.nargs in (None, 1):
        return "1"
    return str(action.nargs)


def _negatives(action: argparse.Action) -> tuple[str, ...]:
    negative = getattr(action, "negative_option_strings", None)
    if negative is None and isinstance(action, argparse.BooleanOptionalAction):
        negative = {s for s in action.option_strings if s.startswith("--no-")}
    return tuple(sorted(negative or ()))


def table(parser) -> dict[str, tuple]:
    """dest -> (nargs, accepted option strings, negative option strings)."""
    by_action: dict[int, list[str]] = {}
    actions = {}
    for option, action in parser._option_string_actions.items():
        if isinstance(action, argparse._HelpAction):
            continue
        by_action.setdefault(id(action), []).append(option)
        actions[id(action)] = action
    out = {}
    for key, options in by_action.items():
        action = actions[key]
        out[action.dest] = (_nargs(action), tuple(sorted(options)), _negatives(action))
    return dict(sorted(out.items()))


COMMANDS = {"serve": "vllm serve", "bench": "vllm bench serve"}


def render(version: str, which: str, parser) -> str:
    lines = [
        f'"""Every option of ``{COMMANDS[which]}``, vLLM {version}.',
        "",
        f"Generated from vLLM's own parsers by ``tests/tools/dump_vllm_flags.py {which}``;",
        "do not edit. ``dest -> (nargs, option strings, negative option strings)``:",
        'nargs is "0" (a switch), "1" (one value), "?", "+" or "*"; a negative option',
        "(``--no-enable-prefix-caching``, ``--disable-prefix-caching``) sets the",
        "switch to false. kvsim uses it to tell a flag vLLM does not have from one",
        "kvsim does not model, and to skip the values of ignored flags.",
        '"""',
        "",
        f'VLLM_VERSION = "{version}"',
        "",
    ]
    lines.append("OPTIONS = {")
    for dest, entry in table(parser).items():
        lines.append(f"    {dest!r}: {entry!r},")
    lines.append("}")
    lines.append("")
    return "\n".join(lines)


def main(which: str) -> str:
    version, serve, bench = _parsers()
    return render(version, which, serve if which == "serve" else bench)


if __name__ == "__main__":
    sys.stdout.write(main(sys.argv[1]))
