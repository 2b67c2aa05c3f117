"""`workbench doctor`: the CLI over :func:`workbench.diagnostics.diagnose.doctor`."""

from __future__ import annotations

import argparse

from workbench.diagnostics.diagnose import doctor


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON (schema: workbench/diagnostics/report.py)")
    parser.add_argument(
        "--output-dir", default=None, metavar="DIR",
        help="checkpoint directory to check (default: $WORKBENCH_OUTPUT_DIR or ./outputs)",
    )
    parser.add_argument("--no-network", action="store_true", help="skip the Hugging Face Hub reachability request")


def run_cli(args: argparse.Namespace) -> int:
    """Exit status: 1 when any check fails at level error, else 0 (warnings included)."""
    report = doctor(args.output_dir, check_network=not args.no_network)
    print(report.to_json() if args.json else report.to_text())
    return 0 if report.ok else 1
