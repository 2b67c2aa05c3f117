"""Accuracy and macro-F1, by hand, checked against values worked out on paper."""

from __future__ import annotations

import math

import numpy as np
import torch

from workbench.tasks.metrics import accuracy, classification_metrics, confusion_matrix, macro_f1


def test_accuracy():
    assert accuracy([0, 1, 1, 0], [0, 1, 0, 0]) == 0.75
    assert accuracy(torch.tensor([2, 2]), torch.tensor([2, 2])) == 1.0
    assert math.isnan(accuracy([], []))


def test_confusion_matrix_rows_are_true_labels():
    matrix = confusion_matrix([0, 1, 1], [0, 0, 1], 2)
    assert matrix.tolist() == [[1, 1], [0, 1]]


def test_macro_f1_worked_example():
    labels = [0, 0, 0, 1, 1, 2]
    predictions = [0, 0, 1, 1, 2, 2]
    # class 0: tp2 fp0 fn1 -> 0.8; class 1: tp1 fp1 fn1 -> 0.5; class 2: tp1 fp1 fn0 -> 2/3
    assert macro_f1(predictions, labels, 3) == (0.8 + 0.5 + 2 / 3) / 3


def test_macro_f1_ignores_absent_classes_and_counts_missed_ones_as_zero():
    assert macro_f1([0, 0], [0, 0], 3) == 1.0  # classes 1, 2 absent everywhere
    assert macro_f1([0, 0], [0, 1], 2) == (2 / 3 + 0.0) / 2


def test_classification_metrics_fields():
    metrics = classification_metrics(np.array([1, 0]), np.array([1, 1]), 2, loss=0.25)
    assert metrics == {"eval_loss": 0.25, "eval_accuracy": 0.5, "eval_f1": (2 / 3 + 0) / 2}
