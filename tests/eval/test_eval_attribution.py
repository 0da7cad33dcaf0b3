"""Bad-case attribution finds a planted noisy source; leakage detection finds a planted near duplicate."""
import json

import pytest

from tinystack.config import EvalConfig
from tinystack.eval.neardup import find_near_duplicates
from tinystack.eval.offline import evaluate_model
from tinystack.model.io import load_model
from tinystack.tokenizer import BPETokenizer


@pytest.fixture
def evaluated(toy_model_dir, planted_data_dir):
    model, tok = load_model(toy_model_dir), BPETokenizer.load(toy_model_dir)
    return evaluate_model(model, tok, EvalConfig(worst_k=6, length_buckets=[16, 48]), data_dir=planted_data_dir,
                          progress=False)


def test_attribution_finds_the_planted_noise_source(evaluated):
    docs = evaluated["val"]["docs"]
    assert docs["source_blame"][0]["source"] == "noise"
    noise, total = docs["by_source"]["noise"], docs["total"]
    assert noise["loss"] > 2 * total["loss"] and noise["nats"] / total["nats"] > noise["tokens"] / total["tokens"]
    assert [w["source"] for w in docs["worst_cases"]] == ["noise"] * 6
    assert all(w["cluster_id"] >= 1000 and w["id"].startswith("nz") and not w["near_duplicate_in_train"]
               for w in docs["worst_cases"])
    losses = [w["loss"] for w in docs["worst_cases"]]
    assert losses == sorted(losses, reverse=True)
    text = " ".join(evaluated["findings"])
    assert "Worst source (val): `noise`" in text and "Most excess loss (val): `noise`" in text
    assert "6 come from `noise`" in text
    # the test split has no noise: its worst source is some toy source, at most mildly worse
    test_docs = evaluated["test"]["docs"]
    assert "noise" not in test_docs["by_source"]


def test_leakage_finds_the_planted_near_duplicate(evaluated, planted_data_dir):
    leak = evaluated["val"]["docs"]["leakage"]
    assert leak["leaked"] == 1 and [e["id"] for e in leak["examples"]] == ["leak"]
    assert leak["examples"][0]["train_id"] == "tr7" and leak["examples"][0]["jaccard"] >= 0.8
    assert leak["rate"] == pytest.approx(1 / leak["checked"])
    assert evaluated["test"]["docs"]["leakage"]["leaked"] == 0
    assert "Leakage (val): 1 of 31 documents (3.2%)" in " ".join(evaluated["findings"])


def test_near_duplicate_is_not_an_exact_match_and_unrelated_text_is_not_flagged():
    train = ["The quick brown fox jumps over the lazy dog near the river bank today.",
             "Completely different words about databases, indexes and query planners."]
    queries = ["The quick brown fox jumps over the lazy dog near the river bank today!",
               "Totally unrelated: a recipe for bread with flour, water, salt and yeast."]
    got = find_near_duplicates(train, queries, threshold=0.8)
    assert got[0] is not None and got[0][0] == 0 and got[0][1] < 1.0
    assert got[1] is None
    assert find_near_duplicates([], queries) == [None, None]


def test_eval_json_is_deterministic(toy_model_dir, planted_data_dir):
    model, tok = load_model(toy_model_dir), BPETokenizer.load(toy_model_dir)
    runs = [json.dumps(evaluate_model(model, tok, EvalConfig(max_docs=10), data_dir=planted_data_dir,
                                      progress=False), sort_keys=True) for _ in range(2)]
    assert runs[0] == runs[1]
    assert json.loads(runs[0])["val"]["docs"]["total"]["docs"] == 10
