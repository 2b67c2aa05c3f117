"""The notebook view of an evaluation: one progress bar for the current model and stage.

The events come from ``workbench.evaluation.progress`` (the harness's own bars, reported
instead of drawn); the scores table is the returned ``EvaluationResult`` itself, shown by
the cell. Redrawn at most ~10 times a second: a benchmark has thousands of requests.
"""

from __future__ import annotations

import time


class EvaluationProgress:
    """ipywidgets bar + label, updated from evaluation events."""

    def __init__(self, min_interval_s: float = 0.1):
        import ipywidgets as widgets
        from IPython.display import display

        self.bar = widgets.IntProgress(value=0, min=0, max=1, layout=widgets.Layout(width="60%"))
        self.label = widgets.HTML("starting...")
        self.box = widgets.VBox([self.label, self.bar])
        self.min_interval_s = min_interval_s
        self._last = 0.0
        self._model = ""
        display(self.box)

    def __call__(self, event: dict) -> None:
        import html

        kind = event.get("kind")
        if kind == "evaluate_start":
            self._model = f"{event['model']} ({event['index'] + 1}/{event['models']})"
            self.label.value = f"<b>{html.escape(self._model)}</b>: loading"
            self.bar.value, self.bar.max = 0, 1
        elif kind == "progress":
            now = time.monotonic()
            total, done = event.get("total") or 0, event.get("done", 0)
            if total and done < total and now - self._last < self.min_interval_s:
                return
            self._last = now
            self.bar.max = max(total, 1)
            self.bar.value = min(done, self.bar.max)
            self.label.value = (f"<b>{html.escape(self._model)}</b>: {html.escape(str(event.get('stage')))} "
                                f"{done}/{total or '?'}")
        elif kind == "evaluate_end":
            self.bar.value = self.bar.max
            self.label.value = f"<b>{html.escape(self._model)}</b>: done in {event.get('seconds', 0):.0f} s"
        elif kind == "message":
            self.label.value = html.escape(event.get("text", ""))

    def close(self) -> None:
        self.bar.bar_style = "success"
