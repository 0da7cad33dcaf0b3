"""Chat prompts (infer/chat.py): templates from chat_template.jinja, rendering without the generation
prompt, and the template's special-token text encoded as the special tokens (a plain prompt keeps them text)."""
import json

import pytest

from tinystack.infer.chat import ChatFormatter, ChatTemplateError, chat_formatter, encode_chat, load_chat_template
from tinystack.tokenizer import load_tokenizer

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    d = tmp_path_factory.mktemp("chat")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(["hello there, how are you today? user assistant system"] * 20, trainers.BpeTrainer(
        vocab_size=120, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(d / "tokenizer.json"))
    (d / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    (d / "chat_template.jinja").write_text(CHATML)
    return d


def test_template_file_wins_over_tokenizer_config(chat_dir, tmp_path):
    assert load_chat_template(chat_dir) == CHATML
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ 'old' }}"}))
    assert load_chat_template(tmp_path) == "{{ 'old' }}"
    (tmp_path / "chat_template.jinja").write_text("{{ 'new' }}")
    assert load_chat_template(tmp_path) == "{{ 'new' }}"


def test_render_with_and_without_the_generation_prompt(chat_dir):
    fmt = chat_formatter(chat_dir, load_tokenizer(chat_dir))
    msgs = [{"role": "user", "content": "hello"}]
    assert fmt.render(msgs) == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert fmt.render(msgs, add_generation_prompt=False) == "<|im_start|>user\nhello<|im_end|>\n"
    assert ChatFormatter(None).render(msgs, add_generation_prompt=False) == "user: hello\n"


def test_template_special_tokens_become_special_ids(chat_dir):
    tok = load_tokenizer(chat_dir)
    prompt = chat_formatter(chat_dir, tok).render([{"role": "user", "content": "hello"}])
    ids = encode_chat(tok, prompt)
    assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1  # <|im_start|> x2, <|im_end|> x1
    assert tok.decode(ids) == "user\nhello\nassistant\n"
    plain = tok.encode_ordinary(prompt)  # a completion prompt: the same characters stay text
    assert 1 not in plain and 2 not in plain and len(plain) > len(ids)
    assert tok.encode_ordinary(prompt) == plain  # the chat encoder did not change the plain one


def test_a_formatter_leaves_the_tokenizer_ready_to_encode_chats(chat_dir, monkeypatch):
    import tokenizers

    tok = load_tokenizer(chat_dir)
    fmt = chat_formatter(chat_dir, tok)
    built = []
    real = tokenizers.Tokenizer.from_str
    monkeypatch.setattr(tokenizers.Tokenizer, "from_str", lambda s: built.append(1) or real(s))
    ids = encode_chat(tok, fmt.render([{"role": "user", "content": "hello"}]))
    assert ids[0] == 1 and not built  # no encoder built in the request's path



# what real templates use beyond plain Jinja: {% break %} (loopcontrols), tojson on non-ASCII text, strftime_now
# (Llama 3.1+ write today's date), raise_exception
RICH = ("{%- set date = strftime_now('%d %b %Y') if strftime_now is defined else 'no date' -%}"
        "<|im_start|>system\nToday: {{ date }} {{ {'note': 'café <b>'} | tojson }}<|im_end|>\n"
        "{%- for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
        "{% if loop.index > 3 %}{% break %}{% endif %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_templates_render_as_transformers_renders_them(chat_dir):
    transformers = pytest.importorskip("transformers")
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(chat_dir / "tokenizer.json"))
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "naïve?"},
            {"role": "assistant", "content": "yes"}, {"role": "user", "content": "more"},
            {"role": "assistant", "content": "cut by the break"}]
    ours = ChatFormatter(RICH).render(msgs)
    assert ours == tok.apply_chat_template(msgs, chat_template=RICH, tokenize=False, add_generation_prompt=True)
    assert "no date" not in ours and '"café <b>"' in ours and "cut by the break" not in ours


def test_a_template_that_does_not_parse_is_named():
    with pytest.raises(ChatTemplateError, match=r"chat template does not parse \(line 1\): Unexpected end of template"):
        ChatFormatter("{% for m in messages %}")
