"""Shared by the fine-tuning tests: tiny random-weight model directories (Llama with a ChatML template,
GPT-2 with the built-in role format) over a small byte-level BPE trained here with `tokenizers`
(real special tokens, no downloads), and conversation files."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from tinystack.model import GPT, GPTConfig, Llama, LlamaConfig, save_model

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
WORDS = ["the", "capital", "of", "is", "what", "who", "where", "when", "which", "city", "river", "mountain",
         "island", "king", "queen", "founded", "built", "answer", "question", "paris", "france", "rome",
         "italy", "veloria", "quenmar", "zorbin", "tallow", "kest", "marrow", "ember", "one", "two", "three",
         "four", "five", "six", "seven", "eight", "nine", "ten", "user", "assistant", "system", "you", "are",
         "a", "helpful"]


def write_tokenizer(out: Path, vocab_size: int = 300) -> int:
    """A byte-level BPE with SPECIALS (ids 0, 1, 2) as added special tokens; returns its vocab size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = [" ".join(WORDS[i:] + WORDS[:i]) + "?\n" for i in range(len(WORDS))]
    tok.train_from_iterator(corpus, trainer)
    tok.save(str(out / "tokenizer.json"))
    return tok.get_vocab_size()


def model_dir(out: Path, kind: str = "llama", template: bool = True, seed: int = 0, context: int = 96) -> Path:
    """A model directory: random weights of `kind` ("llama" | "qwen3" | "gpt2"), the tokenizer, ChatML if
    `template`."""
    out.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(out)
    torch.manual_seed(seed)
    if kind in ("llama", "qwen3"):
        model = Llama(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, n_layer=2, n_head=4,
                                  n_kv_head=2, max_position_embeddings=context, tie_word_embeddings=True,
                                  qk_norm=kind == "qwen3", model_type=kind))
    else:
        model = GPT(GPTConfig(vocab_size=vocab, block_size=context, n_layer=2, n_head=4, n_embd=32))
    save_model(model, out, eos_token_id=SPECIALS.index("<|im_end|>" if template else "<|endoftext|>"))
    if template:
        (out / "chat_template.jinja").write_text(CHATML, encoding="utf-8")
    return out


def write_jsonl(path: Path, rows: list) -> Path:
    """Rows as JSONL; a str row is written verbatim (for malformed lines)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def qa(question: str, answer: str, source: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
            "source": source, **extra}
