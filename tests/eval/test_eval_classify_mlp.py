"""Classifier metrics on the real NumPy MLP: trained on scikit-learn's digits, reported and cross-checked."""
import numpy as np
import pytest

from tinystack.eval.classify import classification_report
from tinystack.nn import MLP
from tinystack.nn.classify import fit
from tinystack.nn.datasets import load_digits

metrics = pytest.importorskip("sklearn.metrics")


def test_mlp_on_digits_report_matches_sklearn_and_is_consistent():
    x_tr, y_tr, x_te, y_te = load_digits()
    model = MLP([64, 64, 10], seed=0)
    fit(model, x_tr, y_tr, epochs=15, batch_size=64, lr=1e-2)
    pred = model.predict(x_te)
    report = classification_report(y_te, pred)

    assert report["accuracy"] > 0.9  # the model is real, not a constant predictor
    assert report["accuracy"] == pytest.approx(metrics.accuracy_score(y_te, pred))
    cm = np.array(report["confusion_matrix"])
    assert (cm == metrics.confusion_matrix(y_te, pred, labels=list(range(10)))).all()
    assert cm.sum() == len(y_te) and np.trace(cm) == (pred == y_te).sum()
    p, r, f, s = metrics.precision_recall_fscore_support(y_te, pred, labels=list(range(10)), zero_division=0)
    for i in range(10):
        row = report["per_class"][str(i)]
        assert row["precision"] == pytest.approx(p[i]) and row["recall"] == pytest.approx(r[i])
        assert row["f1"] == pytest.approx(f[i]) and row["support"] == s[i]
    assert report["macro"]["f1"] == pytest.approx(metrics.f1_score(y_te, pred, average="macro"))
