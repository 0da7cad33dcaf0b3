"""Our encoder against two independent implementations fed our merges:
tiktoken (Rust, rank-of-merged-bytes BPE, fancy-regex) and Hugging Face
`tokenizers` (Rust, pair-rank BPE, Oniguruma) loading our saved tokenizer.json.

Random text uses characters assigned in Python's Unicode database: the three
regex engines ship different Unicode versions, so a code point assigned after
the oldest of them may be a letter in one engine and unassigned in another.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinystack.tokenizer import BPETokenizer

tiktoken = pytest.importorskip("tiktoken")
tokenizers = pytest.importorskip("tokenizers")

CHINESE = ("自然语言处理是计算机科学领域与人工智能领域中的一个重要方向。"
           "它研究能实现人与计算机之间用自然语言进行有效通信的各种理论和方法。")
CODE = Path(__file__).read_text(encoding="utf-8") + Path(tokenizers.__file__).read_text(encoding="utf-8")
EDGES = "2024 12345678 don't DON'T we'LL  \n\n  \t\r\n x  y\u00a0z \u3000全角 \u2028 ... !!! ?!\n"
NAMES = ["english", "chinese", "code", "mixed", "edges"]

stable_text = st.text(st.characters(exclude_categories=("Cs", "Cn")), max_size=60)
ascii_soup = st.text(alphabet=" \n\t'sdmtlvreSLL0123456789abc.,!?:-_你好🤖\u00a0\r", max_size=80)


def to_tiktoken(tok: BPETokenizer):
    return tiktoken.Encoding(name="tinystack-test", pat_str=tok.pattern,
                             mergeable_ranks=tok.mergeable_ranks(), special_tokens=tok.special_tokens)


@pytest.fixture(scope="module")
def samples(english: str, mixed: str) -> dict[str, str]:
    return {"english": english, "chinese": CHINESE, "code": CODE, "mixed": mixed, "edges": EDGES}


@pytest.fixture(scope="module")
def tt(tok: BPETokenizer):
    return to_tiktoken(tok)


@pytest.fixture(scope="module")
def hf(tok: BPETokenizer, tmp_path_factory: pytest.TempPathFactory):
    path = tok.save(tmp_path_factory.mktemp("tok"))
    return tokenizers.Tokenizer.from_file(str(path))


@pytest.mark.parametrize("name", NAMES)
def test_matches_tiktoken(tok: BPETokenizer, tt, samples: dict[str, str], name: str) -> None:
    s = samples[name] + "<|endoftext|>" + samples[name][:100]
    assert tok.encode(s) == tt.encode(s, allowed_special="all")
    assert tok.encode_ordinary(s) == tt.encode_ordinary(s)


@pytest.mark.parametrize("name", NAMES)
def test_matches_hf_tokenizers(tok: BPETokenizer, hf, samples: dict[str, str], name: str) -> None:
    s = samples[name] + "<|endoftext|>" + samples[name][:100]
    ids = tok.encode(s)
    assert hf.encode(s).ids == ids
    assert hf.decode(ids, skip_special_tokens=False) == tok.decode(ids) == s
    assert hf.get_vocab_size() == tok.vocab_size


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(stable_text, ascii_soup))
def test_random_text_matches_both(tok: BPETokenizer, tt, hf, s: str) -> None:
    ids = tok.encode(s)
    assert ids == tt.encode(s, allowed_special="all")
    assert ids == hf.encode(s).ids


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 1023), max_size=40))
def test_decode_of_arbitrary_ids_matches_hf(tok: BPETokenizer, hf, ids: list[int]) -> None:
    # Includes ids that cut UTF-8 characters: both replace bad bytes the same way.
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=False)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet="aab \n", min_size=1, max_size=30), min_size=1, max_size=20),
       st.text(alphabet="aab \n", max_size=200))
def test_tiny_alphabet_vocab_matches_tiktoken(corpus: list[str], probe: str) -> None:
    # Small alphabets make deep, overlapping merge chains ("aaaa"), the case where
    # pair-rank BPE (ours, HF) and merged-bytes-rank BPE (tiktoken) could diverge.
    t = BPETokenizer.train(corpus, 400)
    assert t.encode(probe) == to_tiktoken(t).encode(probe, allowed_special="all")


def test_transformers_autotokenizer(tok: BPETokenizer, mixed: str, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    tok.save(tmp_path)
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    s = mixed + "<|endoftext|>"
    assert auto(s)["input_ids"] == tok.encode(s)
    assert auto.eos_token_id == tok.eos_token_id
    assert auto.decode(tok.encode(s)) == s
