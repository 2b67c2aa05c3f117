"""Where a run's processes come from and how they agree: one process, torchrun,
``accelerate launch`` (one node or several), or forked from a notebook.

``make_accelerator`` reads the launcher's environment (RANK, WORLD_SIZE,
MASTER_ADDR...) through Accelerate, so the same ``fit`` runs unchanged in a
kernel, in a terminal and under ``torchrun --nnodes N``. Only the main process
writes files; every process must take the same decisions at the same step (stop,
retry, finish) or the collective operations of DDP wait forever.
"""

from __future__ import annotations

import torch

from workbench.config import TrainConfig
from workbench.engine.precision import accelerate_mixed_precision
from workbench.errors import ConfigError, WorkbenchError


def reset_accelerate_state() -> None:
    """Accelerate keeps its state in process-wide singletons: a second fit() in the same
    kernel (maybe with another precision) needs fresh ones, and
    ``accelerate.notebook_launcher`` refuses to start while one exists."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state()
    GradientState._reset_state()


def make_accelerator(config: TrainConfig, precision: str):
    from accelerate import Accelerator, DataLoaderConfiguration

    reset_accelerate_state()
    kwargs = {}
    if config.distributed == "fsdp":
        if not torch.cuda.is_available():
            raise ConfigError("distributed", "fsdp", "'fsdp' only on CUDA GPUs", fix="use distributed='ddp'.")
        from accelerate import FullyShardedDataParallelPlugin

        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin()
    return Accelerator(
        # cpu=True on a machine without CUDA: Accelerate then recognises torchrun's
        # environment as multi-process CPU (gloo) instead of one process per rank.
        cpu=not torch.cuda.is_available(),
        mixed_precision=accelerate_mixed_precision(precision),
        dataloader_config=DataLoaderConfiguration(non_blocking=torch.cuda.is_available()),
        step_scheduler_with_optimizer=False,  # the loop steps the schedule once per real step
        **kwargs,
    )


def any_process(accelerator, flag: bool) -> bool:
    """True on every process when ``flag`` is True on any (a collective: call on all ranks)."""
    if accelerator.num_processes == 1:
        return flag
    value = torch.tensor(float(flag), device=accelerator.device)
    return bool(accelerator.reduce(value, "max").item())


def differs_across_processes(accelerator, value: int) -> bool:
    """True on every process when ``value`` is not the same on all of them (a collective)."""
    if accelerator.num_processes == 1:
        return False
    both = torch.tensor([float(value), -float(value)], device=accelerator.device)
    highest, minus_lowest = accelerator.reduce(both, "max").tolist()
    return highest != -minus_lowest


def check_can_fork() -> None:
    """A notebook launcher forks the kernel, which an initialised CUDA does not survive."""
    if torch.cuda.is_initialized():
        raise WorkbenchError(
            "CUDA is already initialised in this kernel, so it cannot fork the training processes.",
            "restart the kernel (Kernel > Restart) and run fit_distributed before any cell that "
            "uses the GPU (no fit(), .to('cuda') or GPU panel sampling through torch first).")


def launch_from_notebook(function, args: tuple, num_processes: int) -> None:
    """Run ``function(*args)`` in ``num_processes`` forked processes (accelerate.notebook_launcher)."""
    from accelerate import notebook_launcher

    check_can_fork()
    notebook_launcher(_forked, args=(function, args), num_processes=num_processes)


def _forked(function, args) -> None:
    from accelerate.state import AcceleratorState

    # A forked child inherits the kernel's single-process state (from an earlier fit):
    # drop it so Accelerate reads the launcher's multi-process environment.
    AcceleratorState._reset_state(reset_partial_state=True)
    function(*args)
