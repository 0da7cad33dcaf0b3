"""Shared corpus and fixtures for the tokenizer tests.

Self-contained on purpose: under `--import-mode=importlib` a conftest cannot import
sibling helper modules, so tests get everything through fixtures.
"""
from __future__ import annotations

import pytest

from tinystack.tokenizer import BPETokenizer


def _stdlib_english() -> str:
    """~330 kB of English prose built on this machine: the standard library's docstrings."""
    from tinystack.data.io.corpus import iter_corpus

    parts, size = [], 0
    for record in iter_corpus():
        parts.append(record.text)
        size += len(record.text)
        if size > 330_000:
            break
    return "\n\n".join(parts)


ENGLISH = _stdlib_english()

# Always mixed into the corpus so merges exist inside multi-byte UTF-8 (Chinese,
# emoji), in code indentation and in digits -- the places tokenizers disagree.
MIXED = """
def fibonacci(n: int) -> int:
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)

for i in range(10):
    print(f"{i:3d} -> {fibonacci(i)}")  # 2024-01-01, 3.14159, 1,000,000

机器学习是人工智能的一个分支。我们今天学习自然语言处理和分词器。
東京は日本の首都です。Привет, мир! Γειά σου κόσμε. مرحبا بالعالم
Emoji: 🤖🚀✨👍🏽 👨‍👩‍👧 — “quotes” and ‘apostrophes’ … don't won't I'LL we've
"""


def corpus_texts() -> list[str]:
    return [MIXED] * 30 + [ENGLISH[:300_000]]


@pytest.fixture(scope="session")
def texts() -> list[str]:
    return corpus_texts()


@pytest.fixture(scope="session")
def tok(texts: list[str]) -> BPETokenizer:
    """One small tokenizer (vocab 1024, ~0.2 s to train) shared by the whole suite."""
    return BPETokenizer.train(texts, vocab_size=1024)


@pytest.fixture(scope="session")
def mixed() -> str:
    return MIXED


@pytest.fixture(scope="session")
def english() -> str:
    """30 kB of English the tokenizer was not trained on (docstrings past the training slice)."""
    return ENGLISH[-30_000:]
