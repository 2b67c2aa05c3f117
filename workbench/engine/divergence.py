"""A run whose loss has diverged while its weights stay finite: found, and stopped before it is saved.

A learning rate far too high rarely ends in NaN. The loss climbs far above where the model
started (a classifier's to ln(C) or beyond, C labels; a language model's towards ln(V), V
vocabulary tokens) and stays there; every weight is finite, so the NaN check passes, and
the ruined model would be saved as the final and the best one. The guard stops such a run
with a TrainingError.

The rule. A step counts as diverged when its training loss is at or above

    bound = max(start + max(0.5, start / 2), floor)

- ``start``: the training loss of the model as it was before the first update, measured by
  :func:`measure_start` on ``START_ROWS`` training rows (forward passes only, dropout off).
  Not the first batch's loss: continuing a fine-tuned classifier, one easy batch measured
  0.01 while the data's loss was 1.3; a bound of 0.59 then stopped a healthy run at step 10.
  Not the median of the first steps either: a run at a huge rate is ruined at its second
  step, so its first steps are no start. And not the step-0 evaluation: it measures the
  validation split, which is often cleaner than the training data (noisy training labels,
  clean validation), so it would put the bound below the training data's own loss.
- ``floor``: for a classifier, ln(C), the loss of a uniform guess: a model that was nearly
  perfect at its start (start 0.01) may wobble up to a guess's loss without being called
  diverged, and a healthy run on noisy labels sits near its noise floor (0.61 for 30% noise
  on two labels), which is below ln 2 = 0.69. For a language model, none: its start is
  its pretrained knowledge and a LoRA run at a rate that ruins it stays far below ln(V)
  (the tiny Llama of the tests: from 0.46 to 4-30, never near 10.8).

The run stops when ``SUSTAINED`` (3/4) of the last ``window`` steps are diverged, so one bad
batch never stops a run; ``window`` is a tenth of the run, but at least the steps that hold
``WINDOW_ROWS`` rows (with a batch of one row, one hard example is one step) and between
4 and 20 steps. Before the final or a best model is saved, a window that is not full yet is
judged too (a run shorter than the window must not save a diverged model either).

What it costs: the start is measured once per run, before the first step: forward passes
over ``START_ROWS`` rows, about the compute of ``START_ROWS / 3`` rows of training
(one step of a batch of 16: a third of a second for a 7B LoRA on one GPU). The per-step
check reads the losses the engine already brought to the host.

Measured (tests/test_divergence.py; the table is in docs/troubleshooting.md): healthy runs stay
under their bound but for lone steps (a classifier continued on 30%-noisy labels peaks at 1.59
against 2.33, where the old first-batch rule stopped it at step 5; a fresh one at 0.72 against
1.19), and ruined ones sit far above it (learning rate 1: 24.8 against 1.19; LoRA at rate 1:
29.4 against 0.96), stopped at their fourth step. A ruined run of a test must be far past the
edge, of a model with much to lose: LoRA at 0.1 learned on an Intel AMX CPU, and at rate 1 a
model whose start was 1.9 collapsed to ~2.1-2.6, under its bound of 2.8, on some CPUs.
"""

from __future__ import annotations

import math
import random
from collections import deque

WINDOW_MIN, WINDOW_MAX = 4, 20  # steps; a tenth of the run in between
WINDOW_ROWS = 32  # the window holds at least this many training rows (up to WINDOW_MAX steps)
SUSTAINED = 0.75  # share of the window's steps that must be above the bound
START_ROWS = 32  # training rows the start is measured on


def floor_for(num_classes: int | None, language_model: bool) -> float:
    """The bound's floor: ln(C) for a classifier, 0 for a language model (see the docstring)."""
    if language_model or not num_classes or num_classes < 2:
        return 0.0
    return math.log(num_classes)


def threshold(start: float, floor: float = 0.0) -> float:
    """The loss at or above which a step counts as diverged."""
    return max(start + max(0.5, 0.5 * start), floor)


def window_for(total_steps: int, rows_per_step: int = 1) -> int:
    steps_for_rows = math.ceil(WINDOW_ROWS / max(1, rows_per_step))
    return min(WINDOW_MAX, max(WINDOW_MIN, total_steps // 10, steps_for_rows))


class DivergenceGuard:
    """Fed every step's loss; says when most of the last ``window`` steps are past the bound."""

    def __init__(self, num_classes: int | None, total_steps: int, *, rows_per_step: int = 1,
                 language_model: bool = False, start: float | None = None):
        self.num_classes = num_classes if num_classes and num_classes > 1 else None
        self.language_model = language_model
        self.floor = floor_for(self.num_classes, language_model)
        self.window = window_for(total_steps, rows_per_step)
        self.start = start  # measure_start's value; kept in TrainState across resumes
        self.recent: deque[tuple[int, float]] = deque(maxlen=self.window)
        self.highest: tuple[int, float] | None = None  # (step, loss): the run's peak, for reports

    @property
    def limit(self) -> float | None:
        return None if self.start is None else threshold(self.start, self.floor)

    def observe(self, step: int, loss: float) -> None:
        if self.start is None:  # a checkpoint from before the start was measured: its first loss
            self.start = loss
        self.recent.append((step, loss))
        if self.highest is None or loss > self.highest[1]:
            self.highest = (step, loss)

    def diverged(self, *, partial: bool = False) -> tuple[int, int, float] | None:
        """(first step, last step, median loss) of a diverged window, else None.

        ``partial``: judge a window that is not full yet (before the final or a best model
        is saved: a run shorter than the window must not save a diverged model either).
        """
        if self.limit is None or not self.recent or (len(self.recent) < self.window and not partial):
            return None
        if len(self.recent) < 2:  # one step is one batch, never "sustained"
            return None
        above = sum(loss >= self.limit for _, loss in self.recent)
        if above < math.ceil(SUSTAINED * len(self.recent)):
            return None
        losses = sorted(loss for _, loss in self.recent)
        first = next(step for step, loss in self.recent if loss >= self.limit)
        return first, self.recent[-1][0], losses[len(losses) // 2]

    def describe(self) -> str:
        parts = [f"its start ({self.start:.3f}, the training loss before the first update)"]
        if self.floor:
            parts.append(f"the loss of a uniform guess over {self.num_classes} labels "
                         f"(ln({self.num_classes}) = {math.log(self.num_classes):.2f})")
        return " and ".join(parts) + f"; bound {self.limit:.2f}"


def measure_start(accelerator, model, task, dataset, collate, micro_batch: int, seed: int,
                  rows: int = START_ROWS) -> float:
    """The model's mean training loss before any update, over ``rows`` training rows.

    The rows are a fixed sample (``seed``), batched by length; forward passes only, in eval
    mode (no dropout, so the run's random stream is untouched), weighted like a training
    step (rows, or supervised tokens). Every process measures the same rows; the mean over
    processes is returned, so all of them agree on the bound.
    """
    import torch

    from workbench.engine.memory import with_halving
    from workbench.errors import TrainingError
    from workbench.tasks.base import split_batch

    chosen = random.Random(seed).sample(range(len(dataset)), min(rows, len(dataset)))
    lengths = getattr(dataset, "lengths", None)
    if lengths is not None:
        chosen.sort(key=lambda i: -lengths[i])

    def mean_loss(size: int) -> torch.Tensor:
        total = units = 0
        for begin in range(0, len(chosen), size):
            batch = collate([dataset[i] for i in chosen[begin:begin + size]])
            batch = {k: v.to(accelerator.device) if hasattr(v, "to") else v for k, v in batch.items()}
            for piece in split_batch(task, batch, size):
                weight = task.units(piece)
                total = total + task.loss(model, piece).detach().float() * weight
                units = units + weight
        return total / units

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            loss = with_halving(mean_loss, max(1, micro_batch), on_halve=lambda size: None,
                                give_up=lambda: TrainingError(
                                    "CUDA out of memory measuring the start loss even with batches of 1.",
                                    "use a shorter max_length or a smaller model.", step=0))
    finally:
        model.train(was_training)
    if accelerator.num_processes > 1:
        loss = accelerator.reduce(loss.reshape(1), "mean")[0]
    return float(loss)
