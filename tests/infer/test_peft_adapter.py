"""An adapter trained with PEFT (the library) for a Llama-family base loads in the engine (model/lora_adapter.py,
infer/lora.py) and gives what PEFT's own merge_and_unload model gives, token for token; one for another base is
refused naming the module that does not fit."""
import copy

import pytest
import torch
from infer_helpers import ToyTokenizer, _hf_model

from tinystack.infer import LLM, SamplingParams
from tinystack.model.io import load_model
from tinystack.model.lora_adapter import LoRAAdapter

peft = pytest.importorskip("peft")
GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
PROMPTS = ["a prompt of some length", "hi"]


def _tokens(model) -> list[list[int]]:
    llm = LLM(model, ToyTokenizer(), weight_format="float32", memory_limit_mb=128)
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


def test_a_peft_adapter_serves_as_peft_merges_it(tmp_path):
    hf = _hf_model("llama")
    hf.save_pretrained(tmp_path / "base", safe_serialization=True)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"],
                             lora_dropout=0.0)
    tuned = peft.get_peft_model(copy.deepcopy(hf), config)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # PEFT starts B at zero: give it something to say
        for name, p in tuned.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    tuned.save_pretrained(tmp_path / "adapter")  # adapter_config.json + adapter_model.safetensors
    tuned.merge_and_unload().save_pretrained(tmp_path / "merged", safe_serialization=True)

    adapter = LoRAAdapter.load(tmp_path / "adapter")
    assert adapter.rank == 4 and adapter.scale == 2.0 and len(adapter.weights) == 4 * 2
    base, merged = load_model(tmp_path / "base"), load_model(tmp_path / "merged")
    expected = _tokens(merged)
    assert expected != _tokens(base)
    llm = LLM(base, ToyTokenizer(), weight_format="float32", memory_limit_mb=128)
    llm.engine.add_lora("peft", tmp_path / "adapter")
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY, lora="peft")] == expected

    other = peft.get_peft_model(_hf_model("qwen3"), peft.LoraConfig(r=4, target_modules=["q_proj"]))
    other.save_pretrained(tmp_path / "other")  # qwen3's q_proj: 4 heads x 16, not 48 rows
    with pytest.raises(ValueError, match=r"q_proj has A \(4, 48\) and B \(64, 4\)"):
        llm.engine.add_lora("other", tmp_path / "other")
