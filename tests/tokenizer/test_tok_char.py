"""CharTokenizer: ids are sorted characters, round-trips, saves an HF-loadable file that load_tokenizer reads."""
from tokenizers import Tokenizer

from tinystack.tokenizer import BPETokenizer, CharTokenizer, load_tokenizer
from tinystack.tokenizer.shards import token_byte_lengths

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"


def test_ids_are_sorted_characters_then_specials():
    tok = CharTokenizer.train([TEXT])
    chars = sorted(set(TEXT))
    assert tok.vocab_size == len(chars) + 2
    assert tok.encode_ordinary("aA") == [chars.index("a"), chars.index("A")]
    assert tok.eos_token_id == len(chars)
    assert tok.decode(tok.encode(TEXT)) == TEXT


def test_unknown_characters_and_specials():
    tok = CharTokenizer.train([TEXT])
    ids = tok.encode("hi<|endoftext|>Z.")
    assert ids[2] == tok.eos_token_id
    assert tok.special_tokens["<|unk|>"] in ids  # 'Z' never occurred
    assert tok.encode_ordinary("<|endoftext|>")[0] == tok.encode_ordinary("<")[0]  # ordinary: plain text
    assert tok.decode(ids) == "hi<|endoftext|>\ufffd."


def test_save_load_and_huggingface_agree(tmp_path):
    tok = CharTokenizer.train([TEXT])
    tok.save(tmp_path)
    assert CharTokenizer.load(tmp_path).encode(TEXT) == tok.encode(TEXT)  # the hand-built reader
    again = load_tokenizer(tmp_path)  # the package's loader
    assert again.fingerprint() == tok.fingerprint() and again.encode_ordinary(TEXT) == tok.encode_ordinary(TEXT)
    hf = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    sample = "Speak, speak!\nBefore all<|endoftext|>"
    assert hf.encode(sample).ids == tok.encode(sample)
    plain = "Speak, speak.\nBefore all"
    assert hf.decode(tok.encode(plain)) == plain  # the Fuse decoder joins characters back without spaces
    assert len(token_byte_lengths(tok)) == tok.vocab_size


def test_load_tokenizer_still_loads_bpe(tmp_path):
    bpe = BPETokenizer.train([TEXT * 20], vocab_size=270)
    bpe.save(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert loaded.encode_ordinary(TEXT) == bpe.encode_ordinary(TEXT) and loaded.vocab_size == bpe.vocab_size
