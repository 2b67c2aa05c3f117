"""What a user passes to ``fit``, checked before anything is built: the settings
(a TrainConfig plus keyword overrides), the data in any accepted form, and the
output folder. Every problem is an error that names the field and the fix.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

from workbench.config import DatasetChoice, TrainConfig
from workbench.errors import ConfigError


def make_config(config: TrainConfig | None, overrides: dict[str, Any]) -> TrainConfig:
    """``config`` (default TrainConfig()) with ``overrides`` applied and validated."""
    config = config or TrainConfig()
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    for name in overrides:
        if name not in known:
            raise ConfigError(name, overrides[name], "a TrainConfig field: " + ", ".join(sorted(known)))
    return dataclasses.replace(config, **overrides)  # __post_init__ validates again


# The tasks that read the columns their TrainConfig fields name, and what to set instead of
# text_columns / label_column.
OWN_COLUMNS = {
    "causal_lm": "name the data's columns with messages_column, prompt_column + completion_column, or "
                 "text_column (TrainConfig fields).",
    "preference": "name the data's columns with prompt_column, chosen_column and rejected_column (TrainConfig "
                  "fields).",
    "token_classification": "name the data's columns with tokens_column and tags_column (TrainConfig "
                            "fields), or leave them to be found (tokens / words; ner_tags / tags / labels).",
    "question_answering": "name the data's columns with question_column, context_column and answers_column "
                          "(TrainConfig fields).",
}


def resolve_task(data, text_columns, label_column, config: TrainConfig) -> str:
    """The task to run: ``config.task``, or for ``"auto"`` the one the data's columns say
    (``sources.data_checks.detect_task``). Text or label columns given mean classification."""
    if config.task != "auto":
        return config.task
    if text_columns or label_column:
        return "classification"
    train = _train_split_of(data)
    if train is None:  # not data we can look into: classification's checks say what is wrong
        return "classification"
    from workbench.sources.data_checks import detect_task

    return detect_task(train, config.question_column, config.context_column, config.answers_column)


def _train_split_of(data):
    """The train split (or the only one) of any accepted ``data``, read as the run will read it."""
    if isinstance(data, (str, os.PathLike)):
        from workbench.sources.data import resolve_data_source

        data = DatasetChoice(source=resolve_data_source(data), path=str(data))
    if isinstance(data, DatasetChoice):
        from workbench.sources.data import load_raw

        raw = load_raw(data)
        if data.train_split in raw and set((*data.text_columns, data.label_column)) <= set(
                raw[data.train_split].column_names):
            return None  # the chosen text and label columns are there: classification
        return raw.get(data.train_split)
    if hasattr(data, "keys") and hasattr(data, "get"):
        return data.get("train")
    return None


def resolve_data(data, text_columns, label_column, task: str = "classification"):
    """(DatasetDict, text_columns, label_column) from any accepted ``data``.

    A causal LM, token classification and question answering read the columns their
    TrainConfig names (messages_column, tokens_column, question_column...): their splits are
    loaded whole and checked by the task, and text/label columns are refused.
    """
    if task in OWN_COLUMNS:
        return _resolve_own_columns(data, text_columns, label_column, task)
    if isinstance(data, (str, os.PathLike)):
        from workbench.sources.data import resolve_data_source

        source = resolve_data_source(data)  # a missing path is "file not found", not a hub error
        data = DatasetChoice(source=source, path=str(data), text_columns=tuple(text_columns or ("text",)),
                             label_column=label_column or "label")
    if isinstance(data, DatasetChoice):
        from workbench.sources.data import load_choice

        return load_choice(data), data.text_columns, data.label_column
    columns = tuple([text_columns] if isinstance(text_columns, str) else (text_columns or ("text",)))
    if not 1 <= len(columns) <= 2:
        raise ConfigError("text_columns", columns, "one column, or two for sentence pairs")
    return data, columns, label_column or "label"


def describe_data(data) -> dict[str, Any]:
    """What the run trained on, for its record (``run.json``): enough for the model card to name
    the data and for ``workbench.evaluate`` to load the held-out split again.

    A path or a DatasetChoice is recorded as the DatasetChoice it becomes (local paths made
    absolute, so the record works from another folder); a DatasetDict by its name, when the
    datasets library kept one, and its split sizes. {} when nothing can be said.
    """
    try:
        if isinstance(data, (str, os.PathLike)):
            from workbench.sources.data import resolve_data_source

            data = DatasetChoice(source=resolve_data_source(data), path=str(data))
        if isinstance(data, DatasetChoice):
            facts = dataclasses.asdict(data)
            if data.source == "files":
                facts["path"] = str(Path(data.path).expanduser().resolve())
            facts["text_columns"] = list(facts["text_columns"])
            return facts
        if hasattr(data, "keys"):
            info = getattr(next(iter(data.values()), None), "info", None)
            return {"source": "memory", "name": getattr(info, "dataset_name", None) or getattr(info, "builder_name", None),
                    "config_name": getattr(info, "config_name", None),
                    "splits": {name: len(split) for name, split in data.items()}}
    except Exception:  # noqa: BLE001 - a description for the record; the data itself was already checked
        return {}
    return {}


def _resolve_own_columns(data, text_columns, label_column, task: str):
    for name, value in (("text_columns", text_columns), ("label_column", label_column)):
        if value:
            raise ConfigError(name, value, f"not set for task={task!r}", fix=OWN_COLUMNS[task])
    if isinstance(data, (str, os.PathLike)):
        from workbench.sources.data import resolve_data_source

        data = DatasetChoice(source=resolve_data_source(data), path=str(data))
    if isinstance(data, DatasetChoice):
        from workbench.sources.data import load_splits

        data = load_splits(data)
    return data, (), None


def check_output_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        # A unique name: processes on other nodes may have the same PID in the same folder.
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError("output_dir", str(path), "a writable folder",
                          fix=f"choose another output_dir ({exc.strerror or exc}).") from None
