"""GpuReader: one Snapshot of every GPU per call, with failures kept apart.

Cheap metrics are read every call; the process list (the slow NVML call) at a
slower rate. One broken GPU does not blank the others: its last values come
back marked stale with the reason, and it is retried after a back-off; when
every GPU fails with a session-breaking error (driver reloaded, GPU lost) the
NVML session is dropped and re-initialised no sooner than its own back-off.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from workbench.gpu.host import host_sample
from workbench.gpu.nvml import (
    SESSION_BREAKING,
    describe_error,
    error_name,
    nvml_status,
    optional,
    session_for,
    to_text,
)
from workbench.gpu.samples import GIB, MIB, GpuProcess, GpuSample, NvmlStatus, Snapshot, TorchMemory
from workbench.gpu.torch_allocator import torch_memory

# A CUDA context costs this much beyond what the caching allocator reports.
CONTEXT_ALLOWANCE_BYTES = 768 * MIB
# Memory beyond this, held by no process of this container, is flagged.
FOREIGN_THRESHOLD_BYTES = 256 * MIB
# Utilization at or above this with no process of ours is flagged.
FOREIGN_LOAD_PERCENT = 10.0


class GpuReader:
    """Reads one Snapshot per call. Cheap metrics every call; processes less often.

    ``process_interval``: seconds between process-list queries (the slow NVML
    call). After a session-breaking error (GPU lost, driver reloaded) NVML is
    re-initialised no sooner than the back-off allows (doubling, capped), and
    meanwhile the last values are returned marked stale.
    """

    def __init__(
        self,
        nvml: Any = None,
        process_interval: float = 5.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._nvml_arg = nvml
        self.process_interval = process_interval
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._clock = clock
        self._processes: dict[tuple[int, int | None], tuple[Any, ...] | None] = {}
        self._processes_at = -math.inf
        self._last: dict[tuple[int, int | None], GpuSample] = {}
        self._nvml_backoff = _Backoff(backoff_initial, backoff_max)
        self._device_backoff: dict[int, _Backoff] = {}
        self.process_queries = 0  # for tests and the benchmark
        self._lock = threading.Lock()

    # -- public

    def read(self) -> Snapshot:
        # The sampler thread and a direct refresh() may call at once; the caches need one reader.
        with self._lock:
            return self._read()

    def _read(self) -> Snapshot:
        now = self._clock()
        host = host_sample()
        torch_mem = torch_memory()
        session = session_for(self._nvml_arg)
        if isinstance(session, NvmlStatus):
            return Snapshot(time.time(), session, (), host, torch_mem)
        backoff = self._nvml_backoff
        if backoff.waiting(now):
            return Snapshot(time.time(), NvmlStatus(False, backoff.reason, None, None, 0, backoff.delay),
                            tuple(self._stale(None, backoff)), host, torch_mem,
                            stale=bool(self._last))
        status = nvml_status(session.nvml)
        if not status.available:
            backoff.fail(now, status.reason)
            return Snapshot(time.time(), replace(status, retry_in_s=backoff.delay),
                            tuple(self._stale(None, backoff)),
                            host, torch_mem, stale=bool(self._last))
        refresh_processes = now - self._processes_at >= self.process_interval
        if refresh_processes:
            self._processes_at = now
            self.process_queries += 1
        gpus: list[GpuSample] = []
        failed, breaking = 0, None
        for index in range(status.device_count):
            backoff = self._device_backoff.setdefault(
                index, _Backoff(self.backoff_initial, self.backoff_max))
            if backoff.waiting(now):
                gpus.extend(self._stale(index, backoff))
                failed += 1
                continue
            samples, exc = self._read_gpu(session, index, torch_mem, refresh_processes)
            if exc is None:
                backoff.ok()
                gpus.extend(samples)
                continue
            # This GPU failed: keep its last values marked stale, drop its cached handle,
            # and try it again after a back-off. The other GPUs are unaffected.
            failed += 1
            backoff.fail(now, describe_error(exc, session.nvml))
            session.forget(index)
            gpus.extend(self._stale(index, backoff))
            if error_name(exc, session.nvml) in SESSION_BREAKING:
                breaking = exc
        if breaking is not None and failed == status.device_count:
            # Every GPU is gone at once: the driver was reloaded or lost; start NVML afresh.
            session.reset()
            self._nvml_backoff.fail(now, describe_error(breaking, session.nvml))
        else:
            self._nvml_backoff.ok()
        return Snapshot(time.time(), status, tuple(gpus), host, torch_mem)

    # -- one GPU

    def _read_gpu(self, session, index, torch_mem, refresh_processes):
        """Samples of the GPU and its MIG slices, and the error that broke the GPU (or None)."""
        try:
            handle = session.handle(index)
            slices = session.mig_handles(index)
        except Exception as exc:
            return [], exc
        sample, exc = self._read_one(session, (index, None), handle, False, torch_mem,
                                     refresh_processes)
        if exc is not None:
            return [], exc
        samples = [sample]
        for mig_index, mig_handle in slices:
            # A slice that fails carries its own error; it does not fail the GPU.
            mig_sample, _ = self._read_one(session, (index, mig_index), mig_handle, True,
                                           torch_mem, refresh_processes)
            samples.append(mig_sample)
        return samples, None

    def _read_one(self, session, key, handle, is_mig, torch_mem, refresh_processes):
        nvml = session.nvml
        index, mig_index = key
        try:
            name = to_text(nvml.nvmlDeviceGetName(handle))
            uuid = optional(nvml, lambda: to_text(nvml.nvmlDeviceGetUUID(handle)))
            used, total = _memory(nvml, handle)
            util = optional(nvml, lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            temp = optional(nvml, lambda: float(nvml.nvmlDeviceGetTemperature(
                handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0))))
            power = optional(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
            limit = optional(nvml, lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)
            if refresh_processes or key not in self._processes:
                self._processes[key] = self._read_processes(nvml, handle)
        except Exception as exc:
            reason = describe_error(exc, nvml)
            last = self._last.get(key)
            if last is not None:
                return replace(last, error=reason, stale=True), exc
            label = f"GPU {index} MIG {mig_index}" if is_mig else f"GPU {index}"
            return GpuSample(index, label, None, is_mig, mig_index, None, None, None, None, None,
                             None, None, None, error=reason), exc
        mine = _match_torch(uuid, index, torch_mem) if not is_mig or uuid else None
        processes = self._processes.get(key)
        foreign, warnings = _foreign_use(used, util, processes, mine)
        sample = GpuSample(index, name, uuid, is_mig, mig_index, util, used, total, temp, power,
                           limit, processes, foreign, warnings, torch=mine)
        self._last[key] = sample
        return sample, None

    def _read_processes(self, nvml, handle) -> tuple[GpuProcess, ...] | None:
        seen: dict[int, GpuProcess] = {}
        readable = False
        for query in ("nvmlDeviceGetComputeRunningProcesses",
                      "nvmlDeviceGetGraphicsRunningProcesses"):
            fn = getattr(nvml, query, None)
            if fn is None:
                continue
            try:
                entries = fn(handle)
            except Exception as exc:
                if error_name(exc, nvml) in SESSION_BREAKING:
                    raise
                continue  # NOT_SUPPORTED / NO_PERMISSION: this list is unreadable
            readable = True
            for entry in entries:
                pid = int(entry.pid)
                used = getattr(entry, "usedGpuMemory", None)
                if pid not in seen:
                    seen[pid] = _process(pid, int(used) if used is not None else None)
        return tuple(seen.values()) if readable else None

    def _stale(self, index: int | None, backoff: _Backoff) -> list[GpuSample]:
        """Last values of GPU ``index`` (all GPUs if None) marked stale with the back-off's reason."""
        reason, retry = backoff.reason, backoff.delay
        stale = [replace(s, error=reason, stale=True, retry_in_s=retry) for key, s in self._last.items()
                 if index is None or key[0] == index]
        if not stale and index is not None:
            stale = [GpuSample(index, f"GPU {index}", None, False, None, None, None, None, None,
                               None, None, None, None, error=reason, retry_in_s=retry)]
        return stale


class _Backoff:
    """Retry delays that double after each failure, up to a cap; reset by a success."""

    def __init__(self, initial: float, maximum: float):
        self.initial, self.maximum = initial, maximum
        self.delay = 0.0
        self.retry_at = -math.inf
        self.reason: str | None = None
        self.failures = 0

    def waiting(self, now: float) -> bool:
        return now < self.retry_at

    def fail(self, now: float, reason: str | None) -> None:
        self.failures += 1
        self.delay = min(self.maximum, max(self.initial, self.delay * 2))
        self.retry_at = now + self.delay
        self.reason = reason

    def ok(self) -> None:
        self.delay, self.retry_at, self.reason = 0.0, -math.inf, None


def _memory(nvml: Any, handle: Any) -> tuple[int, int]:
    """(used, total). Memory info v2 leaves driver-reserved memory out of "used"."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            info = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            return int(info.used), int(info.total)
        except Exception as exc:
            if error_name(exc, nvml) in SESSION_BREAKING:
                raise
            # older driver, or a MIG handle: fall back to v1
    info = nvml.nvmlDeviceGetMemoryInfo(handle)
    return int(info.used), int(info.total)


def _uuid_key(uuid: str | None) -> str | None:
    if not uuid:
        return None
    uuid = uuid.lower()
    return uuid.split("-", 1)[1] if uuid.startswith(("gpu-", "mig-")) else uuid


def _match_torch(uuid: str | None, index: int, torch_mem: tuple[TorchMemory, ...]):
    """The torch reading of the device NVML calls ``uuid`` (torch and NVML order may differ)."""
    key = _uuid_key(uuid)
    for reading in torch_mem:
        if key and _uuid_key(reading.uuid) == key:
            return reading
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        for reading in torch_mem:
            if reading.uuid is None and reading.device == index:
                return reading
    return None


def _foreign_use(used, util, processes, mine: TorchMemory | None):
    """Memory and load that no process of this container accounts for, and why it matters.

    A process counts as ours when its PID resolves in this container's /proc.
    Inside a container this kernel itself shows under a host PID, so what its
    PyTorch holds (plus a CUDA context) is subtracted before flagging.
    """
    warnings: list[str] = []
    if processes is None or used is None:
        return None, ()
    hidden = [p for p in processes if not p.visible]
    ours = sum(p.used_memory_bytes or 0 for p in processes if p.visible)
    own_listed = any(p.is_this_kernel for p in processes)
    own_estimate = 0
    if mine is not None and not own_listed:
        own_estimate = mine.reserved_bytes + CONTEXT_ALLOWANCE_BYTES
    foreign = max(0, used - ours - own_estimate)
    if hidden:
        warnings.append(f"{len(hidden)} process(es) with host PIDs not visible from this "
                        "container")
    if foreign > FOREIGN_THRESHOLD_BYTES:
        warnings.append(f"{foreign / GIB:.1f} GiB used by no process of this container "
                        "(another job on this GPU?)")
    busy_with_nothing = (util is not None and util >= FOREIGN_LOAD_PERCENT
                         and not any(p.visible for p in processes) and mine is None)
    if busy_with_nothing:
        warnings.append(f"{util:.0f}% load with no process of this container on this GPU")
    return foreign, tuple(warnings)


def _process(pid: int, used: int | None) -> GpuProcess:
    """Resolve a PID from NVML in this container's /proc; a host PID does not resolve."""
    name = None
    try:
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
    except OSError:
        pass
    return GpuProcess(pid, used, name is not None, name, is_this_kernel=pid == os.getpid())

