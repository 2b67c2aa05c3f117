"""The optimizer (AdamW) and the learning-rate schedule of a run."""

from __future__ import annotations

import torch

from workbench.config import TrainConfig

# our name -> transformers' schedule with a warm-up
_SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant_with_warmup"}


def make_optimizer(model, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters; no weight decay on biases and norms."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]  # biases, LayerNorm
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    try:
        # The fused kernel updates all parameters in one pass (CPU and CUDA); the default
        # loops over them in Python, which cost ~5x the optimizer time of a 22M-parameter
        # BERT on CPU (benchmarks/train_throughput.py).
        return torch.optim.AdamW(groups, lr=config.lr, fused=True)
    except (RuntimeError, TypeError):  # a device or dtype without a fused kernel
        return torch.optim.AdamW(groups, lr=config.lr, foreach=True)


def make_scheduler(name: str, optimizer, warmup_steps: int, total_steps: int):
    """transformers' schedule ``name`` with a linear warm-up, one step on.

    transformers' warm-up gives the first optimizer step a learning rate of 0: that
    step computes a full forward and backward and changes nothing. The workbench's
    schedule starts where transformers' is after one step: the curve of
    ``get_scheduler(name, warmup + 1, total + 1)`` from its step 1, so step s gets
    ``(s + 1) / (warmup + 1)`` of the rate during the warm-up and the same decay after.
    """
    from transformers import get_scheduler

    library = get_scheduler(_SCHEDULES[name], optimizer, num_warmup_steps=warmup_steps + 1,
                            num_training_steps=total_steps + 1)
    factors = [lambda step, factor=factor: factor(step + 1) for factor in library.lr_lambdas]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factors)
