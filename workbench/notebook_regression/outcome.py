"""What happened to one notebook, from the worker's result file and the executed ``.ipynb``.

Cell numbers in reports are 1-based positions in the *source* notebook (markdown
cells counted; papermill's injected parameters cell not counted); ``In [n]`` is
the execution count in the executed copy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.notebook_regression.baselines import Baseline, compare_metrics
from workbench.notebook_regression.record import read_records
from workbench.notebook_regression.report import NotebookFailure, NotebookResult
from workbench.notebook_regression.task import Task


def notebook_result(
    task: Task,
    returncode: int,
    timed_out: bool,
    wall: float,
    *,
    kernel: str,
    cell_timeout_s: float,
    notebook_timeout_s: float,
    baselines: Mapping[str, Baseline],
) -> NotebookResult:
    """The result of a finished (or killed) worker: records, verdicts and the failure, if any."""
    nb = read_json(task.executed_path)
    records = read_records(nb) if nb else {}
    outcome = read_json(task.result_path) or {}
    failure = None
    if timed_out:
        index = running_cell(nb)
        failure = NotebookFailure(
            "notebook_timeout",
            f"ran past the notebook timeout ({notebook_timeout_s:g} s)"
            + (f" in cell {source_cell(nb, index)}" if index is not None else "")
            + "; the kernel was killed",
            cell=source_cell(nb, index) if index is not None else None,
            last_output=last_output(nb, index),
        )
    elif outcome.get("outcome", "missing") != "ok":
        failure = _failure(task, nb, outcome, returncode, kernel, cell_timeout_s)
    metrics = compare_metrics(records, baselines)
    if failure:
        status = "failed"
    elif any(m.failed for m in metrics):
        status = "regressed"
    else:
        status = "passed"
    return NotebookResult(
        notebook=task.notebook,
        status=status,
        wall_s=wall,
        executed_path=str(task.executed_path) if nb else None,
        log_path=str(task.log_path),
        attempts=int(outcome.get("attempts", 1)),
        failure=failure,
        metrics=metrics,
        records=records,
    )


def _failure(
    task: Task, nb: dict | None, outcome: dict, returncode: int, kernel: str, cell_timeout_s: float
) -> NotebookFailure:
    kind = outcome.get("outcome")
    index = outcome.get("cell_index")
    cell = source_cell(nb, index) if index is not None else None
    where = f"cell {cell}" if cell is not None else "an unknown cell"
    if kind == "cell_error":
        error = f"{outcome.get('ename')}: {_first_line(outcome.get('evalue'))}"
        count = outcome.get("execution_count")
        return NotebookFailure(
            "cell_error",
            f"{where}" + (f" (In [{count}])" if count else "") + f": {error}",
            cell=cell,
            execution_count=count,
            ename=outcome.get("ename"),
            evalue=outcome.get("evalue"),
        )
    if kind == "cell_timeout":
        return NotebookFailure(
            "cell_timeout",
            f"{where} ran past the cell timeout ({cell_timeout_s:g} s)",
            cell=cell,
            last_output=last_output(nb, index),
        )
    if kind == "kernel_died":
        last = last_output(nb, index)
        tail = f"; last output: {_last_line(last)}" if last else ""
        return NotebookFailure(
            "kernel_died", f"kernel died in {where}{tail}", cell=cell, last_output=last
        )
    if kind == "kernel_start":
        return NotebookFailure(
            "kernel_start",
            f"kernel {kernel!r} failed to start "
            f"({'tried twice' if outcome.get('attempts', 1) > 1 else 'not retried'}): "
            f"{_first_line(outcome.get('message'))}",
        )
    if kind == "error":
        return NotebookFailure("harness", _first_line(outcome.get("message")), cell=cell)
    # No result file: the worker itself crashed (import error, killed from outside).
    return NotebookFailure(
        "harness",
        f"the worker exited with code {returncode} without a result; see {task.log_path}",
        last_output=_tail(task.log_path),
    )


def read_json(path: Path) -> dict | None:
    """The file's JSON, or None when it is missing or half-written (a killed worker)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def source_cell(nb: dict | None, index: int | None) -> int | None:
    """1-based position in the source notebook of executed cell ``index``."""
    if index is None:
        return None
    if not nb:
        return index + 1
    injected = sum(
        1
        for i, cell in enumerate(nb.get("cells", [])[:index])
        if "injected-parameters" in cell.get("metadata", {}).get("tags", [])
    )
    return index + 1 - injected


def running_cell(nb: dict | None) -> int | None:
    """The cell papermill marked as running when it last saved (the one that hung)."""
    cells = (nb or {}).get("cells", [])
    running = [
        i
        for i, c in enumerate(cells)
        if c.get("metadata", {}).get("papermill", {}).get("status") == "running"
    ]
    return running[-1] if running else None


def last_output(nb: dict | None, upto: int | None = None) -> str:
    """The tail of the last text output at or before cell ``upto``."""
    cells = (nb or {}).get("cells", [])
    if upto is not None:
        cells = cells[: upto + 1]
    for cell in reversed(cells):
        for output in reversed(cell.get("outputs", []) or []):
            if output.get("output_type") == "stream":
                text = _join(output.get("text"))
            elif output.get("output_type") == "error":
                if output.get("ename") == "KeyboardInterrupt":
                    continue  # the harness's own interrupt at a timeout, not the notebook's output
                text = f"{output.get('ename')}: {output.get('evalue')}"
            else:
                text = _join((output.get("data") or {}).get("text/plain"))
            lines = [line for line in text.splitlines() if line.strip()]
            if lines:
                return "\n".join(lines[-5:])[-1000:]
    return ""


def _join(text: Any) -> str:
    return "".join(text) if isinstance(text, list) else str(text or "")


def _first_line(text: Any) -> str:
    lines = [line for line in str(text or "").splitlines() if line.strip()]
    return (lines[0] if lines else "")[:300]


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:300]


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-n:])
    except OSError:
        return ""
