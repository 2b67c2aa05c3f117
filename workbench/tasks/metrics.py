"""Evaluation metrics: classification (by hand), entities (seqeval), SQuAD exact match and F1 (by hand).

Classification: predictions and labels are integer class ids (numpy arrays or torch tensors).
Entities: tag sequences per sentence. SQuAD: answer texts per question.
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


# ------------------------------------------------------- token classification: entities
def entity_metrics(true_tags: list[list[str]], predicted_tags: list[list[str]]) -> dict[str, float]:
    """Entity-level precision, recall and F1 (micro over entities) with seqeval, per entity type
    too, and word accuracy: the eval event's fields.

    An entity counts only when its type and both ends are right (CoNLL's conlleval rules,
    seqeval's default mode: IOB1, IOB2 and IOBES tags alike). ``eval_<TYPE>_number`` is how many
    entities of that type the reference holds. Fractions in [0, 1].
    """
    from seqeval.metrics import accuracy_score, classification_report

    report = classification_report(true_tags, predicted_tags, output_dict=True, zero_division=0)
    overall = report.get("micro avg", {})
    out = {"eval_precision": float(overall.get("precision", 0.0)),
           "eval_recall": float(overall.get("recall", 0.0)),
           "eval_f1": float(overall.get("f1-score", 0.0)),
           "eval_accuracy": float(accuracy_score(true_tags, predicted_tags))}
    for name, scores in sorted(report.items()):
        if name.endswith(" avg"):
            continue
        out.update({f"eval_{name}_precision": float(scores["precision"]),
                    f"eval_{name}_recall": float(scores["recall"]),
                    f"eval_{name}_f1": float(scores["f1-score"]),
                    f"eval_{name}_number": int(scores["support"])})
    return out


# ------------------------------------------------- question answering: the SQuAD metric
# Exactly the official evaluation scripts (SQuAD v1.1's evaluate-v1.1.py, v2.0's
# evaluate-v2.0.py), without their file handling. Written here because the `evaluate` library
# downloads its metric code when a run starts: offline machines could not score at all.
def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles (a, an, the), single spaces: both scripts' rule."""
    import re
    import string

    text = text.lower()
    punctuation = set(string.punctuation)
    text = "".join(ch for ch in text if ch not in punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text, flags=re.UNICODE)
    return " ".join(text.split())


def _answer_tokens(text: str) -> list[str]:
    return normalize_answer(text).split() if text else []


def squad_exact(prediction: str, reference: str) -> int:
    return int(normalize_answer(prediction) == normalize_answer(reference))


def squad_f1(prediction: str, reference: str, *, version_2: bool = False) -> float:
    """Token-overlap F1 of two answers. ``version_2``: v2.0's rule that an empty answer (no answer)
    scores 1 against an empty one and 0 against anything else; v1.1 scores 0 whenever nothing overlaps."""
    from collections import Counter

    predicted, gold = _answer_tokens(prediction), _answer_tokens(reference)
    if version_2 and (not predicted or not gold):
        return float(predicted == gold)
    same = sum((Counter(predicted) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def squad_scores(prediction: str, references: list[str], *, version_2: bool = False) -> tuple[int, float]:
    """(exact match, F1) of one prediction: the best over its references, as both scripts take it.

    v2.0 drops references that normalise to nothing and scores an unanswerable question (no
    reference left) against the empty answer."""
    if version_2:
        references = [r for r in references if normalize_answer(r)] or [""]
    if not references:  # v1.1 data always has a reference; an unanswerable one scores 0 there
        return 0, 0.0
    return (max(squad_exact(prediction, r) for r in references),
            max(squad_f1(prediction, r, version_2=version_2) for r in references))


def squad_metrics(predictions: list[str], references: list[list[str]], *, version_2: bool = False
                  ) -> dict[str, float]:
    """``eval_exact_match`` and ``eval_f1`` over questions (fractions: x100 is the scripts' percent);
    with SQuAD 2.0 data also the answerable (``has_answer``) and unanswerable (``no_answer``) parts."""
    scores = [squad_scores(p, r, version_2=version_2) for p, r in zip(predictions, references, strict=True)]
    total = max(len(scores), 1)
    out = {"eval_exact_match": sum(s[0] for s in scores) / total, "eval_f1": sum(s[1] for s in scores) / total}
    if version_2:
        for name, keep in (("has_answer", True), ("no_answer", False)):
            part = [s for s, r in zip(scores, references, strict=True) if bool(r) == keep]
            if part:
                out[f"eval_{name}_exact_match"] = sum(s[0] for s in part) / len(part)
                out[f"eval_{name}_f1"] = sum(s[1] for s in part) / len(part)
    return out
