"""What people call in notebooks: ``fit``, ``fit_distributed``, ``watch``, ``runs``, ``sweep`` and
``evaluate`` with the view chosen for where the call runs.

The engine (``workbench.engine.train``) and the log follower (``workbench.engine.watcher``) are
headless and take any listener; this module picks one: in a kernel someone looks at,
the notebook view (a bar and a live chart, ``workbench.widgets.progress``); under
papermill, plain lines plus the final chart in the executed notebook; in a terminal,
plain lines. ``progress="none"`` shows nothing (the event log is still written).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from workbench.config import ModelChoice, TrainConfig
from workbench.engine import distributed, progress
from workbench.engine.progress import Progress, RunHistory
from workbench.engine.results import FitResult, result_from_disk


def make_view(mode: str = "auto", **kwargs) -> Progress:
    """A view of a run's events: ``mode`` is "auto" | "notebook" | "console" | "none".

    ``kwargs``: ``output_dir``, ``save_chart``, ``stream``; ``chart_every_s`` and
    ``clock`` for the notebook view.
    """
    chosen = progress.choose_mode(mode)
    notebook_only = {k: kwargs.pop(k) for k in ("chart_every_s", "clock") if k in kwargs}
    if chosen == "notebook":
        from workbench.widgets.progress import NotebookProgress

        return NotebookProgress(**notebook_only, **kwargs)
    if chosen == "console":
        from workbench.engine.runtime import in_jupyter_kernel

        if in_jupyter_kernel():  # papermill: keep the final chart in the executed notebook
            from workbench.widgets.progress import ConsoleChartProgress

            return ConsoleChartProgress(**kwargs)
        return progress.ConsoleProgress(**kwargs)
    return Progress(output_dir=kwargs.get("output_dir"), save_chart=False, stream=kwargs.get("stream"))


def fit(model: str | ModelChoice, data, config: TrainConfig | None = None, *,
        text_columns: Sequence[str] | None = None, label_column: str | None = None,
        progress: str = "auto", listeners: Sequence[Callable[[dict], None]] = (),
        **overrides) -> FitResult:
    """Fine-tune ``model`` on ``data`` and show the run as it goes (see ``workbench.engine.train.fit``).

    ``progress``: "auto" (a live chart in a notebook, lines elsewhere), "notebook",
    "console" or "none". ``listeners``: your own callables, given every event (a dict)
    beside the view (to log elsewhere, or stop on a condition of your own).
    """
    from workbench.engine import train

    view = make_view(progress)
    try:
        return train.fit(model, data, config, text_columns=text_columns, label_column=label_column,
                         listeners=[*listeners, *([] if progress == "none" else [view])], **overrides)
    finally:
        view.close()


def fit_distributed(model: str | ModelChoice, data, config: TrainConfig | None = None, *,
                    num_processes: int, progress: str = "console", **kwargs) -> FitResult:
    """``fit`` on ``num_processes`` GPUs from a notebook (accelerate.notebook_launcher).

    The launcher forks the kernel, which CUDA does not survive: call this before
    anything in the kernel touches the GPU. Widgets do not cross a fork, so the
    processes print lines; the result is read back from the run's folder.
    """
    from workbench.engine.inputs import make_config

    mode = "console" if progress == "auto" else progress
    distributed.launch_from_notebook(_fit_in_process, (model, data, config, mode, kwargs), num_processes)
    config = make_config(config, {k: v for k, v in kwargs.items() if k not in ("text_columns", "label_column")})
    return result_from_disk(config.output_dir)


def _fit_in_process(model, data, config, mode, kwargs) -> None:
    from workbench.engine import train

    view = progress.ConsoleProgress() if mode == "console" else None
    train.fit(model, data, config, listeners=[view] if view else [], **kwargs)


def watch(output_dir: str | os.PathLike, mode: str = "auto", *, follow: bool = True, poll_s: float = 1.0,
          wait_for_log_s: float = 30.0, stream=None) -> RunHistory:
    """Show a run's progress from its event log (``workbench.engine.watcher.watch``) in the view for here."""
    from workbench.engine import watcher

    view = make_view(mode, save_chart=False, stream=stream)
    return watcher.watch(output_dir, view, follow=follow, poll_s=poll_s, wait_for_log_s=wait_for_log_s)


def runs(root: str | os.PathLike = "outputs", mode: str = "auto"):
    """Every run under ``root`` side by side (``workbench.engine.runs``): in a notebook someone
    looks at, a widget (filter, sort, select runs -> overlaid curves, live for running ones);
    elsewhere the RunsTable (printed as text, shown as HTML by papermill). Both have
    ``.to_frame()``, the pandas DataFrame."""
    from workbench.engine.runs import runs as read_runs

    table = read_runs(root)
    if progress.choose_mode(mode) == "notebook":
        from workbench.widgets.runs import RunsBrowser

        return RunsBrowser(table)
    return table


def sweep(notebook: str | os.PathLike, grid, *, mode: str = "auto", **kwargs):
    """Run ``notebook`` once per combination of ``grid`` (``workbench.sweep.runner.sweep``); in a
    notebook someone looks at, the sweep's runs table is shown and re-read as combinations start
    and end. Returns the SweepResult (``.failed``, ``.runs()``)."""
    from workbench.sweep import runner

    if progress.choose_mode(mode) != "notebook":
        return runner.sweep(notebook, grid, **kwargs)
    from IPython.display import display

    from workbench.widgets.runs import RunsBrowser

    plan = runner.make_plan(notebook, grid, **{k: v for k, v in kwargs.items()
                                               if k not in ("devices", "on_update", "log")})
    plan.save()
    from workbench.engine.runs import runs as read_runs

    browser = RunsBrowser(read_runs(plan.root_path))
    display(browser)
    return runner.run_plan(plan, devices=kwargs.get("devices", "auto"), on_update=lambda _: browser.reload(),
                           log=kwargs.get("log", print))


def evaluate(models, tasks=("heldout",), *, progress: str = "auto", listeners: Sequence[Callable[[dict], None]] = (),
             **options):
    """Benchmark ``models`` with lm-evaluation-harness (``workbench.evaluation.harness.evaluate``).

    ``models``: a run folder (its final model; ``checkpoint="best"`` its best), a model folder, an
    adapter folder, a hub id, ``(model, tokenizer)``, or ``{"base": ..., "tuned": ...}`` for one
    table of several. ``tasks``: harness task names (``"arc_easy"``...), names of your own task
    YAMLs with ``include_path=FOLDER``, or ``"heldout"`` (the run's own held-out split). Options:
    ``limit``, ``num_fewshot``, ``apply_chat_template``, ``system_instruction``, ``batch_size``,
    ``device``, ``dtype``, ``log_samples``, ``data`` (for heldout, or a labelled file to score a
    classifier with ``text_columns``/``label_column``). Results go into each run's folder
    (``evaluation/``), its model card and ``workbench runs``. ``progress``: "auto" (a bar in a
    notebook, lines elsewhere), "notebook", "console" or "none".
    """
    from workbench.evaluation.harness import evaluate as run_evaluation
    from workbench.evaluation.progress import ConsoleProgress

    view = None
    chosen = _choose_mode(progress)
    if chosen == "notebook":
        from workbench.widgets.evaluation import EvaluationProgress

        view = EvaluationProgress()
    elif chosen == "console":
        view = ConsoleProgress()
    try:
        return run_evaluation(models, tasks, listeners=[*listeners, *([view] if view else [])], **options)
    finally:
        if view is not None:
            view.close()


def _choose_mode(mode: str) -> str:
    return progress.choose_mode(mode)  # the module: ``evaluate``'s argument of the same name hides it there
