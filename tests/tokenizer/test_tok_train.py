"""Training: deterministic, exact vocab size, and the incremental algorithm makes
exactly the merges a naive full-recount implementation makes."""
from __future__ import annotations

import random
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinystack.tokenizer import BPETokenizer
from tinystack.tokenizer.pretokenize import pretokenize
from tinystack.tokenizer.train import learn_merges, merge_word


def naive_merges(word_counts: dict[bytes, int], num_merges: int) -> list[tuple[int, int]]:
    """The textbook loop: recount every pair of every word before each merge.
    Same rule as train.py: most frequent pair, ties -> smallest (a, b), never a
    pair whose merged bytes are already a token."""
    words = [(list(w), f) for w, f in word_counts.items()]
    vocab = [bytes([i]) for i in range(256)]
    merges: list[tuple[int, int]] = []
    while len(merges) < num_merges:
        counts: Counter[tuple[int, int]] = Counter()
        for w, f in words:
            for p in zip(w, w[1:]):
                counts[p] += f
        known = set(vocab)
        cands = [(-c, p) for p, c in counts.items() if vocab[p[0]] + vocab[p[1]] not in known]
        if not cands:
            break
        _, (a, b) = min(cands)
        new_id = len(vocab)
        vocab.append(vocab[a] + vocab[b])
        merges.append((a, b))
        words = [(merge_word(w, a, b, new_id), f) for w, f in words]
    return merges


def _counts(texts: list[str]) -> dict[bytes, int]:
    c: Counter[str] = Counter()
    for t in texts:
        c.update(pretokenize(t))
    return {w.encode(): n for w, n in c.items()}


def test_incremental_equals_naive_on_real_text(texts: list[str]) -> None:
    wc = _counts([texts[0], texts[-1][:20_000]])
    assert learn_merges(wc, 300) == naive_merges(wc, 300)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(alphabet="aab ", min_size=1, max_size=14).map(str.encode),
                       st.integers(1, 9), min_size=1, max_size=12),
       st.integers(1, 40))
def test_incremental_equals_naive_on_adversarial_words(wc: dict[bytes, int], n: int) -> None:
    # Tiny alphabets and runs ("aaaa...") are where ties, overlapping pairs and
    # already-existing merged byte strings show up.
    assert learn_merges(wc, n) == naive_merges(wc, n)


def test_deterministic_and_order_independent(texts: list[str]) -> None:
    a = BPETokenizer.train(texts, 700)
    shuffled = list(texts)
    random.Random(0).shuffle(shuffled)
    b = BPETokenizer.train(reversed(shuffled), 700)  # any iterable, any order
    assert a.merges == b.merges and a.fingerprint() == b.fingerprint()


@pytest.mark.parametrize("vocab_size", [257, 300, 1000])
def test_vocab_size_is_exact(texts: list[str], vocab_size: int) -> None:
    assert BPETokenizer.train(texts, vocab_size).vocab_size == vocab_size


def test_vocab_size_too_small_raises() -> None:
    with pytest.raises(ValueError):
        BPETokenizer.train(["abc"], 256)  # no room for <|endoftext|>


def test_tiny_corpus_stops_early() -> None:
    t = BPETokenizer.train(["ab ab"], 1000)  # only "ab" and " ab" can ever be formed
    assert t.vocab_size == 256 + 2 + 1
    assert t.decode(t.encode("ab ab")) == "ab ab" and t.encode("ab ab") == [256, 257]


def test_progress_reports(texts: list[str]) -> None:
    seen: list[tuple[int, int]] = []
    BPETokenizer.train(texts, 500, progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (243, 243) and all(t == 243 for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_training_is_fast(texts: list[str]) -> None:
    # The full target (4096 vocab on 1 MB in <= 10 s) lives in benchmarks/; this
    # guards against falling back to a full recount per merge.
    t0 = time.perf_counter()
    BPETokenizer.train(texts, 2048)
    assert time.perf_counter() - t0 < 5.0
