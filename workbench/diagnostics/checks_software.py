"""Checks of the software: Python, the required packages, torch's build, and whether torch
can use the GPU the driver sees."""

from __future__ import annotations

from typing import Any

from workbench.diagnostics.facts import TorchFacts
from workbench.diagnostics.report import ERROR, OK, WARN, CheckResult
from workbench.diagnostics.values import _version_tuple

MIN_PYTHON = (3, 10)


def check_python(version: str, minimum: tuple[int, int] = MIN_PYTHON) -> CheckResult:
    if _version_tuple(version)[:2] < minimum:
        need = ".".join(map(str, minimum))
        return CheckResult(
            "python", ERROR, f"Python {version} is too old: workbench needs Python >= {need}.",
            f"Create the environment with Python {need} or newer (in a workbench checkout: "
            "PYTHON=/path/to/python3 bash scripts/setup.sh).",
        )
    return CheckResult("python", OK, f"Python {version}")


def check_package(name: str, version: str | None, minimum: str | None = None) -> CheckResult:
    if version is None:
        return CheckResult(
            name, ERROR, f"{name} is not installed.",
            f"pip install '{name}>={minimum or '0'}' (in a workbench checkout, the pinned set: "
            "bash scripts/setup.sh).",
        )
    if minimum and _version_tuple(version) < _version_tuple(minimum):
        return CheckResult(
            name, ERROR, f"{name} {version} is older than the {minimum} workbench needs.",
            f"pip install -U '{name}>={minimum}' (in a workbench checkout, the pinned set: "
            "bash scripts/setup.sh).",
        )
    return CheckResult(name, OK, f"{name} {version}")


def check_torch_build(t: TorchFacts) -> CheckResult:
    if t.version is None:
        return CheckResult(
            "torch build", ERROR, f"torch cannot be imported: {t.import_error}",
            "Reinstall torch (the command for your machine: https://pytorch.org/get-started/locally/; "
            "in a workbench checkout: bash scripts/setup.sh).",
        )
    if not t.cuda_build:
        return CheckResult("torch build", OK, f"torch {t.version}: CPU-only build (no CUDA)")
    parts = [f"CUDA {t.cuda_build}", f"cuDNN {t.cudnn or 'none'}", f"NCCL {t.nccl or 'none'}"]
    return CheckResult("torch build", OK, f"torch {t.version}: " + ", ".join(parts))


def check_cuda_available(t: TorchFacts, status: Any) -> CheckResult:
    """Can torch use the GPU? ``status`` is the NVML status (``workbench.gpu.NvmlStatus``)."""
    name = "torch.cuda"
    if t.version is None:
        return CheckResult(name, WARN, "not checked: torch cannot be imported.", "See 'torch build'.")
    if t.cuda_available:
        return CheckResult(name, OK, f"torch.cuda.is_available() = True, {t.device_count} device(s)")
    driver_ok = bool(getattr(status, "available", False))
    hidden = t.cuda_visible_devices
    if not driver_ok:
        return CheckResult(
            name, WARN,
            "torch.cuda.is_available() = False: no usable NVIDIA GPU, training runs on the CPU.",
            "See 'nvidia driver' for how to give this environment a GPU.",
        )
    if not t.cuda_build:
        return CheckResult(
            name, ERROR,
            f"The NVIDIA driver sees {getattr(status, 'device_count', '?')} GPU(s) but torch "
            f"{t.version} is a CPU-only build: training would silently run on the CPU.",
            "Install a CUDA build of torch: pick the command at "
            "https://pytorch.org/get-started/locally/ (in a workbench checkout, the pinned set "
            "is environment/requirements-gpu.txt; the Docker image has it built in).",
        )
    if hidden is not None and hidden.strip() in ("", "-1"):
        return CheckResult(
            name, ERROR, f"torch.cuda.is_available() = False: CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU.",
            "unset CUDA_VISIBLE_DEVICES, or set it to the GPU indices to use (e.g. 0,1).",
        )
    reason = t.cuda_error or "torch gave no reason"
    return CheckResult(
        name, ERROR, f"The NVIDIA driver works but torch cannot initialise CUDA: {reason}",
        "Check 'nvidia driver' below (driver too old for this build?); in Docker, start with "
        "--gpus all and the NVIDIA Container Toolkit.",
    )
