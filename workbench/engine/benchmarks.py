"""Benchmark scores saved in a run folder: ``<run>/evaluation/results-*.json``.

``workbench.evaluate`` writes one file per evaluation of a run's model: the full results of
lm-evaluation-harness (``results``, ``n-shot``, ``n-samples``, ``configs``, ``versions``...)
plus a ``workbench`` section saying what was evaluated and how (the model folder, few-shot,
chat template, limit). This module reads them back, for the runs table (``arc_easy/acc``
columns) and for the model card; standard library only, like ``runs.py``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

EVALUATION_DIR = "evaluation"
RESULTS_GLOB = "results-*.json"


def evaluation_results(run_dir: str | os.PathLike, folders: Iterable[str] | None = None) -> list[dict]:
    """Every saved result of the run, oldest first (the file names start with the UTC time):
    the file's JSON plus ``"file"``. ``folders``: only results of those model folders
    (``model``, ``best``, ``model_merged``); unreadable files are skipped."""
    folder = Path(run_dir) / EVALUATION_DIR
    wanted = set(folders) if folders is not None else None
    found = []
    try:
        paths = sorted(folder.glob(RESULTS_GLOB))
    except OSError:
        return []
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        meta = data.get("workbench") if isinstance(data, dict) else None
        if not isinstance(meta, dict) or (wanted is not None and meta.get("folder") not in wanted):
            continue
        found.append({"file": path.name, **data})
    return found


def score_rows(result: dict) -> list[dict]:
    """One row per (task, metric, filter) of a result: value, stderr, shots, samples, settings."""
    rows = []
    meta = result.get("workbench") or {}
    for task, metrics in (result.get("results") or {}).items():
        if not isinstance(metrics, dict):
            continue
        for key, value in metrics.items():
            # Scores are "metric,filter" keys; "alias", "name", "sample_len" describe the task.
            if "," not in key or "_stderr" in key or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            metric, _, filt = key.partition(",")
            stderr = metrics.get(f"{metric}_stderr,{filt}" if filt else f"{metric}_stderr")
            rows.append({
                "task": task, "metric": metric, "filter": filt or "none", "value": float(value),
                "stderr": float(stderr) if isinstance(stderr, (int, float)) and not isinstance(stderr, bool) else None,
                "shots": (result.get("n-shot") or {}).get(task),
                "samples": ((result.get("n-samples") or {}).get(task) or {}).get("effective"),
                "chat_template": meta.get("apply_chat_template"), "limit": meta.get("limit"),
            })
    return rows


def column_name(row: dict) -> str:
    """The runs-table column of a score: ``arc_easy/acc``; ``gsm8k/exact_match[strict-match]``
    when the harness applied a filter other than "none"."""
    name = f"{row['task']}/{row['metric']}"
    return name if row.get("filter") in (None, "none") else f"{name}[{row['filter']}]"


def latest_scores(results: Iterable[dict]) -> dict[str, dict]:
    """column -> the newest row for it (results oldest first: a later evaluation wins)."""
    latest: dict[str, dict] = {}
    for result in results:
        for row in score_rows(result):
            latest[column_name(row)] = row
    return latest


def benchmark_columns(run_dir: str | os.PathLike) -> dict[str, float]:
    """``{"arc_easy/acc": 0.71, ...}``: the newest score of each task and metric of the run's own
    model (``model``, ``model_merged`` or ``best``), for the runs table."""
    return {name: row["value"] for name, row in latest_scores(evaluation_results(run_dir)).items()}
