"""Typed configuration: what to train (ModelChoice, DatasetChoice) and how (TrainConfig).

Pickers, parameter files, `workbench train --config` and papermill parameters all
produce these same dataclasses, so a run chosen with the mouse re-runs unchanged
in CI. Validation happens in ``__post_init__`` and names the field that is wrong.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from workbench.errors import ConfigError

PRECISIONS = ("auto", "fp32", "fp16", "bf16")
SCHEDULERS = ("linear", "cosine", "constant")
METRICS = ("accuracy", "f1", "loss")
DISTRIBUTED = ("ddp", "fsdp")


def _check_positive(name: str, value: Any, *, allow_zero: bool = False, kind=int) -> None:
    ok_type = isinstance(value, kind) and not isinstance(value, bool)
    if kind is float:
        ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok_type or value < 0 or (value == 0 and not allow_zero):
        allowed = f"{'a non-negative' if allow_zero else 'a positive'} {kind.__name__}"
        raise ConfigError(name, value, allowed)


@dataclass
class ModelChoice:
    """Which model to fine-tune: a hub id (``bert-base-uncased``) or a local folder."""

    name_or_path: str = "bert-base-uncased"
    revision: str | None = None  # a hub branch, tag or commit; None = default branch

    def __post_init__(self) -> None:
        if not isinstance(self.name_or_path, str) or not self.name_or_path.strip():
            raise ConfigError("model.name_or_path", self.name_or_path, "a hub id or a local folder")


@dataclass
class DatasetChoice:
    """Which data to train on and which columns hold the text and the label.

    ``source`` is ``"hub"`` (``path`` is a dataset name such as ``stanfordnlp/sst2``)
    or ``"files"`` (``path`` is a CSV/TSV/JSON/JSONL/Parquet file or a folder of them).
    """

    source: str = "hub"
    path: str = "stanfordnlp/sst2"
    config_name: str | None = None
    train_split: str = "train"
    eval_split: str | None = "validation"  # None: split validation_fraction off train
    text_columns: tuple[str, ...] = ("sentence",)
    label_column: str = "label"
    validation_fraction: float = 0.1  # used only when there is no eval split
    max_train_rows: int | None = None  # cap for quick runs; None = all rows
    max_eval_rows: int | None = None
    seed: int = 42  # for the stratified split and row sampling

    def __post_init__(self) -> None:
        if self.source not in ("hub", "files"):
            raise ConfigError("data.source", self.source, "'hub' or 'files'")
        if isinstance(self.text_columns, str):
            self.text_columns = (self.text_columns,)
        self.text_columns = tuple(self.text_columns)
        if not self.text_columns or not all(isinstance(c, str) and c for c in self.text_columns):
            raise ConfigError("data.text_columns", self.text_columns, "one or two column names")
        if len(self.text_columns) > 2:
            raise ConfigError(
                "data.text_columns", self.text_columns, "one column, or two for sentence pairs"
            )
        if not isinstance(self.label_column, str) or not self.label_column:
            raise ConfigError("data.label_column", self.label_column, "a column name")
        if not (isinstance(self.validation_fraction, (int, float)) and 0 < self.validation_fraction < 1):
            raise ConfigError("data.validation_fraction", self.validation_fraction, "a number in (0, 1)")
        for name in ("max_train_rows", "max_eval_rows"):
            value = getattr(self, name)
            if value is not None:
                _check_positive(f"data.{name}", value)


@dataclass
class TrainConfig:
    """How to fine-tune. Defaults follow the BERT paper's fine-tuning recipe."""

    output_dir: str = "outputs/run"  # checkpoints, event log, final model
    learning_rate: float = 2e-5
    num_epochs: float = 3.0
    max_steps: int | None = None  # optimizer steps; overrides num_epochs when set
    batch_size: int = 16  # per device, per micro-batch
    gradient_accumulation_steps: int = 1  # effective batch = batch_size * this * devices
    warmup_ratio: float = 0.06  # share of total steps with a linear warm-up
    scheduler: str = "linear"  # linear | cosine | constant
    weight_decay: float = 0.01
    max_grad_norm: float | None = 1.0  # None disables clipping
    precision: str = "auto"  # auto: bf16 where supported, fp16 on other CUDA GPUs, fp32 on CPU
    max_length: int = 256  # tokens; longer texts are truncated
    group_by_length: bool = True  # batch similar lengths together: less padding
    eval_every: int | None = None  # optimizer steps; None = at the end of each epoch
    save_every: int | None = None  # optimizer steps; None = at the end of each epoch
    log_every: int = 10  # optimizer steps between event-log lines
    keep_checkpoints: int = 2  # newest K step checkpoints are kept (plus the best)
    best_metric: str = "accuracy"  # accuracy | f1 | loss
    seed: int = 42
    resume: str | None = "auto"  # "auto": newest valid checkpoint in output_dir; a path; None
    num_workers: int | None = None  # DataLoader workers; None: 2 on CUDA, 0 (main process) on CPU
    gradient_checkpointing: bool = False  # trade compute for activation memory
    distributed: str = "ddp"  # ddp | fsdp (sharded, for models that do not fit one GPU)
    max_skipped_steps: int = 20  # consecutive fp16 overflow skips before giving up

    def __post_init__(self) -> None:
        _check_positive("learning_rate", self.learning_rate, kind=float)
        _check_positive("num_epochs", self.num_epochs, kind=float)
        if self.max_steps is not None:
            _check_positive("max_steps", self.max_steps)
        _check_positive("batch_size", self.batch_size)
        _check_positive("gradient_accumulation_steps", self.gradient_accumulation_steps)
        if not (isinstance(self.warmup_ratio, (int, float)) and 0 <= self.warmup_ratio < 1):
            raise ConfigError("warmup_ratio", self.warmup_ratio, "a number in [0, 1)")
        if self.scheduler not in SCHEDULERS:
            raise ConfigError("scheduler", self.scheduler, " | ".join(SCHEDULERS))
        _check_positive("weight_decay", self.weight_decay, allow_zero=True, kind=float)
        if self.max_grad_norm is not None:
            _check_positive("max_grad_norm", self.max_grad_norm, kind=float)
        if self.precision not in PRECISIONS:
            raise ConfigError("precision", self.precision, " | ".join(PRECISIONS))
        _check_positive("max_length", self.max_length)
        for name in ("eval_every", "save_every"):
            if getattr(self, name) is not None:
                _check_positive(name, getattr(self, name))
        _check_positive("log_every", self.log_every)
        _check_positive("keep_checkpoints", self.keep_checkpoints)
        if self.best_metric not in METRICS:
            raise ConfigError("best_metric", self.best_metric, " | ".join(METRICS))
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ConfigError("seed", self.seed, "an integer")
        if self.resume is not None and not isinstance(self.resume, str):
            raise ConfigError("resume", self.resume, "'auto', a checkpoint path, or None")
        if self.num_workers is not None:
            _check_positive("num_workers", self.num_workers, allow_zero=True)
        if self.distributed not in DISTRIBUTED:
            raise ConfigError("distributed", self.distributed, " | ".join(DISTRIBUTED))
        _check_positive("max_skipped_steps", self.max_skipped_steps)


def _build(cls, values: dict[str, Any] | None, section: str):
    values = dict(values or {})
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"{section}.{unknown[0]}", values[unknown[0]], "one of: " + ", ".join(sorted(known)))
    return cls(**values)


@dataclass
class RunSpec:
    """A whole headless run: the parameter file of `workbench train` and of papermill."""

    model: ModelChoice = field(default_factory=ModelChoice)
    data: DatasetChoice = field(default_factory=DatasetChoice)
    train: TrainConfig = field(default_factory=TrainConfig)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunSpec:
        unknown = sorted(set(values) - {"model", "data", "train"})
        if unknown:
            raise ConfigError(unknown[0], values[unknown[0]], "sections model, data, train")
        return cls(
            model=_build(ModelChoice, values.get("model"), "model"),
            data=_build(DatasetChoice, values.get("data"), "data"),
            train=_build(TrainConfig, values.get("train"), "train"),
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> RunSpec:
        """Read a YAML (.yaml/.yml) or JSON file."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError("config", str(path), "an existing .yaml, .yml or .json file")
        text = path.read_text(encoding="utf-8")
        if path.suffix in (".yaml", ".yml"):
            import yaml

            values = yaml.safe_load(text) or {}
        else:
            values = json.loads(text)
        return cls.from_dict(values)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["data"]["text_columns"] = list(self.data.text_columns)
        return out

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix in (".yaml", ".yml"):
            import yaml

            path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False), encoding="utf-8")
        else:
            path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return path
