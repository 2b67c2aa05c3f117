"""GPU queries through NVML, returned as plain data.

This is the only module that imports ``pynvml`` (from nvidia-ml-py). It knows
nothing of widgets: the panel (``workbench.widgets.gpu_panel``) draws what it
returns. Every function takes an optional ``nvml`` argument, a module with
pynvml's interface, so tests inject a fake (tests/fake_nvml.py) through the
same calls the real library answers.

Rules this module keeps:
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

import collections
import contextlib
import gc
import logging
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from workbench.errors import ConfigError

log = logging.getLogger(__name__)

MIB = 1024**2
GIB = 1024**3

# pynvml's NVML_ERROR_* codes; read from the module in use when it has them.
_ERROR_CODES = {
    "UNINITIALIZED": 1,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "NOT_FOUND": 6,
    "DRIVER_NOT_LOADED": 9,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "LIB_RM_VERSION_MISMATCH": 18,
    "UNKNOWN": 999,
}

# Errors after which cached handles are worthless: drop the session, re-init later.
_SESSION_BREAKING = (
    "UNINITIALIZED",
    "DRIVER_NOT_LOADED",
    "GPU_IS_LOST",
    "RESET_REQUIRED",
    "LIB_RM_VERSION_MISMATCH",
)

# One line per failure: what is wrong, then what to do next.
_REASONS = {
    "LIBRARY_NOT_FOUND": (
        "NVML library libnvidia-ml.so.1 not found: no NVIDIA driver here, or the container "
        "was started without GPU access (install the driver; run docker with --gpus all and "
        "the NVIDIA Container Toolkit)"
    ),
    "DRIVER_NOT_LOADED": (
        "NVIDIA driver is not loaded (check `nvidia-smi`; load the nvidia kernel module or reboot)"
    ),
    "NO_PERMISSION": (
        "no permission to query the GPU (give this user read/write access to /dev/nvidia*, "
        "or ask the administrator)"
    ),
    "NOT_SUPPORTED": "not supported by this GPU or driver",
    "LIB_RM_VERSION_MISMATCH": (
        "NVIDIA driver/library version mismatch: the kernel module and libnvidia-ml differ, "
        "usually after a driver update (reboot, or reload the nvidia kernel module)"
    ),
    "GPU_IS_LOST": (
        "GPU is lost (fell off the bus): check `dmesg` for Xid errors; reset the GPU "
        "(nvidia-smi -r) or reboot"
    ),
    "RESET_REQUIRED": "GPU needs a reset (nvidia-smi -r, or reboot)",
    "UNINITIALIZED": "NVML is not initialised (the driver was probably reloaded; retrying)",
    "FUNCTION_NOT_FOUND": (
        "the NVIDIA driver is too old for this NVML call (update the driver)"
    ),
}


# ---------------------------------------------------------------- data


@dataclass(frozen=True)
class NvmlStatus:
    """Whether NVML answers, and if not, why (one line that says what to do)."""

    available: bool
    reason: str | None
    driver_version: str | None
    cuda_driver_version: str | None  # e.g. "12.4", from nvmlSystemGetCudaDriverVersion
    device_count: int


@dataclass(frozen=True)
class DeviceInfo:
    """Static facts about one GPU or MIG slice.

    A MIG slice has ``is_mig=True``, ``index`` of its parent GPU and its own
    ``mig_index``. A GPU that cannot be read has ``error`` set and ``None`` in
    the fields that could not be read (so check ``error`` first).
    """

    index: int
    name: str
    uuid: str | None
    memory_total_bytes: int | None
    compute_capability: tuple[int, int] | None
    mig_mode: bool | None  # None: MIG not supported by this GPU
    is_mig: bool
    error: str | None
    mig_index: int | None = None


@dataclass(frozen=True)
class GpuProcess:
    """A process holding GPU memory, as NVML reports it.

    Inside a container NVML reports *host* PIDs; ``visible`` is False when the
    PID does not resolve in this container's /proc, and ``name`` is then None.
    """

    pid: int
    used_memory_bytes: int | None  # None: the driver does not say (n/a)
    visible: bool
    name: str | None
    is_this_kernel: bool = False


@dataclass(frozen=True)
class TorchMemory:
    """What this kernel's PyTorch holds on one CUDA device (caching allocator figures)."""

    device: int  # torch's index (after CUDA_VISIBLE_DEVICES)
    uuid: str | None  # as torch prints it (hex, no "GPU-"), to match a GpuSample
    allocated_bytes: int
    reserved_bytes: int
    peak_allocated_bytes: int  # since the last reset_torch_peak(); catches the peak between samples
    peak_reserved_bytes: int


@dataclass(frozen=True)
class GpuSample:
    """Live values of one GPU or MIG slice. ``None`` means n/a (not supported or unread)."""

    index: int
    name: str
    uuid: str | None
    is_mig: bool
    mig_index: int | None
    utilization_percent: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None
    processes: tuple[GpuProcess, ...] | None  # None: the list could not be read
    foreign_memory_bytes: int | None  # memory no process of this container accounts for
    warnings: tuple[str, ...] = ()
    error: str | None = None  # one line: why this GPU's values are missing or stale
    stale: bool = False  # values carried over from an earlier read
    torch: TorchMemory | None = None

    @property
    def label(self) -> str:
        if self.is_mig:
            return f"GPU {self.index} MIG {self.mig_index}"
        return f"GPU {self.index}"


@dataclass(frozen=True)
class HostSample:
    """CPU and RAM use, shown next to the GPUs and instead of them when there are none."""

    cpu_percent: float | None  # whole machine, 0..100
    cpu_count: int
    ram_used_bytes: int
    ram_total_bytes: int
    process_rss_bytes: int  # this kernel


@dataclass(frozen=True)
class Snapshot:
    """One sample of everything the panel shows."""

    time: float
    status: NvmlStatus
    gpus: tuple[GpuSample, ...]
    host: HostSample | None
    torch: tuple[TorchMemory, ...]
    error: str | None = None  # an error of the sampling itself (the sampler keeps going)
    stale: bool = False


@dataclass(frozen=True)
class FreeMemoryResult:
    """What "free cached memory" did: this kernel's PyTorch memory before and after."""

    before: tuple[TorchMemory, ...]
    after: tuple[TorchMemory, ...]
    message: str

    @property
    def freed_bytes(self) -> int:
        return sum(b.reserved_bytes for b in self.before) - sum(
            a.reserved_bytes for a in self.after
        )


# ---------------------------------------------------------------- errors


def error_name(exc: BaseException, nvml: Any = None) -> str | None:
    """The NVML_ERROR_* suffix of an exception ("GPU_IS_LOST"), or None if not an NVML error."""
    code = getattr(exc, "value", None)
    if not isinstance(code, int):
        return None
    for name, default in _ERROR_CODES.items():
        if getattr(nvml, f"NVML_ERROR_{name}", default) == code:
            return name
    return f"CODE_{code}"


def describe_error(exc: BaseException, nvml: Any = None) -> str:
    """One line for an NVML (or other) failure: what is wrong and what to do next."""
    name = error_name(exc, nvml)
    if name in _REASONS:
        return _REASONS[name]
    try:
        text = str(exc)
    except Exception:  # pynvml's __str__ calls into the library, which may be gone
        text = ""
    if name is not None:
        return f"NVML error {name.lower()}: {text or 'no detail'}"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is(exc: BaseException, nvml: Any, name: str) -> bool:
    return error_name(exc, nvml) == name


# ---------------------------------------------------------------- session


def _load_pynvml() -> tuple[Any, str | None]:
    try:
        import pynvml  # noqa: PLC0415 - only here, so `import workbench.gpu` stays cheap
    except Exception as exc:  # ImportError, or a broken install
        return None, (
            f"the NVML bindings cannot be imported ({type(exc).__name__}: {exc}); "
            "install them with `pip install nvidia-ml-py`"
        )
    return pynvml, None


class NvmlSession:
    """One initialised NVML connection with its device handles cached.

    ``nvmlInit`` and handle look-ups cost far more than a metric read, so they
    happen once; ``reset()`` (after a lost GPU or reloaded driver) drops them
    and the next call re-initialises.
    """

    def __init__(self, nvml: Any):
        self.nvml = nvml
        self._lock = threading.RLock()
        self._status: NvmlStatus | None = None
        self._handles: dict[int, Any] = {}
        self._mig_handles: dict[int, list[tuple[int, Any]]] = {}

    @property
    def ready(self) -> bool:
        return self._status is not None and self._status.available

    def status(self) -> NvmlStatus:
        """Initialise NVML if needed. A failed init is not cached: the next call retries."""
        with self._lock:
            if self.ready:
                return self._status  # type: ignore[return-value]
            nvml = self.nvml
            try:
                nvml.nvmlInit()
            except Exception as exc:
                return NvmlStatus(False, describe_error(exc, nvml), None, None, 0)
            try:
                count = int(nvml.nvmlDeviceGetCount())
            except Exception as exc:
                self._shutdown()
                return NvmlStatus(False, describe_error(exc, nvml), None, None, 0)
            driver = _try(lambda: _text(nvml.nvmlSystemGetDriverVersion()))
            cuda = _try(lambda: _cuda_version(nvml.nvmlSystemGetCudaDriverVersion()))
            reason = None if count else "the NVIDIA driver is loaded but reports no GPU"
            self._status = NvmlStatus(count > 0, reason, driver, cuda, count)
            if count == 0:
                # Nothing to cache; keep NVML closed so a later call sees hot-plugged GPUs.
                status, self._status = self._status, None
                self._shutdown()
                return status
            return self._status

    def handle(self, index: int) -> Any:
        with self._lock:
            if index not in self._handles:
                self._handles[index] = self.nvml.nvmlDeviceGetHandleByIndex(index)
            return self._handles[index]

    def mig_handles(self, index: int) -> list[tuple[int, Any]]:
        """(mig_index, handle) of the MIG slices of GPU ``index``; [] when MIG is off."""
        with self._lock:
            if index not in self._mig_handles:
                self._mig_handles[index] = self._find_mig_handles(index)
            return self._mig_handles[index]

    def _find_mig_handles(self, index: int) -> list[tuple[int, Any]]:
        nvml, parent = self.nvml, self.handle(index)
        if not _mig_enabled(nvml, parent):
            return []
        found = []
        for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(parent))):
            try:
                found.append((slot, nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)))
            except Exception as exc:
                if not _is(exc, nvml, "NOT_FOUND"):  # NOT_FOUND: an empty slot
                    raise
        return found

    def forget(self, index: int) -> None:
        """Drop the cached handles of one GPU (it failed); the next use looks them up again."""
        with self._lock:
            self._handles.pop(index, None)
            self._mig_handles.pop(index, None)

    def reset(self) -> None:
        """Forget handles and shut NVML down; the next ``status()`` re-initialises."""
        with self._lock:
            if self._status is not None:
                self._shutdown()
            self._status = None
            self._handles.clear()
            self._mig_handles.clear()

    def _shutdown(self) -> None:
        # Already gone with the driver, or never opened: nothing to release.
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


_sessions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_sessions_lock = threading.Lock()


def session_for(nvml: Any = None) -> NvmlSession | NvmlStatus:
    """The shared session for an NVML module, or a status saying why there is none."""
    if nvml is None:
        nvml, reason = _load_pynvml()
        if nvml is None:
            return NvmlStatus(False, reason, None, None, 0)
    with _sessions_lock:
        try:
            session = _sessions.get(nvml)
            if session is None:
                session = _sessions[nvml] = NvmlSession(nvml)
        except TypeError:  # not weak-referenceable: a session of its own, not shared
            session = NvmlSession(nvml)
        return session


# ---------------------------------------------------------------- contract API


def nvml_status(nvml: Any = None) -> NvmlStatus:
    """Whether NVML works here; never raises. ``nvml``: a module like pynvml (tests: a fake)."""
    session = session_for(nvml)
    if isinstance(session, NvmlStatus):
        return session
    try:
        return session.status()
    except Exception as exc:  # a broken binding: report, never raise into a notebook
        return NvmlStatus(False, describe_error(exc, session.nvml), None, None, 0)


def list_devices(nvml: Any = None) -> list[DeviceInfo]:
    """Every GPU, followed by its MIG slices; [] when NVML is unavailable (see nvml_status)."""
    session = session_for(nvml)
    if isinstance(session, NvmlStatus):
        return []
    status = nvml_status(session.nvml)
    if not status.available:
        return []
    devices: list[DeviceInfo] = []
    for index in range(status.device_count):
        info = _device_info(session, index)
        devices.append(info)
        if info.mig_mode and info.error is None:
            devices.extend(_mig_infos(session, index))
    return devices


def _device_info(session: NvmlSession, index: int) -> DeviceInfo:
    nvml = session.nvml
    try:
        handle = session.handle(index)
        name = _text(nvml.nvmlDeviceGetName(handle))
        uuid = _optional(nvml, lambda: _text(nvml.nvmlDeviceGetUUID(handle)))
        total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
        cc = _optional(nvml, lambda: tuple(nvml.nvmlDeviceGetCudaComputeCapability(handle)))
        mig = _optional(nvml, lambda: _mig_enabled(nvml, handle, strict=True))
    except Exception as exc:
        _maybe_reset(session, exc)
        return DeviceInfo(index, f"GPU {index}", None, None, None, None, False,
                          describe_error(exc, nvml))
    return DeviceInfo(index, name, uuid, total, cc, mig, False, None)


def _mig_infos(session: NvmlSession, index: int) -> list[DeviceInfo]:
    nvml = session.nvml
    try:
        slices = session.mig_handles(index)
    except Exception as exc:
        return [DeviceInfo(index, f"GPU {index} MIG", None, None, None, None, True,
                           f"MIG slices cannot be listed: {describe_error(exc, nvml)}")]
    infos = []
    for mig_index, handle in slices:
        try:
            name = _text(nvml.nvmlDeviceGetName(handle))
            uuid = _optional(nvml, lambda h=handle: _text(nvml.nvmlDeviceGetUUID(h)))
            total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
            infos.append(DeviceInfo(index, name, uuid, total, None, None, True, None, mig_index))
        except Exception as exc:
            infos.append(DeviceInfo(index, f"GPU {index} MIG {mig_index}", None, None, None,
                                    None, True, describe_error(exc, nvml), mig_index))
    return infos


# ---------------------------------------------------------------- helpers


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(value: int) -> str:
    # NVML encodes 12.4 as 12040.
    return f"{value // 1000}.{(value % 1000) // 10}"


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:
        return None


def _optional(nvml: Any, fn: Callable[[], Any]) -> Any:
    """A metric the device does not support is None; any other error propagates."""
    try:
        return fn()
    except Exception as exc:
        if _is(exc, nvml, "NOT_SUPPORTED"):
            return None
        raise


def _mig_enabled(nvml: Any, handle: Any, strict: bool = False) -> bool:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except Exception as exc:
        if not strict and _is(exc, nvml, "NOT_SUPPORTED"):
            return False
        raise
    return current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)


def _maybe_reset(session: NvmlSession, exc: BaseException) -> bool:
    if error_name(exc, session.nvml) in _SESSION_BREAKING:
        session.reset()
        return True
    return False


def _pid_max() -> int:
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read())
    except OSError:
        return 4_194_304


def _process(pid: int, used: int | None) -> GpuProcess:
    """Resolve a PID from NVML in this container's /proc; a host PID does not resolve."""
    name = None
    try:
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
    except OSError:
        pass
    return GpuProcess(pid, used, name is not None, name, is_this_kernel=pid == os.getpid())


# ---------------------------------------------------------------- torch and host


def torch_memory() -> tuple[TorchMemory, ...]:
    """This kernel's PyTorch memory per CUDA device; () when CUDA is not in use here.

    Reads only when torch is already imported and CUDA already initialised: the
    sampler must never create a CUDA context (hundreds of MiB on the GPU) itself.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return ()
    try:
        if not torch.cuda.is_initialized():
            return ()
        readings = []
        for device in range(torch.cuda.device_count()):
            uuid = _torch_uuid(torch, device)
            readings.append(TorchMemory(
                device=device,
                uuid=uuid,
                allocated_bytes=int(torch.cuda.memory_allocated(device)),
                reserved_bytes=int(torch.cuda.memory_reserved(device)),
                peak_allocated_bytes=int(torch.cuda.max_memory_allocated(device)),
                peak_reserved_bytes=int(torch.cuda.max_memory_reserved(device)),
            ))
        return tuple(readings)
    except Exception as exc:  # a broken CUDA state must not stop the sampler
        log.debug("torch memory unreadable: %s", exc)
        return ()


_torch_uuids: dict[int, str | None] = {}


def _torch_uuid(torch: Any, device: int) -> str | None:
    # torch prints the bare hex ("58ef5b8f-..."); NVML prefixes "GPU-" or "MIG-".
    if device not in _torch_uuids:
        _torch_uuids[device] = _try(lambda: str(torch.cuda.get_device_properties(device).uuid))
    return _torch_uuids[device]


def reset_torch_peak() -> None:
    """Start a new peak measurement (torch.cuda.reset_peak_memory_stats on every device)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    for device in range(torch.cuda.device_count()):
        torch.cuda.reset_peak_memory_stats(device)


def free_cached_memory() -> FreeMemoryResult:
    """gc.collect() then torch.cuda.empty_cache(); returns the memory before and after.

    Only memory no tensor uses goes back to the driver; tensors still referenced
    (a model, an optimizer, ``_`` in the notebook) stay allocated.
    """
    before = torch_memory()
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and _try(torch.cuda.is_initialized):
        torch.cuda.empty_cache()
    after = torch_memory()
    if not before:
        message = "PyTorch holds no GPU memory in this kernel; nothing to free."
    else:
        freed = sum(b.reserved_bytes for b in before) - sum(a.reserved_bytes for a in after)
        still = sum(a.allocated_bytes for a in after)
        message = (f"Freed {freed / MIB:.0f} MiB of cached memory; {still / MIB:.0f} MiB is "
                   "still allocated by live tensors (delete them, e.g. `del model`, to free it).")
    return FreeMemoryResult(before, after, message)


def host_sample() -> HostSample | None:
    """CPU and RAM from psutil; None if psutil is missing. Non-blocking."""
    try:
        import psutil  # noqa: PLC0415
    except ImportError:
        return None
    mem = psutil.virtual_memory()
    return HostSample(
        # interval=None: the use since the previous call, without sleeping.
        cpu_percent=psutil.cpu_percent(interval=None),
        cpu_count=psutil.cpu_count() or 1,
        ram_used_bytes=int(mem.total - mem.available),
        ram_total_bytes=int(mem.total),
        process_rss_bytes=int(_try(lambda: psutil.Process().memory_info().rss) or 0),
    )


# ---------------------------------------------------------------- reader


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
        if self._nvml_backoff.waiting(now):
            reason = self._nvml_backoff.reason
            return Snapshot(time.time(), NvmlStatus(False, reason, None, None, 0),
                            tuple(self._stale(None, reason)), host, torch_mem,
                            stale=bool(self._last))
        status = nvml_status(session.nvml)
        if not status.available:
            reason = self._nvml_backoff.fail(now, status.reason)
            return Snapshot(time.time(), replace(status, reason=reason),
                            tuple(self._stale(None, reason)),
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
                gpus.extend(self._stale(index, backoff.reason))
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
            reason = backoff.fail(now, describe_error(exc, session.nvml))
            session.forget(index)
            gpus.extend(self._stale(index, reason))
            if error_name(exc, session.nvml) in _SESSION_BREAKING:
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
            name = _text(nvml.nvmlDeviceGetName(handle))
            uuid = _optional(nvml, lambda: _text(nvml.nvmlDeviceGetUUID(handle)))
            used, total = _memory(nvml, handle)
            util = _optional(nvml, lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            temp = _optional(nvml, lambda: float(nvml.nvmlDeviceGetTemperature(
                handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0))))
            power = _optional(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
            limit = _optional(nvml, lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)
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
                if error_name(exc, nvml) in _SESSION_BREAKING:
                    raise
                continue  # NOT_SUPPORTED / NO_PERMISSION: this list is unreadable
            readable = True
            for entry in entries:
                pid = int(entry.pid)
                used = getattr(entry, "usedGpuMemory", None)
                if pid not in seen:
                    seen[pid] = _process(pid, int(used) if used is not None else None)
        return tuple(seen.values()) if readable else None

    def _stale(self, index: int | None, reason: str | None) -> list[GpuSample]:
        """Last values of GPU ``index`` (all GPUs if None) marked stale with the reason."""
        stale = [replace(s, error=reason, stale=True) for key, s in self._last.items()
                 if index is None or key[0] == index]
        if not stale and index is not None:
            stale = [GpuSample(index, f"GPU {index}", None, False, None, None, None, None, None,
                               None, None, None, None, error=reason)]
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

    def fail(self, now: float, reason: str | None) -> str:
        self.failures += 1
        self.delay = min(self.maximum, max(self.initial, self.delay * 2))
        self.retry_at = now + self.delay
        self.reason = f"{reason} (retrying in {self.delay:g} s)"
        return self.reason

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
            if error_name(exc, nvml) in _SESSION_BREAKING:
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


# ---------------------------------------------------------------- sampler


class Sampler:
    """A daemon thread that calls ``read()`` every ``interval`` seconds into a bounded history.

    The thread never dies silently: an exception from ``read`` is logged, kept
    in ``errors`` and ``last_error``, the last snapshot is re-published marked
    stale, and the next attempt waits longer (doubling up to ``backoff_max``).
    ``on_sample`` is called with each snapshot from the sampler thread.
    """

    def __init__(
        self,
        read: Callable[[], Snapshot] | None = None,
        interval: float = 1.0,
        history_seconds: float = 300.0,
        on_sample: Callable[[Snapshot], None] | None = None,
        backoff_max: float = 30.0,
        nvml: Any = None,
    ):
        if not interval > 0:
            raise ConfigError("interval", interval, "a number of seconds > 0",
                              "use e.g. GPUPanel(interval=1.0)")
        self.read = read or GpuReader(nvml).read
        self.interval = float(interval)
        self.backoff_max = backoff_max
        self.on_sample = on_sample
        self.history: collections.deque[Snapshot] = collections.deque(
            maxlen=max(2, math.ceil(history_seconds / self.interval)))
        self.errors: collections.deque[tuple[float, str]] = collections.deque(maxlen=50)
        self.samples_taken = 0
        self._logged: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def latest(self) -> Snapshot | None:
        return self.history[-1] if self.history else None

    @property
    def last_error(self) -> str | None:
        return self.errors[-1][1] if self.errors else None

    def start(self) -> None:
        with self._lock:
            if self.running:
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="workbench-gpu-sampler",
                                            daemon=True)  # never keeps a kernel alive
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def sample_once(self) -> Snapshot:
        """Take one sample now, in this thread (also what the thread does each tick)."""
        snapshot = self.read()
        self.history.append(snapshot)
        self.samples_taken += 1
        return snapshot

    def _run(self) -> None:
        delay, error_delay = 0.0, 0.0
        while not self._stop.wait(delay):
            started = time.monotonic()
            try:
                snapshot = self.sample_once()
                error_delay = 0.0
                delay = max(0.0, self.interval - (time.monotonic() - started))
            except Exception as exc:
                self._log_error("reading failed; retrying with back-off", exc)
                snapshot = self._stale(describe_error(exc))
                error_delay = min(self.backoff_max, max(self.interval, error_delay * 2))
                delay = error_delay
            if self.on_sample is not None and snapshot is not None:
                try:
                    self.on_sample(snapshot)
                except Exception as exc:  # a drawing bug must not stop sampling
                    self._log_error("display failed", exc, prefix="display: ")

    def _log_error(self, what: str, exc: BaseException, prefix: str = "") -> None:
        """Record every error; log a traceback the first time each one is seen.

        A GPU that stays lost fails at every retry; one traceback says it, and a
        log line every 30 s in the notebook would bury the user's own output.
        """
        message = prefix + describe_error(exc)
        if message not in self._logged:
            self._logged.add(message)
            log.warning("GPU sampler: %s: %s", what, message, exc_info=exc)
        else:
            log.debug("GPU sampler: %s again: %s", what, message)
        self.errors.append((time.time(), message))

    def _stale(self, reason: str) -> Snapshot | None:
        last = self.latest
        if last is None:
            return None
        snapshot = replace(last, error=reason, stale=True,
                           gpus=tuple(replace(g, stale=True) for g in last.gpus))
        self.history.append(snapshot)
        return snapshot


__all__ = [
    "DeviceInfo", "FreeMemoryResult", "GpuProcess", "GpuReader", "GpuSample", "HostSample",
    "NvmlSession", "NvmlStatus", "Sampler", "Snapshot", "TorchMemory", "describe_error",
    "error_name", "free_cached_memory", "host_sample", "list_devices", "nvml_status",
    "reset_torch_peak", "session_for", "torch_memory",
]
