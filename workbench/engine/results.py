"""What a run returns (``FitResult``), also rebuilt from its folder after the fact
(a run started by torchrun, forked from a notebook, or in another kernel)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from workbench.errors import TrainingError

MODEL_DIR = "model"  # final model: save_pretrained + tokenizer (+ label mapping)
BEST_DIR = "best"  # the best model by config.best_metric, same layout


@dataclass
class FitResult:
    output_dir: Path
    model_dir: Path | None  # loadable with the task's pipeline, e.g. pipeline("text-classification", model=...)
    status: str  # completed | interrupted
    metrics: dict[str, float]  # last evaluation: eval_loss, eval_accuracy, eval_f1
    history: list[dict] = field(default_factory=list)  # the events of this call
    best_checkpoint: Path | None = None
    label_names: list[str] = field(default_factory=list)
    # Did it learn anything? engine/verdict.py: "outcome" (better | no_better | worse | unknown),
    # "metric", "value", "baseline", "baseline_value", "margin", "best_step", "text". None until
    # the run completes.
    verdict: dict | None = None

    @property
    def learned(self) -> bool | None:
        """True when the final model beat its baseline, False when not, None when unknown."""
        outcome = (self.verdict or {}).get("outcome")
        return None if outcome in (None, "unknown") else outcome == "better"

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v:.4f}" for k, v in self.metrics.items())
        outcome = (self.verdict or {}).get("outcome")
        said = f", verdict={outcome!r}" if outcome else ""
        return f"FitResult(status={self.status!r}{said}, {shown}, model_dir={str(self.model_dir)!r})"


def read_verdict(output_dir: str | os.PathLike) -> dict | None:
    """The verdict of a run folder's last completed run (its ``end`` event), or None.

    What a model card, a report or a script reads to say whether the model learned anything.
    """
    from workbench.engine.events import read_events

    ends = [e for e in read_events(output_dir) if e.get("kind") == "end"]
    verdict = ends[-1].get("verdict") if ends else None
    return verdict if isinstance(verdict, dict) else None


def result_from_disk(output_dir: str | os.PathLike) -> FitResult:
    """A FitResult rebuilt from a run's folder (events.jsonl, model/, best/)."""
    from workbench.engine.events import read_events
    from workbench.tasks.classification_data import LABELS_FILE

    output_dir = Path(output_dir)
    events = read_events(output_dir)
    ends = [e for e in events if e.get("kind") == "end"]
    starts = [e for e in events if e.get("kind") == "start"]
    model_dir = output_dir / MODEL_DIR
    labels = []
    if (model_dir / LABELS_FILE).is_file():
        mapping = json.loads((model_dir / LABELS_FILE).read_text(encoding="utf-8"))
        labels = [mapping["id2label"][k] for k in sorted(mapping["id2label"], key=int)]
    elif starts:
        labels = starts[-1].get("label_names", [])
    status = ends[-1]["status"] if ends else "interrupted"
    if status == "failed":
        raise TrainingError(f"The distributed run failed: see {output_dir / 'events.jsonl'}.",
                            "read the error event, fix it, and run again (it resumes).")
    return FitResult(output_dir=output_dir, model_dir=model_dir if model_dir.is_dir() else None,
                     status=status, metrics=ends[-1].get("metrics", {}) if ends else {}, history=events,
                     best_checkpoint=output_dir / BEST_DIR if (output_dir / BEST_DIR).is_dir() else None,
                     label_names=labels, verdict=ends[-1].get("verdict") if ends else None)
