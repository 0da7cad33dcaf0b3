"""Metrics on a hand-computable model: uniform logits give loss = ln(V)."""
import math

import numpy as np
import pytest
import torch

from tinystack.eval import evaluate_tokens, window_starts
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
    m = evaluate_tokens(_uniform_model(vocab, block), tokens, nbytes, batch_size=3)
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
        evaluate_tokens(_uniform_model(), np.zeros(8, dtype=np.uint16), np.ones(37))


def test_accuracy_of_uniform_logits_is_the_share_of_token_zero():
    """All-zero logits: argmax is always id 0, so accuracy = share of targets equal to 0."""
    vocab, block = 5, 8
    tokens = np.random.default_rng(2).integers(0, vocab, 300).astype(np.uint16)
    m = evaluate_tokens(_uniform_model(vocab, block), tokens, np.ones(vocab, dtype=np.int64))
    scored = np.concatenate([tokens[s + 1:s + block + 1] for s in window_starts(len(tokens), block)])
    assert m["accuracy"] == pytest.approx(float((scored == 0).mean()))
