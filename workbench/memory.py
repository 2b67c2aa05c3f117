"""Out-of-memory handling and memory hygiene.

When a micro-batch does not fit, the loop retries the same optimizer step with
half the micro-batch and twice the accumulation (same effective batch, same loss
curve). For that to free anything, the exception and its traceback, which keep
every activation of the failed forward pass alive, must be gone before retrying:
``is_oom`` is called inside the ``except`` block, the retry happens after it.

``simulate_oom`` makes the retry path testable on a CPU: the loop calls
``maybe_simulate_oom(step, micro_batch_size)`` before each forward pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

# (optimizer step, micro-batch size) -> raise an OOM?  Set only by simulate_oom.
_oom_trigger: Callable[[int, int], bool] | None = None


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


@contextlib.contextmanager
def simulate_oom(trigger: Callable[[int, int], bool]) -> Iterator[None]:
    """Raise torch.cuda.OutOfMemoryError before a forward pass when ``trigger(step, size)``.

    Example (tests): ``with simulate_oom(lambda step, size: step == 3 and size > 4): fit(...)``
    """
    global _oom_trigger
    previous, _oom_trigger = _oom_trigger, trigger
    try:
        yield
    finally:
        _oom_trigger = previous


def maybe_simulate_oom(step: int, micro_batch_size: int) -> None:
    if _oom_trigger is not None and _oom_trigger(step, micro_batch_size):
        raise torch.cuda.OutOfMemoryError(
            f"CUDA out of memory (simulated at step {step}, micro-batch {micro_batch_size})"
        )
