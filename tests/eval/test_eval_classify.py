"""Classifier metrics agree with scikit-learn's, including classes never predicted or never present."""
import numpy as np
import pytest
from sklearn import metrics as skm

from tinystack.eval.classify import classification_report, confusion_matrix


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    y_true = rng.integers(0, 6, 300)
    y_pred = np.where(rng.random(300) < 0.6, y_true, rng.integers(0, 7, 300))  # class 6 is never true
    y_pred[y_pred == 2] = 3  # class 2 is never predicted
    labels = sorted(set(y_true) | set(y_pred))
    rep = classification_report(y_true.tolist(), y_pred.tolist())
    assert rep["accuracy"] == pytest.approx(skm.accuracy_score(y_true, y_pred))
    cm, got_labels = confusion_matrix(y_true.tolist(), y_pred.tolist())
    assert got_labels == labels
    assert (cm == skm.confusion_matrix(y_true, y_pred, labels=labels)).all()
    assert rep["confusion_matrix"] == cm.tolist()
    p, r, f, s = skm.precision_recall_fscore_support(y_true, y_pred, labels=labels, zero_division=0)
    for i, lab in enumerate(labels):
        c = rep["per_class"][str(lab)]
        assert (c["precision"], c["recall"], c["f1"], c["support"]) == pytest.approx((p[i], r[i], f[i], s[i]))
    for avg in ("macro", "weighted"):
        p, r, f, _ = skm.precision_recall_fscore_support(y_true, y_pred, labels=labels, average=avg, zero_division=0)
        assert (rep[avg]["precision"], rep[avg]["recall"], rep[avg]["f1"]) == pytest.approx((p, r, f))


def test_string_labels_and_length_mismatch():
    rep = classification_report(["a", "b", "a"], ["a", "a", "a"])
    assert rep["labels"] == ["a", "b"] and rep["per_class"]["b"]["recall"] == 0.0
    assert rep["per_class"]["a"]["precision"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="3 labels"):
        classification_report(["a", "b", "a"], ["a"])
