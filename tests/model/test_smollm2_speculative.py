"""Speculative decoding on the real SmolLM2 in its own 4-bit format: greedy output token for token the plain
engine's (the fused step gives a verified token the bits a decode would), with drafts accepted along the way."""
import pytest

from tinystack.config import InferConfig
from tinystack.infer import LLM, SamplingParams
from tinystack.infer.loading import load_for_inference
from tinystack.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow  # two 135M-parameter engines and 2 x 64 tokens (~30 s on 2 CPU cores)

CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"


def test_prompt_lookup_gives_plain_greedy_tokens_on_smollm2(smollm2_dir):
    tok = load_tokenizer(smollm2_dir)
    prompt = tok.encode_ordinary("Rename add to plus in this code and repeat it:\n" + CODE)
    greedy = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)

    def engine(**spec):
        model = load_for_inference(smollm2_dir, InferConfig(weight_format="q4_1"), tokenizer=tok)[0]
        return LLM(model, tok, kv_cache="paged", max_num_seqs=1, **spec)

    plain = engine().generate([prompt], greedy)[0]
    spec_llm = engine(speculative="prompt_lookup", num_speculative_tokens=4)
    spec = spec_llm.generate([prompt], greedy)[0]
    assert spec.token_ids == plain.token_ids
    assert spec_llm.engine.speculator.accepted_tokens > 0  # it did speculate: some drafts were taken
