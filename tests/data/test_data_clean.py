from __future__ import annotations

import random
import unicodedata

import pytest

from tinystack.data.filters.clean import LengthFilter, Normalize, normalize_text
from tinystack.data.io.records import Record


def test_normalize_rules():
    assert normalize_text("  a  \r\nb\t \rc\n\n\n\n\nd \n\n") == "a\nb\nc\n\nd"
    assert normalize_text("e\u0301") == "\u00e9"  # NFC composes
    assert normalize_text("x\ty") == "x\ty"  # tabs are content, kept
    assert normalize_text("ﬁ²") == "ﬁ²"  # NFC, not NFKC: compatibility chars untouched
    assert normalize_text("p\x0cq\u2028r") == "p\x0cq\u2028r"  # only \n splits lines
    assert normalize_text("one\n\ntwo") == "one\n\ntwo"  # a single blank line survives


ALPHABET = ["a", "b", " ", "\t", "\n", "\r", "\r\n", "e\u0301", "\u0301", "\u00e9", "\u212b", "\u2000", "\u3000",
            "\x0c", "日", " \n"]


def test_normalize_idempotent_and_nfc_fuzz():
    rng = random.Random(0)
    for _ in range(3000):
        s = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 30)))
        once = normalize_text(s)
        assert normalize_text(once) == once, repr(s)
        assert unicodedata.is_normalized("NFC", once)
        assert "\r" not in once and "\n\n\n" not in once
        assert all(line == line.rstrip() for line in once.split("\n"))
        assert once == once.strip()


def test_normalize_step_counts():
    step = Normalize()
    recs = [Record(text="clean"), Record(text="dirty  \r\n"), Record(text="e\u0301")]
    out = list(step(recs))
    assert [r.text for r in out] == ["clean", "dirty", "\u00e9"]
    assert out[1].source == recs[1].source
    assert (step.stats.n_in, step.stats.kept, step.stats.extra["changed"]) == (3, 3, 2)
    step.stats.check()


def test_length_filter_counts():
    lens = [0, 3, 4, 5, 9, 10, 11, 50]
    step = LengthFilter(min_chars=4, max_chars=10)
    out = list(step(Record(text="x" * n) for n in lens))
    assert [len(r.text) for r in out] == [n for n in lens if 4 <= n <= 10]
    assert step.stats.dropped == {"too_short": sum(n < 4 for n in lens), "too_long": sum(n > 10 for n in lens)}
    assert step.stats.n_in == len(lens)
    step.stats.check()
    # max_chars <= 0: no upper bound
    assert len(list(LengthFilter(4, 0)(Record(text="y" * n) for n in lens))) == sum(n >= 4 for n in lens)


def test_length_filter_rejects_impossible_bounds():
    with pytest.raises(ValueError):
        LengthFilter(min_chars=10, max_chars=5)
    with pytest.raises(ValueError):
        LengthFilter(min_chars=-1)
