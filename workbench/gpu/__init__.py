"""GPU queries through NVML, returned as plain data.

Import everything from here (``from workbench.gpu import nvml_status``); the
modules behind it each have one job:

- ``samples``: the frozen dataclasses every call returns (NvmlStatus, DeviceInfo,
  GpuSample, Snapshot, ...).
- ``nvml``: the only importer of ``pynvml``: loading, the init-once session and
  handle cache, NVML error -> one-line reason, ``nvml_status``, ``list_devices``.
- ``reader``: ``GpuReader``, one Snapshot per call with per-GPU back-off.
- ``sampler``: ``Sampler``, the background thread and its bounded history.
- ``torch_allocator``: this kernel's PyTorch memory; free cached memory.
- ``host``: CPU and RAM through psutil.

It knows nothing of widgets: the panel (``workbench.widgets.gpu_panel``) draws
what it returns. Every NVML call takes an optional ``nvml`` argument, a module
with pynvml's interface, so tests inject a fake (tests/fake_nvml.py).

Rules the package keeps:
- It never raises for a missing library, driver or GPU: the answer says so
  (``available=False`` with a one-line ``reason``).
- A metric the GPU does not support (MIG slices have no utilization) is
  ``None``, drawn as "n/a", never 0.
- One broken GPU does not blank the others: its entry carries ``error``.
- NVML is initialised once per module object and its handles are cached; a
  lost GPU or a reloaded driver drops the session and re-initialises later,
  with a back-off.
"""

from __future__ import annotations

import logging

from workbench.gpu.host import host_sample
from workbench.gpu.nvml import (
    NvmlSession,
    describe_error,
    error_name,
    list_devices,
    nvml_status,
    session_for,
)
from workbench.gpu.reader import CONTEXT_ALLOWANCE_BYTES as CONTEXT_ALLOWANCE_BYTES
from workbench.gpu.reader import FOREIGN_LOAD_PERCENT as FOREIGN_LOAD_PERCENT
from workbench.gpu.reader import FOREIGN_THRESHOLD_BYTES as FOREIGN_THRESHOLD_BYTES
from workbench.gpu.reader import GpuReader
from workbench.gpu.sampler import Sampler
from workbench.gpu.samples import GIB as GIB
from workbench.gpu.samples import MIB as MIB
from workbench.gpu.samples import (
    DeviceInfo,
    FreeMemoryResult,
    GpuProcess,
    GpuSample,
    HostSample,
    NvmlStatus,
    Snapshot,
    TorchMemory,
)
from workbench.gpu.torch_allocator import free_cached_memory, reset_torch_peak, torch_memory

# The parent of the submodules' loggers ("workbench.gpu.sampler", ...): configure this one.
log = logging.getLogger(__name__)

# Unchanged from the single-module days, so `from workbench.gpu import *` gives the same names.
__all__ = [
    "DeviceInfo", "FreeMemoryResult", "GpuProcess", "GpuReader", "GpuSample", "HostSample",
    "NvmlSession", "NvmlStatus", "Sampler", "Snapshot", "TorchMemory", "describe_error",
    "error_name", "free_cached_memory", "host_sample", "list_devices", "nvml_status",
    "reset_torch_peak", "session_for", "torch_memory",
]
