"""Out-of-memory handling and memory hygiene.

``with_halving`` runs a piece of work with a micro-batch size and, on an
out-of-memory error, again with half of it, down to 1: training steps (same
effective batch through more accumulation) and evaluation batches use it.

When a micro-batch does not fit, the loop retries the same optimizer step with
half the micro-batch and twice the accumulation (same effective batch, same loss
curve). For that to free anything, the exception and its traceback, which keep
every activation of the failed forward pass alive, must be gone before retrying:
``is_oom`` is called inside the ``except`` block, the retry happens after it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error worth retrying smaller: Accelerate's test (CUDA, CPU, cuDNN, ...)."""
    from accelerate.utils.memory import should_reduce_batch_size

    return isinstance(exc, torch.cuda.OutOfMemoryError) or should_reduce_batch_size(exc)


def free_memory() -> None:
    """Collect garbage and return cached blocks to the driver (after an OOM, and when a run ends)."""
    from accelerate.utils.memory import clear_device_cache

    clear_device_cache(garbage_collection=True)


def halve(micro_batch_size: int) -> int:
    return max(1, micro_batch_size // 2)


def with_halving(attempt: Callable[[int], T], size: int, *, on_halve: Callable[[int], None],
                 give_up: Callable[[], Exception]) -> T:
    """``attempt(size)``, retried with half the size after each out-of-memory error.

    ``on_halve(new_size)`` is told of each retry (to say so and clean up); at size 1
    the error ``give_up()`` returns is raised instead.
    """
    while True:
        try:
            return attempt(size)
        except Exception as exc:
            if not is_oom(exc):
                raise
        # Out of the except block: the exception and its traceback (which hold every
        # activation of the failed pass) are gone, so the memory can really be freed.
        free_memory()
        if size == 1:
            raise give_up()
        size = halve(size)
        on_halve(size)
