"""The NVML connection: the only module that imports ``pynvml`` (nvidia-ml-py).

It loads the bindings on first use (so ``import workbench.gpu`` stays cheap and
works without them), keeps one initialised session per NVML module with its
device handles cached, turns every NVML error into one line that says what is
wrong and what to do, and answers the two contract calls, ``nvml_status`` and
``list_devices``. Every function takes an optional ``nvml`` argument, a module
with pynvml's interface, so tests inject a fake (tests/fake_nvml.py) through
the same calls the real library answers. Nothing here raises for a missing
library, driver or GPU: the answer says so.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable
from typing import Any

from workbench.gpu.samples import DeviceInfo, NvmlStatus

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
SESSION_BREAKING = (
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
            driver = _try(lambda: to_text(nvml.nvmlSystemGetDriverVersion()))
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
        name = to_text(nvml.nvmlDeviceGetName(handle))
        uuid = optional(nvml, lambda: to_text(nvml.nvmlDeviceGetUUID(handle)))
        total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
        cc = optional(nvml, lambda: tuple(nvml.nvmlDeviceGetCudaComputeCapability(handle)))
        mig = optional(nvml, lambda: _mig_enabled(nvml, handle, strict=True))
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
            name = to_text(nvml.nvmlDeviceGetName(handle))
            uuid = optional(nvml, lambda h=handle: to_text(nvml.nvmlDeviceGetUUID(h)))
            total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
            infos.append(DeviceInfo(index, name, uuid, total, None, None, True, None, mig_index))
        except Exception as exc:
            infos.append(DeviceInfo(index, f"GPU {index} MIG {mig_index}", None, None, None,
                                    None, True, describe_error(exc, nvml), mig_index))
    return infos


# ---------------------------------------------------------------- helpers


def to_text(value: Any) -> str:
    # Older pynvml releases answer bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(value: int) -> str:
    # NVML encodes 12.4 as 12040.
    return f"{value // 1000}.{(value % 1000) // 10}"


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:
        return None


def optional(nvml: Any, fn: Callable[[], Any]) -> Any:
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
    if error_name(exc, session.nvml) in SESSION_BREAKING:
        session.reset()
        return True
    return False

