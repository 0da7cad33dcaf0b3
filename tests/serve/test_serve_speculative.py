"""Speculative decoding behind the server: built from [infer], the same answers as without it, its draft tokens
counted in /metrics (tinystack_spec_{proposed,accepted}_tokens_total) and per request in the JSON log."""
import json

import httpx
import pytest
from obs_helpers import scrape, value

from tinystack.config import InferConfig
from tinystack.serve.engine.adapter import load_engine

PROMPT = "return the value of the value of the value of the"
GREEDY = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}


@pytest.fixture(autouse=True)
def weight_format_cache(tmp_path, monkeypatch):
    """A draft directory loads with dtype "auto": its decision is cached here, not in the user's ~/.cache."""
    from tinystack.infer.quant import auto

    monkeypatch.setattr(auto, "CACHE_DIR", tmp_path / "weight_format_cache")


def _infer(**kw) -> InferConfig:
    return InferConfig(weight_format="float32", max_num_seqs=4, memory_limit_mb=256, **kw)


@pytest.mark.parametrize("mode", ["prompt_lookup", "draft"])
def test_served_speculation_is_counted_and_answers_like_plain_decoding(serve, model_dir, mode):
    plain = load_engine(model_dir, _infer())
    try:
        s = serve(plain)
        with httpx.Client(base_url=s.url, timeout=30) as c:
            want = c.post("/v1/completions", json=GREEDY).json()["choices"][0]["text"]
    finally:
        plain.shutdown()
    # draft: the target itself as its own draft model (loaded from its directory): every draft is accepted
    spec = load_engine(model_dir, _infer(speculative=mode, num_speculative_tokens=3,
                                         draft_model=str(model_dir) if mode == "draft" else ""))
    try:
        s = serve(spec, log=True)
        with httpx.Client(base_url=s.url, timeout=30) as c:
            before = scrape(s.url)
            got = c.post("/v1/completions", json=GREEDY).json()["choices"][0]["text"]
            after = scrape(s.url)
        assert got == want
        llm = spec.engine
        names = ("tinystack_spec_proposed_tokens_total", "tinystack_spec_accepted_tokens_total")
        proposed, accepted = (value(after, name) - value(before, name) for name in names)
        assert proposed == llm.spec_proposed_tokens > 0 and accepted == llm.spec_accepted_tokens
        assert (accepted == proposed) if mode == "draft" else (0 <= accepted <= proposed)
        s.log.close()
        row = next(json.loads(line) for line in s.log_path.read_text().splitlines() if '"/v1/completions"' in line)
        assert (row["spec_proposed_tokens"], row["spec_accepted_tokens"]) == (proposed, accepted)
    finally:
        spec.shutdown()


def test_a_draft_with_another_tokenizer_is_refused_in_one_line(tmp_path, model_dir, tiny_model):
    from tinystack.model.io import save_model
    from tinystack.tokenizer import BPETokenizer

    other = BPETokenizer.train([f"completely different words number {i}" for i in range(200)], vocab_size=300)
    draft_dir = tmp_path / "draft"
    save_model(tiny_model, draft_dir, eos_token_id=other.eos_token_id)  # same vocabulary size, other tokenizer
    other.save(draft_dir)
    with pytest.raises(ValueError, match="its tokenizer is not the target's") as e:
        load_engine(model_dir, _infer(speculative="draft", draft_model=str(draft_dir)))
    assert "\n" not in str(e.value)
