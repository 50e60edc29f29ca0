"""A vLLM user's command lines as a scenario: ``vllm serve ...`` and ``vllm bench serve ...``.

    kvsim run s.yaml --serve-args '--max-num-seqs 128 --no-enable-prefix-caching -tp 2' \\
                     --bench-args '--dataset-name random --random-input-len 2048 --request-rate 8'

``map_serve_args`` and ``map_bench_args`` read the flags exactly as vLLM 0.33's
parsers do (``parse.py``: aliases, ``--foo_bar``, ``--no-enable-x``, unique
prefixes) and return scenario overrides: ``[("engine.max_num_seqs", 128),
("hardware.tp", 2), ...]`` for ``vllm serve``; for ``vllm bench serve`` the whole
``workload`` section (``{"bench": {...}}``, vLLM's argument names) plus
``model``/``slo``/``seed`` when those flags are given. ``expand_scenario_args``
does the same for ``engine: {serve_args: "..."}`` and ``workload: {bench_args:
"..."}`` in a scenario file.

Each flag is supported (mapped), has no effect on a simulation (listed in
``Mapped.no_effect``), or is not modelled: refused with the list of supported
flags, or, with ``ignore_unsupported``, listed in ``Mapped.ignored``. A flag
vLLM does not have, or a value vLLM would refuse, is always an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from kvsim.scenario.vllm_args import bench as bench_table
from kvsim.scenario.vllm_args import bench_flags, serve_flags
from kvsim.scenario.vllm_args import serve as serve_table
from kvsim.scenario.vllm_args.engine_flags import fold_speculative
from kvsim.scenario.vllm_args.parse import Given, VllmArgsError, parse_options, split_command
from kvsim.scenario.vllm_args.serve import DEFAULT, Unmodelled

__all__ = ["Mapped", "VllmArgsError", "cli_overrides", "expand_scenario_args", "map_bench_args",
           "map_serve_args", "supported_flags"]


@dataclass(frozen=True)
class Mapped:
    """What a command line means for a scenario.

    ``overrides``: (dotted scenario key, value), applied in order;
    ``ignored``: flags kvsim does not model, skipped because ``ignore_unsupported``;
    ``no_effect``: flags that cannot change a simulation (server, logging, sampling).
    """

    overrides: list[tuple[str, Any]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    no_effect: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Program:
    name: str            # "vllm serve"
    label: str           # "--serve-args", for messages
    options: dict        # the generated option table
    table: ModuleType    # SUPPORTED / PLANNED / NO_EFFECT
    positional: str | None


SERVE = _Program("vllm serve", "--serve-args", serve_flags.OPTIONS, serve_table, "model_tag")
BENCH = _Program("vllm bench serve", "--bench-args", bench_flags.OPTIONS, bench_table, None)


def map_serve_args(args, *, ignore_unsupported: bool = False, label: str | None = None) -> Mapped:
    """``vllm serve`` flags (a string or a list) -> overrides of ``model``, ``hardware``, ``engine``."""
    return _map(SERVE, args, ignore_unsupported, label)


def map_bench_args(args, *, ignore_unsupported: bool = False, label: str | None = None) -> Mapped:
    """``vllm bench serve`` flags -> ``workload: {bench: {...}}`` (+ ``model``, ``slo``).

    The workload section is replaced as a whole: what the flags do not set
    takes ``vllm bench serve``'s default (the random dataset, 1000 prompts,
    every request at t=0), as when running the command.
    """
    mapped = _map(BENCH, args, ignore_unsupported, label)
    bench, rest = {}, []
    for key, value in mapped.overrides:
        if key.startswith("workload.bench."):
            bench[key.removeprefix("workload.bench.")] = value
        else:
            rest.append((key, value))
    return Mapped([("workload", {"bench": bench}), *rest], mapped.ignored, mapped.no_effect)


def supported_flags(program: str) -> list[str]:
    """The long option names kvsim maps, for messages and docs (``program``: serve | bench)."""
    prog = SERVE if program == "serve" else BENCH
    names = []
    for dest in prog.table.SUPPORTED:
        if dest in prog.options:
            options = prog.options[dest][1]
            own = "--" + dest.replace("_", "-")     # the name vLLM's docs use
            names.append(own if own in options else next(o for o in options if o.startswith("--")))
    return sorted(names)


def cli_overrides(serve_args: str | None, bench_args: str | None, *, ignore_unsupported: bool,
                  log=None) -> list[tuple[str, Any]]:
    """``kvsim run --serve-args ... --bench-args ...`` as ``--set``-style overrides.

    ``log`` (e.g. a print to stderr) receives one line naming the flags that
    were ignored or have no effect, so nothing is dropped silently.
    """
    overrides: list[tuple[str, Any]] = []
    for text, mapper, label in ((serve_args, map_serve_args, "--serve-args"),
                                (bench_args, map_bench_args, "--bench-args")):
        if text is None:
            continue
        mapped = mapper(text, ignore_unsupported=ignore_unsupported)
        overrides += mapped.overrides
        if log is not None and mapped.ignored:
            log(f"{label}: ignored (not modelled by kvsim): {', '.join(mapped.ignored)}")
        if log is not None and mapped.no_effect:
            log(f"{label}: no effect on a simulation: {', '.join(mapped.no_effect)}")
    models = [value for key, value in overrides if key == "model"]
    if len(set(models)) > 1:
        raise VllmArgsError(f"--serve-args and --bench-args name different models "
                            f"({models[0]!r}, {models[1]!r}); keep one")
    return overrides


def expand_scenario_args(data: dict) -> dict:
    """Replace ``engine.serve_args`` / ``workload.bench_args`` of a scenario mapping by their keys.

    A key that a command line sets and the file also sets is an error (which
    one should win is not obvious); ``--set`` overrides still apply afterwards.
    """
    engine = data.get("engine")
    if isinstance(engine, dict) and "serve_args" in engine:
        engine = dict(engine)
        text = engine.pop("serve_args")
        data = {**data, "engine": engine}
        mapped = map_serve_args(_text(text, "engine.serve_args"), label="engine.serve_args")
        data = _merge(data, mapped.overrides, "engine.serve_args")
    workload = data.get("workload")
    if isinstance(workload, dict) and "bench_args" in workload:
        rest = {k: v for k, v in workload.items() if k != "bench_args"}
        if rest:
            raise VllmArgsError(f"workload.bench_args: describes the whole workload; remove "
                                f"workload.{sorted(rest)[0]} (or put it in the bench_args)")
        mapped = map_bench_args(_text(workload["bench_args"], "workload.bench_args"),
                                label="workload.bench_args")
        data = {**data, "workload": {}}
        data = _merge(data, mapped.overrides, "workload.bench_args")
    return data


# --------------------------------------------------------------------------- private

def _text(value, path: str) -> str:
    if not isinstance(value, (str, list)):
        raise VllmArgsError(f"{path}: expected a string of flags, got {value!r}")
    return value


def _merge(data: dict, overrides: list[tuple[str, Any]], path: str) -> dict:
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for key, value in overrides:
        section, _, sub = key.partition(".")
        if not sub:
            if data.get(section) not in (None, {}) and data[section] != value:
                raise VllmArgsError(f"{path} sets {section} but the scenario sets it too "
                                    f"({data[section]!r}); keep one")
            data[section] = value
            continue
        target = data.setdefault(section, {})
        if not isinstance(target, dict):
            raise VllmArgsError(f"{path} sets {key} but {section} is {target!r}, not a mapping")
        if isinstance(value, dict) and isinstance(target.get(sub), dict):
            # engine.speculative_config from the flags, its acceptance from the file
            target[sub] = _merge_mapping(target[sub], value, f"{path} sets {key}")
            continue
        if sub in target and target[sub] != value:
            raise VllmArgsError(f"{path} sets {key} = {value!r} but the scenario sets it to "
                                f"{target[sub]!r}; keep one")
        target[sub] = value
    return data


def _merge_mapping(given: dict, flags: dict, where: str) -> dict:
    """The file's mapping and the flags' one; a key both set differently is an error."""
    out = dict(given)
    for k, v in flags.items():
        if k in out and out[k] != v:
            raise VllmArgsError(f"{where}.{k} = {v!r} but the scenario sets it to {out[k]!r}; "
                                f"keep one")
        out[k] = v
    return out


def _map(prog: _Program, args, ignore_unsupported: bool, label: str | None) -> Mapped:
    label = label or prog.label
    try:
        given = parse_options(split_command(args, program=prog.name), prog.options,
                              program=prog.name, positional=prog.positional)
    except VllmArgsError as exc:
        raise VllmArgsError(f"{label}: {exc}{_version_note(exc)}") from None
    no_effect_dests = {d for dests in prog.table.NO_EFFECT.values() for d in dests}
    overrides: dict[str, Any] = {}
    ignored, no_effect = [], []
    for g in given:
        to = prog.table.SUPPORTED.get(g.dest)
        if to is None:
            if g.dest in no_effect_dests:
                no_effect.append(g.option)
                continue
            if ignore_unsupported:
                ignored.append(g.shown())
                continue
            raise VllmArgsError(_unsupported(prog, label, g))
        try:
            value = to.rule.read(g)
            if to.convert is not None:
                value = to.convert(value)
        except Unmodelled as exc:
            if ignore_unsupported:
                ignored.append(g.shown())
                continue
            raise VllmArgsError(f"{label}: {_shown(g)}: a value vLLM accepts but kvsim does not "
                                f"model: {exc}; pass --ignore-unsupported to simulate without it") from None
        except VllmArgsError as exc:
            raise VllmArgsError(f"{label}: {exc}") from None
        if value is DEFAULT or to.key is None:
            continue
        overrides.pop(to.key, None)            # a later flag wins, as in argparse
        overrides[to.key] = value
    if prog is SERVE:
        overrides = fold_speculative(overrides, label)
    return Mapped(list(overrides.items()), ignored, list(dict.fromkeys(no_effect)))


def _shown(g: Given) -> str:
    return g.value if g.option == "MODEL" else g.shown()


def _unsupported(prog: _Program, label: str, g: Given) -> str:
    planned = prog.table.PLANNED.get(g.dest)
    why = f" yet ({planned})" if planned else ""
    return (f"{label}: {g.option}: kvsim does not model this {prog.name} flag{why}; supported: "
            f"{', '.join(supported_flags('serve' if prog is SERVE else 'bench'))}; "
            f"pass --ignore-unsupported to simulate without it")


def _version_note(exc: VllmArgsError) -> str:
    if "not a vllm" in str(exc):
        return f" (vLLM {serve_flags.VLLM_VERSION})"
    return ""
