"""Fine-tuning data: bad lines quarantined with their line numbers, dedup and split by source, the loss mask
on exactly the assistant tokens of the prompts the server would build, padding that leaks nothing."""
import json
import random

import numpy as np
import pytest
import torch
from finetune_helpers import WORDS, model_dir, qa, write_jsonl

from tinystack.config import DataConfig
from tinystack.data.io.rejects import Rejects
from tinystack.eval.scoring import score_batches
from tinystack.infer.chat import ChatFormatter, chat_formatter, encode_chat
from tinystack.model import load_model
from tinystack.tokenizer import load_tokenizer
from tinystack.train.finetune_batches import ConversationBatches, encode_conversation, fixed_batches, pad_batch
from tinystack.train.finetune_data import ConversationError, conversation_messages, prepare_conversations
from tinystack.train.loss import IGNORE_INDEX


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return model_dir(tmp_path_factory.mktemp("llama"), "llama", template=True)


@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory):
    return model_dir(tmp_path_factory.mktemp("gpt"), "gpt2", template=False)


def _tools(d):
    tok = load_tokenizer(d)
    return tok, chat_formatter(d, tok)


def test_both_schemas_and_their_errors():
    msgs = conversation_messages({"prompt": "p", "completion": "c", "system": "s"})
    assert [m["role"] for m in msgs] == ["system", "user", "assistant"]
    assert conversation_messages(qa("q", "a", "x"))[1] == {"role": "assistant", "content": "a"}
    for obj, reason in [([1], "not_object"), ({"messages": []}, "bad_messages"), ({"text": "x"}, "bad_messages"),
                        ({"messages": [{"role": "robot", "content": "x"}]}, "bad_messages"),
                        ({"messages": [{"role": "user", "content": 3}]}, "bad_messages"),
                        ({"messages": [{"role": "user", "content": "q"}]}, "no_assistant"),
                        ({"prompt": "q", "completion": "  "}, "no_assistant")]:
        with pytest.raises(ConversationError) as e:
            conversation_messages(obj)
        assert e.value.reason == reason


def test_bad_lines_are_quarantined_with_line_numbers(tmp_path, llama_dir):
    _, fmt = _tools(llama_dir)
    path = write_jsonl(tmp_path / "chat.jsonl", [
        qa("what is the capital of veloria?", "quenmar", "a"), "{broken", '"just a string"', "",
        {"messages": [{"role": "user", "content": "hello"}]}, {**qa("who founded rome?", "the king", "b"), "source": 5},
        {"prompt": "where is the river?", "completion": "in the north", "source": "c"}])
    with open(path, "ab") as f:
        f.write(b'{"prompt": "caf\xe9", "completion": "x"}\n')  # invalid UTF-8
    rejects = Rejects()
    prep = prepare_conversations(path, fmt, DataConfig(near_dedup=False, val_fraction=0.0), rejects)
    got = [(e["line"], e["reason"]) for e in rejects.entries]
    assert got == [(2, "invalid_json"), (3, "not_object"), (5, "no_assistant"), (6, "bad_source"),
                   (8, "invalid_utf8")]
    assert [r.origin[1] for r in prep.train] == [1, 7] and prep.val == []
    assert all(e["file"] == str(path) for e in rejects.entries)


def test_dedup_then_split_by_source(tmp_path, llama_dir):
    _, fmt = _tools(llama_dir)
    rnd = random.Random(0)
    rows = [qa(" ".join(rnd.sample(WORDS, 7)) + "?", " ".join(rnd.sample(WORDS, 5)), f"src{i % 6}") for i in range(12)]
    rows += [rows[0], rows[3]]  # exact duplicates (same text, same source)
    rows.append({**rows[1], "source": "src5"})  # the same conversation in another source: dropped too
    rejects = Rejects()
    prep = prepare_conversations(write_jsonl(tmp_path / "c.jsonl", rows), fmt, DataConfig(val_fraction=0.3), rejects)
    dedup = prep.steps[0]
    assert dedup.dropped["exact_duplicate"] == 3 and len(prep.train) + len(prep.val) == 12
    train_src, val_src = {r.source for r in prep.train}, {r.source for r in prep.val}
    assert val_src and not (train_src & val_src)  # whole sources, never split across
    first = prep.train[0].extra["messages"]
    assert prep.train[0].text == f"user: {first[0]['content']}\nassistant: {first[1]['content']}\n"  # not the template


def _decode_targets(tok, ex):
    """The target tokens of each assistant turn, decoded with special tokens kept."""
    runs, cur = [], []
    for i, is_target in zip(ex.ids.tolist(), ex.target.tolist()):
        if is_target:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [tok._tok.decode(r, skip_special_tokens=False) for r in runs]


def test_loss_mask_covers_exactly_the_assistant_turns(llama_dir):
    tok, fmt = _tools(llama_dir)
    msgs = [{"role": "system", "content": "you are a helpful king"},
            {"role": "user", "content": "what is the capital of veloria?"},
            {"role": "assistant", "content": "the capital is quenmar"},
            {"role": "user", "content": "and the river?"},
            {"role": "assistant", "content": "the river is ember"}]
    ex = encode_conversation(msgs, fmt, tok, max_len=200)
    assert _decode_targets(tok, ex) == ["the capital is quenmar<|im_end|>\n", "the river is ember<|im_end|>\n"]
    # the context of the first answer is, token for token, the prompt the server builds for that turn
    prompt = encode_chat(tok, fmt.render(msgs[:2]))
    first = int(np.flatnonzero(ex.target)[0])
    assert ex.ids[:first].tolist() == prompt
    im_end = tok._tok.token_to_id("<|im_end|>")
    assert im_end in ex.ids[ex.target].tolist()  # the real special token: the engine stops on it
    _, y = ex.xy()
    assert (y == IGNORE_INDEX).sum() == len(y) - ex.n_targets
    assert y[first - 1] == ex.ids[first]  # the answer's first token is predicted from the prompt's last


def test_role_format_appends_eos_and_long_conversations_are_rejected(gpt_dir):
    tok, fmt = _tools(gpt_dir)
    assert fmt.template_source is None
    ex = encode_conversation([{"role": "user", "content": "who rules?"}, {"role": "assistant", "content": "the queen"}],
                             fmt, tok, max_len=200)
    assert ex.ids[-1] == tok.eos_token_id and ex.target[-1]
    assert tok.decode(ex.ids[ex.target].tolist()) == " the queen\n"
    long = [{"role": "user", "content": "river " * 80}, {"role": "assistant", "content": "no"}]
    assert encode_conversation(long, fmt, tok, max_len=64) == "too_long"


def test_a_template_that_does_not_render_turn_by_turn_is_refused(llama_dir):
    tok, _ = _tools(llama_dir)
    # puts the number of messages up front: each prefix renders differently from the whole conversation
    odd = ChatFormatter("{{ messages|length }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert encode_conversation(msgs, odd, tok, max_len=200) == "unstable_tokenization"


def test_padding_leaks_nothing(llama_dir):
    tok, fmt = _tools(llama_dir)
    short = encode_conversation([{"role": "user", "content": "who?"}, {"role": "assistant", "content": "the king"}],
                                fmt, tok, 200)
    long = encode_conversation([{"role": "user", "content": "what is the capital of the island of kest?"},
                                {"role": "assistant", "content": "the capital of kest is marrow, on the river"}],
                               fmt, tok, 200)
    model = load_model(llama_dir)
    x, y = pad_batch([short, long], pad_id=tok.eos_token_id)
    assert x.shape[1] == len(long.ids) - 1 and (y[0, len(short.ids) - 1:] == IGNORE_INDEX).all()
    with torch.no_grad():
        alone = model(torch.from_numpy(short.xy()[0])[None])[0][0]
        batched = model(torch.from_numpy(x))[0][0, :len(short.ids) - 1]
    assert torch.allclose(alone, batched, atol=1e-5)
    # so the batch loss is the token-weighted mean of each conversation's own loss
    a, b = (score_batches(model, [pad_batch([e], 0)]) for e in (short, long))
    (la, na), (lb, nb) = (a.loss, a.tokens), (b.loss, b.tokens)
    scored = score_batches(model, fixed_batches([short, long], 2, 0))
    both, n = scored.loss, scored.tokens
    assert n == na + nb == short.n_targets + long.n_targets
    assert both == pytest.approx((la * na + lb * nb) / n, rel=1e-5)


def test_batches_cover_every_conversation_each_epoch_and_resume(llama_dir):
    tok, fmt = _tools(llama_dir)
    exs = [encode_conversation([{"role": "user", "content": w}, {"role": "assistant", "content": w * (i + 1)}],
                               fmt, tok, 200) for i, w in enumerate(["a", "b", "c", "d", "e"])]
    src = ConversationBatches(exs, seed=3, pad_id=0)
    first_epoch = [src.sample(1)[1] for _ in range(5)]
    seen = sorted(int((y != IGNORE_INDEX).sum()) for y in first_epoch)
    assert seen == sorted(e.n_targets for e in exs)  # each once
    src.sample(2)
    state = json.loads(json.dumps({k: v for k, v in src.state_dict().items() if k != "generator"}))
    state["generator"] = src.state_dict()["generator"]
    ahead = [src.sample(3) for _ in range(4)]
    again = ConversationBatches(exs, seed=3, pad_id=0)
    again.load_state_dict(state)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
               for a, b in zip(ahead, (again.sample(3) for _ in range(4))))


def test_openai_fine_tuning_files_content_parts_and_weights(llama_dir):
    """OpenAI's fine-tuning format: text parts are the text; an assistant turn with weight 0 is context only."""
    tok, fmt = _tools(llama_dir)
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is "},
                                                       {"type": "text", "text": "the capital?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "quenmar"}]}]}
    assert conversation_messages(parts) == conversation_messages(qa("what is the capital?", "quenmar", "x"))
    msgs = [{"role": "user", "content": "what is the capital of veloria?"},
            {"role": "assistant", "content": "i do not know", "weight": 0},
            {"role": "user", "content": "try again"},
            {"role": "assistant", "content": "the capital is quenmar", "weight": 1}]
    kept = conversation_messages({"messages": msgs})
    assert "weight" in kept[1] and "weight" not in kept[3]
    ex = encode_conversation(kept, fmt, tok, max_len=200)
    assert _decode_targets(tok, ex) == ["the capital is quenmar<|im_end|>\n"]  # the weight-0 answer is no target
    assert "i do not know" in tok._tok.decode(ex.ids.tolist(), skip_special_tokens=False)  # but still context
    full = encode_conversation(conversation_messages({"messages": [{**m, "weight": 1} if m["role"] == "assistant"
                                                                   else m for m in msgs]}), fmt, tok, max_len=200)
    assert full.ids.tolist() == ex.ids.tolist() and full.n_targets > ex.n_targets
    last_zero = [*msgs[:3], {**msgs[3], "weight": 0}]
    for obj in ({"messages": last_zero},  # nothing left to learn
                {"messages": [msgs[0], {**msgs[1], "weight": 2}]},
                {"messages": [{**msgs[0], "weight": 1}, msgs[3]]},  # weight only on assistant turns
                {"messages": [msgs[0], {**msgs[3], "weight": True}]},
                {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}, msgs[3]]}):
        with pytest.raises(ConversationError) as e:
            conversation_messages(obj)
        assert e.value.reason == ("no_assistant" if obj["messages"] is last_zero else "bad_messages")
