"""`workbench regress` options, mapped one-to-one onto ``regress()``."""

from __future__ import annotations

import argparse

from workbench.notebook_regression.run import DEFAULT_OUTPUT_DIR, regress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile", default="ci", help="profile in the profiles file (default: ci)"
    )
    parser.add_argument(
        "--notebooks",
        nargs="+",
        metavar="NB",
        help="run only these notebooks of the profile (path, file name, stem or prefix like 01)",
    )
    parser.add_argument(
        "--output-dir",
        default=str(DEFAULT_OUTPUT_DIR),
        help="folder for executed notebooks, logs and report.md/json (default: regress-out)",
    )
    parser.add_argument(
        "--cell-timeout", type=float, metavar="S", help="seconds per cell (default: profile's)"
    )
    parser.add_argument(
        "--notebook-timeout",
        type=float,
        metavar="S",
        help="seconds per notebook (default: profile's)",
    )
    parser.add_argument(
        "--kernel", help="Jupyter kernel name (default: the profile's, usually python3)"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, metavar="N", help="notebooks run at once (default: 1)"
    )
    parser.add_argument(
        "--update-baselines",
        action="store_true",
        help="write this run's values into the baselines file (keeps direction/tolerance) for review",
    )
    # The defaults are the files shipped in the package: a checkout's own in its editable
    # install, so the command works the same from any folder and from an installed wheel.
    parser.add_argument(
        "--notebooks-dir",
        metavar="DIR",
        help="folder the profile's notebook paths are relative to "
        "(default: the shipped notebooks; in a checkout, its notebooks/)",
    )
    parser.add_argument(
        "--profiles-file", metavar="PATH", help="profiles YAML (default: the shipped profiles.yaml)"
    )
    parser.add_argument(
        "--baselines-file",
        metavar="PATH",
        help="baselines YAML (default: the shipped baselines.yaml; --update-baselines writes it "
        "only in a checkout, otherwise name the file to write)",
    )


def run_cli(args: argparse.Namespace) -> int:
    report = regress(
        args.profile,
        notebooks=args.notebooks,
        output_dir=args.output_dir,
        notebooks_dir=args.notebooks_dir,
        profiles_file=args.profiles_file,
        baselines_file=args.baselines_file,
        kernel=args.kernel,
        cell_timeout_s=args.cell_timeout,
        notebook_timeout_s=args.notebook_timeout,
        jobs=args.jobs,
        update_baselines=args.update_baselines,
    )
    if args.update_baselines:
        # The new values are the baselines now; only a notebook that did not run fails.
        return 1 if report.failed_notebooks else 0
    return 0 if report.ok else 1
