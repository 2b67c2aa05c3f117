"""One run folder read into a ``Run`` record: ``read_run(path)``, the row ``runs()`` shows for it.

Read from the folder only: a folder is a run when it holds ``events.jsonl``, the lock of a
run (``.workbench.lock``) or ``checkpoints/``. What the record holds comes from the event log
(the ``start`` event's settings, the evals, the ``end`` and its verdict), the lock and, for
old logs, the checkpoint's ``run.json`` (the model). A folder that cannot be read, or holds
half a log, is a record that says so (status ``broken``, ``problem`` says why).

The status: *running* while a process holds the folder's lock, asked of the lock itself
(``run_lock.probe``, a non-blocking ``flock``: no PID that another process may have
inherited can fool it, and on NFS it sees holders on other hosts); else the ``end`` event's
(``completed``, ``interrupted``, ``failed``); with no ``end``, *interrupted* (killed or
crashed: run it again to resume) or, for a run on another host silent for ``LOST_AFTER_S``,
*lost* (its host cannot be reached; also resumable, from any host that mounts the folder).
A run on another host whose lock this host cannot see (a file system that does not share
locks) but whose log was written within ``LOST_AFTER_S`` counts as running. ``verdict``
says whether a completed run learned anything (``engine/verdict.py``).

Fast on purpose (``runs.py`` reads hundreds of these for one table): train lines, the bulk of
a log, are not parsed as JSON: the other kinds are found with ``bytes.find``, and of the
train lines only the last of each part of the run and a sample of 15 (the median
throughput) are decoded. The curves of a run (``Run.history()``) read the whole log, for
the runs one looks at. No torch here.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.config import default_best_metric
from workbench.engine.benchmarks import benchmark_columns
from workbench.engine.events import EVENTS_FILE, MAX_LOG_BYTES, read_events
from workbench.engine.progress import (
    RunHistory,
    format_duration,
    is_number,
    verdict_label,
)
from workbench.engine.run_lock import LOCK_FILE, probe, read_holder
from workbench.engine.safe_read import UnreadableFileError, read_bounded, read_text_bounded
from workbench.errors import WorkbenchError

STATUSES = ("running", "completed", "interrupted", "failed", "lost", "broken")
LOST_AFTER_S = 600.0  # no lock held and no event for this long, on another host: the run is lost
CHECKPOINTS = "checkpoints"  # = checkpoint.CHECKPOINTS (that module imports torch)
RUN_RECORD = "run.json"
# Settings that differ between any two runs and say nothing about the training.
_NOT_SETTINGS = {"output_dir", "resume"}


@dataclass
class Run:
    """One row of the table: what a run folder says about its run."""

    path: Path
    name: str  # the folder, relative to the table's root
    status: str = "broken"  # running | completed | interrupted | failed | lost | broken
    verdict: str | None = None  # a completed run: learned | LEARNED NOTHING | WORSE THAN BASELINE
    task: str | None = None
    model: str | None = None
    step: int = 0  # optimizer steps done
    total_steps: int | None = None
    best_metric: str | None = None  # e.g. "eval_accuracy": the metric that picks the best model
    best_value: float | None = None
    best_step: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # the last evaluation
    started: float | None = None  # unix time of the first start
    duration_s: float | None = None  # time spent running, summed over resumes
    samples_per_s: float | None = None  # mean over the logged intervals
    peak_gpu_mem_bytes: int | None = None  # where recorded (CUDA runs)
    precision: str | None = None  # what ran, "bf16 (auto)" when auto chose it (the last start)
    precision_reason: str | None = None  # why: "auto: bf16, this CPU computes it natively (AVX512-BF16)"
    settings: dict[str, Any] = field(default_factory=dict)  # the TrainConfig of the last start
    problem: str | None = None  # why the folder is broken, or what is odd about it
    host: str | None = None  # where the run last started (its start event, or the lock's record)
    benchmarks: dict[str, float] = field(default_factory=dict)  # "arc_easy/acc": the newest score (evaluation/)

    def history(self) -> RunHistory:
        """The run's curves (train loss, evals), read now: call again for a running run's new points."""
        history = RunHistory()
        try:
            events = read_events(self.path)
        except WorkbenchError:  # a FIFO, a device, a huge file: the row already says why
            events = []
        for event in events:
            history.add(event)
        return history


def read_run(path: str | os.PathLike, name: str | None = None, *, lost_after_s: float = LOST_AFTER_S) -> Run:
    """The row of the run in ``path`` (status ``broken`` with ``problem`` set when it cannot be read)."""
    path = Path(path)
    run = Run(path=path, name=name or path.name)
    held = probe(path)  # before the log: a run that ends meanwhile then shows its end
    try:
        # Regular files only, at most MAX_LOG_BYTES (engine/safe_read.py): never a FIFO or /dev/zero.
        data = read_bounded(path / EVENTS_FILE, MAX_LOG_BYTES)
    except FileNotFoundError:
        data = None
    except OSError as exc:
        run.problem = f"cannot read {EVENTS_FILE}: {exc.strerror or exc}"
        data = None
    notes: list[str] = []
    half_written = False
    if held is None:  # not a lock a probe could take: a FIFO, a device or a link in its place
        try:
            read_holder(path)
        except UnreadableFileError as exc:  # no run's folder
            run.problem = f"cannot read {LOCK_FILE}: {exc.strerror}"
            return run
    if data is not None:
        notes, half_written = _read_log(run, data)
    elif run.problem is None:
        run.problem = f"no {EVENTS_FILE} (a run that never started, or a copied folder)"
    if run.model is None:
        run.model = _model_from_checkpoint(path)
    if half_written and not held:  # while running, the line being written; otherwise a kill's leftover
        notes.append(f"the last line of {EVENTS_FILE} is half-written")
    _settle_status(run, held, notes, lost_after_s)
    run.benchmarks = read_benchmarks(path)
    return run


def _settle_status(run: Run, held: bool | None, notes: list[str], lost_after_s: float) -> None:
    """The status from the lock and the log, and one note that agrees with it."""
    # Read only a lock file the probe could lock: one it could not (a FIFO, say) may never answer a read.
    try:
        holder = read_holder(run.path) if held or (held is False and run.status == "ended-without-end") else None
    except UnreadableFileError:  # replaced since the probe
        holder = None
    host = (holder or {}).get("host") if isinstance((holder or {}).get("host"), str) else run.host
    run.host = host
    if held:
        run.status, run.verdict = "running", None  # a resumed run: the verdict of its earlier part is stale
        if not (holder and "pid" in holder):
            notes.append("the lock's record is not written yet (the run is starting) or unreadable")
    elif held is None and (run.path / LOCK_FILE).exists():
        notes.append("its lock cannot be checked (not a regular file, or a file system without locks)")
    if run.status == "ended-without-end":
        silent_s = _silent_for(run.path)
        elsewhere = host is not None and host != socket.gethostname()
        if elsewhere and silent_s is not None and silent_s < lost_after_s:
            run.status = "running"
            notes.insert(0, f"on host {host}: its lock is not held as seen from this host (a file system "
                            f"that does not share locks?) but its log was written {format_duration(silent_s)} ago; "
                            f"it counts as lost after {format_duration(lost_after_s)} of silence")
        elif elsewhere:
            silence = f"no event for {format_duration(silent_s)}" if silent_s is not None else "no event log"
            run.status = "lost"
            notes.insert(0, f"host {host} cannot be reached: no lock held and {silence}; run it again "
                            "(from any host that mounts the folder) to resume")
        else:
            run.status = "interrupted"
            notes.insert(0, "stopped without an end event (killed or crashed); run it again to resume")
    if notes:
        run.problem = "; ".join(notes) if run.problem is None else f"{run.problem}; " + "; ".join(notes)


def read_benchmarks(path: Path) -> dict[str, float]:
    """The run's benchmark columns (``workbench.evaluate`` saves them in ``evaluation/``); {} when none
    or unreadable: a results file never breaks the table."""
    try:
        return benchmark_columns(path)
    except Exception:  # noqa: BLE001 - as for the rest of a row: the table must always come back
        return {}


def _silent_for(path: Path) -> float | None:
    """Seconds since the run's log was last written (None: no log)."""
    try:
        return max(0.0, time.time() - (path / EVENTS_FILE).stat().st_mtime)
    except OSError:
        return None


def _read_log(run: Run, data: bytes) -> tuple[list[str], bool]:
    """Fill ``run`` from its log; returns (notes about the log, whether its last line is half-written).
    Without an ``end`` after the last start, the status is left as "ended-without-end" for
    ``_settle_status`` to decide."""
    end = data.rfind(b"\n") + 1
    half_written = bool(data[end:].strip())  # the piece after the last newline
    data = data[:end]
    events, starts, unreadable = _scan(data)
    problems = []
    if unreadable:
        problems.append(f"{unreadable} unreadable line(s) in {EVENTS_FILE}")
    if not starts:
        run.problem = "; ".join(problems + [f"{EVENTS_FILE} has no start event"
                                            + (" (only half a line)" if half_written else "")])
        return [], False
    first, start = events[starts[0]], events[starts[-1]]
    run.host = start.get("host") if isinstance(start.get("host"), str) else None
    config = start.get("config") if isinstance(start.get("config"), dict) else {}
    run.settings = {k: v for k, v in config.items() if k not in _NOT_SETTINGS}
    run.task = config.get("task")
    run.model = start.get("model")
    run.precision, run.precision_reason = _precision(start, config)
    run.total_steps = start.get("total_steps") if isinstance(start.get("total_steps"), int) else None
    run.started = first.get("time")

    history = RunHistory()
    for event in events[starts[0]:]:
        if event.get("kind") in ("start", "eval", "end", "train"):
            history.add(event)
    run.step = history.step
    ends_after_start = history.end is not None
    if ends_after_start:
        run.status = str(history.end.get("status", "broken"))
        run.metrics = {k: v for k, v in (history.end.get("metrics") or {}).items() if is_number(v)}
        verdict = history.verdict
        run.verdict = verdict_label(verdict)
        if verdict and verdict.get("outcome") in ("no_better", "worse") and verdict.get("text"):
            problems.append(verdict["text"])
    else:
        run.status = "ended-without-end"  # running, killed, crashed or lost: the lock and the host decide
    if not run.metrics and history.evals:
        run.metrics = {k: v for k, v in history.evals[-1].items() if k.startswith("eval_") and is_number(v)}
    _best(run, config, history.evals)
    run.duration_s = _duration(events, starts)
    speeds = [e["samples_per_s"] for e in _sample_train_lines(data) if is_number(e.get("samples_per_s"))]
    speeds = sorted(v for v in speeds if v > 0)
    run.samples_per_s = speeds[len(speeds) // 2] if speeds else None
    # torch's max_memory_allocated only grows within a process: each part's last train line has its peak.
    memory = [e["gpu_mem_bytes"] for e in events if e.get("kind") == "train" and is_number(e.get("gpu_mem_bytes"))]
    run.peak_gpu_mem_bytes = int(max(memory)) if memory else None
    return problems, half_written and not ends_after_start


_TRAIN = b'"kind": "train"'
_READ_KINDS = (b"start", b"eval", b"end")  # checkpoint and message lines say nothing the table shows


def _line_at(data: bytes, pos: int) -> tuple[int, bytes]:
    begin = data.rfind(b"\n", 0, pos) + 1
    return begin, data[begin:data.find(b"\n", pos)]


def _scan(data: bytes) -> tuple[list[dict], list[int], int]:
    """(events, indexes of the start events, unreadable lines) of a log without its half-written tail.

    Train lines, the bulk of a log, are not decoded: start, eval and end lines are found with
    ``bytes.find`` (C speed; a ``"kind": "x"`` inside a string value is escaped, so every
    hit is a real key), plus the last train line before each start and at the end (where
    each part stopped, its time, its peak memory)."""
    if data and b'"kind": "' not in data:  # not the engine's layout (compact separators...): parse it all
        events = [e for e in map(_decode, data.split(b"\n")) if e is not None]
        unreadable = sum(1 for line in data.split(b"\n") if line.strip()) - len(events)
        return events, [i for i, e in enumerate(events) if e["kind"] == "start"], unreadable
    found: dict[int, bytes] = {}
    for kind in _READ_KINDS:
        needle = b'"kind": "' + kind + b'"'
        pos = data.find(needle)
        while pos >= 0:
            begin, line = _line_at(data, pos)
            found[begin] = line
            pos = data.find(needle, begin + len(line) + 1)
    decoded = {begin: _decode(line) for begin, line in found.items()}
    unreadable_found = sum(e is None for e in decoded.values())
    for begin in [b for b, e in decoded.items() if e is not None and e["kind"] == "start"] + [len(data)]:
        pos = data.rfind(_TRAIN, 0, begin)
        if pos >= 0:
            train_begin, line = _line_at(data, pos)
            if train_begin not in decoded:
                decoded[train_begin] = _decode(line)
    events, starts = [], []
    for begin in sorted(decoded):
        event = decoded[begin]
        if event is None:
            continue
        if event["kind"] == "start":
            starts.append(len(events))
        events.append(event)
    # Lines that are not events at all: neither a "kind" key, nor blank.
    lines = data.count(b"\n") - data.count(b"\n\n") - data.startswith(b"\n")
    return events, starts, max(lines - data.count(b'"kind": "'), 0) + unreadable_found


def _sample_train_lines(data: bytes, count: int = 15) -> list[dict]:
    """Up to ``count`` train events spread evenly through the log (the typical throughput)."""
    sampled, size = {}, len(data)
    for i in range(count):
        pos = data.find(_TRAIN, size * i // count)
        if pos < 0:
            break
        begin, line = _line_at(data, pos)
        if begin not in sampled:
            sampled[begin] = _decode(line)
    return [e for e in sampled.values() if e is not None]


def _decode(line: bytes) -> dict | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("kind"), str) else None


def _best(run: Run, config: dict, evals: list[dict]) -> None:
    chosen = config.get("best_metric") or default_best_metric(config.get("task"))
    name = f"eval_{chosen}"
    # Step 0 (eval_before_training) is the untrained start, never the best (as in fit).
    scored = [(e[name], e.get("step")) for e in evals if is_number(e.get(name)) and e.get("step")]
    if not scored:
        return
    lower_is_better = chosen == "loss"
    value, step = (min if lower_is_better else max)(scored, key=lambda pair: pair[0])
    run.best_metric, run.best_value, run.best_step = name, value, step


def _duration(events: list[dict], starts: list[int]) -> float | None:
    """Seconds between each start and the last event before the next one, summed (gaps between
    an interruption and its resume do not count)."""
    total = 0.0
    bounds = [*starts, len(events)]
    for begin, end in zip(bounds, bounds[1:], strict=False):
        times = [e["time"] for e in events[begin:end] if is_number(e.get("time"))]
        if times:
            total += max(times) - times[0]
    return total


def _precision(start: dict, config: dict) -> tuple[str | None, str | None]:
    """("bf16 (auto)", its reason) from a start event; logs older than the reason give the name alone."""
    ran = start.get("precision")
    if not isinstance(ran, str):
        return None, None
    reason = start.get("precision_reason")
    return (f"{ran} (auto)" if config.get("precision") == "auto" else ran,
            reason if isinstance(reason, str) else None)


def _model_from_checkpoint(path: Path) -> str | None:
    """Logs written before the start event named the model: read it from the newest run.json."""
    folder = path / CHECKPOINTS
    try:
        steps = sorted(p for p in folder.iterdir() if p.name.startswith("step-"))
    except OSError:
        return None
    for step in reversed(steps):
        try:
            model = json.loads(read_text_bounded(step / RUN_RECORD, 1 << 20)).get("model")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(model, str):
            return model
    return None
