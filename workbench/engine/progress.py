"""A run's progress as text: the run folded from its events, console lines, the chart.

Headless on purpose: the engine, ``workbench train``, ``workbench watch`` and
papermill runs use these, and nothing here imports a notebook front end. The
notebook view (a bar and a live chart) is ``workbench.widgets.progress``, built on
the same ``Progress`` interface: a listener called with each event
(``EventLog.add_listener``, or ``watcher.watch`` replaying ``events.jsonl``) and
``close()``. Headless runs get plain lines because a tqdm bar written to a log or
a papermill notebook becomes one line per refresh.

Which view a call gets is chosen once, by ``choose_mode`` ("auto" picks the
notebook view only in a kernel someone looks at: ``workbench.engine.runtime``);
``WORKBENCH_PROGRESS=console|notebook|none`` overrides the choice outright.
"""

from __future__ import annotations

import io
import math
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from workbench.engine.runtime import someone_watching
from workbench.errors import ConfigError

MODES = ("auto", "notebook", "console", "none")
CHART_FILE = "loss_curve.png"


# -- choosing the output ------------------------------------------------------------


def choose_mode(mode: str = "auto") -> str:
    """Resolve ``mode`` to "notebook", "console" or "none"."""
    if mode not in MODES:
        raise ConfigError("progress", mode, " | ".join(MODES), "use progress='auto' unless you need one.")
    forced = os.environ.get("WORKBENCH_PROGRESS", "").strip().lower()
    if mode == "auto" and forced in MODES[1:]:
        return forced
    if mode != "auto":
        return mode
    return "notebook" if someone_watching() else "console"


# -- what the display knows about the run ---------------------------------------------


class RunHistory:
    """The run so far, folded from its events: what the lines and the chart draw."""

    def __init__(self) -> None:
        self.start: dict | None = None
        self.first_start_time: float | None = None
        self.last_train: dict | None = None
        self.end: dict | None = None
        self.train_steps: list[int] = []
        self.train_loss: list[float] = []
        self.train_events: list[dict] = []  # those with a loss, in step order: a task's own train metrics
        self.evals: list[dict] = []
        self.checkpoints: list[dict] = []
        self.messages: list[dict] = []
        self.num_events = 0

    def add(self, event: dict) -> None:
        self.num_events += 1
        kind = event.get("kind")
        if kind == "start":
            self.start = event
            self.end = None  # a resume reopens the run
            if self.first_start_time is None:
                self.first_start_time = event.get("time")
        elif kind == "train" and isinstance(event.get("step"), int):
            step = event["step"]
            if self.train_steps and step <= self.train_steps[-1]:
                self._rewind(step)  # a resumed run repeats steps after its checkpoint
            self.last_train = event
            if is_number(event.get("loss")):
                self.train_steps.append(step)
                self.train_loss.append(float(event["loss"]))
                self.train_events.append(event)
        elif kind == "eval":
            if self.evals and _step(event) <= _step(self.evals[-1]):
                self.evals = [e for e in self.evals if _step(e) < _step(event)]
            self.evals.append(event)
        elif kind == "checkpoint":
            self.checkpoints.append(event)
        elif kind == "message":
            self.messages.append(event)
        elif kind == "end":
            self.end = event

    def _rewind(self, step: int) -> None:
        keep = sum(1 for s in self.train_steps if s < step)
        del self.train_steps[keep:]
        del self.train_loss[keep:]
        del self.train_events[keep:]
        self.evals = [e for e in self.evals if _step(e) < step]

    @property
    def total_steps(self) -> int | None:
        total = (self.start or {}).get("total_steps")
        return total if isinstance(total, int) else None

    @property
    def step(self) -> int:
        for event in (self.end, self.last_train):
            if event and isinstance(event.get("step"), int):
                return event["step"]
        return 0

    @property
    def status(self) -> str:
        if self.end:
            return str(self.end.get("status", "ended"))
        return "running" if self.start else "not started"

    @property
    def verdict(self) -> dict | None:
        """The ``end`` event's verdict (engine/verdict.py): did the run learn anything?"""
        verdict = (self.end or {}).get("verdict")
        return verdict if isinstance(verdict, dict) else None

    @property
    def output_dir(self) -> str | None:
        config = (self.start or {}).get("config")
        return config.get("output_dir") if isinstance(config, dict) else None

    def __repr__(self) -> str:
        total = f"/{self.total_steps}" if self.total_steps else ""
        parts = [f"step {self.step}{total}", self.status]
        metrics = (self.end or {}).get("metrics") or (self.evals[-1] if self.evals else {})
        parts += [f"{k} {_num(v)}" for k, v in metrics.items() if k.startswith("eval_") and is_number(v)]
        return f"RunHistory({', '.join(parts)})"


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _step(event: dict) -> int:
    step = event.get("step")
    return step if isinstance(step, int) else 0


def _num(value: object) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


# -- text -------------------------------------------------------------------------------


def format_duration(seconds: float | None) -> str:
    """45s, 1m03s, 2h05m."""
    if not is_number(seconds) or seconds < 0:
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def format_bytes(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def format_train_line(event: dict, total_steps: int | None = None) -> str:
    """``step 120/500 | epoch 1.20 | loss 0.4312 | lr 1.8e-05 | 412 samples/s | ETA 1m03s``."""
    step = event.get("step", "?")
    parts = [f"step {step}/{total_steps}" if total_steps else f"step {step}"]
    if is_number(event.get("epoch")):
        parts.append(f"epoch {event['epoch']:.2f}")
    if is_number(event.get("loss")):
        parts.append(f"loss {event['loss']:.4f}")
    elif "loss" in event:
        parts.append(f"loss {event['loss']}")  # NaN / inf: show it, it matters
    if is_number(event.get("reward_accuracy")):  # a preference run's train pairs since the last line
        parts.append(f"reward acc {event['reward_accuracy']:.2f}")
    if is_number(event.get("reward_margin")):
        parts.append(f"margin {event['reward_margin']:.3f}")
    if is_number(event.get("lr")):
        parts.append(f"lr {event['lr']:.1e}")
    if is_number(event.get("samples_per_s")):
        parts.append(f"{event['samples_per_s']:.0f} samples/s")
    if is_number(event.get("gpu_mem_bytes")):
        parts.append(f"gpu {format_bytes(event['gpu_mem_bytes'])}")
    if event.get("skipped_steps"):
        parts.append(f"skipped {event['skipped_steps']}")
    if is_number(event.get("eta_s")):
        parts.append(f"ETA {format_duration(event['eta_s'])}")
    return " | ".join(parts)


def format_eval_line(event: dict, total_steps: int | None = None) -> str:
    """``eval step 500/500 | epoch 1.00 | eval_loss 0.3121 | eval_accuracy 0.9120 | ...``."""
    step = event.get("step", "?")
    parts = [f"eval step {step}/{total_steps}" if total_steps else f"eval step {step}"]
    if is_number(event.get("epoch")):
        parts.append(f"epoch {event['epoch']:.2f}")
    parts += [f"{k} {_num(v)}" for k, v in event.items() if k.startswith("eval_")]
    return " | ".join(parts)


def format_start_line(event: dict) -> str:
    parts = ["start"]
    if event.get("resumed_from_step"):
        parts = [f"resume from step {event['resumed_from_step']}"]
    if event.get("total_steps"):
        epochs = event.get("num_epochs")
        parts.append(f"{event['total_steps']} steps" + (f" over {epochs} epochs" if epochs else ""))
    world = event.get("world_size")
    if isinstance(world, int) and world > 1:
        parts.append(f"{world} processes")
    if event.get("precision") or event.get("device"):
        parts.append(f"{event.get('precision', '?')} on {event.get('device', '?')}")
    if event.get("precision_reason"):  # "auto: bf16, this CPU computes it natively (AVX512-BF16)"
        parts.append(str(event["precision_reason"]))
    return " | ".join(parts)


def format_end_line(event: dict, history: RunHistory | None = None) -> str:
    parts = [f"end: {event.get('status', 'ended')} at step {event.get('step', '?')}"]
    started = history.first_start_time if history else None
    if is_number(started) and is_number(event.get("time")):
        parts.append(f"took {format_duration(event['time'] - started)}")
    metrics = event.get("metrics") or {}
    parts += [f"{k} {_num(v)}" for k, v in metrics.items() if is_number(v)]
    line = " | ".join(parts)
    verdict = event.get("verdict")
    if isinstance(verdict, dict) and verdict.get("text"):
        line += f"\nverdict: {verdict['text']}"
    return line


VERDICT_LABELS = {"better": "learned", "no_better": "LEARNED NOTHING", "worse": "WORSE THAN BASELINE"}


def verdict_label(verdict: dict | None) -> str | None:
    """Two or three words for a title or a table cell (None without a verdict)."""
    return VERDICT_LABELS.get((verdict or {}).get("outcome"))


def format_event(event: dict, history: RunHistory | None = None) -> str | None:
    """The console line for any event (None for events that print nothing)."""
    total = history.total_steps if history else None
    kind = event.get("kind")
    if kind == "start":
        return format_start_line(event)
    if kind == "train":
        return format_train_line(event, total)
    if kind == "eval":
        return format_eval_line(event, total)
    if kind == "checkpoint":
        return f"checkpoint step {event.get('step', '?')} -> {event.get('path', '?')}"
    if kind == "message":
        level = event.get("level", "info")
        return event.get("text", "") if level == "info" else f"{level}: {event.get('text', '')}"
    if kind == "end":
        return format_end_line(event, history)
    return None


# -- chart ------------------------------------------------------------------------------


def plot_history(history: RunHistory, figure=None):
    """Draw train/eval loss and the eval metrics against steps on a matplotlib Figure.

    A preference run gets a third panel: the rewards of the chosen and rejected answers and
    their margin (train lines, eval dots), and its metric panel is the reward accuracy, train
    and held-out. Uses ``matplotlib.figure.Figure`` directly, not pyplot, so drawing never
    touches the notebook's global figure state or needs a GUI backend.
    """
    from matplotlib.figure import Figure

    preference = _is_preference(history)
    fig = figure or Figure(figsize=(14 if preference else 10, 3.4), layout="constrained")
    fig.clear()
    axes = fig.subplots(1, 3 if preference else 2)
    loss_ax, metric_ax = axes[0], axes[1]
    if history.train_steps:
        loss_ax.plot(history.train_steps, history.train_loss, label="train loss", linewidth=1.2)
    eval_steps = [_step(e) for e in history.evals]
    eval_loss = [e.get("eval_loss") for e in history.evals]
    if any(is_number(v) for v in eval_loss):
        loss_ax.plot(eval_steps, eval_loss, "o-", label="eval loss")
    loss_ax.set_title("loss")
    loss_ax.set_xlabel("step")
    if loss_ax.lines:
        loss_ax.legend(loc="upper right")

    metric_names = [k for k in ("eval_accuracy", "eval_f1", "eval_reward_accuracy")
                    if any(k in e for e in history.evals)]
    for name in metric_names:
        metric_ax.plot(eval_steps, [e.get(name) for e in history.evals], "o-", label=name[5:])
    values = [e[k] for e in history.evals for k in metric_names if is_number(e.get(k))]
    if preference:
        steps, train_accuracy = _train_series(history, "reward_accuracy")
        if steps:
            metric_ax.plot(steps, train_accuracy, linewidth=1.0, alpha=0.7, label="train reward_accuracy")
            values += train_accuracy
        metric_ax.axhline(0.5, color="gray", linewidth=0.8, linestyle=":")  # chance
        _plot_rewards(axes[2], history, eval_steps)
    metric_ax.set_title("reward accuracy (dotted: chance)" if preference else "eval metrics")
    metric_ax.set_xlabel("step")
    if metric_ax.lines:
        metric_ax.legend(loc="best")
        if values and min(values) >= 0 and max(values) <= 1:  # fractions: keep 1.0 in view
            metric_ax.set_ylim(max(0.0, min(values) - 0.05), 1.01)
    if not metric_names and not (preference and metric_ax.lines):
        metric_ax.text(0.5, 0.5, "no evaluation yet", ha="center", va="center",
                       transform=metric_ax.transAxes, color="gray")
    if history.total_steps:
        for ax in axes:
            ax.set_xlim(0, history.total_steps * 1.02)
    fig.suptitle(_chart_title(history), fontsize=10)
    return fig


def _is_preference(history: RunHistory) -> bool:
    return (any("eval_reward_accuracy" in e for e in history.evals)
            or any("reward_accuracy" in e for e in history.train_events))


def _train_series(history: RunHistory, name: str) -> tuple[list[int], list[float]]:
    pairs = [(e["step"], float(e[name])) for e in history.train_events if is_number(e.get(name))]
    return [s for s, _ in pairs], [v for _, v in pairs]


def _plot_rewards(ax, history: RunHistory, eval_steps: list[int]) -> None:
    """Rewards of the chosen and rejected answers and their margin: DPO can widen the margin
    while both fall, which only this panel shows."""
    for name, color in (("rewards_chosen", "C2"), ("rewards_rejected", "C3"), ("reward_margin", "C0")):
        steps, values = _train_series(history, name)
        if steps:
            ax.plot(steps, values, color=color, linewidth=1.0, alpha=0.7, label=name.replace("_", " "))
        held_out = [e.get("eval_" + name) for e in history.evals]
        if any(is_number(v) for v in held_out):
            ax.plot(eval_steps, held_out, "o", color=color, markersize=4,
                    label=None if steps else "eval " + name.replace("_", " "))
    ax.axhline(0.0, color="gray", linewidth=0.8, linestyle=":")
    ax.set_title("rewards (lines: train, dots: eval)")
    ax.set_xlabel("step")
    if ax.lines:
        ax.legend(loc="best", fontsize=8)


def plot_runs(histories: dict[str, RunHistory], figure=None):
    """Several runs' curves overlaid, the look of ``plot_history``: loss (train lines, eval dots
    on the same colour) on the left, the eval metrics on the right. ``histories``: name -> run."""
    from matplotlib.figure import Figure

    fig = figure or Figure(figsize=(10, 3.6), layout="constrained")
    fig.clear()
    loss_ax, metric_ax = fig.subplots(1, 2)
    metric_names = [k for k in ("eval_accuracy", "eval_f1", "eval_exact_match", "eval_reward_accuracy")
                    if any(k in e for h in histories.values() for e in h.evals)]
    colors = [f"C{i % 10}" for i in range(len(histories))]
    for (name, history), color in zip(histories.items(), colors, strict=True):
        if history.train_steps:
            loss_ax.plot(history.train_steps, history.train_loss, color=color, linewidth=1.1, label=name)
        eval_steps = [_step(e) for e in history.evals]
        eval_loss = [e.get("eval_loss") for e in history.evals]
        if any(is_number(v) for v in eval_loss):
            loss_ax.plot(eval_steps, eval_loss, "o--", color=color, markersize=4,
                         label=None if history.train_steps else name)
        for name_, style in zip(metric_names, ("o-", "s--", "^:", "d-."), strict=False):
            values = [e.get(name_) for e in history.evals]
            if any(is_number(v) for v in values):
                metric_ax.plot(eval_steps, values, style, color=color, markersize=4,
                               label=f"{name} {name_[5:]}" if len(metric_names) > 1 else name)
    loss_ax.set_title("loss (lines: train, dots: eval)")
    loss_ax.set_xlabel("step")
    metric_ax.set_title("eval " + ", ".join(n[5:] for n in metric_names) if metric_names else "eval metrics")
    metric_ax.set_xlabel("step")
    for ax in (loss_ax, metric_ax):
        if ax.lines:
            ax.legend(loc="best", fontsize=8)
    if not metric_ax.lines:
        metric_ax.text(0.5, 0.5, "no eval metric but the loss" if histories else "select runs",
                       ha="center", va="center", transform=metric_ax.transAxes, color="gray")
    running = sum(h.end is None and h.start is not None for h in histories.values())
    fig.suptitle(f"{len(histories)} run(s)" + (f", {running} running" if running else ""), fontsize=10)
    return fig


def render_runs_png(histories: dict[str, RunHistory], figure=None) -> bytes:
    fig = plot_runs(histories, figure)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


def _chart_title(history: RunHistory) -> str:
    total = f"/{history.total_steps}" if history.total_steps else ""
    label = verdict_label(history.verdict)
    title = f"step {history.step}{total} ({history.status}{', ' + label if label else ''})"
    if history.end is None and history.last_train and is_number(history.last_train.get("eta_s")):
        title += f" | ETA {format_duration(history.last_train['eta_s'])}"
    return title


def render_png(history: RunHistory, figure=None) -> bytes:
    fig = plot_history(history, figure)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


def save_loss_curve(history: RunHistory | Iterable[dict], path: str | os.PathLike) -> Path:
    """Save the chart of a run (a RunHistory or its events) as a PNG."""
    if not isinstance(history, RunHistory):
        events, history = history, RunHistory()
        for event in events:
            history.add(event)
    path = Path(path)
    path.write_bytes(render_png(history))
    return path


# -- the displays -----------------------------------------------------------------------


class Progress:
    """Folds events into a RunHistory and shows nothing: ``mode="none"``, and the base
    of the visible displays."""

    def __init__(self, *, output_dir=None, save_chart: bool = True, stream=None):
        self.history = RunHistory()
        self.output_dir = output_dir
        self.save_chart = save_chart
        self.chart_path: Path | None = None
        self._stream = stream
        self.closed = False

    def __call__(self, event: dict) -> None:
        if event.get("kind") == "start" and self.history.end is not None:
            self.closed, self.chart_path = False, None  # a resume after an earlier end
        self.history.add(event)
        self.show(event)
        if event.get("kind") == "end":
            self.finish()

    def replay(self, events: Iterable[dict]) -> None:
        for event in events:
            self(event)

    def show(self, event: dict) -> None:
        """Display one event (already added to the history)."""

    def finish(self) -> None:
        """The run ended: final display, saved chart."""
        if self.save_chart and self.chart_path is None:
            self.chart_path = self._save_chart()

    def close(self) -> None:
        self.closed = True

    def print(self, text: str) -> None:
        stream = self._stream or sys.stdout  # looked up late: notebooks and pytest swap it
        print(text, file=stream, flush=True)

    def _save_chart(self) -> Path | None:
        folder = self.output_dir or self.history.output_dir
        if folder is None or not Path(folder).is_dir():
            return None
        try:
            return save_loss_curve(self.history, Path(folder) / CHART_FILE)
        except ImportError:  # no matplotlib: the lines are the record
            return None
        except OSError as exc:
            self.print(f"warning: could not save {CHART_FILE} in {folder}: {exc}")
            return None


class ConsoleProgress(Progress):
    """One plain line per event, for terminals, log files and papermill."""

    def show(self, event: dict) -> None:
        line = format_event(event, self.history)
        if line is not None:
            self.print(line)

    def finish(self) -> None:
        super().finish()
        if self.chart_path is not None:
            self.print(f"loss curve saved to {self.chart_path}")
