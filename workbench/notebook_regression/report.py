"""What a regression run found: per-notebook results and the report written as JSON and Markdown.

``report.json`` is for tools (CI annotations, dashboards); ``report.md`` is what a
person reads first, so each failure is one table row with the cell and the error.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench.notebook_regression.baselines import Baseline, MetricResult


@dataclass
class NotebookFailure:
    """Why a notebook did not run to the end."""

    kind: str  # cell_error | cell_timeout | kernel_died | kernel_start | notebook_timeout | harness
    message: str  # one line, shown in the report table
    cell: int | None = None  # 1-based position in the source notebook
    execution_count: int | None = None
    ename: str | None = None
    evalue: str | None = None
    last_output: str = ""


@dataclass
class NotebookResult:
    notebook: str  # as named in the profile
    status: str  # passed | regressed | failed
    wall_s: float
    executed_path: str | None  # None when the notebook never got written
    log_path: str
    attempts: int = 1
    failure: NotebookFailure | None = None
    metrics: list[MetricResult] = field(default_factory=list)
    records: dict[str, Any] = field(default_factory=dict)


@dataclass
class RegressReport:
    profile: str
    output_dir: Path
    started_at: str  # ISO 8601, UTC
    wall_s: float
    kernel: str
    kernel_python: str
    results: list[NotebookResult]
    baseline_changes: list[str] | None = None  # set when --update-baselines rewrote the file
    # Which files ran: the shipped copies, a checkout's or ones given on the command line.
    notebooks_dir: str = ""
    profiles_file: str = ""
    baselines_file: str = ""

    @property
    def failed_notebooks(self) -> list[NotebookResult]:
        return [r for r in self.results if r.status == "failed"]

    @property
    def regressions(self) -> list[tuple[str, MetricResult]]:
        return [(r.notebook, m) for r in self.results for m in r.metrics if m.failed]

    @property
    def ok(self) -> bool:
        return not self.failed_notebooks and not self.regressions

    def summary(self) -> str:
        if self.ok:
            return f"PASSED: {len(self.results)} notebook(s), no regression"
        return (
            f"FAILED: {len(self.failed_notebooks)} failed notebook(s), "
            f"{len(self.regressions)} regressed/missing metric(s)"
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["output_dir"] = str(self.output_dir)
        data["ok"] = self.ok
        data["summary"] = self.summary()
        return data

    def to_markdown(self) -> str:
        lines = [
            f"# Regression report: profile `{self.profile}`",
            "",
            f"{self.summary()}. {len(self.results)} notebook(s) in {self.wall_s:.1f} s, "
            f"started {self.started_at}, kernel `{self.kernel}` ({self.kernel_python}).",
            "",
            f"Notebooks from `{self.notebooks_dir}`; profiles `{self.profiles_file}`; "
            f"baselines `{self.baselines_file}`.",
            "",
            "| notebook | metric | baseline | value | verdict |",
            "|---|---|---|---|---|",
        ]
        for r in self.results:
            if not r.metrics:
                lines.append(
                    f"| {_md(r.notebook)} | — | — | — | {'failed' if r.failure else 'no metrics'} |"
                )
            for m in r.metrics:
                verdict = m.verdict + (f": {m.detail}" if m.detail and m.verdict != "pass" else "")
                lines.append(
                    f"| {_md(r.notebook)} | {_md(m.name)} | {_md(_baseline_text(m.baseline))} "
                    f"| {_md(_value_text(m.value))} | {_md(verdict)} |"
                )
        lines += [
            "",
            "| notebook | status | wall time | executed notebook | details |",
            "|---|---|---|---|---|",
        ]
        for r in self.results:
            executed = os.path.relpath(r.executed_path, self.output_dir) if r.executed_path else "—"
            details = r.failure.message if r.failure else ""
            if r.attempts > 1:
                details = f"(kernel start retried) {details}".strip()
            lines.append(
                f"| {_md(r.notebook)} | {r.status} | {r.wall_s:.1f} s | {_md(executed)} | {_md(details)} |"
            )
        for r in self.results:
            if r.failure and r.failure.last_output:
                lines += [
                    "",
                    f"Last output of {r.notebook}:",
                    "",
                    "```",
                    r.failure.last_output,
                    "```",
                ]
        if self.baseline_changes is not None:
            lines += ["", "Baselines updated (review before committing):", ""]
            lines += [f"- {change}" for change in self.baseline_changes] or ["- no value changed"]
        return "\n".join(lines) + "\n"

    def write(self) -> tuple[Path, Path]:
        """Write report.json and report.md into the output folder; return their paths."""
        json_path = self.output_dir / "report.json"
        md_path = self.output_dir / "report.md"
        json_path.write_text(
            json.dumps(self.to_dict(), indent=2, default=str) + "\n", encoding="utf-8"
        )
        md_path.write_text(self.to_markdown(), encoding="utf-8")
        return json_path, md_path


def _baseline_text(b: Baseline | None) -> str:
    if b is None:
        return "—"
    if b.direction == "equal":
        return f"{_value_text(b.value)} (equal)"
    return f"{_value_text(b.value)} ({b.direction}, ±{b.allowed():.4g})"


def _value_text(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def _md(text: str) -> str:
    """Safe inside a Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")
