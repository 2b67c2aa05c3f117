"""A classifier on a labelled file: accuracy, macro F1 and the confusion matrix (the quickstart's report).

``workbench.evaluate(run, data="test.csv", text_columns="text", label_column="label")`` on a
classification run (or model folder) runs its ``text-classification`` pipeline over the file
and scores it with the training's own metrics (``workbench.tasks.metrics``). The result has the
harness results' shape (``results: {<data name>: {"accuracy,none", "accuracy_stderr,none",
"f1,none"}}``), so it is saved, tabled, carded and shown in the runs table like a benchmark,
with the confusion matrix and the label names beside it.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from workbench.errors import DataError, EvaluationError
from workbench.evaluation.targets import Target


def load_labelled(data, text_columns, label_column: str):
    """The rows to score: a file or folder (its test, validation or only split), a DatasetDict or a Dataset."""
    if isinstance(data, (str, Path)):
        from workbench.sources.data_files import load_files

        data = load_files(data)
    if hasattr(data, "keys"):
        name = next((s for s in ("test", "validation") if s in data), next(iter(data.keys())))
        data = data[name]
    columns = [text_columns] if isinstance(text_columns, str) else list(text_columns or ["text"])
    missing = [c for c in [*columns, label_column] if c not in data.column_names]
    if missing:
        raise DataError(f"The labelled data has no column {missing[0]!r}; it has {', '.join(data.column_names)}.",
                        "pass text_columns= and label_column= naming its columns.")
    return data, columns


def report(target: Target, data, *, text_columns=None, label_column: str = "label", batch_size: int = 32,
           device: str | None = None, data_name: str | None = None) -> tuple[dict, dict]:
    """(results in the harness's shape, meta) of ``target`` on ``data``."""
    import torch
    from transformers import pipeline

    from workbench.tasks import metrics

    rows, columns = load_labelled(data, text_columns, label_column)
    started = time.perf_counter()
    model = target.model if target.kind == "object" else target.pretrained
    classifier = pipeline("text-classification", model=model, tokenizer=target.tokenizer,
                          device=device or (0 if torch.cuda.is_available() else -1))
    names = [classifier.model.config.id2label[i] for i in sorted(classifier.model.config.id2label)]
    inputs = list(rows[columns[0]]) if len(columns) == 1 else \
        [{"text": a, "text_pair": b} for a, b in zip(rows[columns[0]], rows[columns[1]], strict=True)]
    predicted = [names.index(p["label"]) for p in classifier(inputs, batch_size=batch_size, truncation=True)]
    feature = rows.features[label_column]
    actual = []
    for value in rows[label_column]:
        name = feature.int2str(value) if hasattr(feature, "int2str") else value
        if isinstance(name, str) and name in names:
            actual.append(names.index(name))
        elif isinstance(name, int) and 0 <= name < len(names):
            actual.append(name)
        else:
            raise DataError(f"The label {value!r} of the data is not one the model knows ({', '.join(map(str, names))}).",
                            "score the model on data labelled like its training data.")
    n = len(actual)
    accuracy = metrics.accuracy(predicted, actual)
    stderr = math.sqrt(accuracy * (1 - accuracy) / (n - 1)) if n > 1 else float("nan")
    matrix = metrics.confusion_matrix(predicted, actual, len(names))
    name = data_name or (Path(str(data)).stem if isinstance(data, (str, Path)) else "data")
    results = {"results": {name: {"alias": name, "accuracy,none": accuracy, "accuracy_stderr,none": stderr,
                                  "f1,none": metrics.macro_f1(predicted, actual, len(names))}},
               "n-samples": {name: {"original": n, "effective": n}}, "n-shot": {name: 0},
               "configs": {name: {"dataset_path": str(data) if isinstance(data, (str, Path)) else name}},
               "confusion_matrix": matrix.tolist(), "labels": names}
    meta = {"kind": "classifier", "model": target.label, "evaluated": target.describe(), "source": target.kind,
            "folder": target.folder_name, "tasks": [name], "data": str(data) if isinstance(data, (str, Path)) else None,
            "text_columns": columns, "label_column": label_column, "batch_size": batch_size,
            "apply_chat_template": False, "limit": None, "seconds": round(time.perf_counter() - started, 2)}
    return results, meta


def check_classifier(target: Target) -> None:
    if target.task != "classification" and target.kind in ("run", "adapter"):
        raise EvaluationError(f"{target.label} is a {target.task} run: data= with a label column scores classifiers.",
                              "for a language model, evaluate on tasks (tasks=['heldout'], a harness task, or "
                              "include_path=FOLDER of task YAMLs).")


def plot_confusion_matrix(results: dict, title: str = "", ax=None):
    """The quickstart's confusion-matrix figure (row = true label, column = prediction)."""
    import matplotlib.pyplot as plt
    import numpy as np

    matrix = np.asarray(results["confusion_matrix"])
    names = [str(n) for n in results["labels"]]
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 4))
    ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(names)), names, rotation=45)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    for (row, col), count in np.ndenumerate(matrix):
        ax.text(col, row, str(count), ha="center", va="center",
                color="white" if count > matrix.max() / 2 else "black")
    ax.set_title(title)
    return ax
