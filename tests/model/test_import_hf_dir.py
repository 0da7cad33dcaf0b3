"""Hugging Face directories as transformers >= 4.43 writes them load and import; what we cannot load is named."""
import json
import shutil

import pytest
import torch
from gguf_helpers import CHATML, hf_model, tiny_bpe
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tinystack.infer.chat import ChatFormatter, load_chat_template
from tinystack.model import ModelFormatError, load_model
from tinystack.model.importer import files_sha256, import_model
from tinystack.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")


def _save_tokenizer(d):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokens, merges, _ = tiny_bpe()
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split()) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>")
    fast.chat_template = CHATML
    fast.save_pretrained(d)
    return len(tokens)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tied Llama with a non-default RoPE theta and a chat template, saved by transformers itself."""
    d = tmp_path_factory.mktemp("hf")
    vocab = _save_tokenizer(d)
    model = hf_model("llama", vocab, tie=True)
    model.config.rope_parameters["rope_theta"] = 777.0
    model = transformers.LlamaForCausalLM(model.config).eval()  # rebuilt so the rotary tables use it
    model.save_pretrained(d)
    return d, model


def _logits(model, ids):
    with torch.no_grad():
        out = model(ids)
    return out[0] if isinstance(out, tuple) else out.logits


def test_the_layout_is_the_new_one(hf_dir):
    """What this file tests only means something if transformers wrote the new layout."""
    d, _ = hf_dir
    cfg = json.loads((d / "config.json").read_text())
    assert "rope_theta" not in cfg and cfg["rope_parameters"]["rope_theta"] == 777.0
    assert (d / "chat_template.jinja").is_file()
    assert "chat_template" not in json.loads((d / "tokenizer_config.json").read_text())
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names


def test_it_loads_directly_and_through_import(hf_dir, tmp_path):
    d, model = hf_dir
    ids = torch.randint(0, model.config.vocab_size, (2, 30), generator=torch.Generator().manual_seed(3))
    direct = load_model(d)
    assert direct.config.rope_theta == 777.0 and direct.config.tie_word_embeddings
    assert torch.allclose(_logits(direct, ids), _logits(model, ids), atol=1e-5, rtol=0)
    assert load_chat_template(d) == CHATML
    lineage = import_model(d, tmp_path / "out")
    out = tmp_path / "out"
    assert torch.equal(_logits(load_model(out), ids), _logits(direct, ids))
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == CHATML
    assert json.loads((out / "config.json").read_text())["rope_theta"] == 777.0
    assert lineage["source"]["format"] == "huggingface" and lineage["source"]["model_type"] == "llama"
    read = [d / n for n in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                            "chat_template.jinja", "generation_config.json")]
    assert lineage["source"]["sha256"] == files_sha256(read)
    text = ChatFormatter(load_chat_template(out)).render([{"role": "user", "content": "hi"}])
    assert load_tokenizer(out).encode_ordinary(text) == load_tokenizer(d).encode_ordinary(text)


def test_a_llama3_rope_directory_imports_and_equals_transformers(tmp_path):
    """Llama 3.1 / 3.2's RoPE scaling as transformers 5 writes it (inside rope_parameters), with a short original
    context (64) so that head_dim 16's wavelengths (6 to 10,590) fall in all three of its bands."""
    d = tmp_path / "hf"
    vocab = _save_tokenizer(d)
    model = hf_model("llama", vocab, tie=True)
    model.config.rope_parameters.update(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                        original_max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(model.config).eval()  # rebuilt so the rotary tables use it
    model.save_pretrained(d)
    assert json.loads((d / "config.json").read_text())["rope_parameters"]["rope_type"] == "llama3"
    import_model(d, tmp_path / "out")
    ids = torch.randint(0, vocab, (2, 120), generator=torch.Generator().manual_seed(4))  # past the original 64
    ours = load_model(tmp_path / "out")
    assert ours.config.rope_scaling["rope_type"] == "llama3"
    assert torch.allclose(_logits(ours, ids), _logits(model, ids), atol=1e-5, rtol=0)


def test_a_gpt2_directory_imports(tmp_path):
    torch.manual_seed(0)
    src = tmp_path / "gpt2"
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=300, n_positions=32, n_embd=32, n_layer=2,
                                                              n_head=2)).eval()
    hf.save_pretrained(src)
    _save_tokenizer(src)
    import_model(src, tmp_path / "out")
    ids = torch.randint(0, 300, (1, 32))
    assert torch.allclose(_logits(load_model(tmp_path / "out"), ids), _logits(hf, ids), atol=1e-5, rtol=0)


def _broken(hf_dir, tmp_path, change):
    d = tmp_path / "broken"
    shutil.copytree(hf_dir[0], d)
    change(d)
    return d


def _edit_config(**kv):
    def change(d):
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(kv)
        (d / "config.json").write_text(json.dumps(cfg))
    return change


def _drop_tensor(d):
    w = load_file(d / "model.safetensors")
    save_file({k: v for k, v in w.items() if "layers.0.mlp.gate_proj" not in k}, d / "model.safetensors")


def _sentencepiece_only(d):
    (d / "tokenizer.json").unlink()
    (d / "tokenizer.model").write_bytes(b"\x00")


@pytest.mark.parametrize("change, message", [
    (_edit_config(quantization_config={"quant_method": "gptq", "bits": 4}), "unsupported quantization 'gptq'"),
    (_edit_config(quantization_config={"quant_method": "fp8"}), "unsupported quantization 'fp8'"),
    (_edit_config(model_type="mamba"), "unsupported model_type 'mamba'"),
    (_edit_config(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}),
     "unsupported rope scaling 'yarn'"),
    (_edit_config(tie_word_embeddings=False), r"missing tensors \['lm_head.weight'\]"),
    (_drop_tensor, r"missing tensors \['model.layers.0.mlp.gate_proj.weight'\]"),
    (lambda d: (d / "config.json").unlink(), "missing config.json"),
    (lambda d: (d / "model.safetensors").unlink(), "missing model.safetensors"),
    (_sentencepiece_only, r"missing tokenizer.json \(tokenizer.model, SentencePiece, is not supported\)"),
    (lambda d: (d / "generation_config.json").write_text('{"top_p": 1.5}'),
     r"generation_config.json: top_p must be in \(0.0, 1.0\], got 1.5"),
])
def test_what_we_cannot_load_is_named(hf_dir, tmp_path, change, message):
    d = _broken(hf_dir, tmp_path, change)
    with pytest.raises(ModelFormatError, match=message) as e:
        import_model(d, tmp_path / "out")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()
