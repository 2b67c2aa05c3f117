"""`workbench train --config run.yaml`: the same fit() as in notebooks, from a terminal.

Works as is under ``torchrun --nproc_per_node N -m workbench train --config ...`` and
``accelerate launch -m workbench train --config ...``: fit() builds its Accelerator
from the environment those launchers set, and only rank 0 writes files.
"""

from __future__ import annotations

import argparse
import sys

from workbench.errors import ConfigError


def _parse_value(text: str):
    """``--set train.num_epochs=1``: the value is read as YAML (numbers, null, true...)."""
    import yaml

    from workbench.config_files import yaml_loader

    return yaml.load(text, Loader=yaml_loader())  # as in the file: 2e-5 is a number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE",
                        help="a RunSpec parameter file (.yaml, .yml or .json) with model, data, train")
    parser.add_argument("--output-dir", metavar="DIR", help="overrides train.output_dir")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override one field, e.g. --set train.num_epochs=1 (repeatable)")
    parser.add_argument("--progress", choices=("auto", "console", "none"), default="console",
                        help="console: one log line per event (default); none: quiet")


def load_spec(args: argparse.Namespace):
    from workbench.config import RunSpec

    values = RunSpec.load(args.config).to_dict()
    for item in args.set:
        key, sep, raw = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot or section not in values:
            raise ConfigError("--set", item, "SECTION.FIELD=VALUE with SECTION one of model, data, train",
                              fix="write it as --set train.num_epochs=1 (the section, a dot, the field, "
                                  "'=', the value).")
        values[section][name] = _parse_value(raw)
    if args.output_dir:
        values["train"]["output_dir"] = args.output_dir
    return RunSpec.from_dict(values)


def run_cli(args: argparse.Namespace) -> int:
    from workbench.engine.progress import ConsoleProgress
    from workbench.engine.train import fit

    spec = load_spec(args)
    # A terminal or a log file: plain lines (the notebook view is for kernels).
    view = ConsoleProgress()
    try:
        result = fit(spec.model, spec.data, spec.train, listeners=[] if args.progress == "none" else [view])
    finally:
        view.close()
    if result.status != "completed":
        return 130  # interrupted: the checkpoint is saved; the same command resumes
    if result.metrics and _is_main():
        shown = ", ".join(f"{k}={v:.4f}" for k, v in result.metrics.items())
        print(f"workbench train: completed: {shown}; model in {result.model_dir}", file=sys.stdout)
    return 0


def _is_main() -> bool:
    import os

    return os.environ.get("RANK", "0") == "0"
