"""`workbench doctor`: find the environment traps that waste days, name each one, give the fix.

The traps: an NVIDIA driver older than torch's CUDA build, a GPU too old for the
kernels torch ships, a 64 MB /dev/shm that kills DataLoader workers, checkpoints
written inside a container layer that is deleted with the container, a Jupyter
server anyone can use.

Three layers, so every check can be tested with plain inputs:

* ``gather_*()`` collect *facts* (dataclasses) from torch, ``workbench.gpu``
  (the only NVML user), ``os`` and ``/proc``. They never raise for a missing
  GPU, driver or package: the absence is a fact.
* ``check_*()`` are pure functions from facts to a :class:`CheckResult`
  (level ``ok`` / ``warn`` / ``error``, a message, and the fix).
* :class:`DoctorReport` renders the results: a text table for terminals, an
  HTML table in notebooks (``workbench.doctor()`` as the last line of a cell),
  JSON for machines.

Modules, one job each:

    values.py           version strings and byte sizes
    report.py           CheckResult, DoctorReport and its text/HTML/JSON rendering (JSON schema)
    mounts.py           /proc/self/mountinfo parsing and container detection
    facts.py            the facts dataclasses and gather_*() for Python, torch, GPUs, /dev/shm,
                        directories, Hugging Face and Jupyter
    checks_software.py  Python, packages, torch build, torch.cuda
    checks_gpu.py       driver vs CUDA build, GPU arch coverage, bf16, MIG (the rules)
    checks_system.py    /dev/shm and the output directory (writable, space, volume)
    checks_hub.py       Hugging Face cache, offline mode, hub reachability
    checks_jupyter.py   Jupyter token/password
    diagnose.py         gather_facts(), build_report(), doctor()
    cli.py              add_arguments()/run_cli() for `workbench doctor`

Every name is re-exported here, so ``workbench.doctor.X`` works as it did when
the doctor was one module.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from workbench.doctor.checks_gpu import (
    EXACT_ONLY_SM,
    MINOR_COMPAT_MIN_DRIVER,
    TOOLKIT_MIN_DRIVER,
    TORCH_WHEEL_CUDA,
    arch_coverage,
    check_bf16,
    check_driver,
    check_gpu_arch,
    check_mig,
)
from workbench.doctor.checks_gpu import _arch_code as _arch_code
from workbench.doctor.checks_gpu import _cuda_tuple as _cuda_tuple
from workbench.doctor.checks_gpu import _min_driver_for as _min_driver_for
from workbench.doctor.checks_gpu import _release_suggestion as _release_suggestion
from workbench.doctor.checks_hub import (
    HUB_TIMEOUT_S,
    check_hub_cache,
    check_hub_offline,
    check_hub_reachable,
    probe_url,
)
from workbench.doctor.checks_hub import _head as _head
from workbench.doctor.checks_jupyter import check_jupyter
from workbench.doctor.checks_software import (
    MIN_PYTHON,
    check_cuda_available,
    check_package,
    check_python,
    check_torch_build,
)
from workbench.doctor.checks_system import (
    OUTPUT_MIN_FREE_BYTES,
    SHM_FIX,
    SHM_MIN_BYTES,
    VOLUME_FIX,
    check_output_space,
    check_output_volume,
    check_output_writable,
    check_shm,
)
from workbench.doctor.cli import add_arguments, run_cli
from workbench.doctor.diagnose import (
    DoctorFacts,
    build_report,
    default_output_dir,
    doctor,
    gather_facts,
)
from workbench.doctor.diagnose import _plain as _plain
from workbench.doctor.facts import (
    REQUIRED_PACKAGES,
    DirFacts,
    HubFacts,
    JupyterFacts,
    PythonFacts,
    ServerFacts,
    ShmFacts,
    TorchFacts,
    gather_dir,
    gather_gpus,
    gather_hub,
    gather_jupyter,
    gather_python,
    gather_shm,
    gather_torch,
    probe_writable,
)
from workbench.doctor.facts import _format_cudnn as _format_cudnn
from workbench.doctor.mounts import (
    CONTAINER_CGROUP_WORDS,
    CONTAINER_MARKERS,
    MountEntry,
    detect_container,
    find_mount,
    gather_container,
    parse_mountinfo,
)
from workbench.doctor.mounts import _read_text as _read_text
from workbench.doctor.mounts import _unescape_mount as _unescape_mount
from workbench.doctor.report import (
    ERROR,
    JSON_VERSION,
    LEVELS,
    OK,
    WARN,
    CheckResult,
    DoctorReport,
)
from workbench.doctor.values import GiB, MiB, format_bytes
from workbench.doctor.values import _version_tuple as _version_tuple

__all__ = [
    # results and rendering
    "OK", "WARN", "ERROR", "LEVELS", "JSON_VERSION", "CheckResult", "DoctorReport",
    # the doctor and its CLI
    "doctor", "build_report", "gather_facts", "default_output_dir", "DoctorFacts",
    "add_arguments", "run_cli",
    # facts
    "REQUIRED_PACKAGES", "PythonFacts", "TorchFacts", "ShmFacts", "DirFacts", "HubFacts",
    "ServerFacts", "JupyterFacts", "gather_python", "gather_torch", "gather_gpus", "gather_shm",
    "gather_dir", "gather_hub", "gather_jupyter", "probe_writable",
    "MountEntry", "CONTAINER_MARKERS", "CONTAINER_CGROUP_WORDS", "parse_mountinfo", "find_mount",
    "detect_container", "gather_container",
    # checks and their thresholds
    "MIN_PYTHON", "check_python", "check_package", "check_torch_build", "check_cuda_available",
    "TOOLKIT_MIN_DRIVER", "TORCH_WHEEL_CUDA", "MINOR_COMPAT_MIN_DRIVER", "EXACT_ONLY_SM",
    "check_driver", "arch_coverage", "check_gpu_arch", "check_bf16", "check_mig",
    "SHM_MIN_BYTES", "OUTPUT_MIN_FREE_BYTES", "SHM_FIX", "VOLUME_FIX", "check_shm",
    "check_output_writable", "check_output_space", "check_output_volume",
    "HUB_TIMEOUT_S", "check_hub_cache", "check_hub_offline", "probe_url", "check_hub_reachable",
    "check_jupyter",
    # values
    "GiB", "MiB", "format_bytes",
]


class _CallableModule(types.ModuleType):
    """``workbench.doctor`` names both this package and its doctor() function: ``workbench``
    exports the function lazily, but once any ``workbench.doctor`` module has been imported
    the import system sets the package attribute to this package. Calling the package runs
    doctor(), so ``workbench.doctor()`` works whatever was imported first."""

    def __call__(self, *args: Any, **kwargs: Any) -> DoctorReport:
        return doctor(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
