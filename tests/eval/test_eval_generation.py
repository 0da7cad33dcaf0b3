"""Generation checks: distinct-n and repetition rate by hand, and a looping model is flagged."""
import pytest
import torch

from tinystack.eval.generation import distinct_n, generation_checks, repetition_rate
from tinystack.model import GPT, GPTConfig
from tinystack.tokenizer import BPETokenizer


def test_distinct_n_and_repetition_rate_by_hand():
    assert distinct_n([[1, 2, 3], [1, 2, 4]], 1) == pytest.approx(4 / 6)
    assert distinct_n([[1, 2, 3], [1, 2, 4]], 2) == pytest.approx(3 / 4)  # (1,2) twice, (2,3), (2,4)
    assert repetition_rate([1, 2, 3, 4, 5], n=2) == 0.0
    assert repetition_rate([7, 7, 7, 7, 7], n=2) == pytest.approx(3 / 4)  # all but the first bigram repeat
    assert repetition_rate([1, 2, 1, 2, 1, 2], n=2) == pytest.approx(3 / 5)  # (1,2),(2,1) new, then 3 repeats
    assert repetition_rate([1, 2], n=4) == 0.0


def test_a_model_that_repeats_one_token_is_flagged_as_looping():
    tok = BPETokenizer.train(["abc abd abe"] * 3, vocab_size=258)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=1, n_embd=8))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        # zero ln_f gain: its output is its bias e_0 at every position, so the logits (tied head)
        # are wte[:, 0]: 1 for the byte "x", 0 for everything else -> greedy says "x" forever
        model.transformer.ln_f.bias[0] = 1.0
        model.transformer.wte.weight[ord("x"), 0] = 1.0
    res = generation_checks(model, tok, ["ab", "abc"], max_tokens=12)
    greedy = res["greedy"]
    assert all(s["completion"] == "x" * 12 for s in greedy["samples"])
    assert greedy["looping"] == 2 and greedy["mean_repetition_rate"] > 0.5
    assert greedy["distinct_1"] == pytest.approx(1 / 24)
    assert res["sampled"]["samples"][0]["tokens"] > 0


def test_evaluation_generates_as_inference_does(toy_model_dir):
    """Evaluation loads the model directory with inference's tokenizer and its generation checks are the
    engine's own outputs: one batch, greedy and seeded sampling, the same tokens as LLM.generate."""
    from tinystack.eval.gate import load_model_dir
    from tinystack.infer import LLM, SamplingParams

    prompts = ["the big cat", "", "the small"]
    model, tok = load_model_dir(toy_model_dir)
    # float32 as evaluation loads it: weight_format "auto" may pick a quantised format on this CPU (q8_0 on a
    # Zen 3), whose greedy text is another model's
    llm = LLM(toy_model_dir, weight_format="float32", memory_limit_mb=1024)
    assert type(tok) is type(llm.tokenizer)
    for p in prompts:
        assert tok.encode_ordinary(p) == llm.tokenizer.encode_ordinary(p)
    res = generation_checks(model, tok, prompts, max_tokens=8, temperature=0.9, top_k=20, top_p=0.9)
    want = llm.generate(prompts * 2, [SamplingParams(max_tokens=8, temperature=0.0, seed=i) for i in range(3)]
                        + [SamplingParams(max_tokens=8, temperature=0.9, top_k=20, top_p=0.9, seed=i)
                           for i in range(3)])
    got = res["greedy"]["samples"] + res["sampled"]["samples"]
    assert [s["completion"] for s in got] == [o.text for o in want]
    assert [s["tokens"] for s in got] == [len(o.token_ids) for o in want]
