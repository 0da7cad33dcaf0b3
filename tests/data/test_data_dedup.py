from __future__ import annotations

import random
from collections import Counter

from tinystack.data.dedup.exact import ExactDedup, text_sha256
from tinystack.data.filters.clean import normalize_text
from tinystack.data.io.records import Record


def _variant(text: str, rng: random.Random) -> str:
    """Same normalised text, different raw bytes: trailing spaces, CRLF, decomposed é."""
    t = text.replace("\u00e9", "e\u0301") if rng.random() < 0.5 else text
    t = t.replace("\n", " \r\n") if rng.random() < 0.5 else t
    return t + "  \n\n\n" if rng.random() < 0.5 else t


def test_dedup_counts_on_crafted_corpus():
    rng = random.Random(1234)
    base = [f"document {i} caf\u00e9\nsecond line {i}" for i in range(40)]
    copies = [rng.randint(1, 4) for _ in base]  # how often each distinct text occurs
    stream = []
    for i, n in enumerate(copies):
        for c in range(n):
            stream.append(Record(text=_variant(base[i], rng), source=f"s{(i + c) % 7}", id=f"{i}.{c}"))
    rng.shuffle(stream)

    step = ExactDedup()
    kept = list(step(stream))

    assert len(kept) == len(base)
    assert step.stats.dropped == {"exact_duplicate": sum(copies) - len(base)}
    assert step.stats.extra["duplicate_groups"] == sum(n > 1 for n in copies)
    step.stats.check()
    # First occurrence (in stream order) wins, deterministically.
    first: dict[str, str] = {}
    for r in stream:
        first.setdefault(normalize_text(r.text), r.id)
    assert sorted(r.id for r in kept) == sorted(first.values())
    assert Counter(normalize_text(r.text) for r in kept).most_common(1)[0][1] == 1
    # Cross-source count: dropped copies whose kept copy came from another source.
    src_of_first = {normalize_text(r.text): r.source for r in kept}
    kept_ids = {r.id for r in kept}
    cross = sum(1 for r in stream if r.id not in kept_ids and src_of_first[normalize_text(r.text)] != r.source)
    assert step.stats.extra["cross_source"] == cross


def test_dedup_is_not_fooled_by_near_duplicates():
    recs = [Record(text="Return self==value."), Record(text="Return self!=value."), Record(text="return self==value.")]
    step = ExactDedup()
    assert len(list(step(recs))) == 3


def test_text_sha256_is_stable():
    # A fixed digest guards against an accidental change of the dedup key definition.
    import hashlib

    assert text_sha256("  abc \r\n") == hashlib.sha256(b"abc").digest()


def test_exact_key_is_nfkc_with_collapsed_whitespace_and_optional_casefold():
    from tinystack.data.dedup.exact import exact_key

    a = "Ｆｕｌｌ\u3000width  text,\n\nsame ﬁle"  # full-width letters, ideographic space, ligature
    b = "Full width text, same file"
    assert exact_key(a) == exact_key(b)
    assert exact_key(b) != exact_key(b.lower()) and exact_key(b, casefold=True) == exact_key(b.lower(), casefold=True)
    step = ExactDedup(casefold=True)
    assert [r.text for r in step([Record(text=b), Record(text=a), Record(text=b.upper())])] == [b]
