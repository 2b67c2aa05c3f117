"""Progress of an evaluation as events, and the console view of them.

lm-evaluation-harness draws its own tqdm bars (building contexts, tokenizing, running the
requests). Under papermill or in a CI log each redraw is a line, thousands for a benchmark;
in a notebook they are text, not a bar. So while the harness runs, its modules' ``tqdm`` is
replaced by ``_Reported``, which draws nothing and hands each step to the listeners as an event:

    {"kind": "evaluate_start", "model": label, "tasks": [...], "models": n, "index": i}
    {"kind": "progress", "model": label, "stage": "Running loglikelihood requests", "done": 120, "total": 480}
    {"kind": "evaluate_end", "model": label, "seconds": 41.2, "scores": [{task, metric, value, stderr}, ...]}
    {"kind": "message", "text": ..., "level": "info" | "warn"}

``ConsoleProgress`` prints them as a few lines (a stage's start, every 10 %, its end); the
notebook view (``workbench.widgets.evaluation``) draws a bar. Library loggers and download bars
(transformers' "Loading weights", datasets' "Generating split") are quieted for the same reason.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable

Listener = Callable[[dict], None]
# Modules of lm-evaluation-harness that draw bars with a module-level ``tqdm``.
_HARNESS_MODULES = ("lm_eval.models.huggingface", "lm_eval.api.model", "lm_eval.api.task")


class _Reported:
    """The part of tqdm's interface the harness uses, reporting to ``emit`` instead of drawing."""

    emit: Callable[[dict], None] = staticmethod(lambda event: None)

    def __init__(self, iterable=None, desc: str | None = None, total: int | None = None, disable: bool = False,
                 **_ignored):
        self.iterable = iterable
        self.stage = desc or "Preparing"
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total, self.n, self.disable = total, 0, disable
        self._report()

    def _report(self) -> None:
        if not self.disable:
            type(self).emit({"kind": "progress", "stage": self.stage, "done": self.n, "total": self.total})

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update(1)

    def update(self, n: int = 1) -> None:
        self.n += n
        self._report()

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.stage = desc or self.stage

    def close(self) -> None:
        pass

    def refresh(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def harness_progress(emit: Callable[[dict], None]):
    """Within this block the harness's bars become ``progress`` events given to ``emit``."""
    import importlib

    reported = type("Reported", (_Reported,), {"emit": staticmethod(emit)})
    swapped = []
    for name in _HARNESS_MODULES:
        module = importlib.import_module(name)
        if hasattr(module, "tqdm"):
            swapped.append((module, module.tqdm))
            module.tqdm = reported
    try:
        yield
    finally:
        for module, original in swapped:
            module.tqdm = original


def _quiet_git_commit_hash() -> str | None:
    """lm_eval's ``get_git_commit_hash`` without git's complaint on the cell's output.

    The harness records the working folder's commit with ``git describe`` and lets git's stderr
    through: from a folder that is no repository (``/workspace`` in the image, most notebook
    folders) every evaluation printed ``fatal: not a git repository``, which reads like an error.
    The same answer: the commit, else what the harness's fallback reads from the folder.
    """
    import os
    import subprocess

    from lm_eval.loggers.utils import get_commit_from_path

    try:
        done = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, timeout=10)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return get_commit_from_path(os.getcwd())


@contextlib.contextmanager
def quiet_libraries():
    """No INFO logs from the harness, no git complaint and no download / loading bars while it runs (put
    back after)."""
    import lm_eval.evaluator
    from transformers.utils import logging as hf_logging

    # Imported by name into the evaluator, so patched there; a harness without it is left as it is.
    git_hash = getattr(lm_eval.evaluator, "get_git_commit_hash", None)
    if git_hash is not None:
        lm_eval.evaluator.get_git_commit_hash = _quiet_git_commit_hash
    harness_log = logging.getLogger("lm_eval")
    level = harness_log.level
    harness_log.setLevel(logging.WARNING)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    datasets_bars = None
    try:
        from datasets.utils import logging as ds_logging

        datasets_bars = ds_logging.is_progress_bar_enabled()
        ds_logging.disable_progress_bar()
    except ImportError:
        ds_logging = None
    try:
        yield
    finally:
        if git_hash is not None:
            lm_eval.evaluator.get_git_commit_hash = git_hash
        harness_log.setLevel(level)
        if bars:
            hf_logging.enable_progress_bar()
        if ds_logging is not None and datasets_bars:
            ds_logging.enable_progress_bar()


class ConsoleProgress:
    """Events as plain lines (terminals, papermill, CI): a stage's start, each 10 %, its end."""

    def __init__(self, stream=None, every_s: float = 30.0):
        self.stream = stream or sys.stdout
        self.every_s = every_s
        self._stage: tuple | None = None
        self._shown = -1
        self._last = 0.0

    def print(self, text: str) -> None:
        print(f"workbench evaluate: {text}", file=self.stream, flush=True)

    def __call__(self, event: dict) -> None:
        kind = event.get("kind")
        if kind == "evaluate_start":
            self.print(f"[{event['index'] + 1}/{event['models']}] {event['model']} on {', '.join(event['tasks'])}")
        elif kind == "progress":
            self._progress(event)
        elif kind == "evaluate_end":
            scores = ", ".join(f"{s['column']} {s['value']:.4f}" + (f" ± {s['stderr']:.4f}" if s.get("stderr") else "")
                               for s in event.get("scores", []))
            self.print(f"{event['model']} done in {event['seconds']:.0f} s: {scores}")
        elif kind == "message":
            self.print(event.get("text", ""))

    def _progress(self, event: dict) -> None:
        total, done = event.get("total"), event.get("done", 0)
        stage = (event.get("model"), event.get("stage"))
        now = time.monotonic()
        if stage != self._stage:
            self._stage, self._shown, self._last = stage, -1, now
            if total:
                self.print(f"{event['stage']}: {total} ...")
            return
        if not total:
            return
        decile = int(10 * done / total)
        if done >= total or (decile > self._shown and now - self._last >= 1.0) or now - self._last >= self.every_s:
            self._shown, self._last = decile, now
            self.print(f"{event['stage']}: {done}/{total} ({done / total:.0%})")

    def close(self) -> None:
        pass
