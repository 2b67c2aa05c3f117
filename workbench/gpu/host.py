"""CPU and RAM of this machine, shown next to the GPUs and instead of them when there are none."""

from __future__ import annotations

from workbench.gpu.samples import HostSample


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
        process_rss_bytes=_rss_bytes(psutil),
    )


def _rss_bytes(psutil) -> int:
    # A process psutil may not inspect (a locked-down container) shows 0, not an error.
    try:
        return int(psutil.Process().memory_info().rss or 0)
    except Exception:
        return 0
