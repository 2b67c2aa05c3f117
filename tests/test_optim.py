"""The learning-rate schedule comes from transformers and matches the workbench's own
curve of version 0.1 (warm-up from (s+1)/(w+1), then linear, cosine or constant)."""

from __future__ import annotations

import math

import pytest
import torch

from workbench.config import TrainConfig
from workbench.engine.optim import make_optimizer, make_scheduler


def _schedule_of_v0_1(name: str, warmup: int, total: int):
    """The hand-written schedule the engine used before transformers' (kept as the reference)."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = (step - warmup) / max(1, total - warmup)
        if name == "constant":
            return 1.0
        if name == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
        return max(0.0, 1.0 - progress)

    return factor


@pytest.mark.parametrize("name", ["linear", "cosine", "constant"])
@pytest.mark.parametrize(("warmup", "total"), [(0, 50), (6, 100), (30, 37), (1, 2)])
def test_schedule_equals_the_old_one(name, warmup, total):
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=3e-4)
    scheduler = make_scheduler(name, optimizer, warmup, total)
    reference = _schedule_of_v0_1(name, warmup, total)
    for step in range(total + 1):  # every step a run takes (the loop ends at total)
        assert scheduler.get_last_lr()[0] == pytest.approx(3e-4 * reference(step), abs=1e-12, rel=0), step
        optimizer.step()
        scheduler.step()


def test_the_first_step_learns():
    """transformers alone gives step 0 a learning rate of 0: a wasted forward and backward."""
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0)
    assert make_scheduler("linear", optimizer, 10, 100).get_last_lr()[0] > 0


def test_no_weight_decay_on_biases_and_norms():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = make_optimizer(model, TrainConfig(weight_decay=0.1))
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and [p.ndim for p in decayed["params"]] == [2]
    assert plain["weight_decay"] == 0.0 and len(plain["params"]) == 3
