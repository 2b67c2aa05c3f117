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


def trivial_baselines(labels, train_counts, names) -> dict:
    """What two models that learned nothing score on these (validation) labels.

    ``chance``: a uniform guess over the classes (the expected accuracy and macro-F1 of
    guessing at random; the loss ln(C)). ``majority``: always the most frequent class of the
    *training* labels ``train_counts`` (what a collapsed model predicts), with the loss of
    predicting the training labels' shares. Returns ``{"rows": n, "baselines": [...]}``,
    each baseline a ``{"name", "detail", "metrics"}`` with the eval_* fields of
    :func:`classification_metrics`.
    """
    labels = _as_numpy(labels).astype(np.int64)
    num_labels = len(names)
    counts = np.asarray(train_counts, dtype=np.float64)
    shares = np.bincount(labels, minlength=num_labels).astype(np.float64) / max(labels.size, 1)
    chance_f1 = 2 * shares / (num_labels * shares + 1)  # per class: precision = share, recall = 1/C
    majority = int(counts.argmax())
    prior = counts / counts.sum()
    prior_loss = float(-np.log(np.maximum(prior[labels], 1e-12)).mean()) if labels.size else float("nan")
    top = f"{100 * prior[majority]:.0f}% of the training labels"
    return {"rows": int(labels.size), "baselines": [
        {"name": "chance", "detail": f"a uniform guess over {num_labels} labels",
         "metrics": {"eval_loss": float(np.log(num_labels)), "eval_accuracy": 1.0 / num_labels,
                     "eval_f1": float(chance_f1.mean())}},
        {"name": "the majority class", "detail": f"always '{names[majority]}', {top}",
         "metrics": {"eval_loss": prior_loss, "eval_accuracy": float(shares[majority]),
                     "eval_f1": macro_f1(np.full(labels.size, majority), labels, num_labels)}},
    ]}
