"""What this kernel's PyTorch holds on each CUDA device, and giving cached memory back.

Reads torch's caching-allocator figures; never imports torch itself and never
creates a CUDA context (that costs hundreds of MiB on the GPU), so the GPU
layer stays cheap for a kernel that does not use CUDA.
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Callable
from typing import Any

from workbench.gpu.samples import MIB, FreeMemoryResult, TorchMemory

log = logging.getLogger(__name__)


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


# A device's UUID never changes in a process; asking torch every sample would cost a CUDA call.
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


def _try(fn: Callable[[], Any]) -> Any:
    # A half-broken CUDA state answers some calls and not others; a missing figure is None.
    try:
        return fn()
    except Exception:
        return None
