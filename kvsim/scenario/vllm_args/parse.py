"""Split a ``vllm serve`` / ``vllm bench serve`` command line the way vLLM's parser does.

vLLM parses its flags with ``FlexibleArgumentParser``
(``vllm/utils/argparse_utils.py``), an argparse parser that:

* reads ``--foo_bar`` as ``--foo-bar`` (underscores before the first ``.`` and
  before any ``=`` become dashes), so both spellings work;
* pairs ``--enable-x`` with ``--disable-x`` and still accepts
  ``--no-enable-x`` (``EnableDisableAction``);
* reads ``--json-arg.key value`` as part of ``--json-arg``;
* like any argparse parser, accepts ``--flag=value`` and a unique prefix of a
  long flag (``--max-num-seq`` for ``--max-num-seqs``; ``allow_abbrev``).

This module does the same with the option tables generated from vLLM's own
parsers (``serve_flags.py``, ``bench_flags.py``), so a flag vLLM would not
accept is refused here by name, and the values of every flag are found even
for flags kvsim then ignores. It does not convert values: ``serve.py`` and
``bench.py`` do that with vLLM's type rules.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass


class VllmArgsError(ValueError):
    """A command line vLLM (or kvsim) refuses; the message names the flag."""


@dataclass(frozen=True)
class Given:
    """One flag as given: the option string used and its raw value.

    ``value`` is ``True``/``False`` for a switch (``False`` for a negative
    option such as ``--no-enable-prefix-caching``), a string for a flag with
    one value, a list of strings for ``nargs='+'``/``'*'``, and for a dotted
    JSON flag (``--compilation-config.mode 3``) the dotted form as given.
    """

    dest: str
    option: str
    value: object

    def shown(self) -> str:
        """The flag as the user wrote it, for messages."""
        if isinstance(self.value, bool):
            return self.option
        if isinstance(self.value, list):
            return " ".join([self.option, *self.value])
        return f"{self.option} {self.value}"


_OPTION_NAME = re.compile(r"(?<=--)[^.=]*")      # vLLM: everything between -- and the first .
_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")      # argparse: a negative number is a value


def split_command(text_or_args, *, program: str) -> list[str]:
    """Tokens of a command line; a leading ``vllm serve`` / ``vllm bench serve`` is dropped."""
    if isinstance(text_or_args, str):
        try:
            args = shlex.split(text_or_args)
        except ValueError as exc:
            raise VllmArgsError(f"cannot split the command line ({exc})") from None
    else:
        args = [str(a) for a in text_or_args]
    words = program.split()
    if args[:len(words)] == words:
        args = args[len(words):]
    elif args[:len(words) - 1] == words[1:]:          # "serve ..." / "bench serve ..."
        args = args[len(words) - 1:]
    return args


def parse_options(args: list[str], options: dict[str, tuple], *, program: str,
                  positional: str | None = None) -> list[Given]:
    """The flags of ``args`` in order, resolved against vLLM's option table.

    ``options`` maps dest -> (nargs, option strings, negative option strings)
    (``serve_flags.OPTIONS``). ``positional`` names the dest of the one
    positional argument the program takes (``vllm serve MODEL``), if any.
    """
    lookup = {opt: dest for dest, (_, opts, _) in options.items() for opt in opts}
    negative = {opt for _, (_, _, neg) in options.items() for opt in neg}
    given: list[Given] = []
    i = 0
    saw_positional = False
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            raise VllmArgsError(f"'--' is not supported in {program} arguments")
        if not arg.startswith("-") or _NUMBER.match(arg):
            if positional is None or saw_positional:
                raise VllmArgsError(f"unrecognized argument {arg!r} ({program} takes "
                                    f"{'one positional argument' if positional else 'no positional arguments'})")
            given.append(Given(positional, "MODEL", arg))
            saw_positional = True
            continue
        if arg.startswith("-O") and arg != "-O":
            # vLLM: -O3 / -O=3 mean --optimization-level 3.
            given.append(Given("optimization_level", "-O", arg[3:] if arg[2:3] == "=" else arg[2:]))
            continue
        option, explicit = _split_explicit(arg)
        dotted = ""
        if option.startswith("--") and "." in option:
            option, _, dotted = option.partition(".")
        option = _resolve(option, lookup, program)
        dest = lookup[option]
        nargs = options[dest][0]
        if dotted:
            # A JSON config flag set key by key: kvsim only needs its name.
            value, i = _values(args, i, "1", explicit, option, program)
            given.append(Given(dest, f"{option}.{dotted}", value))
            continue
        if nargs == "0":
            if explicit is not None:
                raise VllmArgsError(f"argument {option}: ignored explicit argument {explicit!r}")
            given.append(Given(dest, option, option not in negative))
            continue
        value, i = _values(args, i, nargs, explicit, option, program)
        given.append(Given(dest, option, value))
    return given


def _split_explicit(arg: str) -> tuple[str, str | None]:
    """``--foo_bar=1`` -> ("--foo-bar", "1"): vLLM's underscore rule, then argparse's ``=``."""
    if arg.startswith("--"):
        if "=" in arg:
            key, value = arg.split("=", 1)
            return _OPTION_NAME.sub(lambda m: m.group(0).replace("_", "-"), key, count=1), value
        return _OPTION_NAME.sub(lambda m: m.group(0).replace("_", "-"), arg, count=1), None
    if "=" in arg:                       # -tp=2
        key, value = arg.split("=", 1)
        return key, value
    return arg, None


def _resolve(option: str, lookup: dict[str, str], program: str) -> str:
    """The option string argparse would match: exact, else a unique prefix of a long option."""
    if option in lookup:
        return option
    if option.startswith("--"):
        matches = sorted(o for o in lookup if o.startswith(option) and o.startswith("--"))
        # argparse: prefixes that name the same action are not ambiguous.
        if len({lookup[m] for m in matches}) == 1:
            return matches[0]
        if matches:
            raise VllmArgsError(f"ambiguous option: {option} could match {', '.join(matches)}")
    raise VllmArgsError(f"{option}: not a {program} flag")


def _values(args: list[str], i: int, nargs: str, explicit: str | None, option: str,
            program: str) -> tuple[object, int]:
    """The value(s) of a flag starting at ``args[i]``; returns (value, next index)."""
    if explicit is not None:
        return (explicit if nargs in ("1", "?") else [explicit]), i
    taken: list[str] = []
    while i < len(args) and (not args[i].startswith("-") or _NUMBER.match(args[i])):
        taken.append(args[i])
        i += 1
        if nargs in ("1", "?"):
            break
    if nargs == "1" and not taken:
        raise VllmArgsError(f"argument {option}: expected one argument")
    if nargs == "+" and not taken:
        raise VllmArgsError(f"argument {option}: expected at least one argument")
    if nargs in ("1", "?"):
        return (taken[0] if taken else True), i
    return taken, i
