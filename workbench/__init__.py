"""workbench: fine-tune transformer models on NVIDIA GPUs, from Jupyter.

The public names are loaded lazily, so ``import workbench`` stays fast and does
not import torch until a training or GPU function is used.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "WorkbenchError": "workbench.errors",
    "ConfigError": "workbench.errors",
    "DataError": "workbench.errors",
    "ModelError": "workbench.errors",
    "TrainingError": "workbench.errors",
    "CheckpointError": "workbench.errors",
    "OutputDirLockedError": "workbench.errors",
    "TrainConfig": "workbench.config",
    "ModelChoice": "workbench.config",
    "DatasetChoice": "workbench.config",
    "RunSpec": "workbench.config",
    "doctor": "workbench.diagnostics.diagnose",
    "NoEventLogError": "workbench.errors",
    "fit": "workbench.frontend",
    "FitResult": "workbench.engine.results",
    "fit_distributed": "workbench.frontend",
    "result_from_disk": "workbench.engine.results",
    "watch": "workbench.frontend",
    "runs": "workbench.frontend",
    "RunsTable": "workbench.engine.runs",
    "sweep": "workbench.frontend",
    "record": "workbench.notebook_regression.record",
    "regress": "workbench.notebook_regression.run",
    "model_picker": "workbench.widgets.pickers",
    "dataset_picker": "workbench.widgets.dataset_picker",
    "pickers": "workbench.widgets.pickers",
    "GPUPanel": "workbench.widgets.gpu_panel",
    "estimate_vram": "workbench.sources.vram",
    "estimate_causal_vram": "workbench.sources.vram_causal",
    "Playground": "workbench.widgets.playground",
    "evaluate": "workbench.frontend",
    "EvaluationError": "workbench.errors",
    "export": "workbench.shipping.gguf_export",
    "ExportError": "workbench.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
