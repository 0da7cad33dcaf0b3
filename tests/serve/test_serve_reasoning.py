"""Thinking split off a reasoning model's answer (serve/api/reasoning.py, answer.py): every split of an answer into
stream pieces gives the whole answer's reasoning and content, and through the real server a small random Qwen3
whose tokenizer has <think> / </think> answers with `reasoning_content` beside `content` (whole and streamed),
with the template's `enable_thinking` switch reaching it through chat_template_kwargs."""
import json
import re

import httpx
import pytest
import torch

from tinystack.config import InferConfig
from tinystack.infer import AsyncEngine, LLMEngine
from tinystack.infer.chat import ChatFormatter
from tinystack.model import Llama, LlamaConfig, save_model
from tinystack.model.io import load_model
from tinystack.serve.api.answer import ChatAnswer
from tinystack.serve.api.reasoning import ReasoningParser, prompt_opens_thinking
from tinystack.tokenizer.loader import load_tokenizer

ANSWERS = [  # (the prompt opened the block, answer, reasoning, content)
    (False, "<think>\nlet me see</think>\n\nParis.", "\nlet me see", "Paris."),
    (False, "  <think>a</think>b", "a", "b"),
    (False, "no thinking here", "", "no thinking here"),
    (False, "<thin", "", "<thin"),  # cut inside what could have been the marker: it was content
    (False, "<think>cut while thinking </thi", "cut while thinking </thi", ""),
    (True, "already thinking</think>\nanswer <think> kept", "already thinking", "answer <think> kept"),
    (False, "<think></think>", "", ""),
]


def _whole(opened: bool, text: str) -> ReasoningParser:
    p = ReasoningParser(opened)
    p.feed(text)
    p.finish()
    return p


@pytest.mark.parametrize("opened,text,reasoning,content", ANSWERS)
def test_stream_pieces_add_up_to_the_whole_answers_reasoning_and_content(opened, text, reasoning, content):
    whole = _whole(opened, text)
    assert (whole.reasoning, whole.content) == (reasoning, content)
    for size in (1, 2, 3, 5, len(text)):
        p, got = ReasoningParser(opened), {"reasoning": "", "content": ""}
        pieces = [text[i:i + size] for i in range(0, len(text), size)]
        for i, piece in enumerate(pieces):
            for kind, t in p.feed(piece) + (p.finish() if i == len(pieces) - 1 else []):
                got[kind] += t
        assert (got["reasoning"], got["content"]) == (reasoning, content), size


def test_the_prompt_decides_whether_the_answer_starts_inside_a_thinking_block():
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # asked not to think
    assert not prompt_opens_thinking("<|im_start|>assistant\n")
    assert ChatFormatter(QWEN3_STYLE).reasoning and not ChatFormatter("{{ messages }}").reasoning


def test_thinking_then_a_tool_call_splits_into_reasoning_and_the_call():
    from tinystack.serve.api.tools import ToolPlan

    answer = ChatAnswer(False, ToolPlan([], "auto"))
    text = '<think>I need the weather</think>\n<tool_call>{"name": "w", "arguments": {"c": "x"}}</tool_call>'
    deltas = [answer.feed(text[i:i + 4], final=i + 4 >= len(text)) for i in range(0, len(text), 4)]
    msg = answer.message()
    assert msg["reasoning_content"] == "I need the weather" and msg["content"] is None
    assert msg["tool_calls"][0]["function"] == {"name": "w", "arguments": '{"c": "x"}'}
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "I need the weather"
    assert answer.finish_reason("stop") == "tool_calls"


# Qwen3's switch, written here after its template: ChatML, and with enable_thinking false an empty thinking block
# after the assistant's turn opening (the model then answers at once)
QWEN3_STYLE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
               "{% if add_generation_prompt %}<|im_start|>assistant\n"
               "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
               "{% endif %}")
R1_STYLE = QWEN3_STYLE.replace("{% if enable_thinking is defined", "<think>\n{% if false")  # always opened


def _qwen3_dir(out, template: str):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    out.mkdir()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["what is the capital of france? paris is.\n"] * 4, trainer)
    tok.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])  # as Qwen3's
    tok.save(str(out / "tokenizer.json"))
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64, n_layer=2,
                              n_head=4, n_kv_head=2, max_position_embeddings=256, tie_word_embeddings=True,
                              qk_norm=True, model_type="qwen3"))
    save_model(model, out, eos_token_id=2)
    (out / "chat_template.jinja").write_text(template)
    return out


@pytest.fixture
def qwen3(tmp_path):
    engines = []

    def start(template: str):
        path = _qwen3_dir(tmp_path / f"m{len(engines)}", template)
        tok = load_tokenizer(path)
        assert "<think>" in tok.decode(tok.encode_with_special_tokens("<think>"))  # decoded as text, as Qwen3's
        engine = AsyncEngine(LLMEngine(load_model(path), tok, InferConfig(max_num_seqs=2, memory_limit_mb=64)))
        engines.append(engine)
        return path, engine

    yield start
    for e in engines:
        e.shutdown()


ASK = [{"role": "user", "content": "what is the capital of france?"}]
THINK_THEN_ANSWER = "<think>\n[a-z ]{3,12}</think>\n\n[a-z ]{2,10}"


def _chat(url: str, **body) -> dict:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                   json={"messages": ASK, "max_tokens": 60, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _streamed(url: str, **body) -> tuple[str, str]:
    reasoning = content = ""
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=60, json={
            "messages": ASK, "max_tokens": 60, "temperature": 0, "stream": True, **body}) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                d = json.loads(line[6:])["choices"][0]["delta"]
                reasoning += d.get("reasoning_content") or ""
                content += d.get("content") or ""
    return reasoning, content


def test_a_qwen3_answer_has_reasoning_content_beside_content(qwen3, serve):
    path, engine = qwen3(QWEN3_STYLE)
    url = serve(engine, model_dir=path).url
    forced = {"structured_outputs": {"regex": THINK_THEN_ANSWER}}  # a random model made to think, then answer
    msg = _chat(url, **forced)["message"]
    assert re.fullmatch("\n[a-z ]{3,12}", msg["reasoning_content"]) and re.fullmatch("[a-z ]{2,10}", msg["content"])
    assert _streamed(url, **forced) == (msg["reasoning_content"], msg["content"])
    # enable_thinking false: the template writes the empty block into the prompt; the answer is all content
    plain = _chat(url, structured_outputs={"regex": "[a-z ]{2,10}"},
                  chat_template_kwargs={"enable_thinking": False})["message"]
    assert plain["reasoning_content"] is None and re.fullmatch("[a-z ]{2,10}", plain["content"])


def test_a_template_that_opens_the_thinking_block_gets_the_answers_start_as_reasoning(qwen3, serve):
    path, engine = qwen3(R1_STYLE)
    url = serve(engine, model_dir=path).url
    forced = {"structured_outputs": {"regex": "[a-z ]{3,12}</think>\n\n[a-z]{2,5}"}}
    msg = _chat(url, **forced)["message"]
    assert re.fullmatch("[a-z ]{3,12}", msg["reasoning_content"]) and re.fullmatch("[a-z]{2,5}", msg["content"])
    assert "think>" not in msg["reasoning_content"] + msg["content"]
    assert _streamed(url, **forced) == (msg["reasoning_content"], msg["content"])
