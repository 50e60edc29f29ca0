"""``kvsim calibrate fit | report | serve``: turn measurements into a cost profile, and publish errors.

This is a command module (the CLI layer, like every ``cli.py``): ``report``
drives ``kvsim.reports.calibration``, which replays serving runs through
``kvsim.simulate``. The folder of published tables is ``--data`` (default
``$KVSIM_PROFILE_DATA``, else ``../shared/data/profiles`` relative to the
current directory: the repository root in a checkout).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvsim.cost.fitted import PROFILE_DIR


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("calibrate", help="fit cost-model profiles; write the calibration report")
    sub = parser.add_subparsers(dest="calibrate_command", metavar="ACTION")

    fit = sub.add_parser("fit", help="fit a profile to a calibration CSV (format: calibration/README.md)")
    fit.add_argument("--data", required=True, help="measurements CSV (e.g. from python -m calibration.harness)")
    fit.add_argument("--gpu", required=True, help="GPU the data was measured on (catalog name)")
    fit.add_argument("--model", required=True, help="model whose shapes the data was measured at")
    fit.add_argument("--tp", type=int, default=1, help="tensor-parallel degree of the shapes (default 1)")
    fit.add_argument("--for-model", default=None,
                     help="model the profile is for, if not --model (coefficients carry over by FLOPs and bytes)")
    fit.add_argument("--name", default=None, help="profile name (default GPU_MODEL_tpN)")
    fit.add_argument("--out", required=True, help="profile JSON to write")
    fit.set_defaults(func=_fit)

    report = sub.add_parser("report", help="write reports/calibration.md and its figures")
    report.add_argument("--out", default="reports/calibration.md")
    report.add_argument("--data", default=None, metavar="DIR",
                        help="folder of the published tables (vidur/, splitwise/, llmservingsim/, "
                             "apex_plus/); default $KVSIM_PROFILE_DATA, else "
                             "../shared/data/profiles relative to the current directory")
    report.add_argument("--refit", action="store_true",
                        help="refit the published profiles from the --data tables first")
    report.add_argument("--profiles", nargs="*", default=None, help="only these profiles")
    report.add_argument("--profile-dir", default=str(PROFILE_DIR))
    report.add_argument("--no-figures", action="store_true")
    report.add_argument("--no-replay", action="store_true",
                        help="skip replaying the vLLM serving runs through kvsim.simulate")
    report.set_defaults(func=_report)
    # `kvsim calibrate serve` replays serving runs through the simulator, so it lives above
    # it (kvsim/calibrate_serve/cli.py); only its registration is here.
    from kvsim.calibrate_serve.cli import add_serve_parser
    add_serve_parser(sub)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def _fit(args: argparse.Namespace) -> int:
    import pandas as pd

    from kvsim.cost.fit import fit_profile
    from kvsim.cost.fitted import dump_profile
    from kvsim.specs.catalog import load_gpu, load_model

    if args.tp < 1:
        raise ValueError(f"--tp: {args.tp} is not a positive integer")
    path = Path(args.data)
    if not path.exists():
        raise FileNotFoundError(f"--data: {path} does not exist")
    data = pd.read_csv(path)
    for col in ("kind", "time_s"):
        if col not in data.columns:
            raise ValueError(f"--data: {path} has no {col!r} column (format: calibration/README.md)")
    model = load_model(args.model)
    gpu = load_gpu(args.gpu)
    target = load_model(args.for_model) if args.for_model else model
    profile = fit_profile(data, model=model, gpu=gpu, tp=args.tp, name=args.name,
                          target_model=target,
                          sources=[{"part": "all", "file": str(path), "rows": "all",
                                    "n_rows": int(len(data))}])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dump_profile(profile))
    print(f"wrote {out}")
    for part, err in profile["errors"].items():
        print(f"  {part:22s} held-out APE median {err['fitted_median_ape']:6.2f}%  "
              f"p90 {err['fitted_p90_ape']:6.2f}%   (roofline {err['roofline_median_ape']:6.2f}% / "
              f"{err['roofline_p90_ape']:6.2f}%)")
    return 0


def _report(args: argparse.Namespace) -> int:
    from kvsim.cost.published import data_root
    from kvsim.reports.calibration import refit_published, write_report

    root = data_root(args.data)          # a missing folder is a one-line error before any work
    profile_dir = Path(args.profile_dir)
    if args.refit:
        for path in refit_published(args.profiles, profile_dir, root=root):
            print(f"refit {path}")
    out = write_report(Path(args.out), root=root, profile_dir=profile_dir,
                       figures=not args.no_figures, names=args.profiles, replay=not args.no_replay)
    print(f"wrote {out}")
    return 0
