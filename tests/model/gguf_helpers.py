"""Tiny GGUF files written the way llama.cpp's converter writes them, for the import tests.

`write_gguf` takes a random `transformers` Llama/Qwen2 model and a small byte-level BPE
(trained here with `tokenizers`), permutes Llama's Q/K rows exactly as convert_hf_to_gguf.py
does, quantises 2-D weights with `gguf.quants.quantize` (1-D norms stay F32, as llama.cpp
keeps them; a type `gguf` cannot quantise, the K- and IQ-quants, gets `random_blocks` in their
place: any bytes are a valid block) and writes the file with `gguf.GGUFWriter`. `meta` / `drop` / `extra` bend the file
for the error tests.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

QUANTISABLE = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]  # gguf.quants.quantize exists
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = "<think>"
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 2024 and we've got 12345 reasons, 3.14159 and 1,000,000.",
    "def add(a, b):\n    return a + b  # sum\n\nfor i in range(10):\n    print(i ** 2)\n",
    "我喜欢机器学习。深度学习模型很有趣。你好，世界！",
    "Emoji 🎉🚀 ok 👍🏽 café naïve résumé",
] * 20


def tiny_bpe(vocab_size: int = 420) -> tuple[list[str], list[str], list[int]]:
    """(tokens in id order, merges "a b", token types): specials first (control), one user-defined last."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])] + [USER_DEFINED]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [3 if t in SPECIALS else 4 if t == USER_DEFINED else 1 for t in tokens]
    return tokens, merges, types


# byte offsets of the float16 fields (scales, mins) in each block type's block: kept finite in random blocks
F16_FIELDS = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q2_K": [80, 82],
              "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_NL": [0], "IQ4_XS": [0]}


def random_blocks(rows: int, cols: int, qtype: str, rng: np.random.Generator, scale: float = 2.0) -> np.ndarray:
    """[rows, bytes] of random `qtype` blocks for a [rows, cols] tensor, each float16 field in [-scale, scale]."""
    import gguf

    block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    raw = rng.integers(0, 256, size=(rows, cols // block * nbytes), dtype=np.uint8)
    blocks = raw.reshape(-1, nbytes)
    for off in F16_FIELDS[qtype]:
        blocks[:, off:off + 2] = rng.uniform(-scale, scale, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    return raw


def hf_model(kind: str, vocab_size: int, tie: bool = True, seed: int = 0, hidden: int = 64, ffn: int = 96):
    import transformers

    torch.manual_seed(seed)
    kw = {"vocab_size": vocab_size, "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": 2,
          "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 5000.0,
              "tie_word_embeddings": tie, "bos_token_id": 1, "eos_token_id": 2}
    if kind == "qwen2":
        m = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw))
    elif kind == "qwen3":
        # head_dim 128, as every Qwen3 has: transformers reads no head_dim from a qwen3 GGUF (it assumes 128)
        m = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**kw, head_dim=128))
    else:
        m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw))
    with torch.no_grad():  # non-trivial norms and biases, so a mix-up shows in the logits
        for name, p in m.named_parameters():
            if name.endswith(("norm.weight", ".bias")):
                p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else torch.randn_like(p))
    return m.eval()


def permute(w: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: HF's half-split rotary layout -> llama.cpp's pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_name(hf: str) -> str:
    glob = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}
    if hf in glob:
        return glob[hf]
    parts = hf.split(".")  # model.layers.N.<module>.<proj>.<weight|bias>
    sub = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "q_proj": "attn_q",
           "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output", "gate_proj": "ffn_gate",
           "up_proj": "ffn_up", "down_proj": "ffn_down", "q_norm": "attn_q_norm", "k_norm": "attn_k_norm"}
    return f"blk.{parts[2]}.{sub[parts[-2]]}.{parts[-1]}"


def write_gguf(path: Path, model, arch: str = "llama", qtype: str = "F32", pre: str = "smollm",
               meta: dict | None = None, drop: tuple[str, ...] = (), extra: dict | None = None,
               tokenizer: tuple | None = None) -> Path:
    import gguf

    c = model.config
    tokens, merges, types = tokenizer or tiny_bpe()
    w = gguf.GGUFWriter(str(path), arch)
    w.add_string("general.name", "tiny test model")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_dimension_count(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
    if arch == "qwen3":  # as llama.cpp's converter writes qwen3 files: a head_dim of its own
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    for key, value in (meta or {}).items():  # overrides: a str / int / float / bool value
        w.kv_data[0].pop(key, None)
        {str: w.add_string, bool: w.add_bool, int: w.add_uint32, float: w.add_float32}[type(value)](key, value)
    qt, rng = gguf.GGMLQuantizationType[qtype], np.random.default_rng(0)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        a = t.detach().float().numpy()
        if arch == "llama" and "q_proj" in name:
            a = permute(a, c.num_attention_heads, c.num_attention_heads)
        elif arch == "llama" and "k_proj" in name:
            a = permute(a, c.num_attention_heads, c.num_key_value_heads)
        gname = _gguf_name(name)
        if gname in drop:
            continue
        if a.ndim == 1 or qtype == "F32":
            w.add_tensor(gname, np.ascontiguousarray(a, dtype=np.float32))
        elif qtype in QUANTISABLE:
            q = gguf.quants.quantize(a, qt)
            w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=qt)
        else:  # random weights in that format, scaled to |w| <= ~0.1 (as trained weights are)
            big = np.abs(gguf.quants.dequantize(random_blocks(*a.shape, qtype, rng), qt)).max()
            q = random_blocks(*a.shape, qtype, rng, scale=0.1 / big)
            w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=qt)
    for gname, (raw, raw_type) in (extra or {}).items():
        w.add_tensor(gname, raw, raw_shape=raw.shape, raw_dtype=raw_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
