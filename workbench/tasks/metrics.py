"""Classification metrics computed by hand (no scikit-learn dependency).

Predictions and labels are integer class ids (numpy arrays or torch tensors).
"""

from __future__ import annotations

import numpy as np


def _as_numpy(values) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor, maybe on a GPU
        values = values.detach().cpu().numpy()
    return np.asarray(values).reshape(-1)


def accuracy(predictions, labels) -> float:
    predictions, labels = _as_numpy(predictions), _as_numpy(labels)
    if labels.size == 0:
        return float("nan")
    return float((predictions == labels).mean())


def confusion_matrix(predictions, labels, num_labels: int) -> np.ndarray:
    """``matrix[true, predicted]`` counts."""
    predictions, labels = _as_numpy(predictions), _as_numpy(labels)
    matrix = np.zeros((num_labels, num_labels), dtype=np.int64)
    np.add.at(matrix, (labels.astype(np.int64), predictions.astype(np.int64)), 1)
    return matrix


def macro_f1(predictions, labels, num_labels: int) -> float:
    """Unweighted mean of per-class F1 over the classes present in labels or predictions.

    A class that appears in neither has no defined F1 and is left out (as
    scikit-learn does with ``labels=None``); a class predicted but never true, or
    true but never predicted, counts with F1 = 0.
    """
    matrix = confusion_matrix(predictions, labels, num_labels)
    true_positive = np.diag(matrix).astype(np.float64)
    predicted = matrix.sum(axis=0).astype(np.float64)
    actual = matrix.sum(axis=1).astype(np.float64)
    present = (predicted + actual) > 0
    if not present.any():
        return float("nan")
    denominator = predicted + actual
    f1 = np.divide(2 * true_positive, denominator, out=np.zeros_like(true_positive), where=denominator > 0)
    return float(f1[present].mean())


def classification_metrics(predictions, labels, num_labels: int, loss: float) -> dict[str, float]:
    """The eval event's fields: eval_loss, eval_accuracy, eval_f1."""
    return {
        "eval_loss": float(loss),
        "eval_accuracy": accuracy(predictions, labels),
        "eval_f1": macro_f1(predictions, labels, num_labels),
    }
