"""Classifier metrics from labels alone: accuracy, per-class precision/recall/F1, confusion matrix.

Generic over any classifier (the NumPy MLP on digits, or anything else): the
inputs are two equal-length sequences of labels, `y_true` and `y_pred`. The
conventions match scikit-learn's (`confusion_matrix`, `precision_recall_fscore_support`
with zero_division=0): rows of the confusion matrix are true classes, columns
predicted ones; a class never predicted has precision 0, one never present has
recall 0; macro averages weight classes equally, weighted ones by support.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def confusion_matrix(y_true: Sequence[Any], y_pred: Sequence[Any],
                     labels: Sequence[Any] | None = None) -> tuple[np.ndarray, list[Any]]:
    """(matrix [C, C] with counts[i, j] = true labels[i] predicted as labels[j], labels)."""
    y_true, y_pred = list(y_true), list(y_pred)
    if len(y_true) != len(y_pred):
        raise ValueError(f"y_true has {len(y_true)} labels, y_pred {len(y_pred)}")
    labels = sorted(set(y_true) | set(y_pred)) if labels is None else list(labels)
    index = {lab: i for i, lab in enumerate(labels)}
    cm = np.zeros((len(labels), len(labels)), dtype=np.int64)
    for t, p in zip(y_true, y_pred):
        if t in index and p in index:
            cm[index[t], index[p]] += 1
    return cm, labels


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(a.shape, dtype=float), where=b > 0)


def classification_report(y_true: Sequence[Any], y_pred: Sequence[Any],
                          labels: Sequence[Any] | None = None) -> dict[str, Any]:
    """Accuracy, per-class precision/recall/F1/support, macro and weighted averages, confusion matrix."""
    cm, labels = confusion_matrix(y_true, y_pred, labels)
    tp = np.diag(cm).astype(float)
    support = cm.sum(axis=1).astype(float)
    precision = _safe_div(tp, cm.sum(axis=0).astype(float))
    recall = _safe_div(tp, support)
    f1 = _safe_div(2 * precision * recall, precision + recall)
    n = len(list(y_true))
    per_class = {str(lab): {"precision": float(precision[i]), "recall": float(recall[i]), "f1": float(f1[i]),
                            "support": int(support[i])} for i, lab in enumerate(labels)}
    weights = support / support.sum() if support.sum() else np.zeros_like(support)
    return {
        "accuracy": float(tp.sum() / n) if n else float("nan"),
        "per_class": per_class,
        "macro": {"precision": float(precision.mean()), "recall": float(recall.mean()), "f1": float(f1.mean())},
        "weighted": {"precision": float(precision @ weights), "recall": float(recall @ weights),
                     "f1": float(f1 @ weights)},
        "labels": [str(lab) for lab in labels],
        "confusion_matrix": cm.tolist(),
    }
