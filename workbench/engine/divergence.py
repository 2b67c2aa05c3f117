"""A run whose loss has diverged while its weights stay finite: found, and stopped before it is saved.

A learning rate far too high rarely ends in NaN. The loss climbs to about ln(V), the loss
of a model that predicts the uniform distribution over its V classes (vocabulary tokens
for a language model, labels for a classifier), or above it, and stays there; every
weight is finite, so the NaN check passes, and the ruined model would be saved as the
final and the best one. The guard stops such a run with a TrainingError.

Diverged means both, for most of a window of steps (so one bad batch never stops a run):

- far above where the run started: ``start + max(0.5, start / 2)`` (start: the loss of the
  first step, before any update), and
- at or near the uniform-distribution loss: ``0.85 * ln(V)``.

A pretrained language model starts far below ln(V) (SmolLM2: ~2 vs ln 49152 = 10.8), so the
second bound decides (9.2). A random model or a new classifier head starts at about ln(V)
already, so the first one does (binary classifier from 0.69: 1.19). A healthy run only
falls from its start; a run that keeps most of a window above both bounds has forgotten
what it knew. Costs nothing: it reads the losses the engine already brought to the host.
"""

from __future__ import annotations

import math
from collections import deque

NEAR_UNIFORM = 0.85  # share of ln(V) that counts as "near the uniform-distribution loss"
WINDOW_MIN, WINDOW_MAX = 4, 20  # steps; a tenth of the run in between
SUSTAINED = 0.75  # share of the window's steps that must be above the threshold


def threshold(start: float, uniform: float | None) -> float:
    """The loss above which a step counts as diverged (see the module's docstring)."""
    far_above = start + max(0.5, 0.5 * start)
    return max(far_above, NEAR_UNIFORM * uniform) if uniform else far_above


class DivergenceGuard:
    """Fed every step's loss; says when most of the last ``window`` steps are past the threshold."""

    def __init__(self, num_classes: int | None, total_steps: int, start: float | None = None):
        self.uniform = math.log(num_classes) if num_classes and num_classes > 1 else None
        self.window = min(WINDOW_MAX, max(WINDOW_MIN, total_steps // 10))
        self.start = start  # the first step's loss; kept in TrainState across resumes
        self.recent: deque[tuple[int, float]] = deque(maxlen=self.window)

    @property
    def limit(self) -> float | None:
        return None if self.start is None else threshold(self.start, self.uniform)

    def observe(self, step: int, loss: float) -> None:
        if self.start is None:
            self.start = loss
        self.recent.append((step, loss))

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

    def is_diverged_value(self, loss: float) -> bool:
        """Whether one (eval) loss is past the threshold: such a model is never kept as best."""
        return self.limit is not None and loss >= self.limit

    def describe(self) -> str:
        uniform = f"ln({round(math.exp(self.uniform))}) = {self.uniform:.2f}" if self.uniform else "unknown"
        return (f"its start ({self.start:.3f} at the first step) and near the loss of a uniform guess "
                f"({uniform}); threshold {self.limit:.2f}")
