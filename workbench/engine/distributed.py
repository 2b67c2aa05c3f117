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
            # Accelerate would not refuse: on a CPU (gloo) it ignores the plugin and runs DDP
            # (accelerate/state.py sets DistributedType.FSDP only for GPU-like devices), so a
            # run that says "fsdp" would not be one.
            raise ConfigError("distributed", "fsdp", "'fsdp' only on CUDA GPUs", fix="use distributed='ddp'.")
        kwargs["fsdp_plugin"] = fsdp_plugin()
    return Accelerator(
        # cpu=True on a machine without CUDA: Accelerate then recognises torchrun's
        # environment as multi-process CPU (gloo) instead of one process per rank.
        cpu=not torch.cuda.is_available(),
        mixed_precision=accelerate_mixed_precision(precision),
        dataloader_config=DataLoaderConfiguration(non_blocking=torch.cuda.is_available()),
        step_scheduler_with_optimizer=False,  # the loop steps the schedule once per real step
        **kwargs,
    )


def fsdp_plugin():
    """FSDP2 (``fully_shard``), the path PyTorch and Accelerate support on torch 2.11+.

    Not FSDP1, Accelerate's default: it replaces the parameters by flat ones, and Accelerate
    does not point an optimizer made before ``prepare`` at them (``_get_parameters_to_remap``
    returns nothing when ``use_orig_params`` is False), so the optimizer trained orphans and
    saving its state raised ``KeyError: Parameter containing: ...`` in torch's
    ``_optim_utils._unflatten_param_groups`` (issue 32). FSDP2 shards the modules in place and
    Accelerate's ``_prepare_fsdp2`` swaps the optimizer's parameters for the sharded ones, which
    is why the model and its optimizer must go through one ``prepare`` call together.
    """
    from accelerate import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(
        fsdp_version=2,
        # Each rank writes its shard through torch.distributed.checkpoint (model and AdamW
        # moments), and a checkpoint saved by N processes loads on M: DCP reshards on load.
        state_dict_type="SHARDED_STATE_DICT",
        # One shard group per transformer block (the model's _no_split_modules): a block's
        # weights are gathered just before it runs and freed after, the point of sharding.
        auto_wrap_policy="transformer_based_wrap",
        # The task loads the model before the accelerator exists (a LoRA base, 4-bit weights):
        # there is no meta-device model for Accelerate to fill from rank 0.
        cpu_ram_efficient_loading=False,
        reshard_after_forward=True,
    )


def shard_blocks(accelerator, model) -> None:
    """Under FSDP, name the blocks that get a shard group each: the model's ``_no_split_modules``
    less any that holds the input embeddings. Call after the model is built, before ``prepare``.

    Accelerate's FSDP2 wraps every ``_no_split_modules`` class, then the input embeddings on
    their own; BERT lists ``BertEmbeddings`` there, so its word embeddings would be sharded twice
    (``fully_shard`` then fails in ``DeviceMesh._concatenate``: the weight is already a DTensor).
    """
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if plugin is None:
        return
    plugin.transformer_cls_names_to_wrap = fsdp_block_names(model)


def fsdp_block_names(model) -> list[str]:
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    found: dict[str, list] = {}
    for module in model.modules():
        found.setdefault(type(module).__name__, []).append(module)
    names = []
    for name in getattr(model, "_no_split_modules", None) or []:
        modules = found.get(name, [])
        holds_embeddings = embeddings is not None and any(
            sub is embeddings for module in modules for sub in module.modules())
        if modules and not holds_embeddings:
            names.append(name)
    return names


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
