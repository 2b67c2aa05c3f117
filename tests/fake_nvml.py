"""A fake ``pynvml`` module for tests without a GPU, with named scenarios.

It answers the same calls workbench.gpu makes on the real module, with the same
shapes (names as str, memory objects with total/free/used, process entries with
pid/usedGpuMemory, errors as ``NVMLError`` subclasses carrying ``.value``), so
``nvml_status(fake)``, ``list_devices(fake)`` and ``GpuReader(fake)`` run the
very code paths that real NVML drives.

    from tests.fake_nvml import FakeNVML, FakeDevice, scenario
    fake = FakeNVML(devices=[FakeDevice()], driver="550.54.15", cuda_driver=12040)
    fake = FakeNVML(fail_init=NVML_ERROR_LIBRARY_NOT_FOUND)
    fake = scenario("gpu_lost")            # GPU 1 lost, GPU 0 fine
    fake.devices[0].fail("GPU_IS_LOST")    # break a GPU mid-run ...
    fake.devices[0].heal()                 # ... and bring it back

Errors are injected per device and per call: ``FakeDevice(errors={"nvmlDeviceGetTemperature":
NVML_ERROR_NOT_SUPPORTED})``; the key "*" fails every call on that device (a lost GPU).
"""

from __future__ import annotations

import collections
import itertools
import os
from dataclasses import dataclass, field
from types import SimpleNamespace

# Same codes as pynvml (nvidia-ml-py).
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
nvmlMemory_v2 = 0x02000028

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}

GIB = 1024**3
MIB = 1024**2


class NVMLError(Exception):
    """Like pynvml.NVMLError: ``.value`` is the NVML_ERROR_* code."""

    def __init__(self, value: int):
        self.value = value
        super().__init__(value)

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


def code(name_or_code: str | int) -> int:
    """NVML_ERROR_* code from "GPU_IS_LOST" / "NVML_ERROR_GPU_IS_LOST" / 15."""
    if isinstance(name_or_code, int):
        return name_or_code
    name = name_or_code.upper()
    if not name.startswith("NVML_ERROR_"):
        name = "NVML_ERROR_" + name
    return globals()[name]


def unused_pids(count: int) -> list[int]:
    """PIDs above the kernel's pid_max: they can never exist in this container's /proc."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            pid_max = int(f.read())
    except OSError:
        pid_max = 4_194_304
    return [pid_max + 1000 + i for i in range(count)]


@dataclass
class FakeProcess:
    pid: int
    used_memory_bytes: int | None = 512 * MIB


@dataclass
class FakeDevice:
    """One GPU (or, inside ``mig_devices``, one MIG slice). Values in NVML's own units."""

    name: str = "NVIDIA A100-SXM4-40GB"
    uuid: str | None = None  # None: a uuid is made up
    memory_total: int = 40 * GIB
    memory_used: int = 2 * GIB
    memory_reserved: int = 400 * MIB
    utilization_gpu: int = 37
    utilization_memory: int = 12
    temperature_c: int = 45
    power_mw: int = 123_000
    power_limit_mw: int = 400_000
    compute_capability: tuple[int, int] = (8, 0)
    mig_mode: int | None = NVML_DEVICE_MIG_DISABLE  # None: MIG not supported
    mig_devices: list[FakeDevice] = field(default_factory=list)
    mig_slots: int = 7
    processes: list[FakeProcess] = field(default_factory=list)
    graphics_processes: list[FakeProcess] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # call name (or "*") -> error code

    def fail(self, error: str | int, call: str = "*") -> None:
        """Make ``call`` (every call by default) on this device raise the NVML error."""
        self.errors[call] = code(error)

    def heal(self) -> None:
        self.errors.clear()


class _Handle:
    def __init__(self, device: FakeDevice, is_mig: bool = False):
        self.device = device
        self.is_mig = is_mig


class FakeNVML:
    """An object with pynvml's module interface. ``calls`` counts every call by name."""

    NVMLError = NVMLError

    def __init__(
        self,
        devices: list[FakeDevice] | None = None,
        driver: str = "550.54.15",
        cuda_driver: int = 12040,
        fail_init: int | str | None = None,
        fail_count: int | str | None = None,
        memory_v2: bool = True,
    ):
        self.devices = list(devices) if devices is not None else [FakeDevice()]
        self.driver = driver
        self.cuda_driver = cuda_driver
        self.fail_init = code(fail_init) if fail_init is not None else None
        self.fail_count = code(fail_count) if fail_count is not None else None
        self.memory_v2 = memory_v2
        self.initialized = 0  # refcount, like NVML
        self.calls: collections.Counter[str] = collections.Counter()
        # Same constants as the module, reachable as attributes.
        for name, value in globals().items():
            if name.startswith(("NVML_", "nvmlMemory_")):
                setattr(self, name, value)

    # ---- library

    def _call(self, name: str) -> None:
        self.calls[name] += 1
        if name not in ("nvmlInit", "nvmlShutdown") and not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def nvmlInit(self):
        self._call("nvmlInit")
        if self.fail_init is not None:
            raise NVMLError(self.fail_init)
        self.initialized += 1

    def nvmlShutdown(self):
        self._call("nvmlShutdown")
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._call("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._call("nvmlSystemGetCudaDriverVersion")
        return self.cuda_driver

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        if self.fail_count is not None:
            raise NVMLError(self.fail_count)
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._call("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        device = self.devices[index]
        self._check(device, "nvmlDeviceGetHandleByIndex")
        return _Handle(device)

    # ---- per device

    def _dev(self, handle: _Handle, name: str) -> FakeDevice:
        self._call(name)
        self._check(handle.device, name)
        return handle.device

    @staticmethod
    def _check(device: FakeDevice, name: str) -> None:
        error = device.errors.get(name, device.errors.get("*"))
        if error is not None:
            raise NVMLError(error)

    def nvmlDeviceGetName(self, handle) -> str:
        return self._dev(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetUUID(self, handle) -> str:
        device = self._dev(handle, "nvmlDeviceGetUUID")
        if device.uuid is None:
            prefix = "MIG" if handle.is_mig else "GPU"
            device.uuid = f"{prefix}-{next(_uuids):08x}-0000-4000-8000-000000000000"
        return device.uuid

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        device = self._dev(handle, "nvmlDeviceGetMemoryInfo")
        if version is not None:
            if not self.memory_v2 or handle.is_mig:
                raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND if not self.memory_v2
                                else NVML_ERROR_NOT_SUPPORTED)
            return SimpleNamespace(
                version=version, total=device.memory_total, reserved=device.memory_reserved,
                used=device.memory_used,
                free=device.memory_total - device.memory_used - device.memory_reserved)
        used = device.memory_used + device.memory_reserved  # v1 counts reserved as used
        return SimpleNamespace(total=device.memory_total, used=used,
                               free=device.memory_total - used)

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return self._dev(handle, "nvmlDeviceGetCudaComputeCapability").compute_capability

    def nvmlDeviceGetUtilizationRates(self, handle):
        device = self._dev(handle, "nvmlDeviceGetUtilizationRates")
        if handle.is_mig:  # NVML has no utilization per MIG slice
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=device.utilization_gpu, memory=device.utilization_memory)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        device = self._dev(handle, "nvmlDeviceGetTemperature")
        if handle.is_mig:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return device.temperature_c

    def nvmlDeviceGetPowerUsage(self, handle) -> int:
        device = self._dev(handle, "nvmlDeviceGetPowerUsage")
        if handle.is_mig:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return device.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle) -> int:
        device = self._dev(handle, "nvmlDeviceGetEnforcedPowerLimit")
        if handle.is_mig:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return device.power_limit_mw

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        device = self._dev(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_memory_bytes,
                                gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
                for p in device.processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        device = self._dev(handle, "nvmlDeviceGetGraphicsRunningProcesses")
        return [SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_memory_bytes)
                for p in device.graphics_processes]

    def nvmlDeviceGetMigMode(self, handle):
        device = self._dev(handle, "nvmlDeviceGetMigMode")
        if device.mig_mode is None or handle.is_mig:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [device.mig_mode, device.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle) -> int:
        device = self._dev(handle, "nvmlDeviceGetMaxMigDeviceCount")
        return device.mig_slots if device.mig_mode == NVML_DEVICE_MIG_ENABLE else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index: int) -> _Handle:
        device = self._dev(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if index >= len(device.mig_devices):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _Handle(device.mig_devices[index], is_mig=True)

    def nvmlDeviceIsMigDeviceHandle(self, handle) -> int:
        self._call("nvmlDeviceIsMigDeviceHandle")
        return int(handle.is_mig)


_uuids = itertools.count(0x1000)


# ---------------------------------------------------------------- scenarios


def _two_gpus() -> list[FakeDevice]:
    # GPU 0 busy with this test process (so its memory is accounted for), GPU 1 idle.
    return [
        FakeDevice(name="NVIDIA A100-SXM4-40GB",
                   processes=[FakeProcess(os.getpid(), 2 * GIB)]),
        FakeDevice(name="NVIDIA A100-SXM4-40GB", utilization_gpu=0, memory_used=0,
                   temperature_c=31, power_mw=52_000),
    ]


def _failing_second(error: int) -> FakeNVML:
    devices = _two_gpus()
    devices[1].fail(error)
    return FakeNVML(devices=devices)


def _mig() -> FakeNVML:
    slices = [
        FakeDevice(name="NVIDIA A100-SXM4-40GB MIG 3g.20gb", memory_total=20 * GIB,
                   memory_used=3 * GIB),
        FakeDevice(name="NVIDIA A100-SXM4-40GB MIG 2g.10gb", memory_total=10 * GIB,
                   memory_used=1 * GIB),
    ]
    parent = FakeDevice(name="NVIDIA A100-SXM4-40GB", mig_mode=NVML_DEVICE_MIG_ENABLE,
                        mig_devices=slices, utilization_gpu=0)
    return FakeNVML(devices=[parent, FakeDevice(name="NVIDIA A100-SXM4-40GB")])


def _host_pids() -> FakeNVML:
    pids = unused_pids(2)
    device = FakeDevice(memory_used=9 * GIB, utilization_gpu=88,
                        processes=[FakeProcess(pids[0], 6 * GIB), FakeProcess(pids[1], 3 * GIB)])
    return FakeNVML(devices=[device])


def _not_supported() -> FakeNVML:
    device = FakeDevice(name="Tesla K80", compute_capability=(3, 7), mig_mode=None)
    for call in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage",
                 "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetTemperature",
                 "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        device.fail(NVML_ERROR_NOT_SUPPORTED, call)
    return FakeNVML(devices=[device, FakeDevice()])


SCENARIOS = {
    "one_gpu": lambda: FakeNVML(devices=_two_gpus()[:1]),
    "two_gpus": lambda: FakeNVML(devices=_two_gpus()),
    "no_gpus": lambda: FakeNVML(devices=[]),
    # NVML itself does not start: nothing to show but the reason.
    "no_library": lambda: FakeNVML(fail_init=NVML_ERROR_LIBRARY_NOT_FOUND),
    "driver_not_loaded": lambda: FakeNVML(fail_init=NVML_ERROR_DRIVER_NOT_LOADED),
    "no_permission": lambda: FakeNVML(fail_init=NVML_ERROR_NO_PERMISSION),
    "version_mismatch": lambda: FakeNVML(fail_init=NVML_ERROR_LIB_RM_VERSION_MISMATCH),
    # One GPU fails, the other still displays.
    "gpu_lost": lambda: _failing_second(NVML_ERROR_GPU_IS_LOST),
    "gpu_no_permission": lambda: _failing_second(NVML_ERROR_NO_PERMISSION),
    "gpu_not_supported": lambda: _failing_second(NVML_ERROR_NOT_SUPPORTED),
    "gpu_version_mismatch": lambda: _failing_second(NVML_ERROR_LIB_RM_VERSION_MISMATCH),
    "gpu_driver_not_loaded": lambda: _failing_second(NVML_ERROR_DRIVER_NOT_LOADED),
    "metrics_not_supported": _not_supported,  # an old GPU: util/power/temp are n/a
    "mig": _mig,  # GPU 0 split into two MIG slices
    "host_pids": _host_pids,  # processes whose host PIDs this container cannot see
}


def scenario(name: str) -> FakeNVML:
    """A fresh fake for a named scenario (see SCENARIOS)."""
    try:
        return SCENARIOS[name]()
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None
