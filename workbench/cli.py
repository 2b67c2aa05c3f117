"""`workbench doctor | lab | train | watch | runs | sweep | regress | classroom | evaluate | export`: a thin map onto library functions.

Each subcommand lives in the module that does the work, which provides
``add_arguments(parser)`` and ``run_cli(args) -> int``. Only the chosen
subcommand's module is imported, so `workbench doctor` never pays for importing
the training stack and `workbench --help` answers at once.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from workbench.errors import WorkbenchError

# name -> (module, one-line help)
SUBCOMMANDS = {
    "doctor": ("workbench.diagnostics.cli", "diagnose the GPU, CUDA, PyTorch and Jupyter environment"),
    "lab": ("workbench.server.lab", "start a token-protected JupyterLab with the workbench"),
    "train": ("workbench.engine.train_cli", "fine-tune from a parameter file (works under torchrun)"),
    "watch": ("workbench.engine.watcher", "follow a run's progress from its event log"),
    "runs": ("workbench.engine.runs", "a table of every run under a folder (status, metrics, differing settings)"),
    "sweep": ("workbench.sweep.cli", "run a notebook once per combination of settings (here, or as a Slurm array)"),
    "regress": ("workbench.notebook_regression.cli", "run the notebooks headless and compare metrics with baselines"),
    "classroom": ("workbench.classroom.cli", "the class service on a JupyterHub: serve, export, reset its results"),
    "evaluate": ("workbench.evaluation.cli", "benchmark a run or model with lm-evaluation-harness (or a classifier on a labelled file)"),
    "export": ("workbench.shipping.gguf_export", "export a run's model to GGUF (llama.cpp, Ollama) with its Modelfile and card"),
}


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workbench", description="Fine-tune transformer models on NVIDIA GPUs, from Jupyter."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module_name).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if a in SUBCOMMANDS), None)
    args = build_parser(chosen).parse_args(argv)
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    try:
        return int(module.run_cli(args) or 0)
    except WorkbenchError as exc:
        # A known problem: one clear message with the fix, no traceback.
        print(f"workbench {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"workbench {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
