"""Out-of-memory handling and memory hygiene.

When a micro-batch does not fit, the loop retries the same optimizer step with
half the micro-batch and twice the accumulation (same effective batch, same loss
curve). For that to free anything, the exception and its traceback, which keep
every activation of the failed forward pass alive, must be gone before retrying:
``is_oom`` is called inside the ``except`` block, the retry happens after it.
"""

from __future__ import annotations

import torch


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error worth retrying smaller: Accelerate's test (CUDA, CPU, cuDNN, ...)."""
    from accelerate.utils.memory import should_reduce_batch_size

    return isinstance(exc, torch.cuda.OutOfMemoryError) or should_reduce_batch_size(exc)


def free_memory() -> None:
    """Collect garbage and return cached blocks to the driver (at epoch ends and after an OOM)."""
    from accelerate.utils.memory import clear_device_cache

    clear_device_cache(garbage_collection=True)


def halve(micro_batch_size: int) -> int:
    return max(1, micro_batch_size // 2)
