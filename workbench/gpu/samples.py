"""The plain data the GPU layer returns: frozen dataclasses, no behaviour, no NVML.

A metric the GPU does not support is ``None`` (drawn as "n/a"), never 0; an
entry that could not be read carries ``error`` instead of raising. Callers
(doctor, models, the panel) import these from ``workbench.gpu``.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024**2
GIB = 1024**3

@dataclass(frozen=True)
class NvmlStatus:
    """Whether NVML answers, and if not, why (one line that says what to do)."""

    available: bool
    reason: str | None
    driver_version: str | None
    cuda_driver_version: str | None  # e.g. "12.4", from nvmlSystemGetCudaDriverVersion
    device_count: int
    retry_in_s: float | None = None  # NVML failed: the reader tries again after this back-off


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
    retry_in_s: float | None = None  # with error: the reader reads this GPU again after this back-off
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

