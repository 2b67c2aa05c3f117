"""What ``workbench.evaluate`` returns and writes: scores per model, one table, files in the run folder.

``EvaluationResult`` holds, per evaluated model, the harness's full results (as
``lm_eval.simple_evaluate`` returns them, without the per-sample log) and how they were
obtained (``meta``: few-shot, chat template, limit, batch size, the model folder...). Its table
puts the models side by side: one row per task and metric, each model's value and standard
error, and, for two models (base vs tuned), the change and whether it exceeds twice the
combined standard error. In a notebook it shows as that table; ``to_frame()`` gives pandas.

A run's results are saved as ``<run>/evaluation/results-<UTC time>.json`` (the harness's JSON
plus ``"workbench": meta``; ``workbench.engine.benchmarks`` reads them back for the runs
table and the card) and, with ``log_samples=True``, ``samples-<UTC time>-<task>.jsonl``.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.engine.benchmarks import EVALUATION_DIR, column_name, score_rows


@dataclass
class ModelScores:
    """One model's evaluation: the harness's results and how they were made."""

    label: str
    results: dict  # lm_eval.simple_evaluate's dict without "samples"
    meta: dict  # what was evaluated and how (saved as the file's "workbench" section)
    saved: Path | None = None  # the results file in the run folder
    samples: list[Path] = field(default_factory=list)

    def rows(self) -> list[dict]:
        return [{"model": self.label, "column": column_name(r), **r} for r in score_rows(self.results)]

    def score(self, column: str) -> float:
        """The value of ``column`` (``"arc_easy/acc"``); KeyError naming the columns there are."""
        found = {r["column"]: r["value"] for r in self.rows()}
        if column not in found:
            raise KeyError(f"{self.label} has no score {column!r}: it has {sorted(found)}")
        return found[column]


class EvaluationResult:
    """Every model's scores; ``table()`` side by side, ``to_frame()`` one row per score."""

    def __init__(self, models: list[ModelScores]):
        self.models = list(models)

    def __getitem__(self, label: str) -> ModelScores:
        for m in self.models:
            if m.label == label:
                return m
        raise KeyError(f"no model {label!r}: the models are {[m.label for m in self.models]}")

    def __iter__(self):
        return iter(self.models)

    def __len__(self) -> int:
        return len(self.models)

    def rows(self) -> list[dict]:
        return [row for m in self.models for row in m.rows()]

    def to_frame(self):
        """pandas: one row per model, task and metric (value, stderr, shots, chat_template, limit...)."""
        import pandas as pd

        return pd.DataFrame(self.rows())

    def table(self) -> list[dict]:
        """Rows of the side-by-side table: score, then each model's value and stderr (and the change)."""
        columns = list(dict.fromkeys(r["column"] for r in self.rows()))
        out = []
        for column in columns:
            row: dict[str, Any] = {"score": column}
            cells = []
            for m in self.models:
                found = next((r for r in m.rows() if r["column"] == column), None)
                row[m.label] = found["value"] if found else None
                row[f"{m.label} ±"] = found["stderr"] if found else None
                cells.append(found)
            if len(self.models) == 2 and all(cells):
                a, b = cells
                row["change"] = b["value"] - a["value"]
                if a["stderr"] is not None and b["stderr"] is not None:
                    combined = math.sqrt(a["stderr"] ** 2 + b["stderr"] ** 2)
                    row["beyond 2 stderr"] = abs(row["change"]) > 2 * combined if combined else None
            out.append(row)
        return out

    def plot_confusion_matrix(self, model: str | None = None, ax=None):
        """A classifier report's confusion matrix (the quickstart's figure) for ``model`` (default: the last)."""
        from workbench.evaluation.classifier import plot_confusion_matrix

        chosen = self[model] if model else self.models[-1]
        if "confusion_matrix" not in chosen.results:
            raise KeyError(f"{chosen.label} has no confusion matrix: only classifier reports (data=, label_column=) do")
        column = chosen.rows()[0]["column"] if chosen.rows() else ""
        accuracy = next((r["value"] for r in chosen.rows() if r["metric"] == "accuracy"), float("nan"))
        return plot_confusion_matrix(chosen.results, f"{chosen.label}: {column.split('/')[0]}, accuracy {accuracy:.3f}", ax)

    def settings(self) -> list[str]:
        """One line per model: how it was evaluated (what changes scores: shots, chat template, limit)."""
        lines = []
        for m in self.models:
            meta = m.meta
            shots = sorted({str(v) for v in (m.results.get("n-shot") or {}).values()}) or ["-"]
            lines.append(f"{m.label}: {meta.get('evaluated')}; {'/'.join(shots)}-shot; chat template "
                         f"{'on' if meta.get('apply_chat_template') else 'off'}"
                         + (f"; system instruction {meta['system_instruction']!r}" if meta.get("system_instruction") else "")
                         + (f"; limit {meta['limit']}" if meta.get("limit") is not None else "")
                         + f"; batch size {meta.get('batch_size')}; {meta.get('seconds', 0):.0f} s"
                         + (f"; saved in {m.saved}" if m.saved else ""))
        return lines

    def format(self) -> str:
        rows = self.table()
        if not rows:
            return "no scores"
        headers = list(rows[0])
        cells = [[_fmt(r.get(h)) for h in headers] for r in rows]
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
        return "\n".join([*lines, "", *self.settings()])

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:
        return f"EvaluationResult({[m.label for m in self.models]})\n{self.format()}"

    def _repr_html_(self) -> str:
        import html

        rows = self.table()
        headers = list(rows[0]) if rows else ["score"]
        body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(h)))}</td>" for h in headers) + "</tr>"
                       for r in rows)
        notes = "".join(f"<li>{html.escape(line)}</li>" for line in self.settings())
        return (f"<table><thead><tr>{''.join(f'<th>{html.escape(h)}</th>' for h in headers)}</tr></thead>"
                f"<tbody>{body}</tbody></table><ul>{notes}</ul>")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


# ----------------------------------------------------------------------------- files
def timestamp() -> str:
    """UTC time with microseconds: file names that sort in the order they were written."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")


def save(run_dir: Path, scores: ModelScores, samples: dict | None) -> ModelScores:
    """Write the results (and samples) into ``<run_dir>/evaluation/``; sets ``saved``/``samples``."""
    from lm_eval.utils import handle_non_serializable

    folder = Path(run_dir) / EVALUATION_DIR
    folder.mkdir(parents=True, exist_ok=True)
    stamp = timestamp()
    path = folder / f"results-{stamp}.json"
    payload = {"workbench": scores.meta, **scores.results}
    _write_atomic(path, json.dumps(payload, indent=2, default=handle_non_serializable, ensure_ascii=False))
    scores.saved = path
    for task, entries in (samples or {}).items():
        sample_path = folder / f"samples-{stamp}-{task}.jsonl"
        lines = (json.dumps(e, default=handle_non_serializable, ensure_ascii=False) for e in entries)
        _write_atomic(sample_path, "\n".join(lines) + "\n")
        scores.samples.append(sample_path)
    return scores


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
