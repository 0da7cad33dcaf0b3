"""The packaged SmolLM2-135M-Instruct (Q4_1 GGUF), imported, against `transformers` loading the same file:
tensors bit-equal to gguf's dequantisation, the same token ids, logits within 1e-4, and the same 32 greedy
tokens on ChatML conversations through our engine (`tinystack.infer.LLM`)."""
import numpy as np
import pytest
import torch

from tinystack.infer import LLM, SamplingParams
from tinystack.infer.chat import ChatFormatter, load_chat_template
from tinystack.model import load_model
from tinystack.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow  # two 135M-parameter loads (~40 s together on 2 shared CPU cores)

TEXTS = {
    "english": "The quick brown fox jumps over the lazy dog. It's 2024; we've 12,345 reasons!",
    "code": "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)  # O(2^n)\n",
    "chinese": "机器学习是人工智能的一个分支。你好，世界！",
    "emoji": "Party 🎉🚀 thumbs 👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
}
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Write a Python function that reverses a string."}],
]


@pytest.fixture(scope="module")
def gguf_reader(smollm2_gguf):
    """gguf's own reader of the file, parsed once for the two tests below (each parse takes seconds: ~50k
    tokenizer strings), which only read it."""
    gguf = pytest.importorskip("gguf")
    return gguf.GGUFReader(smollm2_gguf)


def test_real_tensors_dequantise_bit_equal(gguf_reader):
    import gguf

    from tinystack.model.gguf_dequant import dequantize

    reader = gguf_reader
    seen = set()
    for t in reader.tensors:  # the first tensor of each type in the file (Q8_0 embedding, Q4_1 weights, F32 norms)
        if t.tensor_type.name in seen:
            continue
        seen.add(t.tensor_type.name)
        ours = dequantize(t.data, t.tensor_type, tuple(int(d) for d in reversed(t.shape)))
        ref = gguf.quants.dequantize(t.data, t.tensor_type).reshape(ours.shape)
        np.testing.assert_array_equal(ours.view(np.uint32), ref.astype(np.float32).view(np.uint32))
    assert seen == {"Q8_0", "Q4_1", "F32"}


def test_our_reader_sees_what_ggufs_own_reader_sees(smollm2_gguf, gguf_reader):
    """open_reader hands gguf.GGUFReader a plain view of its memory map (speed): every metadata field and
    tensor must still be what the library's own reader parses, and the file stays read-only."""
    from tinystack.model.gguf_model import open_reader

    ours, ref = open_reader(smollm2_gguf), gguf_reader
    assert list(ours.fields) == list(ref.fields)
    for key, f in ref.fields.items():
        g = ours.fields[key]
        assert (g.offset, g.name, g.types, g.data) == (f.offset, f.name, f.types, f.data), key
        assert len(g.parts) == len(f.parts) and all(np.array_equal(a, b) for a, b in zip(g.parts, f.parts)), key
    assert [(t.name, t.tensor_type, list(t.shape), t.data_offset) for t in ours.tensors] == [
        (t.name, t.tensor_type, list(t.shape), t.data_offset) for t in ref.tensors]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(ours.tensors, ref.tensors))
    assert not ours.tensors[0].data.flags.writeable


def test_weights_equal_transformers_dequantisation(smollm2_dir, smollm2_reference):
    ours, theirs = load_model(smollm2_dir).state_dict(), smollm2_reference[0].state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_token_ids_equal_transformers_gguf_tokenizer(smollm2_dir, smollm2_reference):
    ref = smollm2_reference[1]
    ours = load_tokenizer(smollm2_dir)
    for kind, text in TEXTS.items():
        ids = ours.encode_ordinary(text)
        assert ids == ref(text)["input_ids"], kind
        assert ours.decode(ids) == text
    assert len(ours.encode_ordinary(TEXTS["english"])) < len(TEXTS["english"]) // 2  # real merges, not bytes


def _chat_ids(model_dir, messages, ref_tok) -> list[int]:
    """The conversation through our chat template, tokenised with special tokens parsed (as a chat server must)."""
    from tokenizers import Tokenizer

    prompt = ChatFormatter(load_chat_template(model_dir)).render(messages)
    assert prompt == ref_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(prompt).ids
    turns = len(messages) + (messages[0]["role"] != "system")  # the template adds a default system turn
    assert ids[0] == 1 and ids.count(2) == turns  # <|im_start|> ... one <|im_end|> per turn, parsed as tokens
    return ids


def test_logits_within_1e4_of_transformers(smollm2_dir, smollm2_reference):
    ref, ref_tok = smollm2_reference
    ours = load_model(smollm2_dir)
    for messages in CONVERSATIONS:
        ids = torch.tensor([_chat_ids(smollm2_dir, messages, ref_tok)])
        with torch.no_grad():
            diff = (ours(ids)[0] - ref(ids).logits).abs().max().item()
        assert diff < 1e-4


LONG_ANSWERS = [  # answers well past 32 tokens, so both sides generate exactly 32 without an EOS to handle
    [{"role": "user", "content": "Write a short story about a robot who learns to paint."}],
    CONVERSATIONS[1],
]


def test_32_greedy_tokens_through_our_engine_equal_transformers(smollm2_dir, smollm2_reference):
    ref, ref_tok = smollm2_reference
    prompts = [_chat_ids(smollm2_dir, m, ref_tok) for m in LONG_ANSWERS]
    # float32, as the reference computes: dtype="auto" may pick a quantised format on this CPU, whose greedy
    # path legitimately drifts from float32's after a few dozen tokens (tests/infer/quant hold the formats)
    llm = LLM(smollm2_dir, weight_format="float32", memory_limit_mb=1024)  # 1 GiB: weights + a small KV cache
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32))
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            want = ref.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=32)[0, len(prompt):].tolist()
        assert len(want) == 32 and list(out.token_ids) == want
    assert "def " in outs[1].text
