"""The notebook view of a run: a tqdm bar and a live loss/metric chart.

Everything that is not drawing (the run folded from its events, the console
lines, the chart itself) is headless and lives in ``workbench.engine.progress``; this
module only puts it on screen in a notebook, so the engine never imports it.
``ConsoleChartProgress`` is the console view for a kernel nobody watches
(papermill): plain lines, and the final chart kept in the executed notebook.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable

from workbench.engine.progress import (
    ConsoleProgress,
    Progress,
    format_end_line,
    format_event,
    is_number,
    render_png,
)


class ConsoleChartProgress(ConsoleProgress):
    """Console lines, plus the final chart as one image in the executed notebook."""

    def finish(self) -> None:
        super().finish()
        if self.chart_path is not None:
            from IPython.display import Image, display

            display(Image(data=self.chart_path.read_bytes()))


class Throttle:
    """Allows an action at most once per ``interval_s``, stretched so that an action
    costing ``cost_s`` keeps to about ``1/budget`` of the time."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic, budget: float = 50):
        self.interval_s = interval_s
        self.clock = clock
        self.budget = budget
        self._next = -math.inf

    def ready(self) -> bool:
        return self.clock() >= self._next

    def done(self, started: float) -> None:
        """Record that the action started at ``started`` (a clock value) just finished."""
        now = self.clock()
        self._next = started + max(self.interval_s, (now - started) * self.budget)


class NotebookProgress(Progress):
    """A tqdm bar and a loss/metric chart, redrawn at most every ``chart_every_s``.

    The chart is a PNG in a display handle updated in place: it works in any
    front end, and the notebook keeps the last picture when saved.
    """

    def __init__(
        self,
        *,
        chart_every_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
        display: Callable | None = None,
        make_bar: Callable | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.throttle = Throttle(chart_every_s, clock)
        self.clock = clock
        self._display = display
        self._make_bar = make_bar
        self._bar = None
        self._chart = None  # display handle
        self._figure = None
        self._drawn_events = 0  # history.num_events at the last redraw
        self.redraws = 0

    def show(self, event: dict) -> None:
        kind = event.get("kind")
        if kind in ("start", "train", "end"):
            self._update_bar(event)
        if kind in ("eval", "checkpoint", "message", "start"):
            line = format_event(event, self.history)
            if line:
                self._bar_write(line)
        if kind in ("train", "eval") and self.throttle.ready():
            self.redraw()

    def _update_bar(self, event: dict) -> None:
        if self._bar is None:
            make_bar = self._make_bar
            if make_bar is None:
                from tqdm.auto import tqdm as make_bar
            self._bar = make_bar(total=self.history.total_steps, unit="step", desc="training")
        bar = self._bar
        if event.get("kind") == "start" and self.history.total_steps:
            bar.total = self.history.total_steps
        step = self.history.step
        if step != bar.n:
            bar.update(step - bar.n)
        last = self.history.last_train or {}
        postfix = {}
        if is_number(last.get("loss")):
            postfix["loss"] = f"{last['loss']:.4f}"
        if is_number(last.get("lr")):
            postfix["lr"] = f"{last['lr']:.1e}"
        if is_number(last.get("samples_per_s")):
            postfix["samples/s"] = f"{last['samples_per_s']:.0f}"
        if postfix:
            bar.set_postfix(postfix, refresh=False)

    def _bar_write(self, text: str) -> None:
        if self._bar is not None and hasattr(self._bar, "write"):
            self._bar.write(text, file=self._stream or sys.stdout)
        else:
            self.print(text)

    def redraw(self) -> None:
        """Draw the chart now (the throttle decides when ``show`` calls this)."""
        started = self.clock()
        try:
            png = render_png(self.history, self._figure)
        except ImportError:  # no matplotlib: the bar alone
            self.throttle.interval_s = math.inf
            return
        from IPython.display import Image

        image = Image(data=png)
        if self._chart is None:
            display = self._display
            if display is None:
                from IPython.display import display
            self._chart = display(image, display_id=True)
        else:
            self._chart.update(image)
        self.redraws += 1
        self._drawn_events = self.history.num_events
        self.throttle.done(started)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.history.end is not None:
            self._bar_write(format_end_line(self.history.end, self.history))
        self.close()
        super().finish()
        if self.chart_path is not None:
            self.print(f"loss curve saved to {self.chart_path}")

    def close(self) -> None:
        """Final redraw if the last events are not drawn yet, then release the bar."""
        if self.closed:
            return
        if self.history.num_events > self._drawn_events and (
            self.history.train_steps or self.history.evals
        ):
            self.redraw()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        super().close()
