"""Per-document scoring and slices: uniform logits give ln(V) per document, slices add back to totals,
and batching or document order never changes a document's score."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tinystack.eval.scoring import score_documents, target_nats
from tinystack.eval.slices import length_bucket, split_report
from tinystack.model import GPT, GPTConfig


def _uniform_model(vocab=29, block=8):
    model = GPT(GPTConfig(vocab_size=vocab, block_size=block, n_layer=1, n_head=1, n_embd=8))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model


def _random_model(vocab=29, block=8):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab, block_size=block, n_layer=1, n_head=2, n_embd=16)).eval()


def _docs(n=23, vocab=29, seed=0):
    rng = np.random.default_rng(seed)
    return [[0, *rng.integers(1, vocab, rng.integers(1, 30)).tolist(), 0] for _ in range(n)]


def test_uniform_logits_give_log_vocab_for_every_document_and_slice():
    vocab = 29
    docs = _docs(vocab=vocab)
    nbytes = [3 * len(d) for d in docs]
    s = score_documents(_uniform_model(vocab), docs, nbytes, batch_size=4)
    assert (s.tokens == [len(d) - 1 for d in docs]).all()  # every token after the leading separator
    assert np.allclose(s.loss, math.log(vocab))
    rep = split_report(s, [f"src{i % 3}" for i in range(len(docs))], [8, 16])
    for group in ("by_source", "by_length"):
        for m in rep[group].values():
            assert m["loss"] == pytest.approx(math.log(vocab))
            assert m["perplexity"] == pytest.approx(vocab)
    total = rep["total"]
    assert total["bits_per_byte"] == pytest.approx(total["tokens"] * math.log2(vocab) / sum(nbytes))


def test_per_source_and_per_length_slices_add_back_up_to_the_totals():
    docs = _docs(n=40, seed=3)
    s = score_documents(_random_model(), docs, [len(d) for d in docs], batch_size=5)
    sources = [["alpha", "beta", "gamma", "delta"][i % 4] if i % 7 else "beta" for i in range(len(docs))]
    rep = split_report(s, sources, [8, 20])
    total = rep["total"]
    assert total["nats"] == pytest.approx(float(s.nats.sum()))
    for group in ("by_source", "by_length"):
        slices = rep[group].values()
        for key in ("docs", "tokens", "bytes", "correct"):
            assert sum(m[key] for m in slices) == total[key]
        assert sum(m["nats"] for m in slices) == pytest.approx(total["nats"], rel=1e-12)
        # the total loss is the token-weighted mean of the slice losses
        assert sum(m["loss"] * m["tokens"] for m in slices) / total["tokens"] == pytest.approx(total["loss"])
    assert set(rep["by_source"]) == set(sources)


def test_scores_do_not_depend_on_batching_or_order_and_match_a_direct_computation():
    model = _random_model()
    docs = _docs(n=12, seed=5)
    a = score_documents(model, docs, [1] * len(docs), batch_size=1)
    b = score_documents(model, docs[::-1], [1] * len(docs), batch_size=7)
    assert np.allclose(a.nats, b.nats[::-1], rtol=1e-5) and (a.correct == b.correct[::-1]).all()
    # direct: a long document is scored as consecutive non-overlapping windows of block_size targets
    doc, T = docs[int(np.argmax([len(d) for d in docs]))], model.config.block_size
    assert len(doc) - 1 > T
    want = 0.0
    with torch.no_grad():
        for st in range(0, len(doc) - 1, T):
            w = torch.tensor(doc[st:st + T + 1])
            logits, _ = model(w[None, :-1])
            want += float(F.cross_entropy(logits[0], w[1:], reduction="sum"))
    i = docs.index(doc)
    assert a.nats[i] == pytest.approx(want, rel=1e-5)


def test_target_nats_scores_only_the_target_tokens():
    vocab = 29
    nats = target_nats(_uniform_model(vocab), [0, 3, 4], [5, 6, 7])
    assert nats.shape == (3,) and np.allclose(nats, math.log(vocab))
    with pytest.raises(ValueError):
        target_nats(_uniform_model(vocab), [0], [])


@pytest.mark.parametrize("n, label", [(0, "<32"), (31, "<32"), (32, "32-127"), (127, "32-127"), (512, ">=512")])
def test_length_buckets(n, label):
    assert length_bucket(n, [32, 128, 512]) == label
