"""The one scoring function (eval.scoring) on a hand-computable model: uniform logits give loss = ln(V);
ignored targets are skipped exactly as F.cross_entropy(ignore_index=-100) skips them."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tinystack.eval.scoring import IGNORE_INDEX, score_batches, score_tokens, window_batches, window_starts
from tinystack.model import GPT, GPTConfig


def _uniform_model(vocab=37, block=8):
    model = GPT(GPTConfig(vocab_size=vocab, block_size=block, n_layer=1, n_head=1, n_embd=8))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # zero embeddings + zero LayerNorm gain -> logits are exactly 0 -> uniform
    return model


def test_uniform_logits_give_log_vocab_and_exact_bits_per_byte():
    vocab, block = 37, 8
    tokens = np.random.default_rng(0).integers(0, vocab, 200).astype(np.uint16)
    nbytes = np.random.default_rng(1).integers(1, 4, vocab)
    m = score_tokens(_uniform_model(vocab, block), tokens, nbytes, batch_size=3).to_dict()
    starts = window_starts(len(tokens), block)
    scored = np.concatenate([tokens[s + 1:s + block + 1] for s in starts])
    assert m["tokens"] == len(scored) == len(starts) * block
    assert m["loss"] == pytest.approx(math.log(vocab), rel=1e-6)
    assert m["perplexity"] == pytest.approx(vocab, rel=1e-5)
    assert m["bytes"] == nbytes[scored].sum()
    assert m["bits_per_byte"] == pytest.approx(len(scored) * math.log2(vocab) / nbytes[scored].sum(), rel=1e-6)


def test_windows_are_non_overlapping_and_thinned_evenly():
    starts = window_starts(1000, 10)
    assert (np.diff(starts) == 10).all() and starts[-1] + 11 <= 1000
    thin = window_starts(1000, 10, max_windows=5)
    assert len(thin) == 5 and thin[0] == 0 and thin[-1] == starts[-1]


def test_too_few_tokens_is_a_clear_error():
    with pytest.raises(ValueError, match="need more than block_size=8"):
        score_tokens(_uniform_model(), np.zeros(8, dtype=np.uint16), np.ones(37))


def test_accuracy_of_uniform_logits_is_the_share_of_token_zero():
    """All-zero logits: argmax is always id 0, so accuracy = share of targets equal to 0."""
    vocab, block = 5, 8
    tokens = np.random.default_rng(2).integers(0, vocab, 300).astype(np.uint16)
    m = score_tokens(_uniform_model(vocab, block), tokens, np.ones(vocab, dtype=np.int64)).to_dict()
    scored = np.concatenate([tokens[s + 1:s + block + 1] for s in window_starts(len(tokens), block)])
    assert m["accuracy"] == pytest.approx(float((scored == 0).mean()))


def test_score_skips_ignored_targets_as_cross_entropy_does_and_keeps_the_model_mode():
    """Batches with IGNORE_INDEX targets (padding, prompts): the sums are F.cross_entropy's over the kept ones,
    accuracy counts only them, bytes only theirs; batch size changes nothing; the model's mode is restored."""
    torch.manual_seed(0)
    vocab, block = 23, 8
    model = GPT(GPTConfig(vocab_size=vocab, block_size=block, n_layer=1, n_head=2, n_embd=16))
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, vocab, (5, block), generator=g)
    y = torch.randint(0, vocab, (5, block), generator=g)
    y[0, :3] = y[2, 5:] = y[4] = IGNORE_INDEX
    nbytes = np.arange(1, vocab + 1)
    model.train()
    s = score_batches(model, [(x[:2], y[:2]), (x[2:], y[2:])], nbytes)
    assert model.training
    model.eval()
    with torch.no_grad():
        logits = model(x)[0]
    keep = y != IGNORE_INDEX
    ref = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1), ignore_index=-100, reduction="sum")
    assert s.tokens == int(keep.sum()) and s.rows == 5
    assert s.nats == pytest.approx(float(ref), rel=1e-6)
    assert s.correct == int(((logits.argmax(-1) == y) & keep).sum())
    assert s.bytes == int(nbytes[y[keep].numpy()].sum())
    assert s.loss == pytest.approx(float(ref) / int(keep.sum()), rel=1e-6)
    assert s.perplexity == pytest.approx(math.exp(s.loss)) and s.accuracy == s.correct / s.tokens
    one = score_batches(model, [(x, y)], nbytes)
    assert one.nats == pytest.approx(s.nats, rel=1e-6) and (one.tokens, one.correct) == (s.tokens, s.correct)
    assert "bits_per_byte" not in score_batches(model, [(x, y)]).to_dict()  # no byte lengths: no bits per byte


def test_window_batches_are_the_windows_in_order():
    tokens = np.arange(100, dtype=np.uint16)
    batches = window_batches(tokens, 8, max_windows=5, batch_size=2)
    starts = window_starts(100, 8, 5)
    assert [len(x) for x, _ in batches] == [2, 2, 1]
    x = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    assert (x[:, 0] == starts).all() and (y == x + 1).all() and x.dtype == np.int64
