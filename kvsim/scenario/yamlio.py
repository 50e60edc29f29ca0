"""Reading scenario YAML strictly: duplicate keys refused, ``1e3`` read as a number.

PyYAML's ``safe_load`` follows YAML 1.1, which surprises users in two ways:

* a key written twice in one mapping silently keeps the last value
  (``engine: {block_size: 16, block_size: 32}`` is 32, the 16 is lost);
* a float needs a dot *and* a signed exponent, so ``1e3``, ``2.5e3`` and
  ``1E6`` are the *strings* "1e3", "2.5e3" and "1E6", and a scenario with
  ``num_requests: 1e6`` fails with "should be a valid integer".

``StrictLoader`` refuses the first (the message names the file, the line and
the key) and reads numbers as YAML 1.2 does (core schema,
``[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?``, so ``-.5`` too). A number written in
scientific notation whose value is a whole number below 2**63 becomes an
``int`` (``num_requests: 1e6`` is one million requests, and so is ``1.0e+6``;
``rate: 1e3`` still passes for a float field, which accepts ints); any other
is a ``float`` (``2.5e-1``, ``1e400`` is ``inf``, which float fields refuse).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml


class YamlError(ValueError):
    """A YAML text that cannot be read; the message names where it came from."""


# YAML 1.2 core-schema floats (with a dot, an exponent or both); plain integers
# are left to PyYAML.
_SCIENTIFIC = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*)(?:[eE][-+]?[0-9]+)?$"
                         r"|^[-+]?[0-9]+[eE][-+]?[0-9]+$")


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys and reads ``1e3`` as a number."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            # The mapping's own keys, before merge keys (<<) add theirs (which it may override).
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = key in first_line
                except TypeError:               # an unhashable key: SafeLoader reports it
                    continue
                if seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first given on line {first_line[key]}); "
                                    "each key may appear once in a mapping", key_node.start_mark)
                first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _construct_scientific(loader: StrictLoader, node) -> int | float:
    text = loader.construct_scalar(node)
    value = float(text)
    scientific = "e" in text or "E" in text
    return int(value) if scientific and value.is_integer() and abs(value) < 2**63 else value


_SCIENTIFIC_TAG = "tag:yaml.org,2002:kvsim-scientific"
StrictLoader.add_constructor(_SCIENTIFIC_TAG, _construct_scientific)
StrictLoader.add_implicit_resolver(_SCIENTIFIC_TAG, _SCIENTIFIC, list("-+0123456789."))
# Ahead of PyYAML's own float rule, so ``1.0e+3`` is read like ``1e3`` (an int).
for _resolvers in StrictLoader.yaml_implicit_resolvers.values():
    _resolvers.sort(key=lambda entry: entry[0] != _SCIENTIFIC_TAG)


def load_yaml(text: str, *, where: str) -> Any:
    """Parse ``text`` strictly; ``where`` names its origin (a file path, ``--set KEY``)."""
    try:
        return yaml.load(text, Loader=StrictLoader)
    except yaml.YAMLError as exc:
        raise YamlError(f"{where}: not valid YAML: {_one_line(exc)}") from None


def read_yaml_file(path: str | Path, *, what: str = "YAML file") -> Any:
    """Read and parse a YAML file; binary or undecodable content is named, not a traceback."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise YamlError(f"{path}: is a folder; expected a {what}") from None
    except OSError as exc:
        raise YamlError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    nul = raw.find(b"\0")
    if nul >= 0:
        raise YamlError(f"{path}: not a text file (a NUL byte at offset {nul}); "
                        f"expected a {what}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise YamlError(f"{path}: not a UTF-8 text file (byte {exc.start} cannot be decoded); "
                        f"expected a {what}") from None
    return load_yaml(text, where=str(path))


def _one_line(exc: yaml.YAMLError) -> str:
    """PyYAML's multi-line message (problem, context, a caret picture) as one line."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem:
        context = getattr(exc, "context", None)
        text = f"{context}, {problem}" if context else problem
        return f"{text} (line {mark.line + 1}, column {mark.column + 1})" if mark else text
    return " ".join(str(exc).split())
