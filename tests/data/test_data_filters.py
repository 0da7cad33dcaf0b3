"""Quality filters and the character n-gram language model."""
from __future__ import annotations

import random

import numpy as np
import pytest

from tinystack.config import DataConfig
from tinystack.data.filters.ngram_lm import CharNgramLM, PerplexityFilter
from tinystack.data.filters.quality import (
    CharsetFilter,
    RepetitionFilter,
    SymbolFilter,
    WordCountFilter,
    words,
)
from tinystack.data.io.records import Record
from tinystack.data.options import quality_params

EN = ("The river carries sediment from the mountains to the sea, and over many years the delta grows. "
      "Farmers value the rich soil, while engineers worry about floods during the spring melt.")
ZH = ("机器学习是人工智能的一个分支，它使计算机能够在没有明确编程的情况下从数据中学习。"
      "研究人员不断改进算法，以提高模型的准确性和效率。")


def run(step, texts):
    kept = [r.text for r in step(Record(t) for t in texts)]
    return kept, dict(step.stats.dropped)


def test_clean_english_and_chinese_pass_every_default_filter():
    for step in quality_params(DataConfig()).steps():
        kept, dropped = run(step, [EN, ZH])
        assert kept == [EN, ZH], (step.name, dropped)


def test_words_count_cjk_characters():
    assert words("hello, world 42") == ["hello", "world", "42"]
    assert words("数据科学 data") == ["数", "据", "科", "学", "data"]
    kept, dropped = run(WordCountFilter(min_words=3, max_words=10), ["two words", "三个字", "a b c d e f g h i j k"])
    assert kept == ["三个字"] and dropped == {"too_few_words": 1, "too_many_words": 1}


def test_charset_flags_controls_mojibake_and_wrong_script():
    texts = [EN, "text with a \x07 bell in it", "cafÃ© rÃ©sumÃ© is broken", "bad \ufffd replacement",
             "Привет, как дела? Это русский текст.", ZH]
    kept, dropped = run(CharsetFilter(), texts)
    assert kept == [EN, ZH]
    assert dropped == {"control_chars": 1, "mojibake": 2, "wrong_script": 1}
    kept, _ = run(CharsetFilter(scripts=("cyrillic",)), texts[4:5])
    assert kept == texts[4:5]


def test_symbol_and_digit_ratios():
    texts = [EN, "{{#}} || == ## ** @@ {{ }} ;; <> ++ -- ## x", "1234 5678 9012 3456 7890 1234 id", ZH]
    kept, dropped = run(SymbolFilter(), texts)
    assert kept == [EN, ZH] and dropped == {"symbol_ratio": 1, "digit_ratio": 1}


def test_repetition_rules():
    dup_lines = "\n".join(["buy now", "cheap offer today", "buy now", "buy now", "click here"])
    spam = " ".join(["click here now"] * 30)
    kept, dropped = run(RepetitionFilter(), [EN, dup_lines, spam, ZH * 2])
    assert dropped.get("dup_line_fraction") == 1 and dropped.get("top_ngram") == 1
    assert EN in kept


@pytest.fixture(scope="module")
def lm():
    rng = random.Random(0)
    sents = [EN, ZH, "The quick brown fox jumps over the lazy dog near the bank of the river.",
             "Engineers measure the flow of water with sensors placed along the channel."]
    return CharNgramLM(order=4).fit(sents * 3 + ["".join(rng.sample(EN, 40)) for _ in range(2)])


def test_lm_probabilities_normalise(lm):
    history = "the riv"
    vocab = [chr(int(k % 1_000_003) - 1) for k in lm.tables[1][0]]  # unigram keys -> characters
    total = sum(np.exp(lm.log_probs(history + c)[-1]) for c in vocab)
    total += np.exp(lm.log_probs(history + "\u2603")[-1])  # unseen character: the unknown share
    assert total == pytest.approx(1.0, abs=1e-6)


def test_perplexity_orders_fluent_below_noise(lm):
    assert lm.perplexity("the river carries water to the sea") < lm.perplexity("xq zzv qpt wvk jjx")
    assert lm.perplexity("计算机从数据中学习") < lm.perplexity("的的的啊啊哦哦")


def test_perplexity_filter_cuts_at_heldout_percentile():
    ref = [f"{EN} {i}" for i in range(20)] + [ZH] * 5
    f = PerplexityFilter(ref, percentile=100, order=4)
    kept, dropped = run(f, [EN, "zqxj vvkw pqzz jjjq xxkz wqpv", ZH])
    assert kept == [EN, ZH] and dropped == {"high_perplexity": 1}
    assert f.stats.extra["heldout_docs"] > 0 and f.stats.examples[0]["reason"] == "high_perplexity"
