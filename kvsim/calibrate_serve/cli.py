"""``kvsim calibrate serve``: fit engine-overhead terms to serving runs (docs/calibrate_serve.md).

    kvsim calibrate serve runs.yaml --out engine_fit.json
    kvsim calibrate serve --scenario server.yaml --train a.json b.json --test c.json \\
        --engine-preset vllm-v1 --fit step_s per_request_s --out engine_fit.json

The fit file is what a scenario then names: ``cost_model: {..., engine_overhead:
engine_fit.json}`` (its preset and any fitted ``gpu_scale`` come with it).
Registered by ``kvsim/cost/cli.py``; nothing here is imported until the
command runs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="fit engine-overhead terms to `vllm bench serve` results by "
                                     "replaying them (docs/calibrate_serve.md)")
    p.add_argument("manifest", nargs="?", default=None,
                   help="YAML listing runs: scenario (server settings) + results + split")
    p.add_argument("--scenario", default=None,
                   help="server settings for --train/--test results (one server, no manifest)")
    p.add_argument("--train", nargs="*", default=[], help="results files to fit on")
    p.add_argument("--test", nargs="*", default=[], help="results files to predict only")
    p.add_argument("--engine-preset", default=None,
                   help="preset whose terms are fitted (default: the manifest's or scenario's)")
    p.add_argument("--fit", nargs="*", default=None,
                   help="terms to fit (default: step_s per_request_s per_prefill_request_s; also "
                        "per_sampled_token_s, tp_hop_s, gpu_scale, ...); none: evaluate only")
    p.add_argument("--max-evals", type=int, default=60, help="simulations the search may use")
    p.add_argument("--out", default=None, help="fit JSON to write (cost_model.engine_overhead)")
    p.add_argument("--report", default=None, help="markdown table of the errors to write")
    p.set_defaults(func=_serve)


def _runs_from_args(args):
    from kvsim.calibrate_serve.results import ServingRun, _scenario_mapping, read_manifest, read_results
    if args.manifest:
        if args.scenario or args.train or args.test:
            raise ValueError("give either a manifest or --scenario with --train/--test, not both")
        return read_manifest(args.manifest)
    if not args.scenario or not (args.train or args.test):
        raise ValueError("needs a manifest, or --scenario SERVER.yaml with --train (and --test) "
                         "results files")
    scenario = _scenario_mapping(str(Path(args.scenario).resolve()), Path("."), "--scenario")
    runs = [ServingRun(Path(f).stem, scenario, read_results(f), split)
            for split, files in (("train", args.train), ("test", args.test)) for f in files]
    return runs, {}


def _serve(args: argparse.Namespace) -> int:
    from kvsim.calibrate_serve.fit import DEFAULT_TERMS, fit_serving_runs, markdown

    runs, options = _runs_from_args(args)
    preset = (args.engine_preset or options.get("engine_preset")
              or (runs[0].scenario.get("cost_model") or {}).get("engine_preset"))
    if not preset:
        raise ValueError("engine preset: none given (--engine-preset, the manifest's "
                         "engine_preset, or the scenario's cost_model.engine_preset)")
    terms = args.fit if args.fit is not None else options.get("fit", list(DEFAULT_TERMS))
    if not isinstance(terms, list):
        raise ValueError(f"fit: {terms!r}; expected a list of terms")
    if args.max_evals < 1:
        raise ValueError(f"--max-evals: {args.max_evals} is not a positive integer")
    from kvsim.scenario.outputs import atomic_open, check_output_file
    outputs = [(option, path) for option, path in (("--out", args.out), ("--report", args.report)) if path]
    for option, path in outputs:
        check_output_file(path, option=option)      # before the fit, which takes minutes
    with tempfile.TemporaryDirectory() as tmp:
        fit = fit_serving_runs(runs, Path(tmp), preset=preset, terms=tuple(terms),
                               max_evals=args.max_evals)
    table = markdown(fit)
    print(table)
    texts = {"--out": json.dumps(fit.as_json(), indent=1) + "\n", "--report": table + "\n"}
    for option, path in outputs:
        with atomic_open(path, option=option) as f:   # an old file stays whole if this fails
            f.write(texts[option])
        print(f"wrote {path}")
    return 0
